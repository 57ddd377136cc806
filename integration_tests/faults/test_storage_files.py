"""Faults in what the storages and datasets write: a full disk under the tensor and nested
checkpointers and under a memmap storage's first write; truncated, missing and garbage files
of converted datasets and of their Minari sources.

Full disks are a small tmpfs mounted for the test (root and mount(8) needed; skipped
otherwise). Each refused call must leave what is on disk as it was.
"""

from __future__ import annotations

import errno
import shutil
import warnings

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer
from tdreplay.storages import (
    LazyMemmapStorage,
    LazyTensorStorage,
    NestedStorageCheckpointer,
    TensorStorageCheckpointer,
)

SIZE = 1024 * 1024




def rows(n: int, width: int = 4) -> TensorDict:
    i = torch.arange(n)
    return TensorDict({"obs": i.float().unsqueeze(-1).expand(n, width).clone(), "i": i,
                       ("next", "obs"): i.double().unsqueeze(-1).expand(n, width).clone()}, [n])


def _save(rb, path, queue) -> None:
    try:
        rb.dumps(path)
        queue.put("saved")
    except OSError as err:
        queue.put(err.errno)


@pytest.mark.parametrize("checkpointer", [TensorStorageCheckpointer, NestedStorageCheckpointer])
def test_full_disk_under_tensor_checkpointers(small_disk, faults, tally, checkpointer):
    path = small_disk / "ckpt"
    small = ReplayBuffer(storage=LazyTensorStorage(50, checkpointer=checkpointer()))
    small.extend(rows(20))
    small.dumps(path)
    entries = sorted(p.relative_to(path) for p in path.rglob("*"))
    big = ReplayBuffer(storage=LazyTensorStorage(3000, checkpointer=checkpointer()))
    big.extend(rows(3000, width=64))
    ctx = faults.fork_context()
    queue = ctx.Queue()
    for _ in range(2):  # in a child first: a SIGBUS would kill only it
        child = ctx.Process(target=_save, args=(big, path, queue))
        child.start()
        child.join(120)
        tally.injected("full disk during tensor checkpoint")
        assert child.exitcode == 0, f"killed by signal {-child.exitcode}"
        assert queue.get(timeout=5) == errno.ENOSPC
        assert sorted(p.relative_to(path) for p in path.rglob("*")) == entries
    restored = ReplayBuffer(storage=LazyTensorStorage(50, checkpointer=checkpointer()))
    restored.loads(path)
    assert torch.equal(restored.storage[:]["next", "obs"], small.storage[:]["next", "obs"])


def test_full_disk_under_a_memmap_first_write(small_disk, tally):
    scratch = small_disk / "scratch"
    storage = LazyMemmapStorage(20_000, scratch_dir=scratch)
    before = sorted(p.relative_to(scratch) for p in scratch.rglob("*"))
    rb = ReplayBuffer(storage=storage)
    for _ in range(3):
        with pytest.raises(OSError) as err:
            rb.extend(rows(10, width=16))
        tally.injected("full disk during memmap first write")
        assert err.value.errno == errno.ENOSPC
        assert sorted(p.relative_to(scratch) for p in scratch.rglob("*")) == before
        assert not storage.initialized


# ---- converted datasets ---------------------------------------------------------------------
@pytest.fixture
def dataset(tmp_path, monkeypatch):
    """A converted Minari dataset (CartPole, 3 short episodes): (id, root, minari dir)."""
    gym = pytest.importorskip("gymnasium")
    minari = pytest.importorskip("minari")
    from minari.data_collector import EpisodeBuffer

    from tdreplay.datasets import MinariExperienceReplay

    source = tmp_path / "minari"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(source))
    env = gym.make("CartPole-v1", max_episode_steps=8)
    episodes = []
    for seed in range(3):
        obs, _ = env.reset(seed=seed)
        observations, actions, rewards, term, trunc = [obs], [], [], [], []
        done = False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(seed % 2)
            done = terminated or truncated
            observations.append(obs)
            actions.append(seed % 2)
            rewards.append(reward)
            term.append(terminated)
            trunc.append(truncated)
        episodes.append(EpisodeBuffer(id=seed, observations=np.stack(observations),
                                      actions=np.array(actions), rewards=np.array(rewards),
                                      terminations=np.array(term), truncations=np.array(trunc),
                                      infos={}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        minari.create_dataset_from_buffers("cartpole/faults-v0", episodes,
                                           observation_space=env.observation_space,
                                           action_space=env.action_space)
    root = tmp_path / "converted"
    MinariExperienceReplay("cartpole/faults-v0", 4, root=root, load_from_local_minari=True,
                           split_trajs=True)
    return "cartpole/faults-v0", root, source


def _files(path):
    return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def _load(dataset_id, root, **kwargs):
    from tdreplay.datasets import MinariExperienceReplay

    return MinariExperienceReplay(dataset_id, 4, root=root, load_from_local_minari=True,
                                  **kwargs)


def test_damaged_converted_dataset_files(dataset, tally):
    dataset_id, root, _ = dataset
    pristine = _files(root)
    targets = [p for p in sorted(root.rglob("*")) if p.is_file()]
    damages = {
        "truncated": lambda p, b: p.write_bytes(b[: len(b) // 2]),
        "emptied": lambda p, b: p.write_bytes(b""),
        "missing": lambda p, b: p.unlink(),
        "garbage": lambda p, b: p.write_bytes(b"\x00garbage{" * 3),
    }
    refused = 0
    for target in targets:
        if target.suffix not in (".memmap", ".json"):
            continue
        split = "_split" in str(target.relative_to(root))
        for kind, damage in damages.items():
            if target.suffix == ".memmap" and kind == "garbage":
                continue  # a same-size overwrite of raw data is not detectable without sums
            original = target.read_bytes()
            damage(target, original)
            before = _files(root)
            if target.name == "tdreplay-dataset.json" and kind == "missing":
                # no marker: the directory holds no conversion, and says so naming it
                error, named = FileExistsError, str(target.parent)
            else:
                error, named = ValueError, str(target)
            with pytest.raises(error) as err:
                _load(dataset_id, root, download=False, split_trajs=split)
            assert named in str(err.value)
            tally.injected("damaged dataset file")
            refused += 1
            assert _files(root) == before  # nothing zero-extended or rebuilt
            target.write_bytes(original)
    assert refused > 20
    assert _files(root) == pristine
    assert len(_load(dataset_id, root, download=False)) > 0


def test_garbage_minari_source_files(dataset, tally):
    dataset_id, root, source = dataset
    shutil.rmtree(root)
    data_dir = source / dataset_id / "data"
    for name in sorted(p.name for p in data_dir.iterdir()):
        target = data_dir / name
        original = target.read_bytes()
        for garbage in (b"", b"not a dataset file" * 50, original[: len(original) // 3]):
            target.write_bytes(garbage)
            with pytest.raises(ValueError, match=f"{name}' is damaged"):
                _load(dataset_id, root)
            tally.injected("damaged Minari source file")
            assert not root.exists()
        target.write_bytes(original)
