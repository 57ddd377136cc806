"""Slice samplers and ``PromptGroupSampler`` on a ``ListStorage``: a ``ListStorage`` of
TensorDicts samples exactly as a tensor storage holding the same steps; items that are no
TensorDict (or lack an entry the sampler reads) are refused naming the slot, the entry and the
argument, with TorchRL's error class (``RuntimeError``), leaving sampler and storage as they
were. A restored ``PromptGroupSampler`` (pickle, ``state_dict``, ``dumps``/``loads``) samples as
the saved one would: its group index is derived data, rebuilt from the storage."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, ReplayBuffer, Storage
from tdreplay.samplers import PromptGroupSampler, SliceSampler, SliceSamplerWithoutReplacement
from tdreplay.samplers.slice import StorageItemsError
from tdreplay.storages import LazyStackStorage, LazyTensorStorage


def _same(a: Any, b: Any) -> bool:
    """Deep equality of states (dicts, sequences, tensors, arrays, scalars)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return type(a) is type(b) and a == b


def _items(storage: ListStorage) -> list[Any]:
    return [storage.get(i) for i in range(len(storage))]


def _unchanged(storage: ListStorage, items: list[Any], revision: int) -> bool:
    now = _items(storage)
    return (
        storage.revision == revision
        and len(now) == len(items)
        and all(a is b for a, b in zip(now, items))
    )


def _episodes() -> TensorDict:
    """TorchRL's ``test_slice_sampler_errors`` data: 4 episodes of 30, 25, 15 and 30 steps,
    with the end flags of the first three."""
    episode = torch.tensor([1] * 30 + [2] * 25 + [3] * 15 + [4] * 30, dtype=torch.int)
    steps = torch.cat([torch.arange(30), torch.arange(25), torch.arange(15), torch.arange(30)])
    done = torch.zeros(100, 1, dtype=torch.bool)
    done[torch.tensor([29, 54, 69])] = True
    return TensorDict({"episode": episode, "steps": steps, ("next", "done"): done}, [100])


def _step(**entries: Any) -> TensorDict:
    return TensorDict({k: torch.as_tensor(v) for k, v in entries.items()}, [])


