"""``TensorDictMaxValueWriter`` behind a buffer writing along ``dim_extend=1`` (an ``ndim=2``
storage's default): the rows offered are the batch's time steps (one step of every
environment each); ``extend`` returns the slots in the batch's ``[B, T]`` layout, ``-1``
where a step was not kept, and the batch's priorities go to the slots kept. Before, ``extend``
returned the kept rows' slots as they came (shape ``[1, 2]`` here) and the priorities were
dropped (the slots kept the max priority)."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer, TensorDictReplayBuffer
from tdreplay.samplers import PrioritizedSampler
from tdreplay.storages import LazyTensorStorage
from tdreplay.writers import TensorDictMaxValueWriter


def _filled(buffer_cls=TensorDictReplayBuffer, **kwargs):
    rb = buffer_cls(storage=LazyTensorStorage(6, ndim=2),  # 3 rows of 2 environments
                    writer=TensorDictMaxValueWriter(rank_key="r"), **kwargs)
    first = rb.extend(TensorDict({"r": torch.zeros(2, 3), "p": torch.ones(2, 3),
                                  "step": torch.arange(3).expand(2, 3)}, [2, 3]))
    assert first.tolist() == [[0, 2, 4], [1, 3, 5]]  # step t of env e at slot 2 t + e
    return rb


def test_extend_returns_the_slots_of_the_kept_steps_in_the_batch_layout():
    rb = _filled(sampler=PrioritizedSampler(6, alpha=1.0, beta=1.0), priority_key="p")
    # step ranks (summed over the 2 environments): 0, 5, -2: only step 1 beats a kept 0
    out = rb.extend(TensorDict({"r": torch.tensor([[0.0, 5.0, -1.0], [0.0, 0.0, -1.0]]),
                                "p": torch.tensor([[100.0, 7.0, 100.0], [100.0, 8.0, 100.0]]),
                                "step": torch.full((2, 3), 10) + torch.arange(3)}, [2, 3]))
    assert out.shape == (2, 3)
    assert out.tolist() == [[-1, 0, -1], [-1, 1, -1]]  # into the lowest row of rank 0: row 0
    assert rb.storage[0]["step"].tolist() == [11, 11]  # (row 0: slots 0 and 1)
    priorities = rb.sampler.state_dict()["priorities"]
    torch.testing.assert_close(priorities[:6].double(),  # (priorities hold eps = 1e-8 more)
                               torch.tensor([7.0, 8.0, 1.0, 1.0, 1.0, 1.0], dtype=torch.float64))


def test_a_plain_buffer_returns_the_batch_layout_too():
    rb = _filled(ReplayBuffer)
    out = rb.extend(TensorDict({"r": torch.tensor([[0.0, 0.0, 3.0], [0.0, 0.0, 3.0]]),
                                "p": torch.zeros(2, 3), "step": torch.zeros(2, 3).long()},
                               [2, 3]))
    assert out.tolist() == [[-1, -1, 0], [-1, -1, 1]]


def test_nothing_kept_is_all_minus_one():
    rb = _filled()
    out = rb.extend(TensorDict({"r": -torch.ones(2, 3), "p": torch.ones(2, 3),
                                "step": torch.zeros(2, 3).long()}, [2, 3]))
    assert out.tolist() == [[-1, -1, -1], [-1, -1, -1]]
    assert rb.storage[:]["step"].tolist() == [[0, 0], [1, 1], [2, 2]]
