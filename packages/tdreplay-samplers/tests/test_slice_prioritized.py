"""PrioritizedSliceSampler: start distribution, boundaries, weights, fallback, checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.samplers import PrioritizedSliceSampler
from tdreplay.storages import LazyTensorStorage


def episodes(lengths: list[int], start_id: int = 0) -> TensorDict:
    ids = torch.cat([torch.full((n,), start_id + i) for i, n in enumerate(lengths)])
    step = torch.cat([torch.arange(n) for n in lengths])
    return TensorDict({"episode": ids, "step": step}, [len(ids)])


def make(size: int = 100, seed: int = 0, ndim: int = 1, **kwargs) -> TensorDictReplayBuffer:
    kwargs.setdefault("traj_key", "episode")
    sampler = PrioritizedSliceSampler(size, alpha=1.0, beta=0.5, **kwargs)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(size, ndim=ndim), sampler=sampler)
    rb.set_rng(torch.Generator().manual_seed(seed))
    return rb


def test_starts_follow_priorities_among_valid_starts() -> None:
    rb = make(slice_len=4)
    rb.extend(episodes([10]))
    priority = torch.arange(1, 11, dtype=torch.float64)
    rb.update_priority(torch.arange(10), priority)
    starts = torch.cat([rb.sample(400)["step"][::4] for _ in range(25)])
    assert starts.max() <= 6  # steps 7-9 cannot start 4 steps
    freq = torch.bincount(starts, minlength=7).double() / starts.numel()
    expected = priority[:7] / priority[:7].sum()
    assert (freq - expected).abs().max() < 0.02


def test_weights_and_generations() -> None:
    rb = make(slice_len=2)
    rb.extend(episodes([5, 5]))
    priority = torch.tensor([1., 2., 4., 8., 16., 1., 1., 1., 1., 1.])
    rb.update_priority(torch.arange(10), priority)
    batch = rb.sample(20)
    start = batch["index"].view(10, 2)[:, 0]
    expected = (priority[start] / priority.min()) ** -0.5
    assert torch.allclose(batch["priority_weight"].view(10, 2),
                          expected[:, None].expand(10, 2).float(), rtol=1e-5)
    gens = rb.sampler.slot_generation(batch["index"])
    assert (batch["write_generation"] == gens).all()


def test_mass_on_trajectory_ends_uses_the_masked_fallback() -> None:
    rb = make(slice_len=3)
    rb.extend(episodes([6, 6, 6]))
    priority = torch.full((18,), 1e-9)
    priority[[4, 5, 10, 11, 16, 17]] = 1e6  # only steps that cannot start a slice
    rb.update_priority(torch.arange(18), priority)
    total = rb.sampler.total_priority
    for _ in range(5):
        batch = rb.sample(30)
        sl = batch.reshape(10, 3)
        assert (sl["episode"] == sl["episode"][:, :1]).all()
        assert (sl["step"].diff(dim=1) == 1).all() and sl["step"][:, 0].max() <= 3
    assert rb.sampler.total_priority == pytest.approx(total)  # masks were restored


def test_no_valid_start() -> None:
    rb = make(slice_len=5)
    rb.extend(episodes([3, 4]))
    with pytest.raises(RuntimeError, match="sufficient length"):
        rb.sample(10)


def test_non_strict_and_right_span() -> None:
    rb = make(slice_len=4, strict_length=False)
    rb.extend(episodes([2, 9]))
    for _ in range(20):
        batch = rb.sample(16)
        ends = batch["next", "truncated"].view(-1).nonzero().squeeze(-1)
        sizes = torch.diff(ends, prepend=torch.tensor([-1]))
        for end, size in zip(ends.tolist(), sizes.tolist()):
            part = batch[end - size + 1: end + 1]
            assert (part["episode"] == part["episode"][0]).all()
            assert size == (2 if part["episode"][0] == 0 else 4)
            assert part["step"][0] == 0 or part["episode"][0] == 1
    rb = make(slice_len=4, span=(False, True))
    rb.extend(episodes([6]))
    sizes = set()
    for _ in range(30):
        batch = rb.sample(4)
        sizes.add(batch.shape[0])
        assert (batch["step"].diff() == 1).all()
    assert sizes == {1, 2, 3, 4}
    with pytest.warns(UserWarning, match="no left span"):  # as TorchRL: left span turned off
        sampler = PrioritizedSliceSampler(10, 1.0, 1.0, slice_len=2, span=True)
    assert sampler.span == (False, True)
    with pytest.warns(UserWarning, match="no left span"):
        assert PrioritizedSliceSampler(10, 1.0, 1.0, slice_len=5, span=3).span == (False, 3)


@pytest.mark.parametrize("span, strict", [((False, True), True), ((False, True), False),
                                          ((False, 1), False)])
def test_right_span_never_cuts_an_empty_slice(span, strict) -> None:
    # as SliceSampler's span (test_differential_slices): a slice hangs over by at most all but
    # one of its steps, also when the priority mass sits on the trajectories' last steps and a
    # trajectory is shorter than the slice (its overhang is capped by its length)
    rb = make(size=10, slice_len=2, span=span, strict_length=strict)
    rb.extend(episodes([4, 1]))
    rb.update_priority(torch.arange(5), torch.tensor([1e-6, 1e-6, 1e-6, 1.0, 1.0]))
    starts = set()
    for _ in range(30):
        batch = rb.sample(4)
        ends = batch["next", "truncated"].view(-1).nonzero().squeeze(-1)
        assert ends.numel() == 2 and int(ends[-1]) == batch.numel() - 1  # 2 slices, none empty
        for first, last in zip([0, int(ends[0]) + 1], ends.tolist()):
            part = batch[first: last + 1]
            assert part.numel() >= 1 and (part["episode"] == part["episode"][0]).all()
            starts.add(int(part["index"][0]))
    assert {3, 4} <= starts  # the last steps start (one-step) slices


def test_new_steps_get_max_priority_and_updates_work_per_step() -> None:
    rb = make(slice_len=2, size=20)
    rb.extend(episodes([4, 4]))
    rb.update_priority(torch.arange(8), torch.full((8,), 1e-6))
    rb.update_priority(torch.tensor([2]), torch.tensor([50.0]))
    rb.extend(episodes([4], start_id=2))  # gets priority 50 (the max so far)
    counts = torch.zeros(3)
    for _ in range(20):
        counts += torch.bincount(rb.sample(20)["episode"][::2], minlength=3)
    assert counts[0] > 0.2 * counts.sum() and counts[2] > 0.5 * counts.sum()
    assert counts[1] < 0.01 * counts.sum()


def test_multi_dim_storage() -> None:
    rb = make(slice_len=4, size=60, ndim=2, traj_key="ep")
    for w in range(3):
        t = (torch.arange(5) + 5 * w).expand(3, 5)
        rb.extend(TensorDict({"ep": torch.arange(3)[:, None].expand(3, 5), "t": t}, [3, 5]))
    for _ in range(20):
        sl = rb.sample(12).reshape(3, 4)
        assert (sl["ep"] == sl["ep"][:, :1]).all() and (sl["t"].diff(dim=1) == 1).all()


def test_state_dict_roundtrip() -> None:
    rb = make(slice_len=3, size=30)
    for i in range(5):
        rb.extend(episodes([4, 5, 3], start_id=3 * i))
        rb.update_priority(torch.arange(len(rb)), torch.rand(len(rb)) + 0.1)
        rb.sample(9)
    restored = make(slice_len=3, size=30)
    restored.load_state_dict(rb.state_dict())
    rb.set_rng(torch.Generator().manual_seed(4))
    restored.set_rng(torch.Generator().manual_seed(4))
    for _ in range(3):
        a, b = rb.sample(9), restored.sample(9)
        assert (a["index"] == b["index"]).all()
        assert torch.equal(a["priority_weight"], b["priority_weight"])
    with pytest.raises(ValueError, match="'index'"):
        restored.sampler.load_state_dict({k: v for k, v in rb.sampler.state_dict().items()
                                          if k != "index"})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(1, 12), min_size=1, max_size=12),
       size=st.integers(5, 40), seq_len=st.integers(1, 4), seed=st.integers(0, 1000))
def test_property_slices_inside_trajectories(lengths: list[int], size: int, seq_len: int,
                                             seed: int) -> None:
    """Wrapped buffers, random priorities: slices stay inside one stored trajectory."""
    rb = make(size=size, seed=seed, slice_len=seq_len, strict_length=False)
    rng = np.random.default_rng(seed)
    rb.extend(episodes(lengths))
    rb.extend(episodes(lengths, start_id=100))
    n = len(rb)
    rb.update_priority(torch.arange(n), torch.from_numpy(rng.random(n) ** 4))
    batch = rb.sample(3 * seq_len)
    ends = batch["next", "truncated"].view(-1).nonzero().squeeze(-1).tolist()
    assert ends[-1] == batch.shape[0] - 1
    begin = 0
    for end in ends:
        part = batch[begin: end + 1]
        assert (part["episode"] == part["episode"][0]).all()
        assert (part["step"].diff() == 1).all()
        begin = end + 1
