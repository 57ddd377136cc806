"""Changing ``alpha`` rewrites the stored priorities ``(q + eps) ** alpha`` (TorchRL's
``alpha`` setter): sampling follows the new exponent at once, on both tree backends, through a
scheduler too, and a checkpoint keeps what was rewritten."""

from __future__ import annotations

import math

import pytest
import torch

from tdreplay.core import ListStorage, ReplayBuffer
from tdreplay.samplers import LinearScheduler, PrioritizedSampler, StepScheduler

RAW = [1.0, 2.0, 4.0, 0.0]  # priorities of slots 0..3


def _sampler(alpha: float, backend: str, eps: float = 0.0, **kw) -> PrioritizedSampler:
    s = PrioritizedSampler(8, alpha=alpha, beta=1.0, eps=eps, backend=backend, **kw)
    s.extend(torch.arange(4))
    s.update_priority(torch.arange(4), torch.tensor(RAW))
    return s


def _stored(s: PrioritizedSampler) -> list[float]:
    return s.state_dict()["priorities"][:4].tolist()


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_alpha_change_rewrites_stored_priorities(backend: str) -> None:
    s = _sampler(1.0, backend, eps=0.5)
    assert _stored(s) == pytest.approx([1.5, 2.5, 4.5, 0.5])
    s.alpha = 2.0
    assert _stored(s) == pytest.approx([1.5**2, 2.5**2, 4.5**2, 0.5**2])
    assert s.total_priority == pytest.approx(1.5**2 + 2.5**2 + 4.5**2 + 0.5**2)
    assert s.min_priority == pytest.approx(0.25)
    s.alpha = 0.5  # from 2 to 0.5: the priorities themselves are recovered, not compounded
    assert _stored(s) == pytest.approx([math.sqrt(v) for v in (1.5, 2.5, 4.5, 0.5)])
    assert s.max_priority == 4.0  # raw priorities do not depend on alpha
    # an update after the change uses the new exponent, like the rewritten slots
    s.update_priority(torch.tensor([3]), torch.tensor([8.5]))
    assert _stored(s)[3] == pytest.approx(3.0)


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_sampling_follows_the_new_alpha(backend: str) -> None:
    storage = ListStorage(8)
    storage.set(torch.arange(2), ["a", "b"])
    s = PrioritizedSampler(8, alpha=1.0, beta=1.0, eps=0.0, backend=backend)
    s.extend(torch.arange(2))
    s.update_priority(torch.arange(2), torch.tensor([1.0, 3.0]))
    s.set_rng(torch.Generator().manual_seed(0))
    index, info = s.sample(storage, 20_000)
    assert (index == 1).float().mean().item() == pytest.approx(3 / 4, abs=0.02)
    s.alpha = 2.0  # 1 : 9
    index, info = s.sample(storage, 20_000)
    assert (index == 1).float().mean().item() == pytest.approx(9 / 10, abs=0.02)
    weights = dict(zip(index.tolist(), info["priority_weight"].tolist()))
    assert weights[1] == pytest.approx(1 / 9) and weights[0] == pytest.approx(1.0)


def test_new_items_get_the_max_priority_under_the_new_alpha() -> None:
    s = _sampler(1.0, "numba")
    s.alpha = 2.0
    s.extend(torch.tensor([4]))  # max priority 4, stored as 4 ** 2
    assert s.state_dict()["priorities"][4].item() == pytest.approx(16.0)


def test_from_alpha_zero_warns_and_keeps_uniform_values() -> None:
    s = _sampler(0.0, "numba")
    assert _stored(s) == [1.0, 1.0, 1.0, 1.0]
    with pytest.warns(UserWarning, match="cannot be recovered"):
        s.alpha = 1.0
    assert _stored(s) == [1.0, 1.0, 1.0, 1.0] and s.alpha == 1.0
    s.update_priority(torch.tensor([2]), torch.tensor([4.0]))
    assert _stored(s)[2] == pytest.approx(4.0)


def test_unwritten_slots_stay_unwritten_and_same_alpha_changes_nothing() -> None:
    s = _sampler(1.0, "torch")
    before = s.state_dict()
    s.alpha = 1.0
    assert torch.equal(s.state_dict()["priorities"], before["priorities"])
    s.alpha = 3.0
    assert s.state_dict()["priorities"][4:].tolist() == [0.0] * 4


@pytest.mark.parametrize("backend", ["numba", "torch"])
@pytest.mark.parametrize("alphas", [(0.5,), (2.0, 0.25), (0.5, 0.0)])
def test_alpha_change_stores_what_a_fresh_write_would(backend: str, alphas: tuple) -> None:
    # RAW holds a zero priority, stored at the clamp tiny with eps=0: it stays at tiny for
    # every alpha > 0 (and is 0 ** 0 = 1 at alpha 0), not tiny ** (new / old)
    s = _sampler(1.0, backend)
    for alpha in alphas:
        s.alpha = alpha
        fresh = _sampler(alpha, backend)
        assert _stored(s) == pytest.approx(_stored(fresh), rel=1e-12, abs=0.0)
        assert s.min_priority == fresh.min_priority


def test_overflowing_alpha_clamps_to_the_largest_finite_leaf() -> None:
    s = PrioritizedSampler(4, alpha=1.0, beta=1.0, eps=0.0)
    s.extend(torch.arange(2))
    s.update_priority(torch.arange(2), torch.tensor([1e100, 1.0], dtype=torch.float64))
    s.alpha = 4.0  # 1e400 overflows float64
    stored = _stored(s)[:2]
    assert math.isfinite(stored[0]) and stored[1] == 1.0
    assert math.isfinite(s.total_priority)


def test_scheduler_steps_rewrite_the_trees() -> None:
    rb = ReplayBuffer(storage=ListStorage(8),
                      sampler=PrioritizedSampler(8, alpha=1.0, beta=1.0, eps=0.0))
    rb.extend([torch.tensor(float(i)) for i in range(3)])
    rb.update_priority(torch.arange(3), torch.tensor([1.0, 2.0, 4.0]))
    sch = LinearScheduler(rb, "alpha", final_value=2.0, num_steps=2)
    sch.step()  # alpha 1.5
    assert rb.sampler.total_priority == pytest.approx(1 + 2**1.5 + 4**1.5)
    sch.step()  # alpha 2
    assert rb.sampler.total_priority == pytest.approx(1 + 4 + 16)
    StepScheduler(rb, "alpha", gamma=0.5, n_steps=1).step()  # alpha 1
    assert rb.sampler.total_priority == pytest.approx(7.0)


def test_restored_sampler_keeps_the_rewritten_priorities() -> None:
    s = _sampler(1.0, "numba", eps=0.0)
    s.alpha = 2.0
    copy = PrioritizedSampler(8, alpha=1.0, beta=1.0, eps=0.0)
    copy.load_state_dict(s.state_dict())  # loads alpha 2 with its priorities: no rewrite
    assert copy.alpha == 2.0 and _stored(copy) == pytest.approx([1.0, 4.0, 16.0, 1e-300],
                                                                  abs=1e-12)
