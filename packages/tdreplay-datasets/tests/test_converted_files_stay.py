"""What a dataset buffer is made to hold (a restore of another buffer's state or checkpoint, a
write into its storage) never reaches the converted files: they were mapped shared, so
``loads`` / ``load_state_dict`` / ``storage.set`` rewrote the dataset on disk, and every later
buffer of that dataset read the other rows (the cache is not checked against the Minari
source again). The files are now mapped copy-on-write."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from tdreplay.datasets import MinariExperienceReplay


def load(dataset_id: str, root: Path, **kwargs) -> MinariExperienceReplay:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return MinariExperienceReplay(dataset_id, 4, root=root, load_from_local_minari=True,
                                      **kwargs)


def files(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("split_trajs", [False, True])
@pytest.mark.parametrize("how", ["load_state_dict", "loads", "storage.set"])
def test_a_restore_or_write_into_a_dataset_buffer_leaves_its_files(cartpole, root, tmp_path,
                                                                   split_trajs, how):
    data = load(cartpole, root, split_trajs=split_trajs)
    before = files(root)
    original = data[:]["action"].clone()
    other = data.state_dict()
    other["_storage"]["storage"]["action"] = 1 - other["_storage"]["storage"]["action"]
    if how == "load_state_dict":
        data.load_state_dict(other)
    elif how == "loads":
        twin = load(cartpole, root, split_trajs=split_trajs)
        twin.load_state_dict(other)  # (this process's view of the files)
        twin.dumps(tmp_path / "ckpt")
        data.loads(tmp_path / "ckpt")
    else:
        rows = data.storage[0:2].clone()
        rows["action"] = 1 - rows["action"]
        data.storage.set(slice(0, 2), rows)
    changed = data[:]["action"]
    assert not torch.equal(changed, original)  # the buffer holds what it was given
    assert files(root) == before  # the files do not
    assert torch.equal(load(cartpole, root, split_trajs=split_trajs)[:]["action"], original)


def test_a_copy_of_a_dataset_buffer_written_in_this_process_warns(cartpole, root):
    # the copy maps the files: rows restored or written here (copy-on-write) are not in it
    import pickle

    data = load(cartpole, root)
    twin = pickle.loads(pickle.dumps(data))  # nothing written: no warning
    assert torch.equal(twin[:]["action"], data[:]["action"])
    rows = data.storage[0:2].clone()
    rows["action"] = 1 - rows["action"]
    data.storage.set(slice(0, 2), rows)
    with pytest.warns(UserWarning, match="not in its files, which the copy being made reads"):
        copy = pickle.loads(pickle.dumps(data))
    assert not torch.equal(copy[:]["action"], data[:]["action"])  # (what the warning says)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pickle.dumps(copy)  # the copy's rows are its files'


def test_a_deep_copy_of_a_dataset_buffer_maps_its_files(cartpole, root):
    # copy.deepcopy raised torch's RuntimeError (a memory-mapped tensor cannot be deep-copied)
    import copy

    data = load(cartpole, root)
    data.sampler.set_rng(torch.Generator().manual_seed(3))
    twin = copy.deepcopy(data)
    assert torch.equal(twin[:]["action"], data[:]["action"])
    assert twin.sampler is not data.sampler and twin.storage is not data.storage
    assert torch.equal(twin.sample()["index"], data.sample()["index"])  # same draws
    rows = data.storage[0:2].clone()
    rows["action"] = 1 - rows["action"]
    data.storage.set(slice(0, 2), rows)
    with pytest.warns(UserWarning, match="not in its files, which the copy being made reads"):
        copied = copy.deepcopy(data)
    assert not torch.equal(copied[:]["action"], data[:]["action"])  # (what the warning says)
    assert torch.equal(copied[:]["action"], twin[:]["action"])
