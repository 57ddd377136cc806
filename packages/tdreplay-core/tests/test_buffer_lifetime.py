"""A dropped buffer is freed by its last reference going, without a ``gc`` pass.

(With ``prefetch``, a draw running on the prefetch thread holds the buffer until it returns;
the jobs still queued hold it weakly and draw nothing once it is gone.)

A reference cycle inside a buffer (its lock or its prefetch queue pointing back at it) kept the
buffer, and the memory of its storage, alive until Python's cyclic collector ran: a program that
replaced a large buffer held two of them for a while, and each new buffer had to take fresh pages
from the kernel.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, ReplayBuffer, TensorDictReplayBuffer


@contextmanager
def no_cyclic_gc() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def plain(prefetch: int | None) -> ReplayBuffer:
    rb = ReplayBuffer(storage=ListStorage(16), batch_size=2, prefetch=prefetch)
    rb.extend([torch.tensor(float(i)) for i in range(8)])
    return rb


def tensordicts(prefetch: int | None) -> ReplayBuffer:
    rb = TensorDictReplayBuffer(storage=ListStorage(16), batch_size=2, prefetch=prefetch)
    rb.extend(TensorDict(obs=torch.arange(8.0), batch_size=[8]))
    return rb


@pytest.mark.parametrize("make", [plain, tensordicts])
@pytest.mark.parametrize("prefetch", [None, 2])
def test_last_reference_frees_the_buffer_and_its_storage(make: Callable, prefetch):
    with no_cyclic_gc():
        rb = make(prefetch)
        for _ in range(3):
            assert rb.sample().shape == torch.Size([2])
        with rb._lock:  # the lock, used as sample and extend use it
            pass
        with rb._prefetcher.held(settle=True):  # the draws queued ahead have run
            pass
        buffer, storage = weakref.ref(rb), weakref.ref(rb.storage)
        del rb
        assert buffer() is None
        assert storage() is None


def test_prefetch_queue_still_cleared_through_the_buffer():
    # the prefetcher holds the buffer's clear_prefetch weakly: a batch-size change still drops
    # the queued batches of the old size, and the next batches have the new size
    rb = plain(prefetch=2)
    assert rb.sample(2).shape == torch.Size([2])
    assert rb.sample(3).shape == torch.Size([3])
    assert rb.sample(3).shape == torch.Size([3])
