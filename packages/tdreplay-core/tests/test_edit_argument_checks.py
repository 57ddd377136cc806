"""Arguments of in-place edits that would change the wrong rows are refused, the buffer
unchanged: a boolean index must cover every written row (as torch's masks do), and
``empty``'s flag must be a bool."""

import pytest
import torch

from tdreplay.core import ListStorage, ReplayBuffer


def filled() -> ReplayBuffer:
    rb = ReplayBuffer(storage=ListStorage(10))
    rb.extend(list(range(6)))
    return rb


@pytest.mark.parametrize("mask", [torch.tensor([False, True]), torch.ones(7, dtype=bool),
                                  torch.ones(2, 3, dtype=bool)])
def test_a_mask_of_another_length_is_refused(mask):
    rb = filled()
    with pytest.raises(IndexError, match="one entry per written row"):
        rb[mask] = [-1] * int(mask.sum())
    assert rb[:] == list(range(6))


def test_a_mask_of_every_row_writes_where_it_is_true():
    rb = filled()
    rb[torch.tensor([False, True, False, False, True, False])] = [-1, -4]
    assert rb[:] == [0, -1, 2, 3, -4, 5]


@pytest.mark.parametrize("flag", ["yes", 1, None])
def test_empty_refuses_a_flag_that_is_not_a_bool(flag):
    rb = filled()
    with pytest.raises(TypeError, match="empty_write_count"):
        rb.empty(flag)
    assert rb[:] == list(range(6)) and rb.write_count == 6
    rb.empty(False)
    assert len(rb) == 0 and rb.write_count == 6
