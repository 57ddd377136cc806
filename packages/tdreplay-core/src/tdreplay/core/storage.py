"""The :class:`Storage` contract and the default :class:`ListStorage`.

Index spaces
------------
A storage holds ``max_size`` *slots*. With ``ndim == 1`` a slot is a row. With ``ndim > 1``
the storage has shape ``[rows, *inner]`` (``inner`` = the ``ndim - 1`` dimensions after the
batch dimension of the written data) and slots are the flat C-order positions in that shape.
Writers address *rows* (the leading dimension); samplers address *slots*. Everything a user
sees from the sampling side (``index`` in samples, ``update_priority``) is in slots.
"""

from __future__ import annotations

import abc
import contextlib
import copy
import io
import pickle
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import LazyStackedTensorDict, is_tensor_collection
from torch.utils._pytree import tree_map  # noqa: PLC2701 (no public pytree in torch 2.13)

from ._compilable import CompilableCount
from .collate import ItemRows, stack_items
from .item_memory import compact_views, compacted_for_saving
from .process_sharing import StorageSpawnChecked
from .revision import RevisionTracking
from .state_dict_checkpointer import StateDictCheckpointer
from .storage_checkpointer import (
    CheckpointedStorage,
    ListStorageCheckpointer,
    StorageCheckpointerBase,
    describe_checkpointer,
)
from .storage_indexing import StorageIndexError, StorageIndexing
from .storage_readers import AttachableStorage
from .utils import ShapeMismatchError, as_long_tensor, check_flag, is_int

#: the capacity of a list storage built with ``max_size=None`` (TorchRL's "unlimited")
UNBOUNDED = 2**63 - 1


def _nested_items(items: list[Any], slots: list[Any]) -> list[Any]:
    """``items`` at ``slots`` (nested lists of ints), in lists of the same shape whose rows
    are :class:`~tdreplay.core.collate.ItemRows` (what ``default_collate`` stacks in that
    shape)."""
    return [ItemRows(_nested_items(items, row)) if isinstance(row, list) else items[row]
            for row in slots]


def written_slots(index: Any, n: int, capacity: int | None = None) -> torch.Tensor:
    """The int64 slots ``index`` names among ``n`` written slots, as a storage's ``get``
    reads them: ints, sequences and tensors of ints, negative ones counting from the last
    written slot (``-1`` is slot ``n - 1``, as TorchRL's ``get`` of a full storage and as
    ``storage[-1]``), or a boolean mask (of any shape) with one entry per written slot, or
    per slot of the ``capacity`` (TorchRL's masks), marking written slots only. ``IndexError``
    for anything outside, ``TypeError`` for what is no index.

    Examples
    --------
    >>> written_slots(torch.tensor([0, -1]), 5).tolist(), written_slots(-2, 5).tolist()
    ([0, 4], 3)
    >>> written_slots(torch.tensor([True, False, True]), 3).tolist()
    [0, 2]
    >>> written_slots(torch.tensor([True, False]), 3)
    Traceback (most recent call last):
    ...
    IndexError: a boolean index must have one entry per written slot (3), got shape (2,).
    >>> written_slots([1, 5], 3)
    Traceback (most recent call last):
    ...
    IndexError: slots must lie in [-3, 3) (the written slots), got values in [1, 5].
    """
    if type(index) is torch.Tensor and index.dtype is torch.long:  # (what samplers draw)
        slots = index
    elif isinstance(index, torch.Tensor) and index.dtype is torch.bool:
        if index.numel() not in (n, capacity):
            per = f"written slot ({n})" if capacity in (None, n) \
                else f"written slot ({n}) or per slot ({capacity})"
            raise IndexError(f"a boolean index must have one entry per {per}, got shape "
                             f"{tuple(index.shape)}.")
        slots = index.reshape(-1).nonzero().reshape(-1)
    else:
        slots = as_long_tensor(index, name="index")
    if slots.numel():
        lo_hi = torch.aminmax(slots)
        lo, hi = int(lo_hi[0]), int(lo_hi[1])
        if lo < -n or hi >= n:
            raise IndexError(f"slots must lie in [{-n}, {n}) (the written slots), got values "
                             f"in [{lo}, {hi}].")
        if lo < 0:
            slots = torch.where(slots < 0, slots + n, slots)
    return slots