# ---- slice samplers --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make",
    [
        lambda: SliceSampler(num_slices=20),  # trajectories by end flags
        lambda: SliceSampler(num_slices=20, traj_key="episode"),
        lambda: SliceSampler(slice_len=5, strict_length=False, end_key=("next", "done")),
        lambda: SliceSamplerWithoutReplacement(num_slices=10, traj_key="episode"),
    ],
    ids=["end-flags", "traj-key", "not-strict", "without-replacement"],
)
def test_slice_list_storage_of_tensordicts_samples_as_tensor_storage(make: Any) -> None:
    data = _episodes()
    samples = []
    for storage in (ListStorage(100), LazyTensorStorage(100)):
        storage.set(range(100), data)
        sampler = make()
        sampler.set_rng(torch.Generator().manual_seed(0))
        samples.append([sampler.sample(storage, 100) for _ in range(3)])
    for (list_index, list_info), (tensor_index, tensor_info) in zip(*samples):
        assert list_index.dtype == tensor_index.dtype == torch.long
        assert torch.equal(list_index, tensor_index)
        assert _same(list_info, tensor_info)
    index, info = samples[0][0]
    slices = index.view(-1, index.numel() // (10 if index.numel() == 50 else 20))
    assert (data["episode"][slices] == data["episode"][slices[:, :1]]).all()
    assert (data["steps"][slices].diff(dim=1) == 1).all()


def test_slice_list_storage_of_tensordicts_after_wrap_around() -> None:
    steps = [
        TensorDict({"episode": torch.tensor([e] * 6), "step": torch.arange(6)}, [6])
        for e in range(5)
    ]
    buffers = [
        ReplayBuffer(
            storage=storage, batch_size=12, sampler=SliceSampler(slice_len=3, traj_key="episode")
        )
        for storage in (ListStorage(16), LazyTensorStorage(16))
    ]
    for rb in buffers:
        for chunk in steps:  # 30 steps into 16 slots
            rb.extend(chunk)
        rb.sampler.set_rng(torch.Generator().manual_seed(1))
    draws = [[rb.sampler.sample(rb.storage, 12)[0] for _ in range(5)] for rb in buffers]
    for a, b in zip(*draws):
        assert torch.equal(a, b)
        stored = buffers[1].storage[b]
        slices_ep, slices_step = stored["episode"].view(4, 3), stored["step"].view(4, 3)
        assert (slices_ep == slices_ep[:, :1]).all() and (slices_step.diff(dim=1) == 1).all()


@pytest.mark.parametrize(
    "bad, slot, words",
    [
        (7, 30, ["slot 30", "of type int", "not a TensorDict"]),
        ("text", 0, ["trajectory key ('episode')", "holds str data, not TensorDicts"]),
        (_step(steps=3), 45, ["slot 45", "'episode' (traj_key)"]),
    ],
    ids=["int", "str-first", "no-traj-key"],
)
def test_slice_list_storage_unreadable_item_refused_unchanged(
    bad: Any, slot: int, words: list[str]
) -> None:
    items = list(_episodes().unbind(0))
    items[slot] = bad
    storage = ListStorage(100)
    storage.set(range(100), items)
    sampler = SliceSampler(num_slices=20, traj_key="episode")
    state, stored, revision = sampler.state_dict(), _items(storage), storage.revision
    with pytest.raises(RuntimeError) as caught:  # TorchRL's class
        sampler.sample(storage, 100)
    if slot:  # (no TensorDict at slot 0: no entry of the storage tells the trajectories)
        assert isinstance(caught.value, StorageItemsError)
        assert isinstance(caught.value, TypeError)
        assert "Could not get a tensordict out of the storage" in str(caught.value)
    for word in words:
        assert word in str(caught.value)
    assert _same(sampler.state_dict(), state)
    assert _unchanged(storage, stored, revision)
    storage.set(slot, _episodes()[slot])  # repaired: samples again
    index, _ = sampler.sample(storage, 100)
    assert index.shape == (100,) and int(index.max()) < 100


def test_slice_list_storage_item_without_end_key_names_it() -> None:
    items = list(_episodes().exclude("episode").unbind(0))
    items[12] = items[12].exclude(("next", "done"))
    storage = ListStorage(100)
    storage.set(range(100), items)
    sampler = SliceSampler(num_slices=20, end_key=("next", "done"))
    state = sampler.state_dict()
    with pytest.raises(StorageItemsError, match=r"slot 12 .*\('next', 'done'\) \(end_key\)"):
        sampler.sample(storage, 100)
    assert _same(sampler.state_dict(), state)


def test_slice_list_storage_item_without_init_key_names_it() -> None:
    items = [_step(episode=0, is_init=i == 0) for i in range(4)]
    items[2] = _step(episode=0)
    storage = ListStorage(10)
    storage.set(range(4), items)
    sampler = SliceSampler(slice_len=4, traj_key="episode")
    with pytest.raises(StorageItemsError, match=r"slot 2 .*'is_init' \(init_key\)"):
        sampler.sample(storage, 4)
    # with init_key=None the entry is not read: the same items sample
    index, _ = SliceSampler(slice_len=4, traj_key="episode", init_key=None).sample(storage, 4)
    assert index.tolist() == [0, 1, 2, 3]


# ---- PromptGroupSampler ----------------------------------------------------------------------
def _prompts(n: int = 24) -> TensorDict:
    g = torch.Generator().manual_seed(5)
    return TensorDict(
        {"prompt": torch.arange(n) % 4, ("next", "reward"): torch.randn(n, 2, generator=g)}, [n]
    )


_STRATEGIES = ["random", "recency", "reward", "variance"]


@pytest.mark.parametrize("strategy", _STRATEGIES)
def test_prompt_group_list_storage_of_tensordicts_samples_as_tensor_storage(strategy: str) -> None:
    draws = []
    for storage in (ListStorage(32), LazyTensorStorage(32)):
        rb = ReplayBuffer(
            storage=storage,
            batch_size=6,
            sampler=PromptGroupSampler(num_groups=2, group_key="prompt", strategy=strategy),
        )
        rb.extend(_prompts())
        rb.extend(_prompts(12))  # wraps around
        rb.sampler.set_rng(torch.Generator().manual_seed(2))
        draws.append([rb.sampler.sample(rb.storage, 6)[0] for _ in range(4)])
    for a, b in zip(*draws):
        assert a.dtype == torch.long and a.shape == (6,)
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "items, slot, what",
    [
        ([1, 2, 3], 0, "of type int"),
        ([_step(prompt=0), _step(prompt=0), "x"], 2, "of type str"),
    ],
    ids=["ints", "one-str"],
)
def test_prompt_group_plain_list_storage_refused_unchanged(
    items: list[Any], slot: int, what: str
) -> None:
    storage = ListStorage(8)
    storage.set(range(len(items)), items)
    sampler = PromptGroupSampler(num_groups=1, group_key="prompt", strategy="recency")
    sampler.extend(torch.arange(len(items)))
    state, stored, revision = sampler.state_dict(), _items(storage), storage.revision
    with pytest.raises(TypeError, match="Plain ListStorage is not supported") as caught:
        sampler.sample(storage, 2)
    assert f"slot {slot} is {what}" in str(caught.value) and "storage" in str(caught.value)
    assert _same(sampler.state_dict(), state)
    assert _unchanged(storage, stored, revision)


