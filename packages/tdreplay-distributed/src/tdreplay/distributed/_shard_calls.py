"""``ShardCalls``: a sharded buffer's calls to its shards, sent at once, dead shards set aside.

Every call goes to all the shards concerned before any answer is awaited, so the round trips
overlap. A shard whose actor is dead (or restarted without its data, or unreachable) is set
aside: reads and writes go on with the live shards, with a
:class:`~tdreplay.distributed.errors.ShardsUnavailableWarning`, until it is respawned. Answers
also carry each shard's max priority: the largest is the global max, which writes carry to
the shard they go to (new items get the max priority of the whole buffer, as in one buffer).
"""

from __future__ import annotations

import math
import threading
import time
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from ._ray import wait_all
from ._sharding import merge_samples
from ._wire import unpack
from .client import ActorClient
from .errors import (
    BufferActorDiedError,
    RemoteBufferError,
    RemoteCallTimeoutError,
    ShardsUnavailableWarning,
)

__all__ = ["ShardCalls"]

Call = tuple[int, str, tuple[Any, ...]]


class ShardCalls:
    """The clients of a sharded buffer's shards, and what their answers told."""

    def __init__(self, clients: list[ActorClient]) -> None:
        self.clients = clients
        #: shards found dead (until respawned)
        self.dead: set[int] = set()
        #: largest max priority any shard reported (``None``: not prioritized, or not known)
        self.max_priority: float | None = None
        self._rng_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_rng_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._rng_lock = threading.Lock()

    def note_max(self, value: float | None) -> None:
        """Keep ``value`` if it is a larger max priority than seen so far."""
        if value is not None and (self.max_priority is None or value > self.max_priority):
            self.max_priority = float(value)

    def live(self) -> list[int]:
        """Shards not known to be dead; :class:`BufferActorDiedError` when none is left."""
        live = [k for k in range(len(self.clients)) if k not in self.dead]
        if not live:
            raise BufferActorDiedError(
                f"every shard of the buffer is dead ({sorted(self.dead)}): respawn(path) it "
                "from its last checkpoint.", actor="all shards")
        return live

    def mark_dead(self, shard: int, err: BaseException) -> None:
        if shard not in self.dead:
            self.dead.add(shard)
            warnings.warn(ShardsUnavailableWarning(
                f"shard {shard} is unavailable ({err}); the buffer goes on with shards "
                f"{[k for k in range(len(self.clients)) if k not in self.dead]}: samples come "
                "from them only, and its items are not sampled until respawn(path) restores "
                "it."), stacklevel=4)

    def strict(self, calls: Sequence[Call], what: str, timeout: float | None) -> list[Any]:
        """Results of ``calls`` (``(shard, method, args)``) in order; any error raises."""
        refs = [(self.clients[k].submit(method, *args), self.clients[k].label)
                for k, method, args in calls]
        return wait_all(refs, what=what, timeout=timeout)

    def tolerant(self, calls: Sequence[Call], what: str, timeout: float | None
                 ) -> list[tuple[int, Any]]:
        """``(shard, result)`` of the calls whose shard answered; a shard that is dead or
        unavailable is set aside (see :meth:`mark_dead`). Timeouts and the buffers' own errors
        raise."""
        submitted = [(k, self.clients[k].submit(method, *args))  # raises once closed
                     for k, method, args in calls]
        deadline = None if timeout is None else time.monotonic() + timeout
        results = []
        for k, ref in submitted:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            try:
                results.append((k, self.clients[k].wait(ref, what, timeout=remaining)))
            except RemoteCallTimeoutError:
                raise
            except RemoteBufferError as err:
                self.mark_dead(k, err)
        if calls and not results:
            self.live()  # raises when no shard is left
        return results

    def sample(self, batch_size: int, generator: torch.Generator | None, offsets: torch.Tensor,
               timeout: float | None) -> tuple[Any, dict[str, Any]]:
        """A batch drawn over the live shards as one buffer would (see :mod:`.sharded`): one
        round of calls reads the shards' masses, one draws from them (each sent to all the
        shards at once). ``info["dead_shards"]`` lists the shards left out, if any."""
        num_shards = len(self.clients)
        masses: list[tuple[float, float, int, Any]] = [(0.0, math.inf, 0, None)] * num_shards
        for k, answer in self.tolerant([(k, "sampling_mass", ()) for k in self.live()],
                                       "sample", timeout):
            masses[k] = answer
            self.note_max(answer[3])
        mass = torch.tensor([m[0] for m in masses], dtype=torch.float64)
        if not float(mass.sum()) > 0:
            raise RuntimeError("Cannot sample from an empty storage: no shard holds an item yet, "
                               "extend the buffer first.")
        with self._rng_lock:  # worker threads of a prefetch draw at once
            which = torch.multinomial(mass / mass.sum(), batch_size, replacement=True,
                                      generator=generator)
        counts = torch.bincount(which, minlength=num_shards).tolist()
        calls = [(k, "sample", (counts[k], True)) for k in range(num_shards) if counts[k]]
        answers = [(k, unpack(r)) for k, r in self.tolerant(calls, "sample", timeout)]
        if len(answers) < len(calls):  # a shard died meanwhile: draw again from the others
            return self.sample(batch_size, generator, offsets, timeout)
        for _, answer in answers:
            self.note_max(answer[4])
        data, info = merge_samples(which, [k for k, _ in answers], counts,
                                   [a[:4] for _, a in answers], [m[:3] for m in masses], offsets)
        if self.dead:
            info["dead_shards"] = tuple(sorted(self.dead))
        return data, info
