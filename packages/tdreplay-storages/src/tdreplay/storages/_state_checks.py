"""Whether a tensor storage can take saved rows, checked before anything changes (no storage
imports): the rows of a checkpoint (:func:`check_rows_fit`) and a whole ``state_dict``
(:func:`check_tensor_state`). Neither lays out a lazy storage: a refused load leaves it as it
was, unlaid included.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tensordict import TensorDictBase

from tdreplay.core.checkpoint import CheckpointError
from tdreplay.core.utils import is_int

from ._formats import DataFormat, tensorclass_name
from ._layout import TensorLayout, as_key
from ._object_values import check_non_tensor_rows
from ._tensorclasses import classes_from_record, inner_first, record_names, with_classes
from .checkpointers import TensorLayoutStorage

__all__ = ["check_rows_fit", "check_tensor_state"]

#: Entries every tensor storage ``state_dict`` holds.
_STATE_KEYS = ("initialized", "len_rows", "storage")


def check_rows_fit(layout: TensorLayout | None, fmt: DataFormat, meta: dict[str, Any],
                   data: TensorDictBase, rows_for: Callable[[Any, bool], int],
                   non_tensor_refusal: str | None = None) -> None:
    """Raise :class:`~tdreplay.core.CheckpointError` unless ``data`` (``meta["len_rows"]`` saved
    rows, ``meta`` a ``layout_meta()`` of the saved storage) fits a storage of ``layout`` and
    data format ``fmt``; ``rows_for(data, batched)`` is the row capacity a lazy storage
    (``layout`` ``None``) would lay out for it; ``non_tensor_refusal``: why the storage keeps
    no non-tensor entries (``None``: it keeps JSON values). Changes nothing.

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> rows = TensorDict({"x": torch.zeros(5)}, [5])
    >>> check_rows_fit(None, DataFormat(), {"len_rows": 5}, rows, lambda data, batched: 4)
    Traceback (most recent call last):
    ...
    tdreplay.core.checkpoint.CheckpointError: checkpoint holds 5 rows, more than the 4 rows ...
    """
    if not isinstance(data, TensorDictBase) or not data.batch_dims:
        hint = (" A TensorDict without one is what a save hook that changes the rows' format "
                "stores (TED2Flat, TED2Nested): load it through the matching load hook "
                "(rb.register_load_hook(Flat2TED()) or Nested2TED())."
                if isinstance(data, TensorDictBase) else "")
        raise CheckpointError(f"checkpoint rows must be a TensorDict with a batch dimension, got "
                              f"{type(data).__name__}.{hint}")
    n = meta["len_rows"]
    if not is_int(n) or data.batch_size[0] != n:
        raise CheckpointError(f"checkpoint data holds {data.batch_size[0]} rows, its metadata "
                              f"says {n!r}.")
    if layout is not None:
        fmt.check_meta(meta)
        layout.check_rows_compatible(data, int(n))
        _check_saved_classes(layout, meta)
        return
    DataFormat.resolve_extra(meta)
    _check_classes_fit(data, meta)
    check_non_tensor_rows(data, non_tensor_refusal)
    try:
        rows = rows_for(data, True)
    except (ValueError, TypeError) as err:
        raise CheckpointError(f"checkpoint rows do not fit this storage: {err}") from err
    if n > rows:
        raise CheckpointError(f"checkpoint holds {n} rows, more than the {rows} rows this "
                              "storage lays out for them.")


def _check_saved_classes(layout: TensorLayout, meta: dict[str, Any]) -> None:
    """:class:`~tdreplay.core.CheckpointError` naming the entry unless the nested
    tensorclasses a checkpoint records (by name) read back as themselves from ``layout``: as
    for a write (:meth:`~._level_classes.LevelClasses.check`), a saved tensorclass where the
    layout holds a plain TensorDict or another class is refused; saved plain TensorDicts
    (a checkpoint without the record included) read back as the layout's classes."""
    held = {path: tensorclass_name(cls) for path, cls in layout.nested_classes.items()}
    for path, name in record_names(meta.get("nested_tensorclasses")).items():
        ours = held.get(path)
        if ours != name and (ours is not None or layout.is_level(path)):
            raise CheckpointError(f"checkpoint entry {as_key(path)!r} holds tensorclass {name}, "
                                  f"this storage {ours or 'a TensorDict'} there.")


