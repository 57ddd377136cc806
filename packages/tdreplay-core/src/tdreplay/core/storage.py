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
import copy
import io
import os
import pickle
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch
from tensordict import LazyStackedTensorDict, is_tensor_collection
from torch.utils._pytree import tree_map  # noqa: PLC2701 (no public pytree in torch 2.13)

from ._compilable import CompilableCount
from .checkpoint import CheckpointError, read_json, save_torch_file, write_json
from .checkpoint_hooks import HookList
from .collate import stack_items
from .item_memory import compact_views, compacted_for_saving
from .process_sharing import StorageSpawnChecked
from .revision import RevisionTracking
from .storage_readers import AttachableStorage
from .utils import as_long_tensor, check_flag, is_int

StorageT = TypeVar("StorageT", bound="Storage")

#: the capacity of a list storage built with ``max_size=None`` (TorchRL's "unlimited")
UNBOUNDED = 2**63 - 1


class StorageIndexError(IndexError, RuntimeError):
    """A write at a row a :class:`ListStorage` cannot address: past its ``max_size``, or
    leaving a gap after its written rows. Nothing is written.

    An ``IndexError`` as tdreplay raised before, and a ``RuntimeError`` as TorchRL's list
    storages raise, so that ``except RuntimeError:`` written for TorchRL keeps working.

    Examples
    --------
    >>> s = ListStorage(2)
    >>> try:
    ...     s.set(5, "x")
    ... except RuntimeError as err:
    ...     print(type(err).__name__, len(s))
    StorageIndexError 0
    """


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