def _list_mask_rows(index: Any, n: int, max_size: int, name: str) -> torch.Tensor | None:
    """The rows a boolean mask ``index`` marks in a :class:`ListStorage` holding ``n`` items, as
    torch's ``t[mask]`` selects them (an int64 tensor, in row order); ``None`` when ``index``
    is no mask (ints, rows). As the tensor storages' masks, it is 1-D with one entry per
    written row or per slot of ``max_size``, and marks written rows only. ``IndexError``
    naming ``name`` otherwise, and ``TypeError`` for a ``uint8`` tensor or array (torch reads
    it as a mask, TorchRL's list storage as rows).

    Examples
    --------
    >>> _list_mask_rows(torch.tensor([True, False, True]), 3, 8, "index").tolist()
    [0, 2]
    >>> _list_mask_rows(torch.tensor([0, 2]), 3, 8, "index") is None
    True
    >>> _list_mask_rows(torch.tensor([True, False]), 3, 8, "cursor")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    IndexError: cursor is a boolean mask of shape (2,): it must be 1-D with one entry per ...
    """
    dtype = getattr(index, "dtype", None)
    if dtype is torch.uint8 or (isinstance(index, np.ndarray) and dtype == np.uint8):
        if index.size if isinstance(index, np.ndarray) else index.numel():
            raise TypeError(f"{name} must hold int rows or be a torch.bool mask, got uint8 "
                            "values (torch reads them as a mask, TorchRL's ListStorage as "
                            "rows): give .bool() for a mask, .long() for rows.")
        return None
    if dtype is not torch.bool or not isinstance(index, torch.Tensor):
        return None
    if index.ndim != 1 or index.shape[0] not in (n, max_size):
        per = f"written row ({n})" if max_size in (n, UNBOUNDED) \
            else f"written row ({n}) or per slot of max_size ({max_size})"
        raise IndexError(f"{name} is a boolean mask of shape {tuple(index.shape)}: it must be "
                         f"1-D with one entry per {per}; nothing was read or written.")
    rows = index.nonzero().reshape(-1).cpu()
    if rows.numel() and int(rows[-1]) >= n:
        raise IndexError(f"{name} marks rows {rows[rows >= n][:5].tolist()} of max_size "
                         f"{max_size}, which are not written ({n} rows are): a mask selects "
                         "written rows (extend adds rows); nothing was read or written.")
    return rows


