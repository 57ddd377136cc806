"""Errors of remote buffers: a dead buffer actor and a call that got no answer in time.

An error raised *by the buffer* inside its actor (a ``ValueError`` for a bad batch size, a
``TypeError`` for bad data, ...) reaches the caller as that same exception type, as a local
buffer would raise it; these classes are for what only a remote buffer can do.
"""

from __future__ import annotations

__all__ = ["BufferActorDiedError", "BufferNotFoundError", "BufferStartError",
           "BufferStateLostError", "RemoteBufferError", "RemoteCallTimeoutError",
           "ShardsUnavailableWarning"]


class RemoteBufferError(RuntimeError):
    """Base class of the errors of remote buffers; ``actor`` names the buffer actor."""

    def __init__(self, message: str, *, actor: str) -> None:
        super().__init__(message)
        self.actor = actor

    def __reduce__(self) -> tuple[object, ...]:  # keeps ``actor`` across processes (Ray)
        return (_rebuild, (type(self), str(self), self.actor))


def _rebuild(cls: type[RemoteBufferError], message: str, actor: str) -> RemoteBufferError:
    return cls(message, actor=actor)


class BufferActorDiedError(RemoteBufferError):
    """The buffer actor is dead (killed, crashed, or its node or owner is gone).

    What it held is lost: build a new actor and restore it from the last checkpoint
    (:meth:`RayReplayBuffer.respawn` does both), then let other clients :meth:`reconnect`.
    """


class RemoteCallTimeoutError(RemoteBufferError, TimeoutError):
    """A call got no answer within the buffer's ``call_timeout``.

    The actor is busy, hung or unreachable. A write that timed out may still be applied
    later: the caller cannot know.
    """


class BufferStateLostError(BufferActorDiedError):
    """The actor was restarted by Ray (``max_restarts``) and could not restore its buffer from
    its ``checkpoint_path``: it refuses every call rather than serve an empty buffer.

    Replace it with :meth:`RayReplayBuffer.respawn` (from a checkpoint), then let other clients
    :meth:`reconnect`.
    """


class BufferNotFoundError(RemoteBufferError, ValueError):
    """No buffer actor has the name looked up (not started yet, or dead and not respawned).

    A ``ValueError`` too, as Ray's ``get_actor`` raises.
    """


class BufferStartError(RemoteBufferError, TimeoutError):
    """A buffer actor did not start within ``start_timeout``: Ray could not schedule it (no
    live node has the resources its options ask for) or building its buffer took longer.
    Nothing was written to it; the actor is killed."""


class ShardsUnavailableWarning(RuntimeWarning):
    """A sharded buffer goes on without shards whose actors are dead or unreachable: samples
    come from the live shards only (``rb.dead_shards`` lists the others; ``respawn`` brings
    them back). Turn it into an error with ``warnings.simplefilter("error",
    ShardsUnavailableWarning)`` to fail instead."""
