"""Errors of remote buffers: a dead buffer actor and a call that got no answer in time.

An error raised *by the buffer* inside its actor (a ``ValueError`` for a bad batch size, a
``TypeError`` for bad data, ...) reaches the caller as that same exception type, as a local
buffer would raise it; these classes are for what only a remote buffer can do.
"""

from __future__ import annotations

__all__ = ["BufferActorDiedError", "RemoteBufferError", "RemoteCallTimeoutError"]


class RemoteBufferError(RuntimeError):
    """Base class of the errors of remote buffers; ``actor`` names the buffer actor."""

    def __init__(self, message: str, *, actor: str) -> None:
        super().__init__(message)
        self.actor = actor


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
