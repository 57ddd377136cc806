"""``SliceSampler(fragmented=True)``: slices along ``(traj_key, step_key)`` of interleaved
trajectories; ``init_key`` of the slice samplers."""

from __future__ import annotations

import pickle
import tempfile

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, TensorDictReplayBuffer
from tdreplay.samplers import (
    PrioritizedSliceSampler,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    StreamingSliceSampler,
)
from tdreplay.storages import LazyTensorStorage


def steps(rows: list[tuple[int, int]], key: object = "episode") -> TensorDict:
    """Steps ``(trajectory id, step number)`` in write order, with the stored flags a
    collector writes: ``is_init`` at step 0, ``done`` / ``terminated`` never set."""
    ids = torch.tensor([r[0] for r in rows])
    step = torch.tensor([r[1] for r in rows])
    false = torch.zeros(len(rows), 1, dtype=torch.bool)
    return TensorDict({key: ids, "step_count": step, "is_init": (step == 0).unsqueeze(-1),
                       ("next", "done"): false, ("next", "terminated"): false.clone()},
                      [len(rows)])


def interleaved(collectors: int, length: int, first_id: int = 0) -> list[tuple[int, int]]:
    """``collectors`` trajectories of ``length`` steps written round robin, one step each."""
    return [(first_id + c, t) for t in range(length) for c in range(collectors)]


def make_rb(sampler: SliceSampler, size: int = 100, batch_size: int | None = None,
            seed: int = 0, storage: object = None) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(storage=storage if storage is not None else LazyTensorStorage(size), sampler=sampler,
                                batch_size=batch_size)
    rb.set_rng(torch.Generator().manual_seed(seed))
    return rb


def slices_of(rb: TensorDictReplayBuffer, batch_size: int, slice_len: int, draws: int = 40
              ) -> set[tuple[int, ...]]:
    """The distinct slices (tuples of slots) of ``draws`` batches."""
    seen = set()
    for _ in range(draws):
        index = rb.sample(batch_size)["index"].view(-1, slice_len)
        seen.update(tuple(row) for row in index.tolist())
    return seen


# ---- which slots a slice holds ---------------------------------------------------------------
def test_three_collectors_interleaved_slices_are_whole_trajectories_in_step_order() -> None:
    rb = make_rb(SliceSampler(slice_len=4, traj_key="episode", fragmented=True))
    rb.extend(steps(interleaved(3, 4)))  # slots: A0 B0 C0 A1 B1 C1 ...
    # one slice per trajectory fits: the slots of its 4 steps, in step order
    assert slices_of(rb, 8, 4) == {(0, 3, 6, 9), (1, 4, 7, 10), (2, 5, 8, 11)}


def test_two_collectors_shorter_slices_start_anywhere_in_a_trajectory() -> None:
    rb = make_rb(SliceSampler(slice_len=2, traj_key="episode", fragmented=True))
    rb.extend(steps(interleaved(2, 3, first_id=5)))  # episode 5 at 0, 2, 4; 6 at 1, 3, 5
    assert slices_of(rb, 6, 2) == {(0, 2), (2, 4), (1, 3), (3, 5)}


def test_sample_index_and_values_follow_the_steps() -> None:
    rb = make_rb(SliceSampler(num_slices=2, traj_key="episode", fragmented=True))
    # writes of unequal sizes from two collectors, interleaved irregularly
    rb.extend(steps([(0, 0), (1, 0), (1, 1), (0, 1), (0, 2), (1, 2), (1, 3), (0, 3)]))
    for _ in range(10):
        s = rb.sample(8).reshape(2, 4)
        assert (s["episode"] == s["episode"][:, :1]).all()
        assert s["step_count"].tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]
        stored = rb.storage.get(s["index"].reshape(-1))
        assert torch.equal(stored["step_count"].view(2, 4), s["step_count"])
        expected = {0: [0, 3, 4, 7], 1: [1, 2, 5, 6]}
        assert s["index"].tolist() == [expected[int(e)] for e in s["episode"][:, 0]]


def test_steps_written_out_of_order_are_sampled_in_step_order() -> None:
    rb = make_rb(SliceSampler(slice_len=4, traj_key="episode", fragmented=True))
    rb.extend(steps([(0, 3), (0, 1), (0, 0), (0, 2)]))
    assert rb.sample(4)["index"].tolist() == [2, 1, 3, 0]


