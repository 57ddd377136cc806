"""Sharing a buffer between processes: ``shared=`` / :meth:`SharingMixin.share`, refusing to
hand a process what it cannot share, and :meth:`SharingMixin.as_remote` (the buffer in a Ray
actor).

What a shared buffer means, part by part:

- **storage**: its rows, its row count and the writer's counters live where every process sees
  them, and it has a lock that excludes other processes: a storage that declares a
  :attr:`~tdreplay.core.Storage.process_lock` (``LazyMemmapStorage``,
  ``LazyTensorStorage(shared_init=True)``). A ``ListStorage`` or a plain tensor storage keeps
  them in one process's memory;
- **sampler**: :attr:`~tdreplay.core.Sampler.shareable`. Uniform samplers need only the
  storage's length and are; a prioritized sampler keeps its trees in one process and is not
  (a prioritized buffer built with ``sync=False`` keeps it in the learner and hands workers a
  uniform sampler);
- **writer**: :attr:`~tdreplay.core.Writer.shareable`. A round-robin writer keeps its cursor and
  write count in the storage's shared memory and is; a writer that keeps its own state in one
  process (``TensorDictMaxValueWriter``'s heap of ranks) is not;
- **transforms**: one that keeps write state (:attr:`~tdreplay.core.Transform.
  requires_shared_write_state`) must move it to shared memory
  (:meth:`~tdreplay.core.Transform.share_memory_`).

A buffer goes to another process when it is pickled for a process being started (spawn and
forkserver start methods) or when a forked child writes into the parent's buffer (a child may
read its copy, e.g. to save it). Either way, a part
that cannot be shared raises :class:`NotShareableError` (a ``RuntimeError``, as TorchRL's)
naming it, where a copy would otherwise diverge silently from the original. A bare part
(a storage, sampler or writer alone, not in a buffer) pickled for a process being started
refuses the same way (:mod:`tdreplay.core.process_sharing`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, TypeVar

from .process_sharing import NotShareableError as NotShareableError  # where it was before
from .process_sharing import sending_to_new_process as sending_to_new_process
from .rate_limit import RateLimiter
from .sampler import Sampler
from .storage import Storage
from .transform import Compose, Transform
from .utils import check_flag
from .writer import Writer

SelfT = TypeVar("SelfT", bound="SharingMixin")

#: this process's id, renewed in a forked child: a write compares it with its buffer's owner
#: without a ``getpid`` system call each time
_this_pid = os.getpid()


def _renew_pid() -> None:
    global _this_pid
    _this_pid = os.getpid()


if hasattr(os, "register_at_fork"):  # POSIX; where it is missing no process forks
    os.register_at_fork(after_in_child=_renew_pid)


def check_shared_flag(value: Any, name: str = "shared") -> bool:
    """``value`` as a bool (a Python or numpy bool); ``TypeError`` naming ``name`` otherwise
    (``shared="yes"``, ``1``, ``None`` are refused, nothing changed):
    :func:`tdreplay.core.utils.check_flag` with ``name`` defaulting to ``"shared"``.

    Examples
    --------
    >>> check_shared_flag(True)
    True
    >>> check_shared_flag(1)
    Traceback (most recent call last):
    ...
    TypeError: shared must be a bool, got int (1).
    """
    return check_flag(value, name)


def share_transform(transform: Transform) -> None:
    """Move the write state of ``transform`` (and of every transform it holds) to shared
    memory; ``RuntimeError`` for one that keeps write state it cannot share."""
    if isinstance(transform, Compose):
        for inner in transform:
            share_transform(inner)
        return
    transform.share_memory_()


class SharingMixin:
    """``shared`` and :meth:`share` (mixed into :class:`~tdreplay.core.ReplayBuffer`)."""

    #: whether the buffer is meant to be used by several processes (:meth:`share`)
    shared: bool = False
    _storage: Storage
    _sampler: Sampler
    _writer: Writer
    _transform: Compose
    _prefetch: int
    _rate_limiter: RateLimiter | None
    _owner_pid: int | None = None  #: the process whose buffer this is (unset in an unpickled copy)
    #: the storage's ``shared_reset_count()`` when the batches drawn ahead were queued
    _reset_count_seen: int | None = None

    if TYPE_CHECKING:  # what the buffer this is mixed into provides
        def locked(self) -> Any: ...

        def clear_prefetch(self) -> None: ...

        @property
        def initialized(self) -> bool: ...

    def share(self: SelfT, shared: bool = True) -> SelfT:
        """Mark the buffer as used by several processes (``shared=False`` unmarks it); returns
        the buffer.

        Its transforms move their write state to shared memory (and are shared when appended
        later); a sampler, writer or rate limiter that cannot be shared, or a prefetching
        buffer, is refused with an error naming it. The storage is checked when the buffer
        goes to another process: only a storage that shares its rows (``LazyMemmapStorage``,
        ``LazyTensorStorage(shared_init=True)``) may. A buffer whose parts wait for its first
        use (``delayed_init``) is only marked: they are checked and shared when built.

        Examples
        --------
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=ListStorage(10), shared=True)
        >>> rb.shared, rb.share(False).shared
        (True, False)
        >>> rb.check_shareable()  # what sending it to another process runs  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        tdreplay.core.process_sharing.NotShareableError: Cannot share a storage of type ...
        """
        check_shared_flag(shared, "shared")
        if shared and self._prefetch:
            raise ValueError("Cannot share prefetched replay buffers. Pass prefetch=0 or "
                             "shared=False.")
        if shared and self._rate_limiter is not None:
            self._rate_limiter.check_shareable()
        if shared and self.initialized:
            self._sampler.check_shareable()
            self._writer.check_shareable()
            share_transform(self._transform)
        self.shared = bool(shared)
        if self._owner_pid is None:
            self._owner_pid = os.getpid()
        return self

    def _drop_batches_of_replaced_rows(self) -> None:
        """Drop the batches drawn ahead when another process has emptied or restored the
        storage since (``Storage.shared_reset_count``): their rows are gone. A reset in this
        process drops them at once (:mod:`~tdreplay.core.buffer_readers`)."""
        count = self._storage.shared_reset_count()
        # (a first sample knows no shared count yet: nothing was queued)
        if self._reset_count_seen is not None and count != self._reset_count_seen:
            self.clear_prefetch()
        self._reset_count_seen = count

    def _check_writing_process(self) -> None:
        """:class:`NotShareableError` at the first write of a forked child into a buffer it
        cannot share (reading the child's copy, e.g. to save it, stays allowed)."""
        pid = _this_pid
        owner = self._owner_pid
        if owner != pid:
            if owner is not None:
                self.check_shareable()
            self._owner_pid = pid

    def _share_new_transform(self, transform: Transform) -> None:
        """Share a transform about to be added, when the buffer is shared."""
        if self.shared:
            share_transform(transform)

    def check_shareable(self) -> None:
        """:class:`NotShareableError` naming the part (storage, sampler, writer, rate limiter)
        that cannot be used by another process; what the buffer runs when it goes to one."""
        self._storage.check_shareable()
        self._sampler.check_shareable()
        self._writer.check_shareable()
        if self._rate_limiter is not None:
            self._rate_limiter.check_shareable()

    @classmethod
    def as_remote(cls, remote_config: dict[str, Any] | None = None) -> Any:
        """The Ray actor class of this buffer class (needs Ray, e.g. from ``tdreplay-distributed``).

        ``cls.as_remote(remote_config).remote(**kwargs)`` builds the buffer inside a Ray actor;
        its methods are then called as ``actor.extend.remote(data)``. Ray is imported here, on
        first use: tdreplay-core does not depend on it. For a buffer whose components are built
        inside the actor, with timeouts and clear errors, see
        :class:`tdreplay.distributed.RayReplayBuffer`.

        Parameters
        ----------
        remote_config : dict, optional
            Options of ``ray.remote`` (``num_cpus``, ``max_concurrency``, ...).

        Raises
        ------
        ImportError
            Ray is not installed.

        Examples
        --------
        >>> import ray  # doctest: +SKIP
        >>> from tdreplay.core import ListStorage, ReplayBuffer  # doctest: +SKIP
        >>> actor = ReplayBuffer.as_remote({"num_cpus": 0}).remote(  # doctest: +SKIP
        ...     storage=ListStorage(10))
        >>> ray.get(actor.extend.remote([1, 2, 3])).tolist()  # doctest: +SKIP
        [0, 1, 2]
        """
        try:
            import ray
        except ImportError as err:
            raise ImportError(
                f"{cls.__name__}.as_remote needs Ray, which tdreplay-core does not install: "
                "pip install tdreplay-distributed (it depends on ray), or pip install ray."
            ) from err
        return ray.remote(**remote_config)(cls) if remote_config else ray.remote(cls)
