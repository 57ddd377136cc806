"""``ClosableBuffer``: what the Ray buffers share about their lifetime: the Ray runtime their
creator holds, pickling as a client, and ``close()`` (TorchRL's ``RayReplayBuffer.close``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._ray import RayLease
from .client import ActorClient

__all__ = ["ClosableBuffer"]


class ClosableBuffer:
    """Base of :class:`RayReplayBuffer` and :class:`ShardedReplayBuffer`: their lifetime.

    The buffer that creates the actors holds a :class:`~._ray.RayLease` (Ray started for it
    is shut down when the last such buffer of the process closes). A pickled copy, handed to a
    Ray task or actor or another process, is a client of the same actors without the lease.
    Subclasses list their actors' clients in :meth:`_actor_clients`.
    """

    #: this process's use of Ray, held by the buffer that created the actors
    _lease: RayLease | None = None

    def _actor_clients(self) -> list[ActorClient]:
        raise NotImplementedError

    def _start_with_ray(self, ray_init_config: dict[str, Any] | None,
                        start: Callable[[], None]) -> None:
        """Take the lease (Ray initialised if it is not), then ``start()`` the actors; the
        lease is given back if they fail to start."""
        lease = RayLease.acquire(ray_init_config)
        try:
            start()
        except BaseException:
            lease.release()
            raise
        self._lease = lease

    def __getstate__(self) -> dict[str, Any]:
        """A copy is a client of the same actors, as ``attach`` gives, without the lease (nor
        the iteration ``next()`` goes through: the copy starts its own)."""
        state = self.__dict__.copy()
        state.pop("_lease", None)
        state.pop("_next_batches", None)
        return state

    def close(self) -> None:
        """Done with the buffer, as TorchRL's ``RayReplayBuffer.close()``: kill its actors.

        Quiet if they are already dead or Ray is already shut down; closing twice does nothing.
        Later calls raise :class:`~tdreplay.distributed.BufferActorDiedError` (other clients'
        calls too: the actors are gone), and a closed buffer cannot ``respawn`` (``shutdown()``
        kills the actors and keeps ``respawn`` possible). If creating this buffer started Ray
        (``ray_init_config``) and no other open buffer of this process did, Ray is shut down
        too; a Ray started by ``ray.init`` beforehand stays up.

        Examples
        --------
        >>> from functools import partial
        >>> from tdreplay.core import ListStorage
        >>> from tdreplay.distributed import RayReplayBuffer
        >>> rb = RayReplayBuffer(storage=partial(ListStorage, 10))
        >>> rb.extend([1, 2]).tolist()
        [0, 1]
        >>> rb.close(); rb.close()
        >>> rb.closed
        True
        >>> len(rb)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        tdreplay.distributed.errors.BufferActorDiedError: length failed: ... was closed...
        """
        self._stop_drawing_ahead()
        for client in self._actor_clients():
            client.close()
        if self._lease is not None:
            self._lease.release()
            self._lease = None

    def _stop_drawing_ahead(self) -> None:
        """Stop the threads drawing batches ahead (``prefetch``), before the actors go: none
        here; a buffer with such threads overrides it."""

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called on this buffer."""
        clients = self._actor_clients()
        return bool(clients) and all(client.closed for client in clients)

    def _check_not_closed(self) -> None:
        if self.closed:
            raise RuntimeError("a closed buffer cannot be respawned (close() is for good; "
                               "shutdown() kills the actors and keeps respawn possible).")
