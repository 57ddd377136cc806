"""In-place edits of the written rows of a tensor storage's entries (imports no storage): the
values ``set_key`` (:func:`entry_edit`), ``update_`` (:func:`checked_updates`) and
``storage[tuple] = ...`` (:func:`index_edit`) write, each checked to fit its entry
(:func:`fitting_value`) before anything is written.

A storage runs each edit in its :class:`EditGuard` (``with storage._edit_guard() as guard``):
once the edit is checked whole, ``guard.record(td, keys, index, rows)`` names the entries and
rows it is about to write, then the edit writes. A single-process storage's guard does nothing;
a storage shared by processes (``LazyMemmapStorage``) holds its lock in it and journals the old
values first, so that an editor that dies half-way leaves no row half edited
(:mod:`~._torn_writes`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from tensordict import TensorDictBase, is_non_tensor, is_tensor_collection

from ._casts import check_cast
from ._keys import TENSOR_KEY, NestedKey, is_key_index, key_path, leaf_keys
from ._source_checks import check_dense

if TYPE_CHECKING:
    from ._layout import TensorLayout

__all__ = ["NO_GUARD", "Edit", "EditGuard", "checked_updates", "entry_edit", "fitting_value",
           "index_edit", "write_entry"]


class Edit(NamedTuple):
    """A checked in-place edit: it writes entries ``keys`` (leaf keys) at ``index`` of the
    written rows (``None``: all of them) when ``write()`` is called."""

    keys: tuple[NestedKey, ...]
    index: Any
    write: Callable[[], Any]


class EditGuard:
    """What a storage runs an in-place edit of its rows in (see the module docstring); this
    one, a single-process storage's (:data:`NO_GUARD`), does nothing."""

    def __enter__(self) -> EditGuard:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        return None

    def record(self, td: TensorDictBase, keys: Sequence[NestedKey], index: Any,
               rows: int) -> None:
        """The edit is about to write entries ``keys`` of ``td`` (the storage's TensorDict) at
        ``index`` of its first ``rows`` rows."""

    def overwrite(self, layout: TensorLayout, rows: int, written: int) -> None:
        """Rows ``[0, rows)`` of ``layout`` (``written`` of them counted) are about to be
        replaced whole (a load)."""


#: the guard of a storage no other process writes or reads
NO_GUARD = EditGuard()


def fitting_value(key: NestedKey, value: Any, target: torch.Tensor) -> torch.Tensor:
    """``value`` as a tensor of ``target``'s dtype and device that broadcasts to its shape;
    ``ValueError`` (another shape) or ``TypeError`` (a lossy cast) naming ``key`` otherwise.

    Examples
    --------
    >>> fitting_value("a", [1, 2], torch.zeros(3, 2)).dtype
    torch.float32
    >>> fitting_value("a", torch.ones(3), torch.zeros(3, 2))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: value of shape (3,) for key 'a' does not fit its entry of shape (3, 2)...
    """
    if isinstance(value, torch.Tensor):  # (a sparse one broke half-way through copy_)
        check_dense(f"value for key {key!r}", value)
    value = torch.as_tensor(value, device=target.device)
    if value.requires_grad:  # a storage holds data, not a graph (see copyable_sources)
        value = value.detach()
    try:
        fits = torch.broadcast_shapes(value.shape, target.shape) == target.shape
    except RuntimeError:
        fits = False
    if not fits:
        where = f"key {key!r}" if key != TENSOR_KEY else "the data"
        raise ValueError(f"value of shape {tuple(value.shape)} for {where} does not fit its "
                         f"entry of shape {tuple(target.shape)} (nothing was written).")
    if value.dtype is not target.dtype:
        check_cast(key, value, target.dtype)  # refuses lossy casts, as writes do
        value = value.to(target.dtype)
    return value


def entry_edit(td: TensorDictBase, keys: list[NestedKey], key: NestedKey, value: Any,
               rows: int, index: Any = None) -> Edit:
    """The checked edit setting entry ``key`` of the first ``rows`` rows of ``td`` (a layout's
    TensorDict, of the leaf keys ``keys``) to ``value`` in place (at ``index`` of those rows
    when given); ``KeyError`` / ``ValueError`` here, before anything is written.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> td = TensorDict({"a": torch.zeros(4)}, [4])
    >>> edit = entry_edit(td, ["a"], "a", 1.0, rows=3, index=slice(1, None))
    >>> edit.keys, td["a"].tolist()
    (('a',), [0.0, 0.0, 0.0, 0.0])
    >>> _ = edit.write()
    >>> td["a"].tolist()
    [0.0, 1.0, 1.0, 0.0]
    """
    leaf = td.get(key, None)
    if leaf is None:
        raise KeyError(f"key {key!r} is not in the storage (keys: "
                       f"{[str(k) for k in keys]}).")
    written = leaf[:rows]
    try:  # every check before anything is written: an index out of the written rows
        # raises here, not half-way through an indexed write
        target = written if index is None else written[index]
    except (RuntimeError, IndexError) as err:
        where = "the written rows" if index is None else f"index {index!r}"
        raise ValueError(f"{where} of key {key!r} is not within the {rows} written rows: "
                         f"{err}") from err
    value = fitting_value(key, value, target)
    path = key_path(key)
    under = tuple(k for k in keys if key_path(k)[:len(path)] == path)
    if index is None:
        return Edit(under, None, lambda: written.copy_(value))
    return Edit(under, index, lambda: written.__setitem__(index, value))


