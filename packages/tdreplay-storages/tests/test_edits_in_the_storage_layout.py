"""In-place entry edits (``set_``, ``set_at_``, ``update_``) of a buffer over an ``ndim=2``
storage take values laid out as the storage holds them (``[T, envs]``), as TorchRL 0.14.1's
(they edit ``rb.storage[:]``), while ``rb[:]`` reads ``[envs, T]``."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer
from tdreplay.storages import LazyTensorStorage


def _buffer() -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyTensorStorage(12, ndim=2))  # dim_extend = 1
    rb.extend(TensorDict({"r": torch.zeros(2, 3)}, [2, 3]))  # 2 envs x 3 steps
    return rb


def test_set_and_update_take_the_storage_layout():
    rb = _buffer()
    value = torch.arange(6.0).reshape(3, 2)  # [T, envs]
    rb.set_("r", value)
    assert torch.equal(rb.storage[:]["r"], value) and torch.equal(rb[:]["r"], value.T)
    rb.update_({"r": 2 * value})
    assert torch.equal(rb.storage[:]["r"], 2 * value)


def test_set_at_addresses_storage_rows():
    rb = _buffer()
    rb.set_at_("r", torch.tensor([7.0, 8.0]), 0)  # time step 0 of both environments
    assert rb.storage[:]["r"][0].tolist() == [7.0, 8.0]
    assert rb[:]["r"][:, 0].tolist() == [7.0, 8.0]
