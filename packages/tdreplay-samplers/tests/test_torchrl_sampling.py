"""Samplers that behave as TorchRL's (issue 16): ``drop_last=True`` needs a buffer batch size,
``RandomSampler(replacement=False)``, prioritized samplers on unwritten slots and small
capacities, ``SliceSampler(pad_output=)``, ``is_init`` marking and ``span``."""

from __future__ import annotations

import pytest
import torch

from tdreplay.core import ListStorage, ReplayBuffer, TensorDictReplayBuffer
from tdreplay.samplers import SamplerWithoutReplacement, SliceSamplerWithoutReplacement
from tdreplay.storages import LazyTensorStorage

DROP_LAST = "Samplers with drop_last=True must work with a predictable batch-size"


# ---- drop_last=True needs the buffer's batch size ------------------------------------------------
@pytest.mark.parametrize("drop_last", [True, False])
def test_requires_batch_size_follows_drop_last(drop_last: bool) -> None:
    assert SamplerWithoutReplacement(drop_last=drop_last).requires_batch_size is drop_last
    assert SliceSamplerWithoutReplacement(num_slices=2, drop_last=drop_last,
                                          traj_key="e").requires_batch_size is drop_last


def test_drop_last_without_batch_size_is_refused() -> None:
    with pytest.raises(ValueError, match=DROP_LAST):
        ReplayBuffer(storage=ListStorage(10), sampler=SamplerWithoutReplacement(drop_last=True))
    with pytest.raises(ValueError, match=DROP_LAST):
        TensorDictReplayBuffer(storage=LazyTensorStorage(10),
                               sampler=SliceSamplerWithoutReplacement(num_slices=2,
                                                                      drop_last=True))
    rb = ReplayBuffer(storage=ListStorage(10))
    with pytest.raises(ValueError, match=DROP_LAST):
        rb.set_sampler(SamplerWithoutReplacement(drop_last=True))
    assert not isinstance(rb.sampler, SamplerWithoutReplacement)


def test_drop_last_with_batch_size_drops_the_incomplete_batch() -> None:
    rb = ReplayBuffer(storage=ListStorage(10), sampler=SamplerWithoutReplacement(drop_last=True),
                      batch_size=3)
    rb.extend(torch.arange(10))
    batches = [b.tolist() for b in rb]
    assert [len(b) for b in batches] == [3, 3, 3]
    assert len(set(sum(batches, []))) == 9
    rb = ReplayBuffer(storage=ListStorage(10), sampler=SamplerWithoutReplacement(drop_last=False))
    rb.extend(torch.arange(10))
    assert sorted(rb.sample(10).tolist()) == list(range(10))


def test_drop_last_sampler_set_on_a_buffer_with_batch_size() -> None:
    rb = ReplayBuffer(storage=ListStorage(10), batch_size=4)
    rb.extend(torch.arange(10))
    rb.set_sampler(SamplerWithoutReplacement(drop_last=True))
    assert [len(b) for b in rb] == [4, 4]


# ---- RandomSampler(replacement=False) ------------------------------------------------------------
def test_random_sampler_replacement_dispatch() -> None:
    from tdreplay.core import RandomSampler, Sampler
    from tdreplay.core import SamplerWithoutReplacement as CoreSWR

    assert SamplerWithoutReplacement is CoreSWR  # one class, served by both packages
    assert type(RandomSampler()) is RandomSampler
    assert type(RandomSampler(replacement=True)) is RandomSampler
    s = RandomSampler(replacement=False)
    assert type(s) is SamplerWithoutReplacement
    assert (s.drop_last, s.shuffle) == (False, True)
    s = RandomSampler(replacement=False, drop_last=True, shuffle=False)
    assert type(s) is SamplerWithoutReplacement and isinstance(s, Sampler)
    assert (s.drop_last, s.shuffle) == (True, False)


def test_random_sampler_replacement_bad_input() -> None:
    from tdreplay.core import RandomSampler

    with pytest.raises(TypeError, match="replacement must be a bool"):
        RandomSampler(replacement="no")
    with pytest.raises(TypeError, match="drop_last"):
        RandomSampler(drop_last=True)  # only the variant without replacement has it

    class Mine(RandomSampler):
        pass

    with pytest.raises(TypeError, match="Mine has no without-replacement variant"):
        Mine(replacement=False)
    assert type(Mine(replacement=True)) is Mine


