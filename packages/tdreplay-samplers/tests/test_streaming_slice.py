"""``StreamingSliceSampler``: fixed-length windows of the stream, queued as they complete and
served first (each once, dropped once overwritten), then uniform slices; its arguments, its
storage checks, and its whole state through every restore."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

import tdreplay.samplers
from tdreplay.core import TensorDictReplayBuffer, testing
from tdreplay.samplers import SliceSampler, StreamingSliceSampler
from tdreplay.samplers.streaming_slice import WindowLengthError
from tdreplay.storages import LazyTensorStorage

L = 3  # slice_len of most tests


def _buffer(capacity=32, seed=0, transform=None, **kwargs):
    kwargs.setdefault("slice_len", L)
    return TensorDictReplayBuffer(storage=LazyTensorStorage(capacity),
                                  sampler=StreamingSliceSampler(**kwargs), transform=transform,
                                  generator=torch.Generator().manual_seed(seed))


def _steps(first, count, done_at=(), episode=None, is_init=None):
    """Steps ``first...`` (``value`` is the step number); ``done_at``: steps ending a
    trajectory (absolute step numbers)."""
    value = torch.arange(first, first + count)
    done = torch.tensor([v in done_at for v in value.tolist()]).view(-1, 1)
    td = TensorDict({"value": value, ("next", "done"): done}, [count])
    if episode is not None:
        td["episode"] = torch.as_tensor(episode)
    if is_init is not None:
        td["is_init"] = torch.as_tensor(is_init).view(-1, 1)
    return td


def _windows(sample, n):
    """The first ``n`` slices of a sample, as lists of step numbers."""
    return sample["value"][: n * L].view(n, L).tolist()


def test_torchrl_docstring_example():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(16),
                                sampler=StreamingSliceSampler(slice_len=3), batch_size=6)
    done = torch.zeros(6, 1, dtype=torch.bool)
    rb.extend(TensorDict({"value": torch.arange(6), ("next", "done"): done}, batch_size=[6]))
    sample = rb.sample()
    assert sample["value"].reshape(2, 3).tolist() == [[0, 1, 2], [3, 4, 5]]
    assert sample["index"].tolist() == list(range(6))
    assert sample["next", "truncated"].view(2, 3).tolist() == [[False, False, True]] * 2


def test_exported():
    assert "StreamingSliceSampler" in tdreplay.samplers.__all__
    assert isinstance(StreamingSliceSampler(slice_len=2), SliceSampler)


def test_windows_stop_at_done_flags():
    rb = _buffer()
    rb.extend(_steps(0, 12, done_at=(4,)))  # trajectories 0-4 and 5-11 (still going)
    # 0-4: one window, the last two steps are left over; 5-11: two windows, step 11 waits
    assert _windows(rb.sample(9), 3) == [[0, 1, 2], [5, 6, 7], [8, 9, 10]]
    rb.extend(_steps(12, 2))  # completes the window step 11 started
    assert _windows(rb.sample(3), 1) == [[11, 12, 13]]


def test_windows_stop_at_trajectory_ids_and_is_init():
    rb = _buffer(traj_key="episode")
    episode = [0] * 4 + [1] * 5
    is_init = [False] * 9
    is_init[6] = True  # a reset inside episode 1: steps 6-8 start anew
    rb.extend(_steps(0, 9, episode=episode, is_init=is_init))
    # 0-3 -> [0,1,2]; 4-5 (cut by is_init) -> nothing; 6-8 -> [6,7,8]
    assert _windows(rb.sample(6), 2) == [[0, 1, 2], [6, 7, 8]]


def test_unfinished_window_is_dropped_at_a_new_trajectory():
    rb = _buffer(traj_key="episode")
    rb.extend(_steps(0, 4, episode=[0] * 4))  # [0,1,2] and step 3 pending
    rb.extend(_steps(4, 3, episode=[1] * 3))  # a new id: step 3 never makes a window
    assert _windows(rb.sample(6), 2) == [[0, 1, 2], [4, 5, 6]]


def test_each_window_is_served_once_then_uniform_slices():
    rb = _buffer()
    rb.extend(_steps(0, 7, done_at=(6,)))
    first = rb.sample(3 * L)
    assert _windows(first, 2) == [[0, 1, 2], [3, 4, 5]]
    # the third slice is uniform: consecutive steps of the trajectory 0-6
    starts = {first["value"][2 * L].item()}
    assert first["value"][2 * L:].tolist() == [s + i for s in starts for i in range(L)]
    for _ in range(40):  # then uniform slices only: every start of the trajectory
        steps = rb.sample(L)["value"].tolist()
        assert steps == [steps[0] + i for i in range(L)]
        starts.add(steps[0])
    assert starts == set(range(5))


def test_overwritten_windows_are_dropped():
    rb = _buffer(capacity=9)
    rb.extend(_steps(0, 9))  # windows at slots 0-2, 3-5, 6-8
    rb[4] = _steps(100, 1)[0]  # index assignment overwrites slot 4
    sample = rb.sample(2 * L)
    assert sample["index"].view(2, L).tolist() == [[0, 1, 2], [6, 7, 8]]


def test_windows_of_the_ring_keep_the_newest():
    rb = _buffer(capacity=6)
    rb.extend(_steps(0, 6))  # windows at slots 0-2 and 3-5
    rb.extend(_steps(6, 3))  # overwrites slots 0-2 with a new window (steps 6-8)
    sample = rb.sample(2 * L)
    assert sample["index"].view(2, L).tolist() == [[3, 4, 5], [0, 1, 2]]
    assert _windows(sample, 2) == [[3, 4, 5], [6, 7, 8]]


def test_more_written_than_the_buffer_holds_between_samples():
    rb = _buffer(capacity=6)
    rb.extend(_steps(0, 4))
    rb.extend(_steps(4, 10))  # slots 4,5,0,...,5,0,1: steps 4-7 were overwritten
    rb.extend(_steps(14, 1))
    # as TorchRL: the write keeps its last 6 steps (8-13), cut into [8,9,10] (step 8 since
    # overwritten by step 14: dropped) and [11,12,13]; step 14 waits for two more steps
    assert _windows(rb.sample(L), 1) == [[11, 12, 13]]
    assert rb.sampler.state_dict()["pending_indices"].tolist() == [2]


def test_init_key_marks_window_starts():
    is_init = [True] + [False] * 5
    rb = _buffer()
    rb.extend(_steps(0, 6, is_init=is_init))
    marks = rb.sample(2 * L)["is_init"].view(2, L).tolist()
    assert marks == [[True, False, False]] * 2
    rb = _buffer(init_key=None)
    rb.extend(_steps(0, 6, is_init=is_init))
    assert rb.sample(2 * L)["is_init"].view(-1).tolist() == is_init  # stored flags untouched


def test_pad_output_masks_every_step_of_windows():
    rb = _buffer(strict_length=False, pad_output=True)
    rb.extend(_steps(0, 6, done_at=(5,)))
    info = rb.sample(2 * L, return_info=True)[1]
    assert info[("collector", "mask")].tolist() == [True] * 6


def test_failed_sample_gives_the_windows_back():
    rb = _buffer(transform=testing.FailOnce(at=0))
    rb.extend(_steps(0, 6))
    with pytest.raises(RuntimeError, match="FailOnce"):
        rb.sample(2 * L)
    assert _windows(rb.sample(2 * L), 2) == [[0, 1, 2], [3, 4, 5]]


def test_empty_forgets_the_stream():
    rb = _buffer()
    rb.extend(_steps(0, 5))  # [0,1,2], step 3-4 pending
    rb.empty()
    rb.extend(_steps(10, 4))
    assert _windows(rb.sample(L), 1) == [[10, 11, 12]]
    assert rb.sampler.state_dict()["pending_indices"].tolist() == [3]


@pytest.mark.parametrize("how", testing.RESTORES)
def test_restore_keeps_queue_pending_window_and_unread_writes(how):
    rb = _buffer(capacity=12, seed=3)
    rb.extend(_steps(0, 7))
    rb.sample(L)  # serves [0,1,2]; [3,4,5] stays queued, step 6 pending
    rb.extend(_steps(7, 4, done_at=(10,)))  # not cut yet: [6,7,8] and a done at 10
    copy = testing.restored(rb, lambda: _buffer(capacity=12), how)
    testing.assert_same(copy.sampler.state_dict(), rb.sampler.state_dict(), "sampler state")
    for buffer in (rb, copy):
        buffer.sampler.generator.manual_seed(5)
    for _ in range(3):
        got, want = copy.sample(3 * L), rb.sample(3 * L)
        assert got["index"].tolist() == want["index"].tolist()
    testing.assert_same(copy.sampler.state_dict(), rb.sampler.state_dict(), "sampler state")


def test_restored_windows_are_served_in_order():
    rb = _buffer(capacity=12)
    rb.extend(_steps(0, 7))
    rb.sample(L)
    rb.extend(_steps(7, 4, done_at=(10,)))
    new = _buffer(capacity=12)
    new.load_state_dict(rb.state_dict())
    assert _windows(new.sample(2 * L), 2) == [[3, 4, 5], [6, 7, 8]]


def test_state_of_another_slice_len_is_refused():
    state = _buffer(slice_len=2).sampler.state_dict()
    sampler = StreamingSliceSampler(slice_len=3)
    before = sampler.state_dict()
    with pytest.raises(WindowLengthError, match="slice_len=2.*slice_len=3"):
        sampler.load_state_dict(state)
    assert issubclass(WindowLengthError, ValueError) and issubclass(WindowLengthError,
                                                                    RuntimeError)
    testing.assert_same(sampler.state_dict(), before, "sampler state")


def test_damaged_state_is_refused_and_changes_nothing():
    rb = _buffer()
    rb.extend(_steps(0, 6))
    rb.sample(L)  # one window left in the queue
    state = rb.sampler.state_dict()
    fresh = _buffer()
    before = fresh.sampler.state_dict()
    bad = dict(state, queued_indices=torch.full((1, L), 99))
    with pytest.raises(ValueError, match="names slots it holds no write count of"):
        fresh.sampler.load_state_dict(bad)
    bad = dict(state, unread_sizes=torch.tensor([7]))
    with pytest.raises(ValueError, match="windows of 3 steps"):
        fresh.sampler.load_state_dict(bad)
    bad = dict(state, last_was_done=torch.tensor(1))
    with pytest.raises(ValueError, match="'last_was_done' must be a bool tensor"):
        fresh.sampler.load_state_dict(bad)
    testing.assert_same(fresh.sampler.state_dict(), before, "sampler state")


ARGUMENTS = {
    "zero": (dict(slice_len=0), ValueError, "slice_len must be >= 1, got 0"),
    "float": (dict(slice_len=2.0), TypeError, r"slice_len must be an int, got float \(2.0\)"),
    "bool": (dict(slice_len=True), TypeError, r"slice_len must be an int, got bool \(True\)"),
    "init_key": (dict(slice_len=2, init_key=3), TypeError, "init_key must be a key"),
    "pad_strict": (dict(slice_len=2, pad_output=True), ValueError, "pad_output=True"),
    "num_slices": (dict(slice_len=2, num_slices=2), TypeError, "num_slices"),
}


@pytest.mark.parametrize("kwargs, error, message", ARGUMENTS.values(), ids=ARGUMENTS.keys())
def test_bad_arguments_are_refused(kwargs, error, message):
    with pytest.raises(error, match=message):
        StreamingSliceSampler(**kwargs)


def test_storage_checks():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(2),
                                sampler=StreamingSliceSampler(slice_len=3, strict_length=False))
    rb.extend(_steps(0, 2))
    with pytest.raises(ValueError, match="holds 2 steps, fewer than one slice_len=3 window"):
        rb.sample(3)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8, ndim=2),
                                sampler=StreamingSliceSampler(slice_len=2))
    rb.extend(TensorDict({("next", "done"): torch.zeros(2, 4, 1, dtype=torch.bool)}, [2, 4]))
    with pytest.raises(RuntimeError, match="requires a one-dimensional storage, got ndim=2"):
        rb.sample(2)
    with pytest.raises(ValueError, match="not divisible by slice_len=3"):
        _buffer().sample(4)


def test_trajectory_key_is_an_alias_of_traj_key_as_on_the_other_slice_samplers():
    assert StreamingSliceSampler(slice_len=2, trajectory_key="episode").traj_key == "episode"
    with pytest.raises(ValueError, match="aliases of one argument"):
        StreamingSliceSampler(slice_len=2, trajectory_key="episode", traj_key="other")