def test_collector_traj_ids_are_detected() -> None:
    sampler = SliceSampler(slice_len=3, fragmented=True)
    rb = make_rb(sampler)
    rb.extend(steps(interleaved(2, 3), key=("collector", "traj_ids")))
    assert slices_of(rb, 6, 3) == {(0, 2, 4), (1, 3, 5)}
    assert sampler.traj_key == ("collector", "traj_ids")


# ---- gaps and overwrites ---------------------------------------------------------------------
def test_a_missing_step_splits_a_trajectory_into_runs() -> None:
    rows = [(0, t) for t in (0, 1, 2, 4, 5, 6)] + [(1, t) for t in range(3)]
    rb = make_rb(SliceSampler(slice_len=3, traj_key="episode", fragmented=True))
    rb.extend(steps(rows))
    assert slices_of(rb, 6, 3) == {(0, 1, 2), (3, 4, 5), (6, 7, 8)}  # never across step 3
    longer = SliceSampler(slice_len=4, traj_key="episode", fragmented=True)
    with pytest.raises(RuntimeError, match=r"sufficient length \(length range: 3 - 3 / requ"):
        longer.sample(rb.storage, 4)  # no run of 4 steps


def test_short_runs_give_short_slices_with_truncation_at_their_ends() -> None:
    rows = [(0, 0), (1, 0), (0, 1), (1, 5)]  # runs: episode 0 steps 0-1, 1 step 0, 1 step 5
    sampler = SliceSampler(num_slices=3, traj_key="episode", fragmented=True,
                           strict_length=False)
    storage = LazyTensorStorage(10)
    storage.set(torch.arange(4), steps(rows))
    torch.manual_seed(0)
    for _ in range(20):
        index, info = sampler.sample(storage, 6)
        parts = index.tolist()
        slices, i = [], 0
        truncated = info["next", "truncated"].view(-1).tolist()
        while i < len(parts):  # a slice is [0, 2] (whole run) or [2], [1], [3] (one step)
            length = 2 if parts[i] == 0 else 1
            slices.append(parts[i:i + length])
            assert truncated[i:i + length] == [False] * (length - 1) + [True]
            i += length
        assert len(slices) == 3 and all(s in ([0, 2], [2], [1], [3]) for s in slices)
        assert info["next", "done"].view(-1).tolist() == truncated
        init = info["is_init"].view(-1).tolist()
        starts = [sum(len(s) for s in slices[:j]) for j in range(3)]
        assert init == [k in starts for k in range(len(parts))]


def test_wrap_around_overwrites_drop_the_oldest_steps() -> None:
    sampler = SliceSampler(slice_len=3, traj_key="episode", fragmented=True)
    rb = make_rb(sampler, size=6)
    rb.extend(steps(interleaved(2, 3)))  # episode 0 at 0, 2, 4; episode 1 at 1, 3, 5
    assert slices_of(rb, 3, 3) == {(0, 2, 4), (1, 3, 5)}
    rb.extend(steps([(0, 3), (1, 3)]))  # overwrite slots 0, 1 (steps 0 of both episodes)
    assert slices_of(rb, 3, 3) == {(2, 4, 0), (3, 5, 1)}
    rb.extend(steps([(0, 4)]))  # slot 2: episode 0 steps 2-4 now
    assert slices_of(rb, 3, 3) == {(4, 0, 2), (3, 5, 1)}
    rb.extend(steps([(2, 0)]))  # slot 3: episode 1 step 1 is gone, steps 2-3 are too short
    assert slices_of(rb, 3, 3) == {(4, 0, 2)}


def test_storage_written_behind_the_samplers_back_is_read_again() -> None:
    sampler = SliceSampler(slice_len=2, traj_key="episode", fragmented=True)
    rb = make_rb(sampler, size=4)
    rb.extend(steps([(0, 0), (0, 1), (0, 2), (0, 3)]))
    assert slices_of(rb, 2, 2) == {(0, 1), (1, 2), (2, 3)}
    rb.storage.set(torch.tensor([1]), steps([(0, 7)]))  # not through the buffer
    assert slices_of(rb, 2, 2) == {(2, 3)}  # step 1 is gone: runs 0 | 2-3 | 7


