"""Configuring the buffer a ``RayReplayBuffer`` serves, as TorchRL's client forwards it.

:class:`RemoteConfigurationMixin` (``RayReplayBuffer``): ``append_transform``,
``insert_transform``, ``register_save_hook``, ``register_load_hook``, ``set_rng``,
``set_storage`` / ``set_sampler`` / ``set_writer`` and ``synchronize`` run on the buffer in the
actor (what they take is pickled there: a transform
or hook must be importable by the actor's process, as for TorchRL's), and ``start``. Batches
this client drew ahead (``prefetch``) before a change are dropped: the next sample sees it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from tdreplay.core import Sampler, Storage, Transform, Writer
from tdreplay.core.utils import check_flag, check_instance

from ._wire import pack

if TYPE_CHECKING:
    from .client import ActorClient

__all__ = ["RemoteConfigurationMixin"]

SelfT = TypeVar("SelfT", bound="RemoteConfigurationMixin")


class RemoteConfigurationMixin:
    """The served buffer's configuration calls (mixed into ``RayReplayBuffer``)."""

    _client: ActorClient

    def _configure(self, method: str, *args: Any, **kwargs: Any) -> None:
        self._client.drop_prefetched()  # (drawn before the change)
        self._client.call("configure", method, pack((args, kwargs)))

    def append_transform(self: SelfT, transform: Transform | Callable[[Any], Any], *,
                         invert: bool = False) -> SelfT:
        """The served buffer's ``append_transform`` (``invert=True``: on writes); returns this
        client.

        Examples
        --------
        >>> from functools import partial
        >>> import torch
        >>> from tdreplay.core import ListStorage
        >>> from tdreplay.distributed import RayReplayBuffer
        >>> rb = RayReplayBuffer(storage=partial(ListStorage, 10), batch_size=2)
        >>> _ = rb.append_transform(torch.neg)  # on samples
        >>> _ = rb.extend([torch.tensor(3), torch.tensor(3)])
        >>> rb.sample().tolist()
        [-3, -3]
        >>> rb.close()
        """
        check_flag(invert, "invert")  # (before the batches drawn ahead are dropped)
        self._configure("append_transform", transform, invert=invert)
        return self

    def insert_transform(self: SelfT, index: int, transform: Transform | Callable[[Any], Any],
                         *, invert: bool = False) -> SelfT:
        """The served buffer's ``insert_transform``; returns this client."""
        check_flag(invert, "invert")
        self._configure("insert_transform", index, transform, invert=invert)
        return self

    def register_save_hook(self, hook: Callable[[Any], Any]) -> None:
        """The served buffer's ``register_save_hook`` (``hook(data) -> data`` before saving)."""
        self._configure("register_save_hook", hook)

    def register_load_hook(self, hook: Callable[[Any], Any]) -> None:
        """The served buffer's ``register_load_hook`` (``hook(data) -> data`` after loading)."""
        self._configure("register_load_hook", hook)

    def set_rng(self, generator: torch.Generator) -> None:
        """The served buffer's ``set_rng``: its sampler draws with (a copy of) ``generator``,
        in the actor."""
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got "
                            f"{type(generator).__name__}.")
        self._configure("set_rng", generator)

    def set_storage(self, storage: Storage) -> None:
        """The served buffer's ``set_storage``: ``storage`` (pickled to the actor, with what
        it holds) replaces the storage there, and what the old one held is dropped with it.

        Unlike the local buffer's (and TorchRL's, which ships the old storage back), returns
        ``None``: the previous storage may hold the whole buffer. ``TypeError`` here for
        anything but a :class:`~tdreplay.core.Storage`. This client reads the buffer's new
        description (``max_size``, ...); other clients do at ``reconnect()``. A restart or
        ``respawn`` builds the buffer from its creation arguments again (so does Ray's
        automatic restart): save a checkpoint and restore it into a buffer built with the new
        part if it must outlive the actor.

        Examples
        --------
        >>> from functools import partial
        >>> import torch
        >>> from tdreplay.core import ListStorage
        >>> from tdreplay.distributed import RayReplayBuffer
        >>> rb = RayReplayBuffer(storage=partial(ListStorage, 10), batch_size=2)
        >>> _ = rb.extend([torch.tensor(1), torch.tensor(2)])
        >>> rb.set_storage(ListStorage(3))
        >>> len(rb), rb.max_size
        (0, 3)
        >>> rb.close()
        """
        self._configure_part(storage, Storage, "set_storage")

    def set_sampler(self, sampler: Sampler) -> None:
        """The served buffer's ``set_sampler`` (``sampler`` pickled to the actor; the buffer
        there refuses one its batch size or parts cannot work with, and keeps its sampler).
        Returns ``None`` and lasts until a restart, as :meth:`set_storage`."""
        self._configure_part(sampler, Sampler, "set_sampler")

    def set_writer(self, writer: Writer) -> None:
        """The served buffer's ``set_writer`` (``writer`` pickled to the actor). Returns
        ``None`` and lasts until a restart, as :meth:`set_storage`."""
        self._configure_part(writer, Writer, "set_writer")

    def _configure_part(self, part: Any, kind: type, method: str) -> None:
        self._configure(method, check_instance(part, kind, method.removeprefix("set_")))
        self._client.refresh_info()  # (max_size, is_prioritized, ... of the new part)

    def synchronize(self) -> None:
        """The served buffer's ``synchronize``: wait for the updates submitted there."""
        self._client.call("configure", "synchronize", pack(((), {})))

    def start(self: SelfT) -> SelfT:
        """This buffer (its actor started when it was built), as TorchRL's ``start``;
        ``RuntimeError`` once it is closed."""
        if getattr(self, "closed", False):
            raise RuntimeError("A closed RayReplayBuffer cannot be restarted.")
        return self