class Storage(StorageSpawnChecked, RevisionTracking, CompilableCount, AttachableStorage,
              StorageIndexing, CheckpointedStorage, abc.ABC):
    """A container of ``max_size`` slots that a writer fills and a sampler reads.

    Contract:

    - ``set(cursor, data)`` writes ``data`` (batched along its first dimension when ``cursor``
      is a slice/tensor/sequence of rows, one item when ``cursor`` is an int) at the rows
      ``cursor`` names. It validates ``data`` first and raises before changing anything.
    - ``get(index)`` returns the items at the flat slots ``index`` (an int or an integer tensor
      of any shape); the result's batch shape is ``index.shape``.
    - ``len(storage)`` is the number of written slots; ``storage[i]`` indexes the written rows
      (``storage[10:]`` is empty while fewer than 11 rows are written).
    - ``state_dict()`` / ``load_state_dict()``, ``dumps(path)`` / ``loads(path)`` (through
      :attr:`checkpointer`) save and restore the whole contents.

    Every storage accepts TorchRL's ``compilable`` keyword (a bool, kept as
    :attr:`compilable`). Writes, reads and samples are the same with either value. As
    TorchRL's, ``compilable=True`` lets ``torch.compile`` trace ``extend`` + ``sample`` without
    recompiling at each new count: ``TensorStorage`` / ``LazyTensorStorage`` then keep their
    written-row count in a 0-dim tensor (:meth:`written_slots_tensor`); other storages keep a
    plain int (a ``LazyMemmapStorage`` shares it between processes through its own files).

    Examples
    --------
    The contract on :class:`ListStorage` (a storage written from scratch is shown under
    :meth:`__getitem__`):

    >>> s = ListStorage(3)
    >>> s.set(torch.arange(2), ["a", "b"])
    >>> s.set(2, "c", set_cursor=False)
    >>> len(s), s.get(torch.tensor([2, 0])), s[1:]
    (3, ['c', 'a'], ['b', 'c'])
    """

    ndim: int = 1
    _default_checkpointer: type[StorageCheckpointerBase[Any]] = StateDictCheckpointer

    def __init__(self, max_size: int,
                 checkpointer: StorageCheckpointerBase[Any] | None = None,
                 compilable: bool = False) -> None:
        if not is_int(max_size) or int(max_size) <= 0:
            raise ValueError(f"max_size must be a positive int, got {max_size!r}.")
        #: TorchRL's ``compilable`` flag (see the class docstring)
        self.compilable = check_flag(compilable, "compilable")
        if checkpointer is not None and not isinstance(checkpointer, StorageCheckpointerBase):
            raise TypeError(f"checkpointer must be a StorageCheckpointerBase instance (or None), "
                            f"got {describe_checkpointer(checkpointer)}.")
        self.max_size = int(max_size)
        self._checkpointer = (checkpointer if checkpointer is not None
                              else self._default_checkpointer())

    @property
    def max_size(self) -> int:
        """The capacity in slots, fixed when the storage is built (TorchRL lets it be assigned
        and then fails at the next write; here an assignment of another value is refused,
        before it could be saved with a checkpoint the storage does not match).

        Examples
        --------
        >>> s = ListStorage(4)
        >>> s.max_size = 8
        Traceback (most recent call last):
        ...
        AttributeError: max_size is fixed when a storage is built (4 here, got 8): build ...
        """
        try:
            return self._max_size
        except AttributeError:  # a storage pickled when max_size was a plain attribute
            return int(self.__dict__["max_size"])

    @max_size.setter
    def max_size(self, value: int) -> None:
        current = self.__dict__.get("_max_size", self.__dict__.get("max_size"))
        if current is not None and value != current:
            raise AttributeError(f"max_size is fixed when a storage is built ({current} here, "
                                 f"got {value!r}): build a new storage of the capacity you want "
                                 "and extend it with this one's rows (its writer's cursor wraps "
                                 "at the old size).")
        self._max_size = int(value)

    # ---- contract --------------------------------------------------------------------------------
    @abc.abstractmethod
    def set(self, cursor: int | slice | torch.Tensor | Sequence[int], data: Any, *,
            set_cursor: bool = True) -> None:
        """Write ``data`` at ``cursor``: the rows (leading-dimension positions) to write.

        ``set_cursor`` (TorchRL's keyword): whether this write is the writer's, made at its
        cursor. The writer holds the cursor; a storage records only the row such a write
        reached last (:attr:`last_written_row`, where the ring is cut). An in-place edit
        (``storage[i] = x``, ``rb[i] = x``) writes with ``set_cursor=False`` and leaves it.
        """

    @abc.abstractmethod
    def get(self, index: int | torch.Tensor) -> Any:
        """Read the items at the flat slots ``index``."""

    def get_trusted(self, index: torch.Tensor) -> Any:
        """Read the items at the slots ``index`` that a sampler just drew from this storage's
        written slots (in range by construction): what a buffer calls instead of :meth:`get`
        for a sampler that declares :attr:`~tdreplay.core.Sampler.draws_written_slots`.

        A storage may skip checking the slots again (``TensorStorage`` does); the default is
        :meth:`get`, checks included. Slots that do not come from such a sampler must go
        through :meth:`get`.

        Examples
        --------
        >>> s = ListStorage(4)
        >>> s.set(torch.arange(2), ["a", "b"])
        >>> s.get_trusted(torch.tensor([1, 0]))
        ['b', 'a']
        """
        return self.get(index)

    @abc.abstractmethod
    def __len__(self) -> int:
        """Number of written slots."""

    def __getitem__(self, index: Any) -> Any:
        """Index the written rows: what :meth:`get` returns for the slots ``index`` names (an
        int, a tensor of slots, or a slice of the written ones). The storages of tdreplay
        override it; a storage written for TorchRL (``set``, ``get``, ``__len__``, ...) reads
        through it as TorchRL's base class does.

        Examples
        --------
        >>> class Squares(Storage):   # the least a storage implements
        ...     def __init__(self): super().__init__(4); self.n = 0
        ...     def set(self, cursor, data, *, set_cursor=True): self.n = 4
        ...     def get(self, index): return torch.as_tensor(index) ** 2
        ...     def __len__(self): return self.n
        ...     def empty(self): self.n = 0
        ...     def state_dict(self): return {}
        ...     def load_state_dict(self, state_dict): pass
        >>> s = Squares()
        >>> s.set(0, None)
        >>> s[1:3], s[3]
        (tensor([1, 4]), tensor(9))
        """
        if isinstance(index, slice):
            index = torch.arange(len(self))[index]
        return self.get(index)

    @abc.abstractmethod
    def empty(self) -> None:
        """Forget every written item (``ReplayBuffer.empty`` calls it under the buffer lock)."""

    @contextlib.contextmanager
    def _replacing_rows(self) -> Iterator[None]:
        """Around a call that replaces every row (``empty``, a restore): it runs under the lock
        of the buffers reading the storage (none reads a row half-replaced), which then hear
        of it (:meth:`~tdreplay.core.storage_readers.StorageReaders.tell_rows_replaced`), and
        it counts in :attr:`restore_count`. A call refused before it changed anything (one of
        :data:`~tdreplay.core.revision.REFUSALS`) tells no one."""
        readers = self._readers  # (None: no buffer reads the storage)
        if readers is None or not self.tells_readers_of_resets:
            with super()._replacing_rows():
                yield
            return
        with readers.lock:
            outermost = not self._rows_being_replaced  # (a restore that calls load_state_dict)
            self._rows_being_replaced = True
            restores = self._restores
            try:
                with super()._replacing_rows():  # (counts it unless it was refused)
                    yield
            finally:
                if outermost:
                    self._rows_being_replaced = False
                    if self._restores != restores:
                        readers.tell_rows_replaced(self)

    _rows_being_replaced = False  # (set under the readers' lock by _replacing_rows)
    #: whether a reset of this storage (``empty``, a restore) runs under the lock of the
    #: buffers reading it and tells each of them at once. A storage made of other storages
    #: (``StorageEnsemble``) says ``False``: each member tells its own buffers, and the buffer
    #: reading the whole follows the resets from :attr:`restore_count`, at its next call
    tells_readers_of_resets: bool = True

    #: A re-entrant lock shared between processes (``acquire()`` / ``release()``), for storages
    #: whose rows other processes write too (e.g. ``LazyMemmapStorage``); the buffer holds it
    #: around every write and read of rows. ``None``: it lives in one process (not shareable).
    process_lock: Any = None

    #: The write generation of every row (:class:`~tdreplay.core.generations.SlotGenerations`),
    #: or ``None`` until a writer built with ``track_generations=True`` writes here. It lives
    #: on the storage so that every buffer sharing the storage sees the others' writes.
    slot_generations: Any = None

    #: Whether :meth:`~tdreplay.core.ReplayBuffer.update_if_present` can patch entries of
    #: stored rows in place (through :meth:`set_key`): storages of TensorDicts.
    supports_conditional_update: bool = False

    #: Whether ``set`` of one item keeps the object it is given (a ``ListStorage``), not a copy
    #: of its values: ``TensorDictReplayBuffer.add`` then writes a shallow copy, as TorchRL's,
    #: so that entries the caller sets in its TensorDict afterwards (``env.step(td)``) stay out
    #: of the stored item.
    keeps_written_objects: bool = False

    #: The row the writer wrote last (a full ring's newest row: the row after it is the
    #: oldest), or ``None`` before any write or where the storage does not record it: ``set``
    #: records it unless ``set_cursor=False`` (an in-place edit); a buffer saves it with its
    #: checkpoints and restores it (a round-robin writer restored alone sets it from its
    #: cursor). The slice samplers, HER, ``Sequence``
    #: sample units and ``rb.query`` cut trajectories there, as at TorchRL's cursor.
    last_written_row: int | None = None

    def shared_writer_counters(self) -> Any:
        """An int64 array ``[cursor, write_count]`` in memory shared between processes, or
        ``None`` (the default) to keep a writer's counters in the writer.

        A storage written by several processes returns one, so that every process's writer
        continues from the same position.
        """
        return None

    def shared_reset_count(self) -> int | None:
        """How many times the rows were replaced wholesale (``empty``, ``load_state_dict``, a
        checkpoint's rows installed), counted in memory shared between the processes that hold
        the storage; ``None`` (the default) for a storage that lives in one process.

        A reset by another process cannot be told from the writer's counters
        (:meth:`shared_writer_counters`): an ``empty`` followed by as many writes as were made
        before leaves them where they were. What a process keeps about the rows (the priority
        trees of a ``sync=False`` prioritized buffer) compares this count with the one it saw
        last: a change means the rows it knew are gone, whoever replaced them. Only comparisons
        for equality are meaningful. Storages shared between processes
        (``LazyMemmapStorage``, ``LazyTensorStorage(shared_init=True)``) return an int.

        Examples
        --------
        >>> ListStorage(4).shared_reset_count() is None  # lives in one process
        True
        """
        return None

    @property
    def shape(self) -> torch.Size | None:
        """Shape of the storage's leading dimensions (``[rows, *inner]``; ``[max_size]`` for a
        list), or ``None`` where it has none or is not known yet (a lazy storage before its
        first write)."""
        return None

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to restore the storage."""

    @abc.abstractmethod
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Raise ``ValueError`` naming the field when :meth:`load_state_dict` would refuse
        ``state_dict`` (another capacity, too many rows, a missing entry); changes nothing.

        ``ReplayBuffer.load_state_dict`` calls it before any component changes. The base
        checks nothing: a storage whose ``load_state_dict`` validates only while it loads
        should override it.

        Examples
        --------
        >>> state = {"storage": [1, 2], "max_size": 8}
        >>> ListStorage(4).check_state_dict(state)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: state_dict['max_size'] is 8 but this ListStorage has max_size=4: ...
        """
        return None

    def saved_rows(self, state_dict: dict[str, Any]) -> int | None:
        """Rows written in a ``state_dict`` that :meth:`check_state_dict` accepted (``None``
        where the storage cannot tell): ``load_state_dict`` of a buffer checks the writer's
        saved cursor against it (:meth:`~tdreplay.core.Writer.check_saved_rows`).

        Examples
        --------
        >>> ListStorage(4).saved_rows({"storage": [1, 2], "max_size": 4})
        2
        """
        return None

    def default_collate(self, data: Any) -> Any:
        """How a buffer turns what :meth:`get` returned into a batch (identity by default)."""
        return data

    def set_key(self, key: Any, value: Any, index: Any = None) -> None:
        """Set entry ``key`` in place at ``index`` (all written rows when None)."""
        raise TypeError(f"{type(self).__name__} keeps its items as objects, not in columns of "
                        "entries: set_/set_at_ need a TensorStorage (e.g. LazyTensorStorage).")

    def update_(self, data: Any, clone: bool = False, keys_to_update: Any = None) -> None:
        """Update the written rows in place from ``data``."""
        raise TypeError(f"{type(self).__name__} keeps its items as objects, not in columns of "
                        "entries: update_ needs a TensorStorage (e.g. LazyTensorStorage).")

    @property
    def device(self) -> torch.device:
        """Device where the data lives."""
        return torch.device("cpu")

    def flatten(self) -> Storage:
        """This storage seen with one dimension (TorchRL's ``storage.flatten()``): the storage
        itself when ``ndim == 1``; storages with more dimensions that can be flattened
        (tensor storages) override it, the others raise ``RuntimeError``.

        Examples
        --------
        >>> s = ListStorage(4)
        >>> s.flatten() is s
        True
        """
        if self.ndim == 1:
            return self
        raise RuntimeError(f"storage.flatten is not supported for storages of type "
                           f"{type(self).__name__} when ndim > 1 (ndim={self.ndim}).")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(max_size={self.max_size}, len={len(self)})"


