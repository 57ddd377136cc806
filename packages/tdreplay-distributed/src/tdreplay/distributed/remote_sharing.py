"""``share`` / ``shared`` and ``as_remote`` of ``RayReplayBuffer``, as TorchRL's has them.

A buffer served by an actor is shared by construction: every process reaches the same buffer
through the actor, which runs the calls against it (one at a time, unless ``max_concurrency``
says otherwise; the buffer locks itself then). :meth:`RemoteSharingMixin.share` therefore has
nothing to set up and returns the buffer. It does not forward to the actor as TorchRL's does:
there, ``share()`` answers with a pickled copy of the whole remote buffer, a local buffer that
no other process sees (writing to it would be lost), and marks the actor's buffer for
multi-process use, which a buffer that one process serves does not need (and which would refuse
a prioritized sampler that the actor serves to every process all the same).
"""

from __future__ import annotations

from typing import Any, TypeVar

from tdreplay.core.utils import check_flag

from ._ray import import_ray

__all__ = ["RemoteSharingMixin"]

SelfT = TypeVar("SelfT", bound="RemoteSharingMixin")


class RemoteSharingMixin:
    """``share``, ``shared`` and ``as_remote`` (mixed into ``RayReplayBuffer``)."""

    @property
    def shared(self) -> bool:
        """Always ``True``: every client, in any process, uses the one buffer in the actor."""
        return True

    def share(self: SelfT, shared: bool = True) -> SelfT:
        """This buffer, already shared by every process that holds it (see :attr:`shared`);
        TorchRL's returns a copy of the remote buffer instead.

        Hand it to other processes as it is: it pickles into a client of the same actor (for
        Ray tasks and actors; :meth:`attach` finds a named one).

        Raises
        ------
        ValueError
            ``shared=False``: a buffer served by an actor cannot be made private to one
            process (build a local ``ReplayBuffer`` for that); nothing is changed.

        Examples
        --------
        >>> from functools import partial
        >>> from tdreplay.core import ListStorage
        >>> from tdreplay.distributed import RayReplayBuffer
        >>> rb = RayReplayBuffer(storage=partial(ListStorage, 10))
        >>> rb.share() is rb, rb.shared
        (True, True)
        >>> rb.share(False)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: share(shared=False): a RayReplayBuffer is shared by every process...
        >>> rb.close()
        """
        if not check_flag(shared, "shared"):
            raise ValueError(f"share(shared={shared!r}): a {type(self).__name__} is shared by "
                             "every process that holds a client of its actor and cannot be "
                             "made private to one; use a local ReplayBuffer for a buffer that "
                             "one process owns.")
        return self

    @classmethod
    def as_remote(cls, remote_config: dict[str, Any] | None = None) -> Any:
        """The Ray actor class of this class, as TorchRL's ``as_remote``:
        ``ray.remote(**remote_config)(cls)``, flagged ``is_remote = True``.

        ``cls.as_remote(config).remote(**kwargs)`` starts an actor that builds the buffer
        (which starts the buffer's own actor) and answers ``actor.extend.remote(data)``, ...
        Seldom needed: the buffer already lives in an actor and pickles to Ray tasks and
        actors. Without ``remote_config`` the actor takes Ray's defaults (TorchRL's ask one
        CPU and 2 GiB of memory), as :meth:`tdreplay.core.ReplayBuffer.as_remote`.

        Raises
        ------
        TypeError
            ``remote_config`` is not a dict (or ``None``).

        Examples
        --------
        >>> from functools import partial
        >>> import ray
        >>> from tdreplay.core import ListStorage
        >>> from tdreplay.distributed import RayReplayBuffer
        >>> RemoteBuffer = RayReplayBuffer.as_remote({"num_cpus": 0})
        >>> RemoteBuffer.is_remote
        True
        >>> actor = RemoteBuffer.remote(storage=partial(ListStorage, 10))
        >>> ray.get(actor.extend.remote([1, 2, 3])).tolist()
        [0, 1, 2]
        >>> ray.get(actor.write_count.remote())  # a property: not callable on an actor
        Traceback (most recent call last):
        ...
        AttributeError: ...
        >>> ray.get(actor.close.remote())
        >>> ray.kill(actor)
        """
        if remote_config is not None and not isinstance(remote_config, dict):
            raise TypeError(f"as_remote: remote_config must be a dict of ray.remote options or "
                            f"None, got {type(remote_config).__name__}.")
        ray = import_ray()
        remote_cls = ray.remote(**remote_config)(cls) if remote_config else ray.remote(cls)
        remote_cls.is_remote = True
        return remote_cls