def test_random_sampler_without_replacement_in_a_buffer_covers_every_item() -> None:
    from tdreplay.core import RandomSampler

    rb = ReplayBuffer(storage=ListStorage(11), sampler=RandomSampler(replacement=False),
                      batch_size=3)
    rb.set_rng(torch.Generator().manual_seed(0))
    rb.extend(torch.arange(11))
    batches = [rb.sample().tolist() for _ in range(4)]
    assert [len(b) for b in batches] == [3, 3, 3, 2]
    assert sorted(sum(batches, [])) == list(range(11))


# ---- PrioritizedSampler: a storage larger than max_capacity, unwritten slots ---------------------
def test_prioritized_sampler_smaller_than_the_storage_grows() -> None:
    from tensordict import TensorDict

    from tdreplay.samplers import PrioritizedSampler

    rb = TensorDictReplayBuffer(sampler=PrioritizedSampler(5, alpha=1.0, beta=1.0, eps=0.0),
                                batch_size=5)  # default storage: ListStorage(1000)
    rb.set_rng(torch.Generator().manual_seed(0))
    rb.extend(TensorDict({"a": torch.arange(3), "td_error": torch.ones(3)}, [3]))
    rb.extend(TensorDict({"a": torch.arange(3, 8), "td_error": torch.full((5,), 2.0)}, [5]))
    assert len(rb) == 8 and rb.sampler.max_capacity == 10
    assert rb.sampler.state_dict()["priorities"][:9].tolist() == [1.0] * 3 + [2.0] * 5 + [0.0]
    s = rb.sample(4000)
    assert torch.equal(s["a"], s["index"])  # every drawn slot holds the row written there
    freq = torch.bincount(s["index"], minlength=8).double() / 4000
    assert torch.allclose(freq, torch.tensor([1 / 13] * 3 + [2 / 13] * 5, dtype=torch.float64),
                          atol=0.03)


def test_prioritized_update_of_an_unwritten_slot_is_refused_and_changes_nothing() -> None:
    from tdreplay.samplers import PrioritizedSampler

    sampler = PrioritizedSampler(10, alpha=1.0, beta=1.0)
    sampler.extend(torch.arange(2))
    before = sampler.state_dict()
    with pytest.raises(IndexError, match="unwritten slots \\[5\\].*belong to no item"):
        sampler.update_priority(torch.tensor([0, 5]), torch.tensor([100.0, 100.0]))
    after = sampler.state_dict()
    assert torch.equal(before["priorities"], after["priorities"])
    assert sampler.max_priority == 1.0  # the refused update did not raise the max either


# ---- PrioritizedSliceSampler: span and trajectories shorter than a slice -------------------------
def _trajs(lengths: list[int]):
    from tensordict import TensorDict

    parts = [TensorDict({"traj": torch.full((n,), t), "step": torch.arange(n),
                         "done": torch.arange(n).eq(n - 1).unsqueeze(-1)}, [n])
             for t, n in enumerate(lengths)]
    return torch.cat(parts)


@pytest.mark.parametrize("span", [(False, True), (False, 3), 3, True])
def test_prioritized_slice_short_trajectories_with_a_right_span(span) -> None:
    import warnings

    from tdreplay.samplers import PrioritizedSliceSampler

    data = _trajs([3, 6, 9])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # left span turned off (int / True)
        sampler = PrioritizedSliceSampler(18, 1.0, 1.0, end_key="done", slice_len=5,
                                          strict_length=True, span=span)
    assert sampler.span[0] is False
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(18), sampler=sampler, batch_size=5)
    rb.set_rng(torch.Generator().manual_seed(0))
    rb.extend(data)
    starts_in_0 = set()
    for _ in range(300):
        s = rb.sample()
        assert s["traj"].unique().numel() == 1 and (s["step"].diff() == 1).all()
        if int(s["traj"][0]) == 0:
            starts_in_0.add(int(s["step"][0]))
            assert s.shape[0] == 3 - int(s["step"][0])  # cut at the trajectory's end
    # a slice needs 5 - overhang steps before it may hang over: 1 (True) or 2 (span 3)
    assert starts_in_0 == ({0, 1, 2} if sampler.span[1] is True else {0, 1})


