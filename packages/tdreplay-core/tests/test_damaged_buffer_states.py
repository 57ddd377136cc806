"""Damaged buffer-level entries of a ``state_dict`` (generator state, batches drawn ahead) are
refused with a ``ValueError`` naming them, and the buffer stays exactly as it was."""

from __future__ import annotations

import copy

import pytest
import torch

from tdreplay.core import ListStorage, ReplayBuffer
from tdreplay.core.testing import assert_same


def scalars(start: int, stop: int) -> list[torch.Tensor]:
    return [torch.tensor(float(i)) for i in range(start, stop)]


def make(**kwargs) -> ReplayBuffer:
    return ReplayBuffer(storage=ListStorage(16), batch_size=4,
                        generator=torch.Generator().manual_seed(0), **kwargs)


def snapshot(rb: ReplayBuffer) -> tuple:
    return ([x.item() for x in rb[:]], rb.write_count, rb.writer.cursor,
            rb._rng.get_state().clone())


def test_a_none_generator_state_is_refused_and_nothing_loads():
    src = make()
    src.extend(scalars(0, 10))
    state = src.state_dict()
    state["_rng"] = None
    dst = make()
    dst.extend(scalars(100, 103))
    before = snapshot(dst)
    with pytest.raises(ValueError, match=r"state_dict\['_rng'\]"):
        dst.load_state_dict(state)
    assert_same(snapshot(dst), before)


def prefetched_state():
    src = make(prefetch=2)
    src.extend(scalars(0, 10))
    src.sample()
    state = src.state_dict()
    assert len(state["_prefetch_state"]["queue"]) == 2
    return state


@pytest.mark.parametrize("index", [torch.tensor([-3, 0, 1, 2]), torch.tensor([0, 1, 2, 16]),
                                   torch.tensor([10**6] * 4), torch.tensor([0.0, 1.0, 2.0, 3.0])],
                         ids=["negative", "past-capacity", "huge", "float"])
def test_batches_drawn_ahead_with_indices_outside_the_storage_are_refused(index):
    state = prefetched_state()
    state["_prefetch_state"]["queue"][1][1]["index"] = index
    dst = make(prefetch=2)
    dst.extend(scalars(100, 103))
    before = snapshot(dst)
    with pytest.raises(ValueError, match=r"batch 1 has info\['index'\]"):
        dst.load_state_dict(state)
    assert_same(snapshot(dst), before)
    assert dst._prefetcher.queued == 0


def test_batches_drawn_ahead_restore_the_saved_draws():
    state = prefetched_state()
    saved = [info["index"].tolist() for _, info in state["_prefetch_state"]["queue"]]
    dst = make(prefetch=2)
    dst.load_state_dict(copy.deepcopy(state))
    for expected in saved:
        _, info = dst.sample(return_info=True)
        assert info["index"].tolist() == expected
        assert all(0 <= i < 10 for i in expected)