class StorageCheckpointerBase(Generic[StorageT]):
    """Saves and restores a storage's contents in a checkpoint directory.

    A checkpointer implements :meth:`dumps` (write the storage into an existing empty
    directory) and :meth:`prepare_load` (read and validate a directory, returning a function
    that installs what was read). Nothing in the storage may change before that function is
    called, so a bad checkpoint never leaves a half-loaded storage.

    A checkpointer written for TorchRL implements ``loads(storage, path)`` instead of
    :meth:`prepare_load`; it works as it is, but then a buffer's ``loads`` can no longer check
    its storage's part before installing the others: that part is read when it is installed.

    Examples
    --------
    >>> import tempfile
    >>> class Squares(StorageCheckpointerBase):          # TorchRL's two methods
    ...     def dumps(self, storage, path):
    ...         (path / "n.txt").write_text(str(len(storage)))
    ...     def loads(self, storage, path):
    ...         n = int((path / "n.txt").read_text())
    ...         storage.set(torch.arange(n), [i * i for i in range(n)])
    >>> s = ListStorage(8, checkpointer=Squares())
    >>> s.set(torch.arange(3), [0, 0, 0])
    >>> with tempfile.TemporaryDirectory() as d:
    ...     s.dumps(d)
    ...     restored = ListStorage(8, checkpointer=Squares())
    ...     restored.loads(d)
    >>> restored.get(torch.arange(3))
    [0, 1, 4]
    """

    def __init__(self) -> None:
        self._save_hook_list = HookList()
        self._load_hook_list = HookList()

    def dumps(self, storage: StorageT, path: Path) -> None:
        """Write ``storage``'s content into the directory ``path`` (which exists), for
        :meth:`loads` to read back; a checkpointer implements it (TorchRL's abstract
        method)."""
        raise NotImplementedError

    # ---- hooks (TorchRL's register_save_hook / register_load_hook) ----------------------------
    def _hooks(self, attr: str) -> HookList:
        # made on first use: a subclass whose __init__ does not call this one's has them too
        hooks = vars(self).get(attr)
        if hooks is None:
            hooks = HookList()
            setattr(self, attr, hooks)
        return hooks

    def register_save_hook(self, hook: Callable[..., Any]) -> None:
        """Register ``hook(data) -> data``, run on the storage's contents before they are
        written; what it returns is what the checkpoint holds.

        Hooks run in registration order, before the checkpointer writes any file, on what the
        checkpointer saves: the written rows for tensor storages (a TensorDict of batch shape
        ``[rows, *inner]``, a view: return new tensors rather than changing them in place),
        the list of items for list storages. A hook that declares a ``path`` parameter (as
        TorchRL's do) is also given the directory being written. A hook that raises stops
        the save: nothing of the new checkpoint is committed, and the storage is unchanged.
        ``Storage.register_save_hook`` and ``ReplayBuffer.register_save_hook`` register here,
        on the storage's checkpointer: giving the storage another checkpointer leaves the
        hooks with this one (as TorchRL).

        Examples
        --------
        >>> import tempfile
        >>> ckpt = ListStorageCheckpointer()
        >>> ckpt.register_save_hook(lambda items: [x * 10 for x in items])
        >>> s = ListStorage(4, checkpointer=ckpt)
        >>> s.set(torch.arange(2), [1, 2])
        >>> with tempfile.TemporaryDirectory() as d:
        ...     s.dumps(d)
        ...     t = ListStorage(4)
        ...     t.loads(d)
        >>> t[:], s[:]
        ([10, 20], [1, 2])
        """
        self._hooks("_save_hook_list").append(hook)

    def register_load_hook(self, hook: Callable[..., Any]) -> None:
        """Register ``hook(data) -> data``, run on what a checkpoint holds after it is read;
        what it returns is what the storage gets.

        Hooks run in registration order while the checkpoint is read and checked, before
        anything of the storage changes: a hook that raises leaves the storage as it was. A
        hook that declares an ``out`` parameter (TorchRL's) gets ``out=None``: it never writes
        into the live storage, whose rows change only once everything is read and checked.

        Examples
        --------
        >>> import tempfile
        >>> s = ListStorage(4)
        >>> s.set(torch.arange(2), [1, 2])
        >>> t = ListStorage(4)
        >>> t.checkpointer.register_load_hook(lambda items: [x + 1 for x in items])
        >>> with tempfile.TemporaryDirectory() as d:
        ...     s.dumps(d)
        ...     t.loads(d)
        >>> t[:]
        [2, 3]
        """
        self._hooks("_load_hook_list").append(hook)

    @property
    def save_hooks(self) -> tuple[Callable[..., Any], ...]:
        """The save hooks, in registration order."""
        return self._hooks("_save_hook_list").as_tuple()

    @property
    def load_hooks(self) -> tuple[Callable[..., Any], ...]:
        """The load hooks, in registration order."""
        return self._hooks("_load_hook_list").as_tuple()

    def apply_save_hooks(self, data: Any, *, path: Path | None = None) -> Any:
        """``data`` passed through every save hook (``path``: the directory being written,
        given to hooks that declare it): what a checkpointer writes."""
        return self._hooks("_save_hook_list").run(data, path=path)

    def apply_load_hooks(self, data: Any) -> Any:
        """``data`` passed through every load hook (``out=None`` to hooks that declare it):
        what a checkpointer installs."""
        return self._hooks("_load_hook_list").run(data, out=None)

    def prepare_load(self, storage: StorageT, path: Path) -> Callable[[], None]:
        """Read and check ``path``; return the function that installs it into ``storage``.

        The base serves a checkpointer that implements TorchRL's :meth:`loads` instead: the
        function it returns calls that ``loads`` (nothing is read before)."""
        if type(self).loads is StorageCheckpointerBase.loads:
            raise NotImplementedError(f"{type(self).__name__} implements neither prepare_load "
                                      "nor TorchRL's loads(storage, path).")
        return partial(self.loads, storage, path)

    def loads(self, storage: StorageT, path: str | os.PathLike[str]) -> None:
        """Restore ``storage`` from directory ``path`` (TorchRL's entry point): read and check
        it all (:meth:`prepare_load`), then install it; a damaged checkpoint raises
        :class:`~tdreplay.core.checkpoint.CheckpointError` and changes nothing."""
        install = self.prepare_load(storage, Path(path))
        try:
            install()
        finally:
            storage.bump_revision()

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class ListStorageCheckpointer(StorageCheckpointerBase["ListStorage"]):
    """Checkpointer of :class:`ListStorage`: saves the list of items with ``torch.save``.

    Items are arbitrary Python objects, so loading unpickles: load only checkpoints you trust.
    Tensors that share memory are saved once and share it again once loaded: items that are
    rows of one batch (``list(td.unbind(0))``, ``LazyStackStorage.extend``) take the batch's
    size, where pickling each (the format of 0.4.0, still loaded) saved the whole batch with
    every row. Items that view a much larger tensor (a few rows kept of a large batch) are
    saved as copies of the views (:func:`~tdreplay.core.item_memory.compact_views`), not
    with the whole tensor.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> s = ListStorage(4)
    >>> s.set(torch.arange(2), ["a", "b"])
    >>> with tempfile.TemporaryDirectory() as d:
    ...     s.dumps(d)
    ...     t = ListStorage(4)
    ...     t.loads(d)
    >>> t.get(torch.tensor([1, 0]))
    ['b', 'a']
    """

    def dumps(self, storage: ListStorage, path: Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        items = self.apply_save_hooks(compact_views(storage.items()), path=path)
        save_torch_file(items, path / "items.pt")
        write_json(path / "storage.json", {"class": type(storage).__name__,
                                           "max_size": storage.max_size, "len": len(items)})

    def prepare_load(self, storage: ListStorage, path: Path) -> Callable[[], None]:
        path = Path(path)
        meta_path = path / "storage.json"
        meta = read_json(meta_path)
        max_size, length = meta.get("max_size"), meta.get("len")
        if not is_int(max_size) or not is_int(length):
            raise CheckpointError(f"checkpoint file {str(meta_path)!r} lacks integer 'max_size' "
                                  "and 'len' entries.")
        if max_size != storage.max_size:
            # the writer's cursor wraps at max_size: another capacity would not continue alike
            raise CheckpointError(
                f"checkpoint storage has max_size={max_size} but this storage has "
                f"max_size={storage.max_size} ({str(meta_path)!r})."
            )
        items_path = path / "items.pt"
        try:
            if items_path.is_file():  # documented: load trusted checkpoints only
                items = torch.load(items_path, weights_only=False)
            else:  # (the pickle of a checkpoint written by 0.4.0)
                items_path = path / "items.pkl"
                with open(items_path, "rb") as f:
                    items = pickle.load(f)
        except Exception as err:  # any unreadable file is a damaged checkpoint
            raise CheckpointError(
                f"checkpoint file {str(items_path)!r} is unreadable: {err!r}") from err
        if not isinstance(items, list) or len(items) != length or length > max_size:
            raise CheckpointError(
                f"checkpoint file {str(items_path)!r} does not hold the list of {length} items "
                f"{meta_path.name} announces.")
        items = self.apply_load_hooks(items)

        def commit() -> None:
            storage.replace_items(items)

        return commit


def _describe(value: Any) -> str:
    """What a refused ``checkpointer`` is: a class (not an instance), else its type."""
    if isinstance(value, type):
        return f"the class {value.__name__} (pass an instance: {value.__name__}())"
    return type(value).__name__


class Storage(StorageSpawnChecked, RevisionTracking, CompilableCount, AttachableStorage, abc.ABC):
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
    _default_checkpointer: type[StorageCheckpointerBase[Any]] = StorageCheckpointerBase

    def __init__(self, max_size: int,
                 checkpointer: StorageCheckpointerBase[Any] | None = None,
                 compilable: bool = False) -> None:
        if not is_int(max_size) or int(max_size) <= 0:
            raise ValueError(f"max_size must be a positive int, got {max_size!r}.")
        #: TorchRL's ``compilable`` flag (see the class docstring)
        self.compilable = check_flag(compilable, "compilable")
        if checkpointer is not None and not isinstance(checkpointer, StorageCheckpointerBase):
            raise TypeError(f"checkpointer must be a StorageCheckpointerBase instance (or None), "
                            f"got {_describe(checkpointer)}.")
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
        """Shape of the storage's leading dimensions (``[rows, *inner]``), or ``None`` where
        it has none (a list) or is not known yet (a lazy storage before its first write)."""
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

    # ---- geometry --------------------------------------------------------------------------------
    @property
    def rows_capacity(self) -> int | None:
        """Capacity along the leading dimension (``None`` while a lazy layout is unknown)."""
        return self.max_size

    def rows_capacity_for(self, data: Any, batched: bool) -> int:
        """Capacity along the leading dimension once ``data`` is written.

        Lazy storages lay out from the first write, so they compute it from ``data``.
        """
        return self.max_size

    @property
    def row_numel(self) -> int:
        """Slots per row (1 when ``ndim == 1``)."""
        return 1

    @property
    def initialized(self) -> bool:
        """Whether the storage layout exists (lazy storages lay out on the first write)."""
        return True

    def rows_to_slots(self, rows: torch.Tensor) -> torch.Tensor:
        """Flat slots covered by ``rows``: shape ``[*rows.shape, *inner]``."""
        return rows

    def valid_slots_mask(self, slots: torch.Tensor) -> torch.Tensor:
        """Boolean mask of ``slots`` that hold written data."""
        return (slots >= 0) & (slots < len(self))

    def __contains__(self, index: int | torch.Tensor) -> bool | torch.Tensor:
        """``index in storage``: :meth:`contains` (whether the slot holds written data), as
        TorchRL's, not a search of the stored values.

        Examples
        --------
        >>> s = ListStorage(10)
        >>> s.set(torch.tensor([0, 1]), ["a", "b"])
        >>> 1 in s, 2 in s, "a" in s.items()
        (True, False, True)
        """
        return self.contains(index)

    def __iter__(self) -> Iterator[Any]:
        """The written rows in slot order, ``storage[i]`` for ``i`` in ``range(len(storage))``
        (TorchRL's); a storage of several dims (``ndim > 1``, whose ``len`` counts slots and
        ``storage[i]`` indexes its first dim) gives each slot's item, ``storage.get(i)``.

        Examples
        --------
        >>> s = ListStorage(10)
        >>> s.set(torch.tensor([0, 1]), ["a", "b"])
        >>> list(s)
        ['a', 'b']
        """
        read = self.__getitem__ if self.ndim == 1 else self.get
        for i in range(len(self)):
            yield read(i)

    def contains(self, index: int | torch.Tensor) -> bool | torch.Tensor:
        """Whether the slot ``index`` holds written data (TorchRL's ``storage.contains``).

        A negative int counts from the end of the written slots, as for a list. A tensor of
        slots gives a boolean tensor of its shape (:meth:`valid_slots_mask`).

        Examples
        --------
        >>> s = ListStorage(10)
        >>> s.contains(0)
        False
        >>> s.set(0, "a")
        >>> s.contains(0), s.contains(-1), s.contains(1)
        (True, True, False)
        >>> s.contains(torch.tensor([0, 1, 9])).tolist()
        [True, False, False]
        """
        if isinstance(index, torch.Tensor) and index.ndim:
            return self.valid_slots_mask(index)
        if not is_int(index):
            raise TypeError(f"index must be an int or an integer tensor, got "
                            f"{type(index).__name__}.")
        slot = int(index)
        if slot < 0:
            slot += len(self)
        return bool(self.valid_slots_mask(torch.tensor([slot]))[0])

    def default_collate(self, data: Any) -> Any:
        """How a buffer turns what :meth:`get` returned into a batch (identity by default)."""
        return data

    def index_to_rows(self, index: Any, value: Any = None) -> torch.Tensor:
        """Rows a user index (int, slice, integer or boolean tensor) selects on dim 0.

        Indices are resolved against the *written* rows, as reads are, so ``rb[i] = x`` writes
        where ``rb[i]`` reads: ``-1`` is the last written row and ``rb[:]`` all written rows.
        Integer indices must address written rows (``extend`` adds rows); a slice with an
        explicit stop past them (``write_all`` of more rows than are written) reaches up to the
        capacity, without leaving a gap. ``value`` (what is being written) lays out a lazy
        storage's capacity before its first write.
        """
        if isinstance(index, tuple):
            index = index[0] if index else slice(None)
        numel = self.row_numel
        n = len(self) // numel if numel else 0
        if isinstance(index, slice):
            stop = index.stop
            if stop is None or stop <= n:
                return torch.arange(*index.indices(n))
            cap = self.rows_capacity
            if cap is None:
                cap = self.rows_capacity_for(value, batched=True) if value is not None else 0
            step = 1 if index.step is None else index.step
            start = 0 if index.start is None else index.start
            start = max(start + n, 0) if start < 0 else start
            if step <= 0 or start > n:
                raise IndexError(f"index {index} would write past the {n} written rows with a "
                                 "gap or backwards: use extend to add rows.")
            return torch.arange(start, min(stop, cap), step)
        if isinstance(index, torch.Tensor) and index.dtype is torch.bool:
            if index.ndim != 1 or index.shape[0] != n:  # as torch: a mask covers every row
                raise IndexError(f"a boolean index must have one entry per written row ({n}), "
                                 f"got shape {tuple(index.shape)}.")
            rows = index.nonzero().squeeze(-1)
        else:
            rows = as_long_tensor(index, name="index").reshape(-1)
        rows = torch.where(rows < 0, rows + n, rows)
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= n):
            raise IndexError(f"index {index!r} is out of range: {n} rows are written (index "
                             "assignment overwrites written rows; extend adds rows).")
        return rows

    def __setitem__(self, index: Any, value: Any) -> None:
        """Write ``value`` at the rows selected by ``index`` (see :meth:`index_to_rows`)."""
        rows = self.index_to_rows(index, value)
        # an in-place edit: the writer's cursor, and the newest row of the ring, stay
        if is_int(index):
            self.set(int(rows[0]), value, set_cursor=False)
        elif isinstance(index, slice) and rows.numel() > 1 and int(rows[1] - rows[0]) == 1:
            self.set(slice(int(rows[0]), int(rows[-1]) + 1), value, set_cursor=False)
        else:
            self.set(rows, value, set_cursor=False)

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

    # ---- hooks and checkpoints -------------------------------------------------------------------
    @property
    def checkpointer(self) -> StorageCheckpointerBase[Any]:
        """The object that writes and reads this storage in checkpoints (settable)."""
        return self._checkpointer

    @checkpointer.setter
    def checkpointer(self, value: StorageCheckpointerBase[Any]) -> None:
        if not isinstance(value, StorageCheckpointerBase):
            raise TypeError(f"checkpointer must be a StorageCheckpointerBase, got "
                            f"{_describe(value)}.")
        self._checkpointer = value

    def register_save_hook(self, hook: Callable[..., Any]) -> None:
        """Register a save hook on :attr:`checkpointer` (as TorchRL, the hook lives there):
        ``hook(data) -> data`` runs on the contents before they are written (see
        :meth:`StorageCheckpointerBase.register_save_hook`). ``ReplayBuffer.register_save_hook``
        registers here; its ``dumps`` also sets a hook's ``shift`` / ``is_full`` attributes when
        it has them (TorchRL's protocol, used by ``TED2Flat``).

        Examples
        --------
        >>> s = ListStorage(4)
        >>> s.register_save_hook(lambda items: items[::-1])
        >>> s.checkpointer.save_hooks == s.save_hooks, len(s.save_hooks)
        (True, 1)
        """
        self.checkpointer.register_save_hook(hook)

    def register_load_hook(self, hook: Callable[..., Any]) -> None:
        """Register a load hook on :attr:`checkpointer`: ``hook(data) -> data`` runs on what a
        checkpoint holds before it is installed (see
        :meth:`StorageCheckpointerBase.register_load_hook`)."""
        self.checkpointer.register_load_hook(hook)

    @property
    def save_hooks(self) -> tuple[Callable[..., Any], ...]:
        """The save hooks of :attr:`checkpointer`, in registration order."""
        return self.checkpointer.save_hooks

    @property
    def load_hooks(self) -> tuple[Callable[..., Any], ...]:
        """The load hooks of :attr:`checkpointer`, in registration order."""
        return self.checkpointer.load_hooks

    def apply_save_hooks(self, data: Any) -> Any:
        """``data`` passed through every save hook of :attr:`checkpointer`.

        Examples
        --------
        >>> s = ListStorage(4)
        >>> s.register_save_hook(lambda items: [2 * x for x in items])
        >>> s.apply_save_hooks([1, 2])
        [2, 4]
        """
        return self.checkpointer.apply_save_hooks(data)

    def apply_load_hooks(self, data: Any) -> Any:
        """``data`` passed through every load hook of :attr:`checkpointer`."""
        return self.checkpointer.apply_load_hooks(data)

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

    def dumps(self, path: str | os.PathLike[str]) -> None:
        """Write the contents into directory ``path`` with :attr:`checkpointer`."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.checkpointer.dumps(self, path)

    def prepare_load(self, path: str | os.PathLike[str]) -> Callable[[], None]:
        """Read and check ``path``; return a function that installs it (see the checkpointers)
        and advances :attr:`revision`."""
        install = self.checkpointer.prepare_load(self, Path(path))

        def commit() -> None:
            try:
                install()
            finally:
                self.bump_revision()

        return commit

    def loads(self, path: str | os.PathLike[str]) -> None:
        """Restore the contents written by :meth:`dumps`."""
        try:
            self.prepare_load(path)()
        finally:
            self._restores += 1  # (restore_count: whichever methods the checkpointer calls)

    save = dumps
    dump = dumps
    load = loads

    def __repr__(self) -> str:
        return f"{type(self).__name__}(max_size={self.max_size}, len={len(self)})"


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
            if isinstance(cursor, slice):
                rows_list = range(*cursor.indices(self.max_size))  # within [0, max_size)
            else:
                rows_list = as_long_tensor(cursor, name="cursor").reshape(-1).tolist()
            if is_tensor_collection(data) or isinstance(data, torch.Tensor):
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
        bad = [r for r in rows_list if not 0 <= r < self.max_size]
        if bad:
            raise StorageIndexError(f"rows {bad[:5]} out of range for a ListStorage of "
                                    f"max_size {self.max_size}.")
        n = len(self._storage)
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
        slots = written_slots(as_long_tensor(index, name="index"), n)  # (no boolean masks)
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
        return self.get(as_long_tensor(index, name="index"))

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
        items = state_dict.get("storage")
        if not isinstance(items, list):
            raise ValueError(f"{type(self).__name__} state_dict needs a 'storage' list.")
        unknown = sorted(map(str, set(state_dict) - set(self.state_entries)))
        if unknown:  # (e.g. a CompressedListStorage's "codec": its items are compressed rows)
            raise ValueError(f"state_dict has entries {unknown} that a {type(self).__name__} "
                             "never saves: it is the state of another kind of storage.")
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