# ---- duplicates and other refusals -----------------------------------------------------------
def test_duplicate_pairs_raise_naming_them_and_heal_once_overwritten() -> None:
    sampler = SliceSampler(slice_len=2, traj_key="episode", fragmented=True)
    rb = make_rb(sampler, size=10)
    rb.extend(steps([(0, 0), (0, 1), (3, 0), (0, 1)]))  # a restarted collector reuses id 0
    with pytest.raises(RuntimeError, match=r"trajectory 0 step 1 twice \(slots 1 and 3"):
        rb.sample(2)
    assert not rb.can_sample(2)
    rb[3] = steps([(0, 2)])[0]  # the duplicate is overwritten by a new step
    assert rb.can_sample(2)
    assert slices_of(rb, 2, 2) == {(0, 1), (1, 3)}


def test_ids_and_steps_must_be_integers_and_steps_non_negative() -> None:
    rb = make_rb(SliceSampler(slice_len=2, traj_key="episode", fragmented=True))
    data = steps(interleaved(1, 4))
    for key, value, error, match in [
        ("episode", data["episode"].float(), TypeError, "traj_key='episode' must hold int"),
        ("step_count", data["step_count"].float(), TypeError, "step_key='step_count' must"),
        ("step_count", data["step_count"] - 2, ValueError, "non-negative.*holds -2"),
    ]:
        bad = data.clone()
        bad[key] = value
        with pytest.raises(error, match=match):
            rb.extend(bad)
        assert len(rb) == 0  # refused before anything is written
    rb.extend(data)
    assert len(rb) == 4


def test_stored_values_refused_at_sampling(ids_stored_unchecked: None) -> None:
    rb = make_rb(SliceSampler(slice_len=2, traj_key="episode", fragmented=True))
    data = steps(interleaved(1, 4))
    data["step_count"] = data["step_count"].double()
    rb.extend(data)
    with pytest.raises(TypeError, match="step_key='step_count' must hold integers"):
        rb.sample(2)


def test_missing_entries_and_layouts_refused_at_sampling() -> None:
    rb = make_rb(SliceSampler(slice_len=2, traj_key="episode", fragmented=True))
    rb.extend(steps(interleaved(1, 4)).exclude("step_count"))
    with pytest.raises(KeyError, match="step_key='step_count'") as err:
        rb.sample(2)
    assert isinstance(err.value, TypeError)  # TorchRL's error type
    rb = make_rb(SliceSampler(slice_len=2, fragmented=True))  # no trajectory key stored
    rb.extend(steps(interleaved(1, 4), key="ids"))
    with pytest.raises(RuntimeError, match="requires a trajectory identifier"):
        rb.sample(2)
    rb = make_rb(SliceSampler(slice_len=2, traj_key="episode", fragmented=True),
                 storage=LazyTensorStorage(8, ndim=2))
    rb.extend(steps(interleaved(2, 2)).reshape(2, 2))
    with pytest.raises(NotImplementedError, match="one-dimensional storages only, got ndim=2"):
        rb.sample(2)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    (dict(step_key=None), ValueError, "step_key must be provided"),
    (dict(ends=torch.zeros(4, dtype=torch.bool)), ValueError, "static ends"),
    (dict(trajectories=torch.zeros(4, dtype=torch.long)), ValueError, "static trajectories"),
    (dict(end_key=("next", "done")), ValueError, "requires a trajectory identifier"),
    (dict(end_keys=[("next", "done")]), RuntimeError, "requires a trajectory identifier"),
    (dict(span=True), NotImplementedError, "span is not supported"),
    (dict(compile=True), NotImplementedError, "compile is not supported"),
    (dict(fragmented="yes"), TypeError, "fragmented must be a bool"),
    (dict(step_key=3), TypeError, "step_key must be a key"),
])
def test_arguments_refused_with_fragmented(kwargs, error, match) -> None:
    args = dict(slice_len=2, fragmented=True)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        SliceSampler(**args)


def test_fragmented_is_only_a_slice_sampler_argument() -> None:
    for make in (lambda: SliceSamplerWithoutReplacement(slice_len=2, fragmented=True),
                 lambda: SliceSampler(slice_len=2, fragmented=True, replacement=False),
                 lambda: PrioritizedSliceSampler(10, 1.0, 1.0, slice_len=2, fragmented=True),
                 lambda: StreamingSliceSampler(slice_len=2, step_key="t")):
        with pytest.raises(TypeError, match="unexpected keyword argument"):
            make()
    plain = SliceSampler(slice_len=2, step_key=None)  # without fragmented, as TorchRL
    assert (plain.fragmented, plain.step_key) == (False, None)
    assert PrioritizedSliceSampler(10, 1.0, 1.0, slice_len=2).step_key == "step_count"