def test_prioritized_slice_strict_without_span_skips_short_trajectories() -> None:
    from tdreplay.samplers import PrioritizedSliceSampler

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(18), batch_size=5,
                                sampler=PrioritizedSliceSampler(18, 1.0, 1.0, end_key="done",
                                                                slice_len=5))
    rb.extend(_trajs([3, 6, 9]))
    trajs = {int(rb.sample()["traj"][0]) for _ in range(100)}
    assert trajs == {1, 2}


# ---- SliceSampler(pad_output=), is_init marks ------------------------------------------------------
def _with_init(lengths: list[int]):
    data = _trajs(lengths)
    data["is_init"] = (data["step"] == 0).unsqueeze(-1)
    data["obs"] = torch.arange(data.shape[0]).float()
    return data


def test_pad_output_pads_short_slices_with_their_last_step_and_masks_them() -> None:
    from tdreplay.samplers import SliceSampler

    with pytest.raises(ValueError, match="pad_output=True is incompatible"):
        SliceSampler(slice_len=4, traj_key="traj", pad_output=True)  # strict_length=True
    sampler = SliceSampler(slice_len=5, traj_key="traj", strict_length=False, pad_output=True)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(11), sampler=sampler, batch_size=15)
    rb.set_rng(torch.Generator().manual_seed(0))
    rb.extend(_with_init([3, 6, 2]))
    for _ in range(20):
        s = rb.sample().reshape(3, 5)
        mask = s["collector", "mask"]
        assert mask.dtype is torch.bool and mask.shape == (3, 5)
        n = mask.sum(-1)
        assert bool((mask == (torch.arange(5) < n[:, None])).all())  # real steps first
        for i in range(3):
            k = int(n[i])
            real = s[i, :k]
            assert (real["traj"] == real["traj"][0]).all() and (real["step"].diff() == 1).all()
            assert (s[i, k:]["index"] == real["index"][-1]).all()  # padding repeats the last
            assert s["next", "truncated"][i].view(-1).nonzero().view(-1).tolist() == [k - 1]
            assert s["is_init"][i, 0].item()  # every slice starts anew


def test_pad_output_without_short_trajectories_pads_nothing() -> None:
    from tdreplay.samplers import SliceSampler

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(16), batch_size=8, sampler=SliceSampler(
        slice_len=4, traj_key="traj", strict_length=False, pad_output=True))
    rb.extend(_with_init([8, 8]))
    s = rb.sample()
    assert ("collector", "mask") not in s.keys(True) and s.shape == (8,)


@pytest.mark.parametrize("prioritized", [False, True])
def test_slice_starts_are_marked_is_init_and_stored_resets_kept(prioritized: bool) -> None:
    from tdreplay.samplers import PrioritizedSliceSampler, SliceSampler

    kw = {"num_slices": 4, "traj_key": "traj", "strict_length": False}
    sampler = PrioritizedSliceSampler(25, 1.0, 1.0, **kw) if prioritized else SliceSampler(**kw)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(25), sampler=sampler, batch_size=24)
    rb.set_rng(torch.Generator().manual_seed(0))
    rb.extend(_with_init([3, 8, 2, 7, 5]))
    for _ in range(10):
        s = rb.sample()
        init = s["is_init"].view(-1)
        truncated = s["next", "truncated"].view(-1)
        starts = torch.cat([torch.tensor([0]), truncated.nonzero().view(-1)[:-1] + 1])
        expected = torch.zeros_like(init)
        expected[starts] = True
        expected |= s["step"] == 0  # the stored resets stay
        assert torch.equal(init, expected)
    stored = rb.storage.get(torch.arange(25))["is_init"].view(-1)
    assert int(stored.sum()) == 5  # the marks are in samples only


def test_no_is_init_in_the_data_no_is_init_in_samples() -> None:
    from tdreplay.samplers import SliceSampler

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(11), batch_size=15, sampler=SliceSampler(
        slice_len=5, traj_key="traj", strict_length=False, pad_output=True))
    rb.extend(_trajs([3, 6, 2]))
    assert "is_init" not in rb.sample().keys()
