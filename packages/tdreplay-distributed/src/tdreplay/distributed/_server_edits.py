"""The actor side of the in-place edits, whole-buffer reads, queries and submitted conditional
updates of a ``RayReplayBuffer`` (its client side: :mod:`.remote_edits` and
:mod:`.conditional_updates`), mixed into :class:`~._server.BufferServer`.

What they answer with crosses as :class:`~._wire.Packed`: the client gets values, never
references to the actor's memory.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from tdreplay.core import ReplayBuffer

from ._wire import Packed, pack, unpack

__all__ = ["EDIT_CALLS", "EditsServerMixin"]

#: the buffer methods a client may call through :meth:`EditsServerMixin.edit`
EDIT_CALLS = frozenset({"write_all", "set_", "set_at_", "update_"})

#: tokens of submitted conditional updates, unique in the actor's process
_TOKENS = itertools.count()


class EditsServerMixin:
    """``edit``, ``read_all_in_order``, ``query`` and submitted conditional updates of the
    buffer an actor serves (mixed into :class:`~._server.BufferServer`)."""

    if TYPE_CHECKING:  # what the server this is mixed into provides
        @property
        def buffer(self) -> ReplayBuffer: ...

        def _received(self, payload: Any) -> Any: ...

    def edit(self, method: str, payload: Any) -> None:
        """``buffer.<method>(*args, **kwargs)`` of an in-place edit (``payload`` packs
        ``(args, kwargs)``); ``ValueError`` for any other method name. The edit's return value
        (the buffer itself) stays here."""
        if method not in EDIT_CALLS:
            raise ValueError(f"{method!r} is not an in-place edit of the buffer (one of "
                             f"{sorted(EDIT_CALLS)}).")
        args, kwargs = self._received(payload)
        getattr(self.buffer, method)(*args, **kwargs)

    def read_all_in_order(self, end: int | None) -> Packed:
        """The buffer's ``read_all_in_order(end)``: the first ``end`` rows in storage order."""
        return pack(self.buffer.read_all_in_order(end))

    def query(self, predicate: Callable[[Any], bool] | None, trajectory_key: Any) -> Packed:
        """The buffer's ``query``: the matching trajectories. ``predicate`` arrives as Ray
        pickles it (cloudpickle: lambdas and ``traj`` expressions travel)."""
        return pack(self.buffer.query(predicate, trajectory_key=trajectory_key))

    # ---- submitted conditional updates -----------------------------------------------------
    def _submitted(self) -> dict[int, Future[Any]]:
        # made at the first submission; setdefault keeps one table under concurrent calls
        return self.__dict__.setdefault("_submitted_updates", {})

    def submit_update_if_present(self, payload: Any) -> int:
        """The buffer's ``submit_update_if_present(**kwargs)`` (``kwargs`` packed): checks the
        arguments now (a bad one raises, nothing is queued) and queues the update on the
        buffer's update worker. Returns the token :meth:`update_result` takes."""
        # the buffer keeps the arguments until the update runs: they must own their memory
        future = self.buffer.submit_update_if_present(**unpack(payload, copy=True))
        token = next(_TOKENS)
        self._submitted()[token] = future
        return token

    def update_result(self, token: int, timeout: float | None) -> Packed:
        """The ``ConditionalUpdateResult`` of the update submitted as ``token``, once it ran
        (at most ``timeout`` s: ``TimeoutError`` after); its error if it failed. Each token is
        answered once."""
        future = self._submitted().pop(token, None)
        if future is None:
            raise KeyError(f"no submitted update has token {token!r} (each is answered once).")
        return pack(future.result(timeout))