def test_end_flags_play_no_part() -> None:
    rb = make_rb(SliceSampler(slice_len=4, traj_key="episode", end_key=("next", "done"),
                              fragmented=True))
    data = steps(interleaved(2, 4))
    data["next", "done"][4] = True  # mid-trajectory: ignored, as TorchRL
    rb.extend(data)
    assert slices_of(rb, 4, 4) == {(0, 2, 4, 6), (1, 3, 5, 7)}


# ---- output: padding, can_sample, list storages ----------------------------------------------
def test_pad_output_pads_every_batch_as_torchrl() -> None:
    sampler = SliceSampler(slice_len=3, traj_key="episode", fragmented=True,
                           strict_length=False, pad_output=True)
    storage = LazyTensorStorage(10)
    storage.set(torch.arange(5), steps([(0, 0), (1, 0), (0, 1), (0, 2), (1, 1)]))
    torch.manual_seed(1)
    seen = set()
    for _ in range(30):
        index, info = sampler.sample(storage, 6)
        mask = info["collector", "mask"]
        assert index.shape == (6,) and mask.shape == (6,)
        for row, real in zip(index.view(2, 3).tolist(), mask.view(2, 3).tolist()):
            seen.add((tuple(row), tuple(real)))
    assert seen == {((0, 2, 3), (True, True, True)), ((1, 4, 4), (True, True, False))}


def test_can_sample_counts_runs_and_changes_nothing() -> None:
    sampler = SliceSampler(slice_len=3, fragmented=True)
    rb = make_rb(sampler)
    assert not rb.can_sample(3)
    rb.extend(steps([(0, 0), (1, 0), (0, 1), (1, 1)]))
    assert not rb.can_sample(3) and sampler.traj_key == "episode"
    rb.extend(steps([(1, 2)]))
    assert rb.can_sample(3)
    assert SliceSampler(slice_len=3, fragmented=True, strict_length=False).can_sample(
        rb.storage, 3)


def test_list_storage_of_tensordicts() -> None:
    rb = make_rb(SliceSampler(slice_len=2, traj_key="episode", fragmented=True),
                 storage=ListStorage(10))
    rb.extend(steps(interleaved(2, 2)))
    assert slices_of(rb, 2, 2) == {(0, 2), (1, 3)}


# ---- state -------------------------------------------------------------------------------------
def _filled(seed: int = 3) -> TensorDictReplayBuffer:
    rb = make_rb(SliceSampler(num_slices=3, traj_key="episode", fragmented=True,
                              strict_length=False), size=20, seed=seed)
    rb.extend(steps(interleaved(3, 5) + [(0, 6), (1, 5)]))
    return rb


def test_state_dict_round_trip_samples_as_the_saved_sampler() -> None:
    rb = _filled()
    rb.sample(9)  # the runs are built
    saved = rb.sampler
    restored = SliceSampler(num_slices=3, traj_key="episode", fragmented=True,
                            strict_length=False)
    restored.load_state_dict(saved.state_dict())
    for seed in range(3):
        saved.set_rng(torch.Generator().manual_seed(seed))
        restored.set_rng(torch.Generator().manual_seed(seed))
        (a, info_a), (b, info_b) = saved.sample(rb.storage, 9), restored.sample(rb.storage, 9)
        assert torch.equal(a, b) and info_a.keys() == info_b.keys()
        assert all(torch.equal(info_a[k], info_b[k]) for k in info_a)
    # a state loaded into a sampler that read other data: the runs are read again
    rb.extend(steps([(7, 0), (7, 1), (7, 2)]))
    restored.load_state_dict(saved.state_dict())
    ids = {int(e) for _ in range(40) for e in rb.storage.get(
        restored.sample(rb.storage, 9)[0])["episode"]}
    assert ids == {0, 1, 2, 7}


