"""``rb.can_sample()`` with the slice samplers answers as TorchRL 0.14.1's (``Sampler.can_sample``
counting slice windows; ``SliceSamplerWithoutReplacement`` inheriting the plain
without-replacement rule), and asking changes nothing in the sampler.

The expected values are literals observed with TorchRL 0.14.1 on the same data (its venv,
``torchrl.data`` samplers and buffers, ``LazyTensorStorage(100)``, ``batch_size=8``), except
where a comment says otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import (
    BatchLargerThanBufferError,
    ListStorage,
    ReplayBuffer,
    Sampler,
    TensorDictReplayBuffer,
)
from tdreplay.samplers import (
    PrioritizedSliceSampler,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    StreamingSliceSampler,
)
from tdreplay.storages import LazyTensorStorage

SAMPLERS: dict[str, Callable[[], Sampler]] = {
    "strict": lambda: SliceSampler(slice_len=4, traj_key="episode"),
    "loose": lambda: SliceSampler(slice_len=4, traj_key="episode", strict_length=False),
    "num_slices": lambda: SliceSampler(num_slices=2, traj_key="episode"),
    "auto_key": lambda: SliceSampler(slice_len=4),
    "end_key": lambda: SliceSampler(slice_len=4, end_key=("next", "done")),
    "swr": lambda: SliceSamplerWithoutReplacement(slice_len=4, traj_key="episode"),
    "swr_drop": lambda: SliceSamplerWithoutReplacement(slice_len=4, traj_key="episode",
                                                       drop_last=True),
    "swr_loose": lambda: SliceSamplerWithoutReplacement(slice_len=4, traj_key="episode",
                                                        strict_length=False),
    "stream": lambda: StreamingSliceSampler(slice_len=4, traj_key="episode"),
    "stream_loose": lambda: StreamingSliceSampler(slice_len=4, traj_key="episode",
                                                  strict_length=False),
    "prioritized": lambda: PrioritizedSliceSampler(100, 0.7, 0.9, slice_len=4,
                                                   traj_key="episode"),
    "prioritized_loose": lambda: PrioritizedSliceSampler(100, 0.7, 0.9, slice_len=4,
                                                         traj_key="episode",
                                                         strict_length=False),
}

# data sets: (trajectory lengths, trajectory-id key or None, whether ("next", "done") is stored)
EMPTY = ((), "episode", False)
SHORT = ((2, 3), "episode", False)
ONE_FITS = ((3, 4), "episode", False)
MIXED = ((2, 3, 6), "episode", False)
LONG = ((12,), "episode", False)
NO_KEYS = ((2, 3), None, False)  # neither a trajectory key nor an end key stored
DONE_SHORT = ((2, 3), None, True)  # end flags only
DONE_LONG = ((5, 6), None, True)
OTHER_KEY = ((5, 6), "other", False)  # ids under a key nobody looks for, no end flags
DATA = [EMPTY, SHORT, ONE_FITS, MIXED, LONG, NO_KEYS, DONE_SHORT, DONE_LONG, OTHER_KEY]

# batch sizes asked: rb.can_sample() (the buffer's 8), then can_sample(4), (8), (12)
F, T = False, True
# TorchRL 0.14.1's answers, one row per DATA entry
STRICT = [(F, F, F, F), (F, F, F, F), (T, T, T, T), (T, T, T, T), (T, T, T, T),
          (F, F, F, F), (F, F, F, F), (T, T, T, T), (F, F, F, F)]
LOOSE = [(F, F, F, F), (T, T, T, T), (T, T, T, T), (T, T, T, T), (T, T, T, T),
         (F, F, F, F), (T, T, T, T), (T, T, T, T), (F, F, F, F)]
NUM_SLICES = [(F, F, F, F), (F, T, F, F), (T, T, T, F), (T, T, T, T), (T, T, T, T),
              (F, F, F, F), (F, T, F, F), (T, T, T, T), (F, F, F, F)]
# TorchRL's SliceSamplerWithoutReplacement.can_sample is SamplerWithoutReplacement's:
# len(storage) >= batch_size with drop_last, else len(storage) > 0 (trajectories not looked at)
SWR = [(F, F, F, F)] + [(T, T, T, T)] * 8
SWR_DROP = [(F, F, F, F), (F, T, F, F), (F, T, F, F), (T, T, T, F), (T, T, T, T),
            (F, T, F, F), (F, T, F, F), (T, T, T, F), (T, T, T, F)]
EXPECTED = {
    "strict": STRICT, "loose": LOOSE, "num_slices": NUM_SLICES, "auto_key": STRICT,
    "swr": SWR, "swr_drop": SWR_DROP, "swr_loose": SWR,
    "stream": STRICT, "stream_loose": LOOSE,
    # not observed: TorchRL's PrioritizedSliceSampler needs its segment-tree extension, which
    # does not load in the peer venv ("SumSegmentTreeFp32 is not available"); by its source it
    # answers as SliceSampler (it inherits SliceSampler._sampleable_count and Sampler.can_sample)
    "prioritized": STRICT, "prioritized_loose": LOOSE,
}


def make_data(lengths: tuple[int, ...], key: str | None, done: bool) -> TensorDict:
    ids = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)]) if lengths \
        else torch.zeros(0, dtype=torch.long)
    td = TensorDict({"obs": torch.arange(ids.numel())}, [ids.numel()])
    if key is not None:
        td[key] = ids
    if done:
        flags = torch.zeros(ids.numel(), 1, dtype=torch.bool)
        flags[torch.tensor(lengths).cumsum(0) - 1] = True
        td["next", "done"] = flags
    return td


def filled(name: str, data: tuple[tuple[int, ...], str | None, bool],
           buffer: type[ReplayBuffer] = TensorDictReplayBuffer) -> ReplayBuffer:
    rb = buffer(storage=LazyTensorStorage(100), sampler=SAMPLERS[name](), batch_size=8)
    if data[0]:
        rb.extend(make_data(*data))
    return rb


def answers(rb: ReplayBuffer) -> tuple[bool, ...]:
    return rb.can_sample(), rb.can_sample(4), rb.can_sample(8), rb.can_sample(12)


def assert_same_state(a: Any, b: Any) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for k in a:
            assert_same_state(a[k], b[k])
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    else:
        assert a == b


@pytest.mark.parametrize("name", list(EXPECTED))
def test_answers_as_torchrl(name: str) -> None:
    got = [answers(filled(name, data)) for data in DATA]
    assert got == EXPECTED[name]


@pytest.mark.parametrize("name", ["strict", "swr_drop", "prioritized"])
def test_plain_replay_buffer(name: str) -> None:
    """``ReplayBuffer`` (not the TensorDict one) asks the sampler the same."""
    got = [answers(filled(name, data, ReplayBuffer)) for data in DATA]
    assert got == EXPECTED[name]


def test_end_key_not_stored_answers_false() -> None:
    # an end_key given alone that the data lacks: TorchRL 0.14.1 answers False (its sample
    # raises "Could not get a tensordict out of the storage"), and tdreplay's sample refuses
    # it (MissingEndKeyError) rather than cutting along the "episode" ids it never named
    got = [answers(filled("end_key", data)) for data in DATA]
    assert got == [STRICT[i] if data[2] else (F, F, F, F) for i, data in enumerate(DATA)]
    rb = filled("end_key", LONG)
    with pytest.raises(RuntimeError, match=r"end_key=\('next', 'done'\)\): the storage has no"):
        rb.sample()


@pytest.mark.parametrize("name", ["strict", "num_slices", "stream", "prioritized"])
def test_batch_size_not_divisible(name: str) -> None:
    # TorchRL: False on an empty storage; else its _adjusted_batch_size raises RuntimeError
    # (tdreplay raises the ValueError its sample raises); num_slices=2 takes 6 (slices of 3)
    assert filled(name, EMPTY).can_sample(6) is False
    rb = filled(name, LONG)
    if name == "num_slices":
        assert rb.can_sample(6) is True
    else:
        with pytest.raises(ValueError, match="divisible"):
            rb.can_sample(6)


@pytest.mark.parametrize("name", ["swr", "swr_drop"])
def test_without_replacement_any_batch_size(name: str) -> None:
    # TorchRL: True (6 is neither checked against slice_len nor more than the 11 steps)
    assert filled(name, DONE_LONG).can_sample(6) is True


def test_without_replacement_drop_last_counts_steps() -> None:
    # TorchRL: (True, True, False) for four trajectories of 2 steps: 8 steps stored, though no
    # slice of 4 fits (as in TorchRL, a sample raises)
    rb = filled("swr_drop", ((2, 2, 2, 2), "episode", False))
    assert (rb.can_sample(), rb.can_sample(4), rb.can_sample(12)) == (T, T, F)
    with pytest.raises(RuntimeError, match="sufficient length"):
        rb.sample()


@pytest.mark.parametrize(("name", "T_", "expected"), [
    # TorchRL: LazyTensorStorage(40, ndim=2), one [2, T] write of two environments
    ("strict", 3, (F, F, F)), ("strict", 5, (T, T, T)), ("loose", 3, (T, T, T)),
    ("swr", 3, (T, T, T)),
    # TorchRL's streaming sampler refuses the write; tdreplay's sample raises: False
    ("stream", 5, (F, F, F)),
])
def test_two_dimensional_storage(name: str, T_: int, expected: tuple[bool, ...]) -> None:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(40, ndim=2), sampler=SAMPLERS[name](),
                                batch_size=8)
    rb.extend(TensorDict({"episode": torch.tensor([[0] * T_, [1] * T_])}, [2, T_]))
    assert (rb.can_sample(), rb.can_sample(4), rb.can_sample(12)) == expected


@pytest.mark.parametrize("name", ["strict", "loose"])
def test_wrapped_buffer(name: str) -> None:
    # TorchRL: True for all four (13 steps of episode 0 written into 10 slots)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), sampler=SAMPLERS[name](),
                                batch_size=8)
    rb.extend(make_data((7,), "episode", False))
    rb.extend(make_data((6,), "episode", False))
    assert answers(rb) == (T, T, T, T)


@pytest.mark.parametrize("name", ["strict", "loose", "stream"])
def test_list_storage(name: str) -> None:
    # TorchRL: False for the slice samplers (they cannot read trajectories out of a list
    # storage; their sample raises) and its streaming sampler refuses the write. tdreplay's
    # slice samplers read list storages, so it answers as for a tensor storage.
    rb = ReplayBuffer(storage=ListStorage(100), sampler=SAMPLERS[name](), batch_size=8)
    rb.extend(make_data((5, 6), "episode", False))
    assert (rb.can_sample(), rb.can_sample(4)) == (T, T)
    assert len(rb.sample()) == 8


def test_strict_length_short_trajectories_then_long_enough() -> None:
    rb = filled("strict", SHORT)
    assert rb.can_sample() is False
    with pytest.raises(RuntimeError):
        rb.sample()
    rb.extend(TensorDict({"episode": torch.full((3,), 1), "obs": torch.zeros(3, dtype=torch.long)},
                         [3]))
    assert rb.can_sample() is True  # trajectory 1 now has 6 steps
    assert rb.sample()["episode"].eq(1).all()


def test_without_batch_size() -> None:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), sampler=SAMPLERS["strict"]())
    rb.extend(make_data(*LONG))
    assert rb.can_sample(4) is True
    with pytest.raises(RuntimeError, match="batch_size not specified"):
        rb.can_sample()


# ---- asking changes nothing ----------------------------------------------------------------
def scenario(name: str, rb: ReplayBuffer) -> list[bool]:
    """Writes and batches, asking can_sample at every stage (pending writes, synced index,
    a rebuild after index assignment)."""
    seen = []
    for lengths in ((2, 3), (6,), (5, 1)):
        rb.extend(make_data(lengths, "episode", False))
        seen.append(rb.can_sample())
        if seen[-1]:
            rb.sample()
            seen.append(rb.can_sample())
    rb[torch.arange(3)] = make_data((3,), "episode", False)  # a rebuild at the next sync
    seen.append(rb.can_sample(4))
    return seen


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_state_dict_unchanged(name: str) -> None:
    rb = filled(name, EMPTY)
    sampler = rb.sampler
    before = sampler.state_dict()
    assert rb.can_sample() is False
    assert_same_state(before, sampler.state_dict())
    for lengths in ((2, 3), (6,), (5, 1)):
        rb.extend(make_data(lengths, "episode", False))  # writes pending in the index
        before = sampler.state_dict()
        answer = rb.can_sample()
        assert_same_state(before, sampler.state_dict())
        # (SliceSamplerWithoutReplacement answers True for the short trajectories, as TorchRL)
        if answer and (max(lengths) >= 4 or not sampler.strict_length):
            try:
                rb.sample()
            except BatchLargerThanBufferError:
                # drop_last=True and fewer trajectories a slice fits in than the batch has
                # slices: refused, never a short batch (TorchRL raises its ValueError too)
                assert name == "swr_drop"
            before = sampler.state_dict()  # the index is synced: asked on it directly
            rb.can_sample(4)
            assert_same_state(before, sampler.state_dict())
    rb[torch.arange(3)] = make_data((3,), "episode", False)
    before = sampler.state_dict()
    rb.can_sample(4)
    assert_same_state(before, sampler.state_dict())


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_draws_unchanged(name: str) -> None:
    """The batches drawn are those drawn without asking (same seed)."""
    def batches(ask: bool) -> list[list[int]]:
        rb = filled(name, EMPTY)
        rb.set_rng(torch.Generator().manual_seed(0))  # (the prioritized draws need it)
        out = []
        for lengths in ((4, 5), (6,), (5, 4)):
            rb.extend(make_data(lengths, "episode", name == "end_key"))
            if ask:
                assert rb.can_sample() and rb.can_sample(4)
            out.append(rb.sample()["obs"].tolist())
            if ask:
                rb.can_sample(12)
        return out

    assert batches(True) == batches(False)


def test_scenario_answers() -> None:
    # (not observed with TorchRL: what the data sets above give, asked along the writes)
    assert scenario("strict", filled("strict", EMPTY)) == [F, T, T, T, T, T]
    assert scenario("loose", filled("loose", EMPTY)) == [T, T, T, T, T, T, T]


def test_failed_index_build_leaves_sampler_as_it_was(ids_stored_unchecked: None) -> None:
    # trajectory ids that are not whole numbers: the index cannot be built (sample raises)
    sampler = SliceSampler(slice_len=2, traj_key="episode")
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20), sampler=sampler, batch_size=4)
    rb.extend(TensorDict({"episode": torch.tensor([0.0, 0.0, 0.0, 0.0])}, [4]))
    rb.sample()
    rb.extend(TensorDict({"episode": torch.tensor([0.5, 0.5, 0.5])}, [3]))
    before, key, signals = sampler.state_dict(), sampler.traj_key, sampler._signals
    assert rb.can_sample() is False
    assert_same_state(before, sampler.state_dict())
    assert (sampler.traj_key, sampler._signals) == (key, signals)
    with pytest.raises(ValueError):
        rb.sample()
    assert_same_state(before, sampler.state_dict())


def test_auto_key_not_adopted() -> None:
    """The trajectory key found while asking is not kept (the next sample finds it)."""
    sampler = SliceSampler(slice_len=2)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20), sampler=sampler, batch_size=4)
    rb.extend(TensorDict({("collector", "traj_ids"): torch.zeros(4, dtype=torch.long)}, [4]))
    key = sampler.traj_key
    assert rb.can_sample() is True
    assert sampler.traj_key == key
    rb.sample()
    assert sampler.traj_key == ("collector", "traj_ids")
