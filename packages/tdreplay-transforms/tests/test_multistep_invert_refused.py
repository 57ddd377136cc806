"""``append_transform(MultiStepTransform(...), invert=True)`` (or ``insert_transform``) is
refused: the n-step transform already works on the write side, and inverted it ran on every
sample, returning truncated batches and holding sampled rows in its checkpointed state. The
error names ``invert`` and the buffer is left exactly as it was."""

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import Compose, InvertedTransform, TensorDictReplayBuffer
from tdreplay.storages import LazyTensorStorage
from tdreplay.transforms import MultiStepTransform


def steps(start, n):
    t = torch.arange(start, start + n)
    return TensorDict({"t": t, ("next", "t"): t + 1, ("next", "reward"): torch.ones(n),
                       ("next", "done"): torch.zeros(n, dtype=torch.bool)}, [n])


def buffer():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=2)
    rb.extend(steps(0, 4))
    return rb


def snapshot(rb):
    return len(rb), rb.write_count, repr(rb.transform), rb.state_dict().get("_transform"), rb[:]


def assert_same(before, after):
    assert before[:4] == after[:4]
    assert (before[4] == after[4]).all()


@pytest.mark.parametrize("how", ["append", "insert"])
@pytest.mark.parametrize("wrap", [lambda t: t, lambda t: Compose(t)])
def test_an_inverted_multistep_transform_is_refused(how, wrap):
    rb = buffer()
    before = snapshot(rb)
    transform = wrap(MultiStepTransform(n_steps=3, gamma=0.9))
    with pytest.raises(ValueError, match="invert"):
        if how == "append":
            rb.append_transform(transform, invert=True)
        else:
            rb.insert_transform(0, transform, invert=True)
    assert_same(before, snapshot(rb))
    assert rb.sample().batch_size == torch.Size([2])


def test_inverted_transform_refuses_it_directly():
    with pytest.raises(ValueError, match="invert"):
        InvertedTransform(MultiStepTransform(n_steps=2, gamma=0.9))


def test_multistep_transform_is_still_accepted_uninverted():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=2)
    rb.append_transform(MultiStepTransform(n_steps=3, gamma=0.9))
    assert rb.extend(steps(0, 6)).tolist() == [0, 1, 2]
    assert rb.sample().batch_size == torch.Size([2])
