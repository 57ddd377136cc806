"""In-place edits of the written rows of a tensor storage's entries (imports no storage): the
values ``set_key`` (:func:`write_entry`) and ``update_`` (:func:`checked_updates`) write, each
checked to fit its entry (:func:`fitting_value`) before anything is written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDictBase

from ._casts import check_cast
from ._keys import NestedKey, key_path, leaf_keys

if TYPE_CHECKING:
    from ._layout import TensorLayout

__all__ = ["checked_updates", "fitting_value", "write_entry"]


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
    value = torch.as_tensor(value, device=target.device)
    try:
        fits = torch.broadcast_shapes(value.shape, target.shape) == target.shape
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(f"value of shape {tuple(value.shape)} for key {key!r} does not fit its "
                         f"entry of shape {tuple(target.shape)} (nothing was written).")
    if value.dtype is not target.dtype:
        check_cast(key, value, target.dtype)  # refuses lossy casts, as writes do
        value = value.to(target.dtype)
    return value


def write_entry(td: TensorDictBase, keys: list[NestedKey], key: NestedKey, value: Any,
              rows: int, index: Any = None) -> None:
    """Set entry ``key`` of the first ``rows`` rows of ``td`` (a layout's TensorDict, of the
    leaf keys ``keys``) to ``value`` in place (at ``index`` of those rows when given);
    ``KeyError`` / ``ValueError`` before anything is written.

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
    leaf = td.get(key, None)
    if leaf is None:
        raise KeyError(f"key {key!r} is not in the storage (keys: "
                       f"{[str(k) for k in keys]}).")
    written = leaf[:rows]
    where = "the written rows" if index is None else f"index {index!r}"
    try:  # every check before anything is written: an index out of the written rows
        # raises here, not half-way through an indexed write
        target = written if index is None else written[index]
    except (RuntimeError, IndexError) as err:
        raise ValueError(f"{where} of key {key!r} is not within the {rows} written rows: "
                         f"{err}") from err
    value = fitting_value(key, value, target)
    if index is None:
        written.copy_(value)
    else:
        written[index] = value


def checked_updates(layout: TensorLayout, rows: TensorDictBase, data: Any,
                    keys_to_update: Any = None) -> dict[NestedKey, torch.Tensor]:
    """The values ``update_`` writes into the written ``rows`` of ``layout``: each entry of
    ``data`` the storage has (and ``keys_to_update`` names, a name standing for the entries
    under it), checked by :func:`fitting_value`; every one checked before the caller writes
    any. Entries the storage lacks are skipped, as ``TensorDict.update_`` skips them.

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
    for key in leaf_keys(data):
        path = key_path(key)
        if key in layout.key_set and (
                chosen is None or any(path[:len(c)] == c for c in chosen)):
            values[key] = fitting_value(key, data.get(key), rows.get(key))
    return values
