"""In-place entry edits (``set_``, ``set_at_``, ``update_``) of a buffer over an ``ndim=2``
storage take values laid out as ``rb[:]`` reads them (``dim_extend=1``: environments first),
as ``rb[i] = x`` does, and broadcast as against ``rb[:][key]``."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage

STORAGES = [lambda: LazyTensorStorage(12, ndim=2), lambda: LazyMemmapStorage(12, ndim=2)]


def _buffer(make) -> ReplayBuffer:
    rb = ReplayBuffer(storage=make())  # dim_extend = 1
    rb.extend(TensorDict({"r": torch.zeros(2, 3), "obs": torch.zeros(2, 3, 4),
                          "next": {"r": torch.zeros(2, 3)}}, [2, 3]))  # 2 envs x 3 steps
    return rb


@pytest.mark.parametrize("make", STORAGES)
def test_set_takes_the_read_layout(make):
    rb = _buffer(make)
    value = torch.arange(6.0).reshape(2, 3)
    rb.set_("r", value)
    rb.set_(("next", "r"), -value)
    assert torch.equal(rb[:]["r"], value)
    assert torch.equal(rb[:]["next", "r"], -value)
    assert torch.equal(rb[1]["r"], value[1])  # environment 1's steps
    assert torch.equal(rb.storage[:]["r"], value.T)  # the storage is time-major


@pytest.mark.parametrize("make", STORAGES)
def test_set_broadcasts_as_against_the_read_entry(make):
    rb = _buffer(make)
    rb.set_("r", torch.tensor([1.0, 2.0, 3.0]))  # one value per step, every environment
    assert rb[:]["r"].tolist() == [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]
    rb.set_("obs", torch.arange(4.0))  # one value per feature
    assert torch.equal(rb[:]["obs"], torch.arange(4.0).expand(2, 3, 4))
    rb.set_("r", torch.tensor(5.0))
    assert (rb[:]["r"] == 5).all()


@pytest.mark.parametrize("make", STORAGES)
def test_set_of_a_value_that_does_not_broadcast_is_refused_unchanged(make):
    rb = _buffer(make)
    rb.set_("r", torch.arange(6.0).reshape(2, 3))
    with pytest.raises(ValueError, match="'r'"):
        rb.set_("r", torch.tensor([1.0, 2.0]))  # [2] does not broadcast against [2, 3]
    assert torch.equal(rb[:]["r"], torch.arange(6.0).reshape(2, 3))


@pytest.mark.parametrize("make", STORAGES)
def test_set_at_addresses_the_extend_dim(make):
    rb = _buffer(make)
    rb.set_at_("r", torch.tensor([7.0, 8.0, 9.0]), 1)
    rb.set_at_("obs", torch.ones(1, 3, 4), slice(0, 1))
    assert rb[:]["r"].tolist() == [[0.0, 0.0, 0.0], [7.0, 8.0, 9.0]]
    assert rb[:]["obs"][0].eq(1).all() and rb[:]["obs"][1].eq(0).all()


@pytest.mark.parametrize("make", STORAGES)
def test_update_takes_the_read_layout(make):
    rb = _buffer(make)
    value = torch.arange(6.0).reshape(2, 3)
    rb.update_({"r": value})
    assert torch.equal(rb[:]["r"], value)
    rb.update_(TensorDict({"r": 2 * value}, [2, 3]))
    assert torch.equal(rb[:]["r"], 2 * value)
    assert torch.equal(rb.storage[:]["r"], 2 * value.T)


def test_dim_extend_0_edits_the_storage_layout():
    rb = ReplayBuffer(storage=LazyTensorStorage(12, ndim=2), dim_extend=0)
    rb.extend(TensorDict({"r": torch.zeros(3, 2)}, [3, 2]))  # time-major batches
    rb.set_("r", torch.arange(6.0).reshape(3, 2))
    assert torch.equal(rb[:]["r"], torch.arange(6.0).reshape(3, 2))
    assert torch.equal(rb.storage[:]["r"], torch.arange(6.0).reshape(3, 2))


def test_an_edit_of_a_storage_never_written_says_so():
    rb = ReplayBuffer(storage=LazyTensorStorage(12, ndim=2))
    with pytest.raises(RuntimeError, match="the storage is empty: nothing to set"):
        rb.set_("r", torch.zeros(2, 3))
    assert len(rb) == 0
