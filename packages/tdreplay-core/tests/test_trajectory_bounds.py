"""find_start_stop_traj / position_in_trajectory: ring storages, cursors, lanes, bad input."""

import pytest
import torch

from tdreplay.core import DEFAULT_DONE_KEYS, find_start_stop_traj
from tdreplay.core.trajectory_bounds import position_in_trajectory


def _lists(out):
    start, stop, lengths = out
    return start.tolist(), stop.tolist(), lengths.tolist()


def test_default_done_keys():
    assert DEFAULT_DONE_KEYS == ("done", "truncated", "terminated")


def test_partial_storage_ends_at_last_row_and_input_untouched():
    end = torch.zeros(6, dtype=torch.bool)
    end[2] = True
    assert _lists(find_start_stop_traj(end=end, at_capacity=False)) == (
        [[0], [3]], [[2], [5]], [3, 3])
    assert not end[5]


def test_full_ring_wraps_and_cursor_cuts():
    end = torch.zeros(10, dtype=torch.bool)
    end[2] = end[7] = True
    # without the cursor the run 8, 9, 0, 1, 2 is one trajectory over the wrap point
    assert _lists(find_start_stop_traj(end=end, at_capacity=True)) == (
        [[8], [3]], [[2], [7]], [5, 5])
    for cursor in (4, torch.tensor(4), torch.tensor([1, 4]), range(3, 5)):
        assert _lists(find_start_stop_traj(end=end, at_capacity=True, cursor=cursor)) == (
            [[8], [3], [5]], [[2], [4], [7]], [5, 2, 3])


def test_ids_equal_flags():
    ids = torch.tensor([5, 5, 5, 0, 0, 1, 1, 1, 5, 5])
    assert _lists(find_start_stop_traj(trajectory=ids, at_capacity=True)) == (
        [[8], [3], [5]], [[2], [4], [7]], [5, 2, 3])
    assert _lists(find_start_stop_traj(trajectory=ids, at_capacity=False))[2] == [3, 2, 3, 2]


def test_full_ring_without_any_end_is_one_trajectory():
    assert _lists(find_start_stop_traj(end=torch.zeros(4, dtype=torch.bool),
                                       at_capacity=True)) == ([[0]], [[3]], [4])


def test_single_step():
    for at_capacity in (True, False):
        assert _lists(find_start_stop_traj(trajectory=torch.tensor([7]),
                                           at_capacity=at_capacity)) == ([[0]], [[0]], [1])


def test_lanes_time_first():
    ids = torch.tensor([[0, 3], [0, 3], [1, 3], [1, 4], [1, 4]])
    start, stop, lengths = _lists(find_start_stop_traj(trajectory=ids, at_capacity=False))
    assert start == [[0, 0], [2, 0], [0, 1], [3, 1]]
    assert stop == [[1, 0], [4, 0], [2, 1], [4, 1]]
    assert lengths == [2, 3, 3, 2]


def test_bad_input():
    end = torch.zeros(4, dtype=torch.bool)
    with pytest.raises(TypeError, match="Exactly one"):
        find_start_stop_traj(at_capacity=True)
    with pytest.raises(TypeError, match="Exactly one"):
        find_start_stop_traj(trajectory=torch.zeros(4), end=end, at_capacity=True)
    with pytest.raises(RuntimeError, match="empty"):
        find_start_stop_traj(end=torch.zeros(0, dtype=torch.bool), at_capacity=True)
    with pytest.raises(RuntimeError, match="cursor must not be"):
        find_start_stop_traj(end=end, at_capacity=True, cursor=range(0))
    with pytest.raises(RuntimeError, match="cursor must not be"):
        find_start_stop_traj(end=end, at_capacity=True, cursor=torch.tensor([], dtype=torch.long))
    with pytest.raises(RuntimeError, match="cursor"):
        find_start_stop_traj(end=end, at_capacity=True, cursor=1.5)


@pytest.mark.parametrize("at_capacity", ["no", None, 1])
def test_at_capacity_must_be_a_bool(at_capacity):
    # ("no" was taken as true: ring mode, the opposite of what it says)
    with pytest.raises(TypeError, match="at_capacity must be a bool"):
        find_start_stop_traj(end=torch.tensor([False, True, False]), at_capacity=at_capacity)


def test_a_cursor_outside_the_steps_is_an_index_error_as_torchrl():
    end = torch.tensor([False, True, False, False])
    # (cursor=10 on 4 steps was taken as 2)
    for cursor in (4, 10, -5, torch.tensor([0, 7]), range(3, 9)):
        with pytest.raises(IndexError, match="outside the 4 steps"):
            find_start_stop_traj(end=end, at_capacity=True, cursor=cursor)
    # negative cursors index from the end, as TorchRL's end[cursor] = True
    assert _lists(find_start_stop_traj(end=end, at_capacity=True, cursor=-2)) == \
        _lists(find_start_stop_traj(end=end, at_capacity=True, cursor=2))


def test_position_in_trajectory_over_the_wrap_point():
    end = torch.zeros(6, dtype=torch.bool)
    end[1] = True
    start, _, lengths = find_start_stop_traj(end=end, at_capacity=True, cursor=3)
    from_start, to_stop = position_in_trajectory(start, lengths, end.shape)
    # trajectories: 4, 5, 0, 1 (over the wrap point) and 2, 3 (cut at the cursor)
    assert from_start.tolist() == [2, 3, 0, 1, 0, 1]
    assert to_stop.tolist() == [1, 0, 1, 0, 3, 2]
