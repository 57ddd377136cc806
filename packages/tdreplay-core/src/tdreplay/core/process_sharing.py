"""Refusing to hand a process being started a part whose state lives in this process.

A storage, sampler or writer pickled for a process being started (the ``spawn`` and
``forkserver`` start methods of :mod:`multiprocessing` / :mod:`torch.multiprocessing`) arrives
there as a copy. For a part whose state lives where every process sees it (a memory-mapped
storage, a writer whose counters follow such a storage, a uniform sampler) that copy is the
same part; for one whose state lives in this process's memory (a ``ListStorage``'s list, a
``PrioritizedSampler``'s trees, a ``TensorDictMaxValueWriter``'s heap) the copy's writes and
updates would diverge silently from the original's. :class:`SpawnChecked`, mixed into the bases
:class:`~tdreplay.core.Storage`, :class:`~tdreplay.core.Sampler` and
:class:`~tdreplay.core.Writer`, runs the part's ``check_shareable()`` when it is pickled for a
process being started, which raises :class:`NotShareableError` for such a part, in the parent,
before the child starts. Every other pickling (``pickle.dumps`` for a file, ``copy.deepcopy``,
a queue to a running process, Ray's serialization) is a copy as before.

Examples
--------
>>> import copy, multiprocessing, pickle
>>> from tdreplay.core import ListStorage
>>> storage = ListStorage(4)
>>> len(pickle.loads(pickle.dumps(storage))), len(copy.deepcopy(storage))  # copies
(0, 0)
>>> child = multiprocessing.get_context("spawn").Process(target=len, args=(storage,))
>>> child.start()  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
tdreplay.core.process_sharing.NotShareableError: Cannot share a storage of type ...
"""

from __future__ import annotations

import multiprocessing.context
from typing import Any, SupportsIndex

__all__ = ["NotShareableError", "SpawnChecked", "StorageSpawnChecked", "sending_to_new_process"]


class NotShareableError(RuntimeError):
    """A part of a buffer cannot be shared between processes (the message names it).

    A ``RuntimeError``, as what TorchRL raises there, so ``except RuntimeError`` clauses
    written for TorchRL keep working.

    Examples
    --------
    >>> issubclass(NotShareableError, RuntimeError)
    True
    """


def sending_to_new_process() -> bool:
    """Whether what is being pickled now goes to a process being started (spawn or
    forkserver start method), rather than to a queue, a file or a copy.

    Examples
    --------
    >>> sending_to_new_process()  # nothing is being started here
    False
    """
    return multiprocessing.context.get_spawning_popen() is not None


class SpawnChecked:
    """Runs :meth:`check_shareable` when the object is pickled for a process being started.

    Mixed into :class:`~tdreplay.core.Storage`, :class:`~tdreplay.core.Sampler` and
    :class:`~tdreplay.core.Writer`, which declare the capability (``shareable``) and the
    message that names the remedy for their kind (``not_shareable_message``). The check sits
    in ``__reduce_ex__``, so a subclass's own ``__getstate__`` cannot skip it; any other
    pickling or copy goes through unchecked.

    Examples
    --------
    >>> import copy
    >>> class Heap(SpawnChecked):
    ...     shareable = False
    ...     not_shareable_message = "{cls}: a heap in this process's memory"
    >>> type(copy.deepcopy(Heap())).__name__  # a copy, not for a process being started
    'Heap'
    >>> Heap().check_shareable()  # what pickling it for a process being started runs
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tdreplay.core.process_sharing.NotShareableError: <class '...Heap'>: a heap in this ...
    """

    #: whether another process may use this object (its state lives where every process sees
    #: it); each base declares its own default
    shareable: bool = True
    #: the :class:`NotShareableError` message when it may not (``{cls}``: its class)
    not_shareable_message: str = "{cls} cannot be shared between processes."

    def check_shareable(self) -> None:
        """:class:`NotShareableError` (``not_shareable_message``) unless this object is
        ``shareable``: what pickling it for a process being started runs."""
        if not self.shareable:
            raise NotShareableError(self.not_shareable_message.format(cls=type(self)))

    def __reduce_ex__(self, protocol: SupportsIndex) -> str | tuple[Any, ...]:
        if sending_to_new_process():  # a child being started would get a diverging copy
            self.check_shareable()
        return super().__reduce_ex__(protocol)


class StorageSpawnChecked(SpawnChecked):
    """``shareable`` and :meth:`check_shareable` of :class:`~tdreplay.core.Storage` (mixed
    into it), from the storage's ``process_lock``."""

    process_lock: Any  # declared with its default (None) on Storage
    not_shareable_message = (
        "Cannot share a storage of type {cls} between processes: its items live in this "
        "process's memory, so another process would read and write its own copy. Use a "
        "LazyMemmapStorage or a LazyTensorStorage(shared_init=True).")

    @property
    def shareable(self) -> bool:  # type: ignore[override]  # derived from process_lock
        """Whether other processes may use this storage: its rows, row count and the writer's
        counters live where every process sees them, which a storage declares with a
        ``process_lock`` (``LazyMemmapStorage``, ``LazyTensorStorage(shared_init=True)``).
        ``False`` for a list or a plain tensor storage: a buffer holding one refuses being
        sent to another process, and so does the storage itself when it is pickled for a
        process being started.

        Examples
        --------
        >>> from tdreplay.core import ListStorage
        >>> ListStorage(4).shareable
        False
        """
        return self.process_lock is not None