def _list_slice_rows(cursor: slice, written: int, max_size: int, count: int) -> range:
    """The rows a slice names in a list storage holding ``written`` items, given ``count``
    items to write, as TorchRL's list storages (a Python list's slice assignment) take it: an
    open end and negative bounds count from the written items; a slice of step 1 that reaches
    past them appends what is left of the ``count`` items (up to ``max_size``). It never
    drops items: fewer items than the written rows it covers are refused by the caller.

    Examples
    --------
    >>> _list_slice_rows(slice(2, None), 4, 8, 2), _list_slice_rows(slice(None, None, 2), 4, 8, 2)
    (range(2, 4), range(0, 4, 2))
    >>> _list_slice_rows(slice(4, None), 4, 8, 2), _list_slice_rows(slice(2, None), 4, 8, 3)
    (range(4, 6), range(2, 5))
    >>> _list_slice_rows(slice(-1, None), 4, 8, 2), _list_slice_rows(slice(4, 12), 4, 8, 2)
    (range(3, 5), range(4, 6))
    """
    start, stop, step = cursor.indices(written)
    if step > 0 and cursor.start is not None and cursor.start >= written:
        start = min(cursor.start, max_size)  # (a gap: refused by the caller)
    if step == 1 and (cursor.stop is None or cursor.stop > written):
        return range(start, max(stop, min(start + count, max_size)))
    return range(start, stop, step)


