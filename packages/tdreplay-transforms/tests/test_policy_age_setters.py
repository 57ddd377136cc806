"""PolicyAgeFilter's ``current_version`` / ``max_policy_lag`` are checked on assignment as the
constructor checks them (before, a bad value was accepted and every sample then raised a raw
error or silently came back empty). A refused assignment leaves the filter and the buffer as
they were."""

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.storages import LazyTensorStorage
from tdreplay.transforms import PolicyAgeFilter


def setup():
    t = PolicyAgeFilter(current_version=3, max_policy_lag=2)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=2, transform=t)
    rb.extend(TensorDict({"x": torch.arange(6.0), "policy_version": torch.full((6,), 3)}, [6]))
    return t, rb


@pytest.mark.parametrize("attr, bad, error", [
    ("current_version", "a", TypeError),
    ("current_version", None, TypeError),
    ("current_version", 1.5, TypeError),
    ("current_version", True, TypeError),
    ("max_policy_lag", "a", TypeError),
    ("max_policy_lag", None, TypeError),
    ("max_policy_lag", 1.0, TypeError),
    ("max_policy_lag", True, TypeError),
    ("max_policy_lag", -1, ValueError),
])
def test_bad_assignment_is_refused_and_changes_nothing(attr, bad, error):
    t, rb = setup()
    with pytest.raises(error, match=attr):
        setattr(t, attr, bad)
    assert (t.current_version, t.max_policy_lag) == (3, 2)
    assert len(rb) == 6 and rb.sample().batch_size == torch.Size([2])
    assert rb[:]["x"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_good_assignments_take_effect():
    t, rb = setup()
    t.current_version = 6
    assert rb[:].batch_size == torch.Size([0])  # lag 3 > 2
    t.max_policy_lag = 3
    assert rb[:].batch_size == torch.Size([6])
    t.current_version = lambda: 3
    t.max_policy_lag = 0
    assert rb[:].batch_size == torch.Size([6])


@pytest.mark.parametrize("returned", ["a", "3", 3.7, True, None])
def test_a_callable_returning_a_non_int_names_current_version(returned):
    # ("3" and 3.7 were cut to 3 at each filtering pass, where the constructor refuses both)
    t, rb = setup()
    t.current_version = lambda: returned
    with pytest.raises(TypeError, match="current_version must return an int"):
        rb.sample()


@pytest.mark.parametrize("returned", [5, torch.tensor(5), np.int64(5)])
def test_a_callable_may_return_any_int(returned):
    t, rb = setup()
    t.current_version = lambda: returned
    assert t.version_now() == 5 and rb[:].batch_size == torch.Size([6])  # lag 2