def test_prompt_group_list_storage_item_without_group_key_names_slot() -> None:
    storage = ListStorage(8)
    storage.set(range(4), [_step(prompt=0), _step(prompt=1), _step(other=1), _step(prompt=1)])
    sampler = PromptGroupSampler(num_groups=1, group_key="prompt")
    with pytest.raises(KeyError, match=r"group_key 'prompt'.*slot 2"):
        sampler.sample(storage, 2)
    storage.set(2, _step(prompt=0))  # repaired
    index, _ = sampler.sample(storage, 2)
    assert storage.get(int(index[0]))["prompt"] == storage.get(int(index[1]))["prompt"]


def _restore(sampler: PromptGroupSampler, how: str, tmp_path: Path) -> PromptGroupSampler:
    if how == "pickle":
        return pickle.loads(pickle.dumps(sampler))
    fresh = PromptGroupSampler(num_groups=2, group_key="prompt", strategy=sampler.strategy)
    if how == "state_dict":
        fresh.load_state_dict(sampler.state_dict())
    else:
        sampler.dumps(tmp_path)
        fresh.loads(tmp_path)
    return fresh


@pytest.mark.parametrize("how", ["pickle", "state_dict", "dumps"])
@pytest.mark.parametrize("strategy", _STRATEGIES)
@pytest.mark.parametrize(
    "make_storage",
    [lambda: LazyTensorStorage(32), lambda: ListStorage(32), lambda: LazyStackStorage(32)],
    ids=["tensor", "list", "stack"],
)
def test_prompt_group_restored_samples_as_saved(
    how: str, strategy: str, make_storage: Any, tmp_path: Path
) -> None:
    storage: Storage = make_storage()
    sampler = PromptGroupSampler(num_groups=2, group_key="prompt", strategy=strategy)
    rb = ReplayBuffer(storage=storage, sampler=sampler, batch_size=6)
    rb.extend(_prompts())
    rb.sample()  # the group index is built
    rb.extend(_prompts(12))  # wraps: slots rewritten
    rb.sample()
    restored = _restore(sampler, how, tmp_path)
    draws = []
    for s in (sampler, restored):
        s.set_rng(torch.Generator().manual_seed(3))
        draws.append([s.sample(storage, 6)[0] for _ in range(4)])
    for a, b in zip(*draws):
        assert torch.equal(a, b)
    assert _same(restored.state_dict(), sampler.state_dict())


@pytest.mark.parametrize("how", ["pickle", "state_dict", "dumps"])
def test_prompt_group_restored_reads_the_storage_it_is_given(how: str, tmp_path: Path) -> None:
    """A restored sampler's groups are those of the storage it samples, never of the one the
    saved sampler had indexed (same length, same revision count)."""
    first, second = LazyTensorStorage(8), LazyTensorStorage(8)
    first.set(range(8), TensorDict({"prompt": torch.zeros(8, dtype=torch.long)}, [8]))
    second.set(range(8), TensorDict({"prompt": torch.arange(8) % 2}, [8]))
    sampler = PromptGroupSampler(num_groups=2, group_key="prompt")
    with pytest.warns(UserWarning, match="smaller than the requested"):
        sampler.sample(first, 4)  # one group: completed
    restored = _restore(sampler, how, tmp_path)
    for _ in range(5):
        index, _ = restored.sample(second, 4)
        prompts = second[index]["prompt"].view(2, 2)
        assert (prompts == prompts[:, :1]).all() and prompts[0, 0] != prompts[1, 0]
