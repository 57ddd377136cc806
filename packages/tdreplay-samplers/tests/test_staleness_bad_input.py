"""StalenessAwareSampler refuses a ``version_key`` that is not a nested key (before, accepted,
then every sample raised tensordict's KeyError) and policy versions that are not whole numbers
at write (before, stored, then every sample raised a misleading staleness_weight_fn error).
The errors name ``version_key``; a refused write leaves the buffer exactly as it was."""

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.samplers import StalenessAwareSampler
from tdreplay.storages import LazyTensorStorage


@pytest.mark.parametrize("bad", [5, 1.5, None, (), ("a", 1), ["policy_version"]])
def test_version_key_must_be_a_nested_key(bad):
    with pytest.raises(TypeError, match="version_key"):
        StalenessAwareSampler(version_key=bad)
    sampler = StalenessAwareSampler(version_key=("meta", "version"))
    with pytest.raises(TypeError, match="version_key"):
        sampler.version_key = bad
    assert sampler.version_key == ("meta", "version")


def buffer():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), sampler=StalenessAwareSampler(),
                                batch_size=2)
    rb.extend(TensorDict({"x": torch.arange(4.0), "policy_version": torch.zeros(4)}, [4]))
    return rb


def snapshot(rb):
    data = rb[:]
    return (len(rb), rb.write_count, rb.state_dict()["_writer"], rb.sampler.state_dict(),
            data["x"].tolist(), data["policy_version"].tolist())


BAD = [
    (torch.tensor([0.5, 1.0]), ValueError),
    (torch.tensor([float("nan"), 1.0]), ValueError),
    (torch.tensor([float("inf"), 1.0]), ValueError),
    (torch.tensor([True, False]), TypeError),
    (torch.tensor([1 + 1j, 0j]), TypeError),
]


@pytest.mark.parametrize("versions, error", BAD)
def test_bad_versions_are_refused_at_extend(versions, error):
    rb = buffer()
    before = snapshot(rb)
    with pytest.raises(error, match="version_key"):
        rb.extend(TensorDict({"x": torch.arange(2.0), "policy_version": versions}, [2]))
    assert snapshot(rb) == before
    assert rb.sample().batch_size == torch.Size([2])


@pytest.mark.parametrize("versions, error", BAD)
def test_bad_versions_are_refused_at_add_and_setitem(versions, error):
    rb = buffer()
    before = snapshot(rb)
    item = TensorDict({"x": torch.tensor(9.0), "policy_version": versions[0]}, [])
    with pytest.raises(error, match="version_key"):
        rb.add(item)
    with pytest.raises(error, match="version_key"):
        rb[0] = item
    assert snapshot(rb) == before


def test_whole_versions_are_still_written():
    rb = buffer()
    rb.extend(TensorDict({"x": torch.arange(2.0),
                          "policy_version": torch.tensor([1.0, 2.0])}, [2]))
    rb.extend(TensorDict({"x": torch.arange(2.0),
                          "policy_version": torch.tensor([3, 4])}, [2]))
    assert len(rb) == 8
    rb.sampler.consumer_version = 4
    assert rb.sample().batch_size == torch.Size([2])