def test_checkpoint_and_pickle_keep_the_configuration() -> None:
    rb = _filled()
    with tempfile.TemporaryDirectory() as d:
        rb.dumps(d)
        other = _filled(seed=3)
        other.extend(steps([(9, 0)]))  # differs until loaded
        other.loads(d)
    assert [other.sample(9)["index"].tolist() for _ in range(3)] == \
        [rb.sample(9)["index"].tolist() for _ in range(3)]
    clone = pickle.loads(pickle.dumps(rb.sampler))
    assert (clone.fragmented, clone.step_key, clone.init_key) == (True, "step_count", "is_init")
    torch.manual_seed(4)
    a = rb.sampler.sample(rb.storage, 9)[0]
    torch.manual_seed(4)
    b = clone.sample(rb.storage, 9)[0]
    assert torch.equal(a, b)
    assert "fragmented=True, step_key='step_count'" in repr(rb.sampler)


# ---- init_key --------------------------------------------------------------------------------
def _plain(cls: type, **kwargs) -> SliceSampler:
    if cls is PrioritizedSliceSampler:
        return cls(100, 1.0, 1.0, slice_len=4, traj_key="episode", **kwargs)
    return cls(slice_len=4, traj_key="episode", **kwargs)


SAMPLERS = [SliceSampler, SliceSamplerWithoutReplacement, PrioritizedSliceSampler,
            StreamingSliceSampler]


def _stored(rows: int = 20) -> TensorDict:
    data = steps([(t // 10, t % 10) for t in range(rows)])
    data["reset"] = torch.zeros(rows, 1, dtype=torch.bool)
    data["reset"][[3, 13]] = True
    return data


@pytest.mark.parametrize("cls", SAMPLERS)
def test_init_key_none_leaves_the_stored_flags(cls: type) -> None:
    sampler = _plain(cls, init_key=None)
    assert sampler.init_key is None
    rb = make_rb(sampler)
    rb.extend(_stored())
    for _ in range(5):
        s = rb.sample(8)
        assert "is_init" in s.keys()
        assert torch.equal(s["is_init"].view(-1), s["step_count"] == 0)  # stored, unmarked


@pytest.mark.parametrize("cls", SAMPLERS)
def test_init_key_marks_slice_starts_or_stored(cls: type) -> None:
    rb = make_rb(_plain(cls, init_key="reset"))
    rb.extend(_stored())
    for _ in range(5):
        s = rb.sample(8)
        starts = torch.tensor([True, False, False, False] * 2)
        stored = rb.storage.get(s["index"])
        assert torch.equal(s["reset"].view(-1), starts | stored["reset"].view(-1))
        assert torch.equal(s["is_init"].view(-1), s["step_count"] == 0)  # not marked


@pytest.mark.parametrize("cls", SAMPLERS)
def test_default_init_key_marks_is_init(cls: type) -> None:
    rb = make_rb(_plain(cls))
    rb.extend(_stored())
    s = rb.sample(8)
    starts = torch.tensor([True, False, False, False] * 2)
    assert torch.equal(s["is_init"].view(-1), starts | (s["step_count"] == 0))


def test_init_key_absent_from_the_data_adds_nothing() -> None:
    rb = make_rb(SliceSampler(slice_len=4, traj_key="episode", init_key="reset"))
    rb.extend(steps([(0, t) for t in range(8)]))
    assert "reset" not in rb.sample(8).keys()


def test_init_key_must_be_a_key() -> None:
    for make in (lambda: SliceSampler(slice_len=2, init_key=3),
                 lambda: SliceSamplerWithoutReplacement(slice_len=2, init_key=3),
                 lambda: PrioritizedSliceSampler(10, 1.0, 1.0, slice_len=2, init_key=3)):
        with pytest.raises(TypeError, match="init_key must be a key"):
            make()
    assert SliceSampler(slice_len=2, init_key=("a", ("b",))).init_key == ("a", "b")


def test_samplers_pickled_before_the_new_arguments_get_their_defaults() -> None:
    rb = make_rb(SliceSampler(slice_len=4, traj_key="episode"))
    rb.extend(_stored())
    old = rb.sampler.__getstate__()
    for name in ("_init_key", "_fragmented", "_step_key", "_fragments"):
        del old[name]
    sampler = object.__new__(SliceSampler)
    sampler.__setstate__(old)
    assert (sampler.init_key, sampler.fragmented, sampler.step_key) == \
        ("is_init", False, "step_count")
    index, info = sampler.sample(rb.storage, 8)
    assert info["is_init"].view(-1)[[0, 4]].all()
