"""Nested TensorDicts with batch dims of their own (TorchRL's multi-agent layout: an
``"agents"`` TensorDict of batch size ``[B, n_agents]`` inside a ``[B]`` one) keep them in a
tensor storage: in samples, reads, pickles, state dicts and every checkpointer. They read back
with the parent's batch size only before (``sample["agents"][:, 0]`` then indexed the wrong
dim); TorchRL 0.14.1 keeps them."""

from __future__ import annotations

import pickle

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.storages import (
    FlatStorageCheckpointer,
    H5StorageCheckpointer,
    LazyMemmapStorage,
    LazyTensorStorage,
    NestedStorageCheckpointer,
    TensorStorageCheckpointer,
)

AGENTS, CELLS = 3, 2


def multi_agent(n: int, start: int = 0) -> TensorDict:
    """``n`` steps; each has an ``"agents"`` level of 3 agents, each with a grid of 2 cells."""
    step = torch.arange(start, start + n, dtype=torch.float32)
    obs = step[:, None, None] * 10 + torch.arange(AGENTS, dtype=torch.float32)[:, None]
    cells = obs[..., None].expand(n, AGENTS, 1, CELLS).clone()
    agents = TensorDict({"obs": obs.expand(n, AGENTS, 4).clone(),
                         "grid": TensorDict({"v": cells}, [n, AGENTS, 1, CELLS])},
                        [n, AGENTS])
    return TensorDict({"step": step, "agents": agents}, [n])


def check_levels(td: TensorDict, lead: tuple[int, ...]) -> None:
    assert td.batch_size == lead
    assert td["agents"].batch_size == (*lead, AGENTS)
    assert td["agents", "grid"].batch_size == (*lead, AGENTS, 1, CELLS)


def check_values(td: TensorDict) -> None:
    # agent a of step s observes 10 s + a, in every entry and cell
    expected = td["step"][..., None] * 10 + torch.arange(AGENTS, dtype=torch.float32)
    assert torch.equal(td["agents", "obs"][..., 0], expected)
    assert torch.equal(td["agents", "grid", "v"][..., 0, 1], expected)


STORAGES = {
    "tensor": lambda scratch: LazyTensorStorage(16),
    "memmap": lambda scratch: LazyMemmapStorage(16, scratch_dir=scratch),
}


@pytest.fixture(params=sorted(STORAGES))
def make(request, tmp_path):
    made = iter(range(10))  # a scratch dir for each buffer made

    def buffer() -> TensorDictReplayBuffer:
        storage = STORAGES[request.param](tmp_path / f"scratch{next(made)}")
        return TensorDictReplayBuffer(storage=storage, batch_size=5)

    return buffer


def test_samples_and_reads_keep_the_nested_batch_dims(make):
    rb = make()
    rb.extend(multi_agent(10))
    sample = rb.sample()
    check_levels(sample, (5,))
    check_values(sample)
    assert sample["agents"][:, 0]["obs"].shape == (5, 4)  # agent 0 of every sampled step
    check_levels(rb[:], (10,))
    check_levels(rb.storage[:], (10,))
    item = rb[3]
    assert item["agents"].batch_size == (AGENTS,) and item["step"].item() == 3.0
    check_values(rb[:])


def test_a_pickled_buffer_keeps_the_nested_batch_dims(make):
    rb = make()
    rb.extend(multi_agent(6))
    copy = pickle.loads(pickle.dumps(rb))  # a memmap storage maps its files again
    check_levels(copy[:], (6,))
    copy.extend(multi_agent(2, start=6))
    check_levels(copy[:], (8,))
    check_values(copy[:])


def test_the_state_dict_keeps_the_nested_batch_dims(make):
    rb = make()
    rb.extend(multi_agent(6))
    restored = make()
    restored.load_state_dict(rb.state_dict())
    check_levels(restored[:], (6,))
    check_values(restored[:])


@pytest.mark.parametrize("checkpointer", [TensorStorageCheckpointer, FlatStorageCheckpointer,
                                          NestedStorageCheckpointer, H5StorageCheckpointer])
def test_every_checkpointer_restores_the_nested_batch_dims(checkpointer, tmp_path):
    def buffer() -> TensorDictReplayBuffer:
        return TensorDictReplayBuffer(storage=LazyTensorStorage(16, checkpointer=checkpointer()),
                                      batch_size=5)

    rb = buffer()
    rb.extend(multi_agent(7))
    rb.dumps(tmp_path / "ckpt")
    restored = buffer()  # laid out by the load (a lazy storage never written)
    restored.loads(tmp_path / "ckpt")
    check_levels(restored[:], (7,))
    assert torch.equal(restored[:]["agents", "grid", "v"], rb[:]["agents", "grid", "v"])
    check_levels(restored.sample(), (5,))


def test_a_storage_of_two_dims_keeps_them_after_its_own():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20, ndim=2), batch_size=4)
    rb.extend(multi_agent(10).reshape(2, 5))  # 2 environments, 5 steps each
    check_levels(rb.storage[:], (5, 2))
    check_levels(rb.sample(), (4,))
    check_values(rb.sample())
