"""``ActorCheckpointsMixin``: a one-actor buffer's checkpoints (``dumps`` / ``loads``, to a
path or the buffer's ``checkpoint_path``) and its ``state_dict``, as calls to its actor."""

from __future__ import annotations

import os
from typing import Any

from ._wire import pack, unpack
from .checkpoints import resolve_location
from .client import ActorClient

__all__ = ["ActorCheckpointsMixin"]


class ActorCheckpointsMixin:
    """Checkpoints of :class:`~tdreplay.distributed.RayReplayBuffer` (mixed into it)."""

    _client: ActorClient
    #: where ``dumps()`` writes by default and a restarted actor restores (the creator's)
    _checkpoint_path: str | None = None

    @property
    def checkpoint_path(self) -> str | None:
        """The buffer's ``checkpoint_path`` (``None``: not given, or an attached client)."""
        return self._checkpoint_path

    def dumps(self, path: str | os.PathLike | None = None) -> None:
        """Checkpoint the buffer under directory ``path`` (default: ``checkpoint_path``).

        The actor writes it, on its node: give a path every node mounts, or an fsspec URL,
        for it to outlive the node (made absolute here). Atomic on a file system.
        """
        self._client.call("dumps", self._location(path))

    def loads(self, path: str | os.PathLike | None = None) -> None:
        """Restore a checkpoint written by :meth:`dumps` (checked before anything changes)."""
        self._client.drop_prefetched()
        self._client.call("loads", self._location(path))

    def _location(self, path: str | os.PathLike | None) -> str:
        if path is not None:
            return resolve_location(path)
        location = self._checkpoint_path
        if location is None:
            raise ValueError("no checkpoint path: pass one, or build the buffer with "
                             "checkpoint_path=...")
        return location

    save = dumps
    dump = dumps
    load = loads

    def state_dict(self) -> dict[str, Any]:
        """The remote buffer's ``state_dict()``."""
        return unpack(self._client.call("state_dict"))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` into the remote buffer."""
        self._client.drop_prefetched()
        self._client.call("load_state_dict", pack(state_dict))

