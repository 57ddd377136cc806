"""``RevisionTracking``: the write revision every :class:`~tdreplay.core.Storage` carries.

A storage's :attr:`~RevisionTracking.revision` advances whenever what it holds may have changed,
whichever buffer, process or direct call changed it. Every subclass gets it without code:
``__init_subclass__`` wraps the mutating methods a class defines or takes from a mixin
(:data:`MUTATING_METHODS`), so
a storage of any package advances it from each of them. The cost is one Python call and an
integer increment per mutating call.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["MUTATING_METHODS", "REFUSALS", "RESTORING_METHODS", "RevisionTracking"]

#: the methods that change what a storage holds: a class that defines one gets it wrapped so
#: that each call advances :attr:`RevisionTracking.revision`
MUTATING_METHODS = ("set", "__setitem__", "set_key", "update_", "empty", "load_state_dict",
                    "replace_items", "install")
#: the mutating methods that replace every row of a storage (a restore, an ``empty``): each call
#: also advances :attr:`RevisionTracking.restore_count` and tells the buffers reading the storage
#: (as ``Storage.loads`` does, whichever methods its checkpointer calls)
RESTORING_METHODS = frozenset({"load_state_dict", "empty"})
#: what a storage raises when it refuses what it is given, before it changes anything (bad input
#: leaves it as it was): a restoring call that raises one replaced no row
REFUSALS = (ValueError, TypeError, KeyError, IndexError)


def _advancing_revision(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` that advances the revision when it returns or raises (a refused write changed
    nothing, but one that failed half-way may have: observers re-read either way); a method of
    :data:`RESTORING_METHODS` runs inside :meth:`RevisionTracking._replacing_rows`.

    Only the outermost override advances it: a subclass's ``set`` that calls ``super().set``
    runs two wrapped methods, and the inner one (not what ``type(self)`` resolves ``set`` to)
    leaves the bump to the outer one, so one call advances the revision once (a shared
    storage's bump takes a process lock)."""
    name = method.__name__

    @functools.wraps(method)
    def mutate(self: RevisionTracking, *args: Any, **kwargs: Any) -> Any:
        if getattr(type(self), name) is not mutate:  # called through super() by an override
            return method(self, *args, **kwargs)
        try:
            return method(self, *args, **kwargs)
        finally:
            self.bump_revision()

    @functools.wraps(method)
    def replace_rows(self: RevisionTracking, *args: Any, **kwargs: Any) -> Any:
        if getattr(type(self), name) is not replace_rows:  # (as mutate)
            return method(self, *args, **kwargs)
        with self._replacing_rows():
            try:
                return method(self, *args, **kwargs)
            finally:
                self.bump_revision()

    wrapped = replace_rows if name in RESTORING_METHODS else mutate
    wrapped.advances_revision = True  # type: ignore[attr-defined]
    return wrapped


class RevisionTracking:
    """The write revision of a storage (a base of :class:`~tdreplay.core.Storage`)."""

    _revision: int = 0  # per instance from the first mutation (see revision)
    _restores: int = 0  # per instance from the first restore (see restore_count)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in MUTATING_METHODS:
            # the class's own methods, and those it takes from a base that is no storage (a
            # mixin): a storage base's are wrapped already
            method = getattr(cls, name, None)
            if callable(method) and not getattr(method, "advances_revision", False) \
                    and not getattr(method, "__isabstractmethod__", False):
                setattr(cls, name, _advancing_revision(method))

    @property
    def revision(self) -> int:
        """A counter that changes whenever what the storage holds may have changed: every
        ``set`` (buffer writes included), ``storage[i] = ...``, in-place edits (``set_key``,
        ``update_``), ``empty``, ``load_state_dict`` and ``loads`` advance it, whichever buffer
        or process made the call.

        A sampler (or anything else) that keeps data derived from the stored items can key it
        on ``(storage, storage.revision)``: an equal revision means nothing was written since.
        Only comparisons for equality are meaningful; one operation may advance it by more
        than one. Every subclass gets this for free: its ``set``, ``__setitem__``, ``set_key``,
        ``update_``, ``empty``, ``load_state_dict``, ``replace_items`` and ``install`` are
        wrapped when the class is defined. Code that writes the stored tensors by another way
        (into a ``written_rows()`` view, say) calls :meth:`bump_revision`. Storages shared
        between processes (``LazyMemmapStorage``) keep it in shared memory, so every process
        sees the others' writes.

        Examples
        --------
        >>> from tdreplay.core import ListStorage
        >>> s = ListStorage(4)
        >>> before = s.revision
        >>> s.set(0, "a")
        >>> after_set = s.revision
        >>> s[0] = "b"  # same length, new data
        >>> before != after_set != s.revision, len(s)
        (True, 1)
        """
        return self._revision

    @property
    def restore_count(self) -> int:
        """How many times the storage's rows were replaced wholesale in this process: restored
        (``load_state_dict``, ``loads``) or emptied (``empty``). Something that keeps data
        derived from the rows and is not told of such a reset (the buffers reading the storage
        are: :class:`~tdreplay.core.storage_readers.StorageReaders`) compares it with the count
        it knows of. Only comparisons for equality are meaningful.

        Examples
        --------
        >>> from tdreplay.core import ListStorage
        >>> s = ListStorage(4)
        >>> s.load_state_dict({"storage": [1, 2], "max_size": 4})
        >>> restored = s.restore_count
        >>> s.empty()
        >>> restored != s.restore_count != 0
        True
        """
        return self._restores

    @contextlib.contextmanager
    def _replacing_rows(self) -> Iterator[None]:
        """Around a call that replaces every row (``empty``, a restore): counted in
        :attr:`restore_count` unless it was refused (raised one of :data:`REFUSALS`, which
        change nothing); ``Storage`` also tells the buffers reading the storage."""
        try:
            yield
        except REFUSALS:
            raise
        except BaseException:  # (failed half-way: rows may have changed)
            self._restores += 1
            raise
        self._restores += 1

    def bump_revision(self) -> None:
        """Advance :attr:`revision`: what the storage holds changed by a way the storage's own
        methods did not see (e.g. a write into the tensors of a ``written_rows()`` view).

        Examples
        --------
        >>> from tdreplay.core import ListStorage
        >>> s = ListStorage(4)
        >>> r = s.revision
        >>> s.bump_revision()
        >>> s.revision == r + 1
        True
        """
        self._revision += 1