class ListStorage(Storage):
    """A storage of arbitrary Python objects kept in a list.

    Parameters
    ----------
    max_size : int or None
        Capacity in items. ``None`` (the default, as TorchRL's ``ListStorage()``) makes it
        unbounded (``2**63 - 1`` items): nothing is ever overwritten. A buffer built without a
        storage gets ``ListStorage(1000)``, as TorchRL's.
    checkpointer : StorageCheckpointerBase, optional
        Defaults to :class:`ListStorageCheckpointer`.
    compilable : bool
        Accepted as in TorchRL; no effect (see :class:`Storage`).
    device : torch.device, str or int, optional
        Where written items go, as TorchRL's: each is moved there with ``.to(device)`` (its
        tensors, for a list, tuple or dict) before it is stored. ``None`` (the default): items
        are stored as they are given.

    Examples
    --------
    >>> s = ListStorage(3)
    >>> s.set(torch.tensor([0, 1]), ["a", {"b": 1}])
    >>> len(s), s.get(1), s[0:5]
    (2, {'b': 1}, ['a', {'b': 1}])
    >>> s = ListStorage(3, device="cpu")
    >>> s.set(0, {"x": torch.zeros(2, dtype=torch.float64)})
    >>> s.get(0)["x"].device
    device(type='cpu')
    """

    _default_checkpointer = ListStorageCheckpointer
    keeps_written_objects = True
    _item_device: torch.device | None = None  # (set by __init__; a storage pickled before has none)

    #: the entries of this storage's :meth:`state_dict`; :meth:`check_state_dict` refuses a
    #: state with others (another kind of storage's, e.g. a compressed one's ``"codec"``)
    state_entries: tuple[str, ...] = ("storage", "max_size")

    def __init__(self, max_size: int | None = None,
                 checkpointer: StorageCheckpointerBase[Any] | None = None, *,
                 compilable: bool = False,
                 device: torch.device | str | int | None = None) -> None:
        super().__init__(UNBOUNDED if max_size is None else max_size, checkpointer,
                         compilable=compilable)
        #: where written items go (``None``: they stay where they are)
        self._item_device = None if device is None else torch.device(device)
        self._storage: list[Any] = []

    @property
    def device(self) -> torch.device:
        """Where written items go (``device=``); the CPU when they are stored as given."""
        return self._item_device or torch.device("cpu")

    @property
    def shape(self) -> torch.Size:
        """``[max_size]``, written or not, as TorchRL's (a list has no other dims).

        >>> ListStorage(4).shape
        torch.Size([4])
        """
        return torch.Size([self.max_size])

    def _to_device(self, data: Any) -> Any:
        """``data`` on the ``device`` given (its tensors, for a pytree), as TorchRL's
        ``ListStorage`` moves what it stores."""
        device = self._item_device
        if device is None:
            return data
        if hasattr(data, "to"):
            return data.to(device)
        return tree_map(lambda x: x.to(device) if hasattr(x, "to") else x, data,
                        is_leaf=is_tensor_collection)

    def set(self, cursor: int | slice | torch.Tensor | Sequence[int], data: Any, *,
            set_cursor: bool = True) -> None:
        if set_cursor is not True and set_cursor is not False:  # (one check when a bool)
            check_flag(set_cursor, "set_cursor")
        data = self._to_device(data)
        rows_list: Sequence[int]
        if is_int(cursor):
            rows_list = [int(cursor)]
            items = [data]
        else:
            if not isinstance(cursor, slice):  # (a mask: the written rows it marks)
                rows = _list_mask_rows(cursor, len(self._storage), self.max_size, "cursor")
                if rows is None:
                    rows = as_long_tensor(cursor, name="cursor")
                rows_list = rows.reshape(-1).tolist()
            if is_tensor_collection(data) or isinstance(data, torch.Tensor):
                if not (data.batch_dims if is_tensor_collection(data) else data.ndim):
                    raise ShapeMismatchError(
                        f"{type(self).__name__}.set with several rows needs data batched "
                        f"along dim 0 (one item a row), got a {type(data).__name__} without "
                        "dims: give one row (an int cursor) or a batch; nothing was written.")
                items = list(data.unbind(0))
                if isinstance(data, LazyStackedTensorDict):
                    # unbind hands back the stacked TensorDicts themselves: keep shallow copies,
                    # so entries later set on the caller's data ("index") stay out of storage
                    items = [item.copy() for item in items]
            elif isinstance(data, (list, range)):
                items = list(data)
            else:
                raise TypeError(
                    "ListStorage.set with several rows expects a list, a range, a tensor or a "
                    f"TensorDict batched along dim 0, got {type(data).__name__} (tuples are "
                    "pytrees, which ListStorage does not split: use a list of items)."
                )
            if isinstance(cursor, slice):
                rows_list = _list_slice_rows(cursor, len(self._storage), self.max_size,
                                             len(items))
            if len(items) != len(rows_list):
                raise ValueError(f"got {len(items)} items for {len(rows_list)} rows.")
            if isinstance(rows_list, range) and rows_list.step == 1:
                # a block (what extend writes): one slice assignment, no per-row checks
                if rows_list and rows_list.start > len(self._storage):
                    self._raise_gap(list(rows_list[:5]))
                self._storage[rows_list.start:rows_list.stop] = items
                if rows_list and set_cursor:
                    self.last_written_row = rows_list[-1]
                return
        n = len(self._storage)
        if any(r < 0 for r in rows_list):  # from the last written item, as TorchRL's list
            rows_list = [r + n if -n <= r < 0 else r for r in rows_list]
        bad = [r for r in rows_list if not 0 <= r < self.max_size]
        if bad:
            raise StorageIndexError(f"rows {bad[:5]} out of range for a {type(self).__name__} of "
                                    f"max_size {self.max_size} holding {n} items.")
        appended = sorted({r for r in rows_list if r >= n})
        if appended != list(range(n, n + len(appended))):
            self._raise_gap(appended[:5])
        self._storage.extend([None] * len(appended))
        for r, item in zip(rows_list, items):
            self._storage[r] = item
        if rows_list and set_cursor:
            self.last_written_row = rows_list[-1]

    def _raise_gap(self, rows: list[int]) -> None:
        raise StorageIndexError(
            f"ListStorage is filled without gaps: cannot write rows {rows} while "
            f"{len(self._storage)} rows are written."
        )

    def get(self, index: int | slice | torch.Tensor) -> Any:
        n = len(self._storage)
        if is_int(index):
            slot = int(index)
            if not -n <= slot < n:
                raise IndexError(f"slot {slot} is not written (len={n}).")
            return self._storage[slot]  # (-1: the last written item, as storage[-1])
        if isinstance(index, slice):  # of the written items, as TorchRL's get (and storage[a:b])
            return self._storage[index]
        if type(index) is torch.Tensor and index.dtype is torch.long:  # (what samplers draw)
            slots = written_slots(index, n)
        else:  # a mask: the written rows it marks, as torch's t[mask]
            rows = _list_mask_rows(index, n, self.max_size, "index")
            slots = rows if rows is not None else written_slots(
                as_long_tensor(index, name="index"), n)
        if slots.ndim > 1:  # items in the index's shape: lists of lists (the batch's shape)
            return _nested_items(self._storage, slots.tolist())
        return [self._storage[s] for s in slots.reshape(-1).tolist()]

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self._storage[index]
        n = len(self._storage)
        if is_int(index):
            item = int(index)
            if not -n <= item < n:
                raise IndexError(f"index {item} is out of range: it is not written "
                                 f"({n} items are).")
            return self.get(item % n)  # rb[-1]: the last written item, as for a list
        rows = _list_mask_rows(index, n, self.max_size, "index")  # (a mask: the rows it marks)
        return self.get(rows if rows is not None else as_long_tensor(index, name="index"))

    def __setitem__(self, index: Any, value: Any) -> None:
        """Write ``value`` at the written rows ``index`` selects (ints, a slice, or a boolean
        mask with one entry per written row, as ``storage[mask]`` reads them).

        Examples
        --------
        >>> s = ListStorage(4)
        >>> s.set(range(3), ["a", "b", "c"])
        >>> s[torch.tensor([True, False, True])] = ["A", "C"]
        >>> s[torch.tensor([False, True, True])], s[:]
        (['b', 'C'], ['A', 'b', 'C'])
        """
        _list_mask_rows(index, len(self._storage), self.max_size, "index")  # (uint8: refused)
        super().__setitem__(index, value)

    def default_collate(self, data: Any) -> Any:
        return stack_items(data)

    def __len__(self) -> int:
        return len(self._storage)

    def empty(self) -> None:
        self._storage = []
        self.last_written_row = None

    def __getstate__(self) -> dict[str, Any]:
        """The storage's attributes, items that view a much larger tensor compacted
        (:func:`~tdreplay.core.item_memory.compact_views`). Items that share memory (rows
        of one batch: ``extend`` of a TensorDict, ``list(t.unbind(0))``) and hold only
        tensors, TensorDicts and builtin containers are written by ``torch.save``, which
        writes a memory once where pickle writes it with every row (2,000 rows of 16 bytes
        made 64 MB); any other items are pickled as they are (a class of the user's script
        stays pickled by value under cloudpickle / Ray)."""
        state = self.__dict__.copy()
        items, shared = compacted_for_saving(state.pop("_storage"))
        if not shared:  # (pickled as they are: any pickler's rules)
            state["_storage"] = items
            return state
        written = io.BytesIO()
        try:
            torch.save(items, written)
        except (pickle.PicklingError, TypeError, AttributeError):
            state["_storage"] = items
        else:
            state["_saved_items"] = written.getvalue()
        return state

    def __deepcopy__(self, memo: dict[int, Any]) -> ListStorage:
        """A copy of every attribute, items included, by ``copy.deepcopy`` itself: its memo
        keeps the sharing of the items' tensors (rows of one batch, a tensor also held
        elsewhere in the copied object) at no ``torch.save`` (which pickling uses) cost."""
        copied = type(self).__new__(type(self))
        memo[id(self)] = copied
        copied.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return copied

    def __setstate__(self, state: dict[str, Any]) -> None:
        saved = state.pop("_saved_items", None)
        if saved is not None:  # written by __getstate__ of this class, not a foreign file
            state["_storage"] = torch.load(io.BytesIO(saved), weights_only=False)
        self.__dict__.update(state)

    def items(self) -> list[Any]:
        """A new list of the written items, in row order (what checkpointers save).

        Examples
        --------
        >>> s = ListStorage(3)
        >>> s.set(torch.tensor([0, 1]), ["a", "b"])
        >>> s.items()
        ['a', 'b']
        """
        return list(self._storage)

    def replace_items(self, items: Sequence[Any]) -> None:
        """Make ``items`` the written rows (what checkpointers install); ``ValueError`` when
        they do not fit in ``max_size``."""
        if len(items) > self.max_size:
            raise ValueError(f"items holds {len(items)} items; max_size is {self.max_size}.")
        self._storage = [self._to_device(item) for item in items]

    def state_dict(self) -> dict[str, Any]:
        """``{"storage": items, "max_size": capacity}`` (items that view a much larger tensor
        as copies of the views: :func:`~tdreplay.core.item_memory.compact_views`)."""
        return {"storage": compact_views(list(self._storage)), "max_size": self.max_size}

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Refuse a ``state_dict`` of another capacity, with more items than fit, or with
        entries this storage never saves.

        A ``state_dict`` without ``"max_size"`` (written before it was recorded) is checked
        for its number of items only.

        Examples
        --------
        >>> s = ListStorage(2)
        >>> s.check_state_dict({"storage": [1, 2, 3], "max_size": 2})
        Traceback (most recent call last):
        ...
        ValueError: state_dict['storage'] holds 3 items; this ListStorage has max_size=2.

        A state with entries a ``ListStorage`` never saves (another storage kind's) is refused
        too:

        >>> s.check_state_dict({"storage": [], "max_size": 2, "codec": "zstd"})
        ... # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: state_dict has entries ['codec'] that a ListStorage never saves: ...
        """
        if not isinstance(state_dict, dict):
            raise ValueError(f"{type(self).__name__} state_dict must be a dict, got "
                             f"{type(state_dict).__name__}.")
        unknown = sorted(map(str, set(state_dict) - set(self.state_entries)))
        if unknown:  # (e.g. a CompressedListStorage's "codec": its items are compressed rows)
            raise ValueError(f"state_dict has entries {unknown} that a {type(self).__name__} "
                             "never saves: it is the state of another kind of storage.")
        items = state_dict.get("storage")
        if not isinstance(items, list):
            raise ValueError(f"{type(self).__name__} state_dict needs a 'storage' list.")
        if "max_size" in state_dict:
            max_size = state_dict["max_size"]
            if not is_int(max_size) or int(max_size) != self.max_size:
                # the writer's cursor wraps at max_size: another capacity would not continue
                # alike (the next extend would overwrite live rows while others stay empty)
                raise ValueError(
                    f"state_dict['max_size'] is {max_size!r} but this {type(self).__name__} has "
                    f"max_size={self.max_size}: a buffer of another capacity cannot be restored "
                    "into it.")
        if len(items) > self.max_size:
            raise ValueError(f"state_dict['storage'] holds {len(items)} items; this "
                             f"{type(self).__name__} has max_size={self.max_size}.")

    def saved_rows(self, state_dict: dict[str, Any]) -> int:
        return len(state_dict["storage"])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.check_state_dict(state_dict)
        self._storage = [self._to_device(item) for item in state_dict["storage"]]
