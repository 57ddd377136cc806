"""How a storage is written into and read from a checkpoint directory.

A :class:`StorageCheckpointerBase` writes a storage's contents into a directory and reads them
back (``ListStorageCheckpointer`` for :class:`~tdreplay.core.ListStorage`; the tensor, memmap
and compressed storages have theirs in ``tdreplay.storages``); it holds the save and load hooks
(TorchRL's ``register_save_hook`` / ``register_load_hook``). :class:`CheckpointedStorage` is
the storage's side: its ``checkpointer``, the hooks it registers there, and ``dumps`` /
``loads``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import torch

from .checkpoint import (
    CheckpointError,
    first_save_unfinished,
    holds_checkpoint_files,
    inside_checkpoint_snapshot,
    open_checkpoint,
    read_json,
    save_torch_file,
    write_checkpoint,
    write_json,
)
from .checkpoint_hooks import HookList
from .item_memory import compact_views
from .utils import is_int

if TYPE_CHECKING:
    from .storage import ListStorage, Storage

# the two checkpointer classes are documented, and imported, with ``tdreplay.core``
__all__ = ["SEAM_FILE", "SEAM_KEY", "CheckpointedStorage", "checked_seam", "checkpoint_files",
           "describe_checkpointer", "saved_by_other_storage"]

StorageT = TypeVar("StorageT", bound="Storage")


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
    >>> from tdreplay.core import ListStorage
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
        raise NotImplementedError(f"{type(self).__name__} implements no dumps(storage, path): "
                                  "a storage checkpointer writes the storage's contents there.")

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
        >>> from tdreplay.core import ListStorage
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
        >>> from tdreplay.core import ListStorage
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
        :class:`~tdreplay.core.checkpoint.CheckpointError` and changes nothing. ``path`` is
        the directory this checkpointer's :meth:`dumps` wrote into, or a checkpoint
        ``storage.dumps`` wrote (its files checked against their CRC-32 first)."""
        with checkpoint_files(path) as files:
            install = self.prepare_load(storage, files)
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
    >>> import tempfile
    >>> from tdreplay.core import ListStorage
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
        save_torch_file(items, path / "items.pt", weights_only=False)  # (any Python items)
        write_json(path / "storage.json", {"class": type(storage).__name__,
                                           "checkpointer": type(self).__name__,
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


def describe_checkpointer(value: Any) -> str:
    """What a refused ``checkpointer`` is, for its error: a class (not an instance), else its
    type.

    Examples
    --------
    >>> describe_checkpointer(ListStorageCheckpointer), describe_checkpointer(3)
    ('the class ListStorageCheckpointer (pass an instance: ListStorageCheckpointer())', 'int')
    """
    if isinstance(value, type):
        return f"the class {value.__name__} (pass an instance: {value.__name__}())"
    return type(value).__name__


def _reads_its_own_files(checkpointer: Any) -> bool:
    """Whether ``checkpointer`` has a ``loads`` of its own (a TorchRL-style checkpointer),
    which reads the directory it is given, not a snapshot of it."""
    return type(checkpointer).loads is not StorageCheckpointerBase.loads


@contextlib.contextmanager
def checkpoint_files(path: str | os.PathLike[str]) -> Iterator[Path]:
    """The directory of a storage checkpoint's files, for reading: the snapshot of ``path``
    (checked, :func:`~tdreplay.core.checkpoint.open_checkpoint`, its lock held until the block
    ends) whenever ``path`` holds files of that format, so that ``open_checkpoint`` refuses
    what is not a committed one (a first save that did not finish, a lost pointer), but for
    one case: plain files (``storage.json``, a checkpoint of an earlier version) beside a
    first save of the format that did not commit, which are still what loads
    (:func:`~tdreplay.core.checkpoint.first_save_unfinished`). Otherwise ``path`` itself,
    whose files were written plainly (by an earlier version, or a checkpointer's own
    ``dumps``). Plain files beside a committed snapshot whose pointer was lost are refused,
    not loaded: they are older than the snapshot.

    Examples
    --------
    >>> import tempfile
    >>> from tdreplay.core import ListStorage
    >>> s = ListStorage(4)
    >>> with tempfile.TemporaryDirectory() as d:
    ...     s.write_files(d)                   # plain files
    ...     with checkpoint_files(d) as files:
    ...         plain = files == Path(d)
    ...     s.dumps(d)                         # a snapshot committed over them
    ...     with checkpoint_files(d) as files:
    ...         print(plain, files.parent == Path(d))
    True True
    """
    path = Path(path)
    plain = (path / "storage.json").exists()
    if holds_checkpoint_files(path) and not (plain and first_save_unfinished(path)):
        with open_checkpoint(path) as snapshot:
            yield snapshot
    else:
        yield path


def saved_by_other_storage(path: str | os.PathLike[str], storage: Any) -> str | None:
    """The error to give when the checkpoint files in ``path`` were written by another storage
    class than ``storage``'s, with another checkpointer than ``storage``'s (``storage.json``
    records both), so ``storage`` cannot read them; ``None`` when they were not, or the files
    do not say (then the checkpointer's own error stands).

    Examples
    --------
    >>> import tempfile
    >>> from tdreplay.core import ListStorage
    >>> from tdreplay.core.checkpoint import write_json
    >>> with tempfile.TemporaryDirectory() as d:
    ...     write_json(Path(d) / "storage.json", {"class": "LazyTensorStorage",
    ...                                           "checkpointer": "TensorStorageCheckpointer"})
    ...     print(saved_by_other_storage(d, ListStorage(4)).split("; ")[1].split(" with ")[0])
    load it into a LazyTensorStorage
    """
    meta_path = Path(path) / "storage.json"
    try:
        meta = read_json(meta_path)
    except CheckpointError:
        return None
    saved_class, saved_checkpointer = meta.get("class"), meta.get("checkpointer")
    mine = type(storage).__name__
    if not isinstance(saved_class, str) or saved_class == mine:
        return None
    if saved_checkpointer == type(storage.checkpointer).__name__:
        return None  # (a storage of the same kind: the checkpointer's own error says why)
    with_checkpointer = (f" with checkpointer={saved_checkpointer}()"
                         if isinstance(saved_checkpointer, str) else "")
    return (f"checkpoint {str(meta_path)!r} was written by a {saved_class}; load it into a "
            f"{saved_class}{with_checkpointer}, not a {mine}.")


#: where a storage's own checkpoints keep its ``last_written_row`` (the ring's seam): the
#: ``state_dict`` entry, and the file beside the checkpointer's files
SEAM_KEY = "last_written_row"
SEAM_FILE = "seam.json"


def checked_seam(value: Any, rows: int | None, where: str,
                 error: type[Exception] = ValueError) -> int | None:
    """``value`` (a saved ``last_written_row``, named ``where`` in errors) if it is ``None`` or a
    row of a storage of ``rows`` rows (``None``: not known yet); ``error`` otherwise. The one
    rule for a storage's own checkpoints and a buffer's.

    Examples
    --------
    >>> checked_seam(3, 8, "state_dict['last_written_row']"), checked_seam(None, 8, "x")
    (3, None)
    >>> checked_seam(8, 8, "state_dict['last_written_row']")
    Traceback (most recent call last):
    ...
    ValueError: state_dict['last_written_row'] must be None or a row of the storage (0 to 7), got 8.
    """
    if value is None or (type(value) is int and value >= 0 and (rows is None or value < rows)):
        return value
    raise error(f"{where} must be None or a row of the storage (0 to "
                f"{'its capacity' if rows is None else rows - 1}), got {value!r}.")


def _state_with_seam(method: Callable[..., Any]) -> Callable[..., Any]:
    """A storage's ``state_dict`` that also holds its ``last_written_row``."""

    @functools.wraps(method)
    def state_dict(self: Any) -> Any:
        state = method(self)
        if isinstance(state, dict):
            state[SEAM_KEY] = self.last_written_row
        return state

    state_dict.keeps_seam = True  # type: ignore[attr-defined]
    return state_dict


def _load_with_seam(method: Callable[..., Any]) -> Callable[..., Any]:
    """A storage's ``load_state_dict`` that restores the ``last_written_row`` saved with it
    (checked before anything loads; a state saved without it, by TorchRL or an earlier version,
    leaves the one the load sets)."""

    @functools.wraps(method)
    def load_state_dict(self: Any, state_dict: Any, *args: Any, **kwargs: Any) -> Any:
        saved = isinstance(state_dict, dict) and SEAM_KEY in state_dict
        try:
            seam = checked_seam(state_dict[SEAM_KEY], self.rows_capacity or self.max_size,
                                f"state_dict[{SEAM_KEY!r}]") if saved else None
        except ValueError:
            self.check_state_dict(state_dict)  # (the state of another capacity: named as such)
            raise
        out = method(self, _without_seam(state_dict), *args, **kwargs)
        if saved:
            self.last_written_row = seam
        return out

    load_state_dict.keeps_seam = True  # type: ignore[attr-defined]
    return load_state_dict


def _without_seam(state_dict: Any) -> Any:
    """``state_dict`` without the entry the wrappers add: a storage class's own methods see the
    state its ``state_dict`` returned."""
    if isinstance(state_dict, dict) and SEAM_KEY in state_dict:
        return {key: value for key, value in state_dict.items() if key != SEAM_KEY}
    return state_dict


def _check_with_seam(method: Callable[..., Any]) -> Callable[..., Any]:
    """A storage's ``check_state_dict`` that checks the saved ``last_written_row`` too, after
    the class's own checks of the rest."""

    @functools.wraps(method)
    def check_state_dict(self: Any, state_dict: Any, *args: Any, **kwargs: Any) -> Any:
        out = method(self, _without_seam(state_dict), *args, **kwargs)
        if isinstance(state_dict, dict) and SEAM_KEY in state_dict:
            checked_seam(state_dict[SEAM_KEY], self.rows_capacity or self.max_size,
                         f"state_dict[{SEAM_KEY!r}]")
        return out

    check_state_dict.keeps_seam = True  # type: ignore[attr-defined]
    return check_state_dict


class CheckpointedStorage:
    """The checkpoint side of a :class:`~tdreplay.core.Storage`: its :attr:`checkpointer`,
    the save / load hooks registered there, and ``dumps`` / ``loads`` through it.

    Every checkpoint of a storage alone keeps its ``last_written_row`` (where the ring is cut:
    the newest row, followed by the oldest), as a buffer's checkpoint does: its
    ``state_dict`` holds it (``"last_written_row"``; each storage class's ``state_dict``,
    ``check_state_dict`` and ``load_state_dict`` are wrapped for it, whichever package defines
    them: the class's own methods never see the entry), ``dumps`` writes it
    beside the checkpointer's files (``seam.json``). Without it, a buffer built on a restored
    storage read a wrapped ring in slot order, and slices, queries and hindsight goals joined
    its newest step to its oldest.
    """

    _checkpointer: StorageCheckpointerBase[Any]
    last_written_row: int | None
    #: whether the storage's checkpoints keep its ``last_written_row`` (``False`` for a storage
    #: of storages, e.g. ``StorageEnsemble``: each member keeps its own)
    saves_seam: bool = True

    if TYPE_CHECKING:  # what the storage this is mixed into provides
        def _replacing_rows(self) -> AbstractContextManager[None]: ...
        def bump_revision(self) -> None: ...
        @property
        def max_size(self) -> int: ...
        @property
        def rows_capacity(self) -> int | None: ...

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # (runs before RevisionTracking's, which then wraps these as mutations: outermost)
        super().__init_subclass__(**kwargs)
        if not cls.saves_seam:
            return
        for name, wrap in (("state_dict", _state_with_seam), ("load_state_dict", _load_with_seam),
                           ("check_state_dict", _check_with_seam)):
            method = cls.__dict__.get(name)  # the class's own (inherited ones are wrapped)
            if callable(method) and not getattr(method, "keeps_seam", False) \
                    and not getattr(method, "__isabstractmethod__", False):
                setattr(cls, name, wrap(method))

    @property
    def checkpointer(self) -> StorageCheckpointerBase[Any]:
        """The object that writes and reads this storage in checkpoints (settable)."""
        return self._checkpointer

    @checkpointer.setter
    def checkpointer(self, value: StorageCheckpointerBase[Any]) -> None:
        if not isinstance(value, StorageCheckpointerBase):
            raise TypeError(f"checkpointer must be a StorageCheckpointerBase, got "
                            f"{describe_checkpointer(value)}.")
        self._checkpointer = value

    def register_save_hook(self, hook: Callable[..., Any]) -> None:
        """Register a save hook on :attr:`checkpointer` (as TorchRL, the hook lives there):
        ``hook(data) -> data`` runs on the contents before they are written (see
        :meth:`StorageCheckpointerBase.register_save_hook`). ``ReplayBuffer.register_save_hook``
        registers here; its ``dumps`` also sets a hook's ``shift`` / ``is_full`` attributes when
        it has them (TorchRL's protocol, used by ``TED2Flat``).

        Examples
        --------
        >>> import torch; from tdreplay.core import ListStorage
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
        >>> import torch; from tdreplay.core import ListStorage
        >>> s = ListStorage(4)
        >>> s.register_save_hook(lambda items: [2 * x for x in items])
        >>> s.apply_save_hooks([1, 2])
        [2, 4]
        """
        return self.checkpointer.apply_save_hooks(data)

    def apply_load_hooks(self, data: Any) -> Any:
        """``data`` passed through every load hook of :attr:`checkpointer`."""
        return self.checkpointer.apply_load_hooks(data)

    def dumps(self, path: str | os.PathLike[str]) -> None:
        """Write the contents into directory ``path`` with :attr:`checkpointer`, atomically.

        The files are written into a new snapshot directory of ``path`` and committed by an
        atomic rename of its pointer file (:func:`~tdreplay.core.checkpoint.write_checkpoint`),
        with the size and CRC-32 of every file: a save that fails midway (a full disk, a
        killed process) leaves the previous checkpoint at ``path`` loadable and intact, and
        :meth:`loads` refuses a damaged file before the storage changes. Called on a path
        inside a snapshot being written (a buffer's ``dumps`` saving its storage), it writes
        the files plainly there (:meth:`write_files`): that snapshot is committed as a whole.
        So it does for a checkpointer with a ``loads`` of its own (TorchRL's way of writing
        one), which reads ``path`` itself.

        Examples
        --------
        >>> import tempfile, torch
        >>> from tdreplay.core import ListStorage
        >>> s = ListStorage(4)
        >>> s.set(torch.arange(2), ["a", "b"])
        >>> with tempfile.TemporaryDirectory() as d:
        ...     s.dumps(d)
        ...     s.set(torch.arange(2), ["c", "d"])
        ...     s.dumps(d)
        ...     t = ListStorage(4)
        ...     t.loads(d)
        >>> t[:]
        ['c', 'd']
        """
        if inside_checkpoint_snapshot(path) or _reads_its_own_files(self.checkpointer):
            self.write_files(path)
            return
        with write_checkpoint(path) as snapshot:
            self.write_files(snapshot)

    def write_files(self, path: str | os.PathLike[str]) -> None:
        """Write the checkpointer's files and ``seam.json`` plainly into directory ``path``
        (created if needed), as :meth:`dumps` does inside a snapshot; :meth:`prepare_load`
        reads such a directory back."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.checkpointer.dumps(self, path)
        if self.saves_seam:
            write_json(path / SEAM_FILE, {SEAM_KEY: self.last_written_row})

    def prepare_load(self, path: str | os.PathLike[str]) -> Callable[[], None]:
        """Read and check ``path``; return a function that installs it (see the checkpointers),
        restores ``last_written_row`` (from ``seam.json``, when the checkpoint has one) and
        advances :attr:`revision`.

        ``path`` is a checkpoint :meth:`dumps` wrote (every file is checked against its size
        and CRC-32 first, :func:`~tdreplay.core.checkpoint.open_checkpoint`), or a directory
        of files written plainly (a buffer's snapshot ``storage/``, or a storage checkpoint
        of an earlier version). A checkpoint another storage class wrote is refused naming
        that class."""
        with checkpoint_files(path) as files:
            return self._prepare_files(files)

    def _prepare_files(self, path: Path) -> Callable[[], None]:
        try:
            install = self.checkpointer.prepare_load(self, path)
        except CheckpointError as err:
            other = saved_by_other_storage(path, self)
            if other is None:
                raise
            raise CheckpointError(other) from err
        saved = self.saves_seam and (path / SEAM_FILE).is_file()
        if saved:
            found = read_json(path / SEAM_FILE)  # (CheckpointError naming it when unreadable)
            if SEAM_KEY not in found:
                raise CheckpointError(f"checkpoint file {str(path / SEAM_FILE)!r} lacks its "
                                      f"{SEAM_KEY!r} entry.")
            seam = checked_seam(found[SEAM_KEY], self.rows_capacity or self.max_size,
                                f"{str(path / SEAM_FILE)!r} {SEAM_KEY}", CheckpointError)

        def commit() -> None:
            with self._replacing_rows():  # (restore_count; the buffers reading it are told)
                try:
                    install()
                    if saved:
                        self.last_written_row = seam
                finally:
                    self.bump_revision()

        return commit

    def loads(self, path: str | os.PathLike[str]) -> None:
        """Restore the contents written by :meth:`dumps` (see :meth:`prepare_load`): a
        missing, damaged or mismatched checkpoint raises
        :class:`~tdreplay.core.checkpoint.CheckpointError` naming the file, and the storage is
        left as it was."""
        with checkpoint_files(path) as files:  # (held while installing: no save removes it)
            self._prepare_files(files)()

    save = dumps
    dump = dumps
    load = loads
