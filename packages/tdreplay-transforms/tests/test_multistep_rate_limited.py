"""A ``MultiStepTransform`` in a buffer whose rate limiter holds writes back: a checkpoint
taken or an ``empty()`` made while a write waits at the gate sees the steps held before that
write, not those the write would hold (which matched no stored row: lost on restore)."""

import copy
import threading
import time

import torch
from tensordict import TensorDict

from tdreplay.core import SampleToInsertRatio, TensorDictReplayBuffer
from tdreplay.storages import LazyTensorStorage
from tdreplay.transforms import MultiStepTransform


def steps(start, n):
    t = torch.arange(start, start + n)
    return TensorDict({"t": t, ("next", "t"): t + 1, ("next", "reward"): torch.ones(n),
                       ("next", "done"): torch.zeros(n, dtype=torch.bool)}, [n])


def buffer():
    # inserts wait for samples once they run 4 items ahead of them (around one per insert)
    return TensorDictReplayBuffer(
        storage=LazyTensorStorage(100), batch_size=2,
        transform=MultiStepTransform(n_steps=3, gamma=0.5),
        rate_limiter=SampleToInsertRatio(1.0, 1, 4.0, timeout=30))


def waiting_extend(rb, batch):
    thread = threading.Thread(target=rb.extend, args=(batch,))
    thread.start()
    time.sleep(0.3)
    assert thread.is_alive()  # the gate holds it back until a sample
    return thread


def test_a_state_saved_while_a_write_waits_restores_every_step():
    rb = buffer()
    rb.extend(steps(0, 5))  # writes steps 0, 1; holds 2, 3, 4
    thread = waiting_extend(rb, steps(5, 5))
    saved = copy.deepcopy(rb.state_dict())
    rb.sample()
    thread.join(30)
    assert rb[:]["t"].tolist() == list(range(7))

    restored = buffer()
    restored.load_state_dict(saved)
    assert restored[:]["t"].tolist() == [0, 1]
    assert restored.transform[0].held["t"].tolist() == [2, 3, 4]
    restored.sample()
    restored.extend(steps(5, 5))  # the write the checkpoint did not hold, again
    assert restored[:]["t"].tolist() == list(range(7))
    assert torch.equal(restored[:]["next", "t"], rb[:]["next", "t"])


def test_an_empty_while_a_write_waits_drops_the_steps_held_before_it():
    rb = buffer()
    rb.extend(steps(0, 5))
    thread = waiting_extend(rb, steps(5, 5))
    rb.empty()  # drops steps 2, 3, 4 and resets the limiter's counts: the write goes on
    thread.join(30)
    assert rb[:]["t"].tolist() == [5, 6]  # the write's own steps, 7, 8, 9 held back
    assert rb.transform[0].held["t"].tolist() == [7, 8, 9]