def _check_classes_fit(data: TensorDictBase, meta: dict[str, Any]) -> None:
    """:class:`~tdreplay.core.CheckpointError` unless every nested tensorclass a checkpoint
    records can be found here and made from the saved rows ``data`` (its level there, with
    its fields)."""
    classes = classes_from_record(meta.get("nested_tensorclasses"))
    if not classes:
        return
    try:
        # (no rows, a structure of its own: only whether the classes can be made is tried)
        with_classes(data[:0].clone(recurse=False), inner_first(classes))
    except Exception as err:  # what a class raises for entries that are not its fields
        raise CheckpointError(f"checkpoint nested tensorclasses do not fit its rows: "
                              f"{type(err).__name__}: {err}") from err


def check_tensor_state(storage: TensorLayoutStorage,
                       state_dict: dict[str, Any]) -> dict[str, Any] | None:
    """Raise ``ValueError`` naming the entry unless ``storage.load_state_dict(state_dict)`` can
    restore it: entries missing, another ``max_size`` (when recorded), more rows than fit, or
    another layout (kind, keys, row shapes, dtypes). Returns the metadata to
    ``storage.install`` the rows with, ``None`` for the state of a storage never written.
    Changes nothing.

    Examples
    --------
    >>> import torch
    >>> from tdreplay.storages import LazyTensorStorage
    >>> big = LazyTensorStorage(20)
    >>> big.set(slice(0, 15), torch.zeros(15, 3))
    >>> small = LazyTensorStorage(10)
    >>> check_tensor_state(small, big.state_dict())
    Traceback (most recent call last):
    ...
    ValueError: state_dict['max_size'] is 20 but this LazyTensorStorage has max_size=10: ...
    >>> small.initialized
    False
    """
    name = type(storage).__name__
    if not isinstance(state_dict, dict):
        raise ValueError(f"{name} state_dict must be a dict, got {type(state_dict).__name__}.")
    for key in _STATE_KEYS:
        if key not in state_dict:
            raise ValueError(f"{name} state_dict is missing {key!r}.")
    if "max_size" in state_dict:
        max_size = state_dict["max_size"]
        if not is_int(max_size) or int(max_size) != storage.max_size:
            # the writer's cursor wraps at max_size: another capacity would not continue alike
            raise ValueError(f"state_dict['max_size'] is {max_size!r} but this {name} has "
                             f"max_size={storage.max_size}: a buffer of another capacity cannot "
                             "be restored into it.")
    initialized = state_dict["initialized"]
    if not isinstance(initialized, bool) or initialized != (state_dict["storage"] is not None):
        raise ValueError(f"state_dict['initialized'] must be True with saved rows under "
                         f"'storage' and False without, got {initialized!r} with "
                         f"{type(state_dict['storage']).__name__}.")
    if not initialized:
        return None
    len_rows = state_dict["len_rows"]
    if not is_int(len_rows) or int(len_rows) < 0:
        raise ValueError(f"state_dict['len_rows'] must be an int >= 0, got {len_rows!r}.")
    meta = storage.layout_meta()
    meta.update(len_rows=int(len_rows), kind=state_dict.get("kind", meta["kind"]),
                treespec=state_dict.get("treespec"), tensorclass=state_dict.get("tensorclass"),
                lazy_stack=state_dict.get("lazy_stack"),
                nested_tensorclasses=state_dict.get("nested_tensorclasses"))
    try:
        storage.check_layout_compatible(meta, state_dict["storage"])
    except CheckpointError as err:
        raise ValueError(f"state_dict['storage'] does not fit this {name}: "
                         f"{str(err).replace('checkpoint', 'state')}") from err
    return meta
