"""Keys a tensor storage takes that are no HDF5 names (``""``, ``"."``, a ``/`` inside a part
next to the nested key it spells) are saved by :class:`H5StorageCheckpointer` under escaped
names: its ``dumps`` raised h5py's raw ``TypeError`` / ``ValueError``, naming no entry."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

pytest.importorskip("h5py")

from tdreplay.core import TensorDictReplayBuffer  # noqa: E402
from tdreplay.storages import H5StorageCheckpointer, LazyTensorStorage  # noqa: E402


@pytest.mark.parametrize("keys", [
    {"a/b": 1.0, ("a", "b"): 2.0},
    {".": 1.0, "x": 2.0},
    {"": 1.0},
    {"5%": 1.0, "5%25": 2.0, ("n", "a/b"): 3.0},
])
def test_keys_that_are_no_hdf5_names_round_trip(tmp_path, keys):
    def make():
        return TensorDictReplayBuffer(storage=LazyTensorStorage(
            10, checkpointer=H5StorageCheckpointer()))

    rb = make()
    rb.extend(TensorDict({k: torch.full((4,), v) for k, v in keys.items()}, [4]))
    rb.dumps(tmp_path)
    restored = make()
    restored.loads(tmp_path)
    for key, value in keys.items():
        assert restored[:][key].tolist() == [value] * 4, key


def test_two_entries_of_one_hdf5_name_are_refused_naming_both(tmp_path):
    """``("a", "@b")`` and ``"a@b"`` are both saved as ``a@b`` (a last part starting with
    ``@`` names a compaction part): h5py raised 'name already exists', naming no entry."""
    from tdreplay.core.checkpoint import CheckpointError

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(5, checkpointer=H5StorageCheckpointer()))
    rb.extend(TensorDict({("a", "@b"): torch.zeros(3), "a@b": torch.ones(3)}, [3]))
    with pytest.raises(CheckpointError, match=r"entries .* would both be saved as the HDF5 "
                                              r"dataset 'a@b'"):
        rb.dumps(tmp_path)
