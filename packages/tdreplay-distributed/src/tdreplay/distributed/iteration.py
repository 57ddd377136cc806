"""``stats()`` and ``for batch in rb`` of the served buffers, as a local buffer's.

:class:`RemoteIterationMixin` (``RayReplayBuffer``): the actor's ``stats()``; iteration
endless with a sampler drawing with replacement, one epoch with a finite one
(``SamplerWithoutReplacement``...). Each batch of an epoch is one actor call, whose answer
tells whether the sampler ran out with it, so the iteration ends with the batch that ends the
epoch, as ``ReplayBuffer.__iter__`` does. :class:`ShardedIterationMixin`
(``ShardedReplayBuffer``): ``stats()`` summed over the live shards, in one round of calls, and
endless iteration (an epoch over several shards is not defined: iterate a shard,
``rb.shards[k]``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ._shard_calls import ShardCalls
from ._wire import unpack
from .client import ActorClient

__all__ = ["RemoteIterationMixin", "ShardedIterationMixin"]

_NO_BATCH_SIZE = ("Cannot iterate over the replay buffer. Batch_size was not specified (build "
                  "the buffer with batch_size=... to iterate).")


class RemoteIterationMixin:
    """``stats()`` and iteration of a buffer served by one actor (``RayReplayBuffer``)."""

    _client: ActorClient

    def stats(self) -> dict[str, int | float | bool]:
        """The remote buffer's :meth:`~tdreplay.core.ReplayBuffer.stats`, in one actor call:
        ``size``, ``write_count``, ``prefetch_queue_size`` (the actor's), ``initialized``,
        ``capacity``, ``utilization``.

        Examples
        --------
        >>> from functools import partial
        >>> from tdreplay.core import ListStorage
        >>> from tdreplay.distributed import RayReplayBuffer
        >>> rb = RayReplayBuffer(storage=partial(ListStorage, 10))
        >>> _ = rb.extend(list(range(4)))
        >>> stats = rb.stats()
        >>> stats["size"], stats["write_count"], stats["capacity"], stats["utilization"]
        (4, 4, 10, 0.4)
        >>> rb.close()
        """
        return self._client.call("stats")

    def __iter__(self) -> Iterator[Any]:
        """Batches of the buffer's ``batch_size``, as ``ReplayBuffer.__iter__``: endless with
        a sampler drawing with replacement; with a finite one (``SamplerWithoutReplacement``),
        one epoch, ending with the batch with which the sampler ran out.

        Raises ``RuntimeError`` (at the first batch) when the buffer has no ``batch_size``.

        Examples
        --------
        >>> from functools import partial
        >>> import torch
        >>> from tdreplay.core import ListStorage, SamplerWithoutReplacement
        >>> from tdreplay.distributed import RayReplayBuffer
        >>> rb = RayReplayBuffer(storage=partial(ListStorage, 10), batch_size=4,
        ...                      sampler=SamplerWithoutReplacement)
        >>> _ = rb.extend([torch.tensor(i) for i in range(10)])
        >>> batches = [batch.tolist() for batch in rb]
        >>> [len(b) for b in batches], sorted(sum(batches, []))
        ([4, 4, 2], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
        >>> rb.close()
        """
        buffer: Any = self  # the RayReplayBuffer this is mixed into
        if buffer.batch_size is None:
            raise RuntimeError(_NO_BATCH_SIZE)
        client = self._client
        if not client.info.get("finite_epochs", True):
            while True:
                yield buffer.sample()
        while True:
            data, ran_out = unpack(client.call("next_batch", client.limit_timeout))
            yield data
            if ran_out:
                return


class ShardedIterationMixin:
    """``stats()`` and iteration of a sharded buffer (``ShardedReplayBuffer``)."""

    _clients: list[ActorClient]
    _calls: ShardCalls
    _call_timeout: float | None

    def stats(self) -> dict[str, int | float | bool]:
        """The shards' :meth:`~tdreplay.core.ReplayBuffer.stats` summed, in one round of
        calls: ``size``, ``write_count`` and ``prefetch_queue_size`` of the live shards,
        ``initialized``, ``capacity`` (every shard's slots, :attr:`max_size`) and
        ``utilization`` (``size / capacity``).

        Examples
        --------
        >>> from functools import partial
        >>> from tdreplay.core import ListStorage
        >>> from tdreplay.distributed import ShardedReplayBuffer
        >>> rb = ShardedReplayBuffer(num_shards=2, storage=partial(ListStorage, 5))
        >>> _ = rb.extend([1, 2, 3]); _ = rb.extend([4])
        >>> rb.stats()  # doctest: +NORMALIZE_WHITESPACE
        {'size': 4, 'write_count': 4, 'prefetch_queue_size': 0, 'initialized': True,
         'capacity': 10, 'utilization': 0.4}
        >>> rb.close()
        """
        answers = self._calls.tolerant([(k, "stats", ()) for k in self._calls.live()],
                                       "stats", self._call_timeout)
        size, written, queued = (sum(int(stats[key]) for _, stats in answers)
                                 for key in ("size", "write_count", "prefetch_queue_size"))
        buffer: Any = self  # the ShardedReplayBuffer this is mixed into
        capacity = buffer.max_size
        return {"size": size, "write_count": written, "prefetch_queue_size": queued,
                "initialized": True, "capacity": capacity,
                "utilization": size / capacity if capacity else 0.0}

    def __iter__(self) -> Iterator[Any]:
        """Endless batches of the buffer's ``batch_size`` (``sample()``), as a local buffer
        with a sampler drawing with replacement.

        Raises ``RuntimeError`` (at the first batch) without a ``batch_size``, and
        ``TypeError`` with a finite sampler (``SamplerWithoutReplacement``): each shard runs
        its own epochs, so the buffer has none; iterate a shard (``rb.shards[k]``) for one.

        Examples
        --------
        >>> from functools import partial
        >>> from tdreplay.core import ListStorage
        >>> from tdreplay.distributed import ShardedReplayBuffer
        >>> rb = ShardedReplayBuffer(num_shards=2, storage=partial(ListStorage, 5),
        ...                          batch_size=3)
        >>> _ = rb.extend([1, 2]); _ = rb.extend([3])
        >>> batches = iter(rb)
        >>> [len(next(batches)) for _ in range(3)]
        [3, 3, 3]
        >>> rb.close()
        """
        buffer: Any = self  # the ShardedReplayBuffer this is mixed into
        if buffer.batch_size is None:
            raise RuntimeError(_NO_BATCH_SIZE)
        if any(client.info.get("finite_epochs", False) for client in self._clients):
            raise TypeError("a ShardedReplayBuffer with a finite sampler (e.g. "
                            "SamplerWithoutReplacement) has no epoch of its own (each shard "
                            "runs its own): iterate a shard, rb.shards[k], for one epoch.")
        while True:
            yield buffer.sample()