def write_entry(td: TensorDictBase, keys: list[NestedKey], key: NestedKey, value: Any,
                rows: int, index: Any = None) -> None:
    """:func:`entry_edit`, written at once.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> td = TensorDict({"a": torch.zeros(4)}, [4])
    >>> write_entry(td, ["a"], "a", 1.0, rows=3, index=slice(1, None))
    >>> td["a"].tolist()
    [0.0, 1.0, 1.0, 0.0]
    >>> write_entry(td, ["a"], "a", 1.0, rows=3, index=5)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: index 5 of key 'a' is not within the 3 written rows: ...
    """
    entry_edit(td, keys, key, value, rows, index).write()


def index_edit(td: TensorDictBase, key_set: Any, rows: int, index: Any,
               data: TensorDictBase) -> Edit:
    """The checked edit writing ``data`` at ``index`` (a tuple: TensorDict indexing) of the
    first ``rows`` rows of ``td`` (a layout's TensorDict, of the leaf keys ``key_set``):
    every entry of ``data``, checked by :func:`fitting_value` before anything is written.
    An entry ``data`` adds, or data without any entry, is refused (``KeyError`` naming the
    keys; a storage that adds entries, :attr:`~.TensorStorage.adds_entries`, lays the new
    one out beforehand: :func:`~._layout.with_new_entries`); the entries it lacks keep their
    values (a writer's own entry, e.g. ``"index"`` of a ``TensorDictRoundRobinWriter``, which the
    value of ``rb[i] = td`` along ``dim_extend`` keeps as stored).
    ``TypeError`` for a key index (``storage["a",] = ...``: :meth:`set_key` writes an entry).

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> td = TensorDict({"a": torch.zeros(4), "b": torch.zeros(4, 2)}, [4])
    >>> new = TensorDict({"a": torch.ones(2), "b": torch.ones(2, 3)}, [2])
    >>> index_edit(td, {"a", "b"}, 4, (slice(1, 3),), new)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: value of shape (2, 3) for key 'b' does not fit its entry of shape (2, 2)...
    >>> td["a"].tolist()  # nothing written
    [0.0, 0.0, 0.0, 0.0]
    """
    if is_key_index(index):
        raise TypeError(f"storage[{index!r}] = value: a key index selects an entry, not rows "
                        "(set_key(key, value) writes an entry).")
    present = leaf_keys(data)
    unexpected = [key for key in present if key not in key_set]
    if unexpected or not present:  # (its values would be dropped; or nothing written)
        got = set(present)
        raise KeyError(f"data keys do not match the storage: missing "
                       f"{sorted(map(str, set(key_set) - got))}, unexpected "
                       f"{sorted(map(str, unexpected))} (nothing was written).")
    view = td[:rows].select(*present)
    target = view[index]  # (what indexing raises, before anything is written)
    for key in present:
        fitting_value(key, data.get(key), target.get(key))
    source = data.select(*present)
    return Edit(tuple(present), index, lambda: view.__setitem__(index, source))


def checked_updates(layout: TensorLayout, rows: TensorDictBase, data: Any,
                    keys_to_update: Any = None) -> dict[NestedKey, torch.Tensor]:
    """The values ``update_`` writes into the written ``rows`` of ``layout``: each entry of
    ``data`` the storage has (and ``keys_to_update`` names, a name standing for the entries
    under it), checked by :func:`fitting_value`; every one checked before the caller writes
    any. An entry the storage lacks (among those ``keys_to_update`` names) is refused with a
    ``KeyError`` naming it, before anything is written: its values would be lost without a word
    (TorchRL refuses one such entry, ``TensorDict.update_``'s ``KeyError``, but skips it among
    others).

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> from tdreplay.storages._layout import TensorLayout
    >>> layout = TensorLayout(TensorDict({"a": torch.zeros(2), "b": torch.zeros(2)}, [2]),
    ...                       ndim=1, device=torch.device("cpu"))
    >>> new = TensorDict({"a": torch.ones(2), "b": torch.ones(2), "c": torch.ones(2)}, [2])
    >>> sorted(checked_updates(layout, layout.td, new, keys_to_update=["a"]))
    ['a']
    """
    if not isinstance(data, TensorDictBase):
        raise TypeError(f"update_ expects a TensorDict or a dict, got {type(data).__name__}.")
    chosen = None if keys_to_update is None else [key_path(k) for k in keys_to_update]
    values = {}
    unknown = []
    for key in leaf_keys(data):
        path = key_path(key)
        if chosen is not None and not any(path[:len(c)] == c for c in chosen):
            continue
        if key in layout.key_set:
            values[key] = fitting_value(key, data.get(key), rows.get(key))
        elif key not in layout.object_key_set and (
                is_non_tensor(value := data.get(key)) or not is_tensor_collection(value)):
            unknown.append(key)  # (an empty nested TensorDict writes nothing)
    if unknown:
        raise KeyError(
            f"update_: input_dict_or_td has entries {unknown} the storage does not hold (it "
            f"holds {sorted(layout.key_set | layout.object_key_set, key=str)}); nothing was "
            "updated. Write new entries with extend, or leave them out (keys_to_update).")
    return values
