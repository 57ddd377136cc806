"""``set_sampler`` / ``set_writer`` of a shared buffer refuse a part that cannot be shared
(``NotShareableError``, the buffer keeping its parts), as its constructor refuses it; they
took it, and the forked worker's first write raised, its rows lost."""

from __future__ import annotations

import pytest

from tdreplay.core import RandomSampler, ReplayBuffer, RoundRobinWriter
from tdreplay.core.process_sharing import NotShareableError
from tdreplay.core.storage import ListStorage


class _LocalSampler(RandomSampler):
    shareable = False  # e.g. trees in this process's memory


class _LocalWriter(RoundRobinWriter):
    shareable = False


def test_a_part_that_cannot_be_shared_is_refused_and_the_buffer_kept():
    rb = ReplayBuffer(storage=ListStorage(4), shared=True)
    sampler, writer = rb.sampler, rb.writer
    with pytest.raises(NotShareableError):
        rb.set_sampler(_LocalSampler())
    with pytest.raises(NotShareableError):
        rb.set_writer(_LocalWriter())
    assert rb.sampler is sampler and rb.writer is writer
    with pytest.raises(NotShareableError):  # (what the constructor does)
        ReplayBuffer(storage=ListStorage(4), sampler=_LocalSampler(), shared=True)


def test_a_buffer_not_shared_takes_them():
    rb = ReplayBuffer(storage=ListStorage(4))
    rb.set_sampler(_LocalSampler())
    rb.set_writer(_LocalWriter())
    assert type(rb.sampler) is _LocalSampler and type(rb.writer) is _LocalWriter
