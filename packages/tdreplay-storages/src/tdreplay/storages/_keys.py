"""The keys of a storage's data (imports no storage): a nested key as a tuple of names and back
(:func:`key_path`, :func:`as_key`), the sorted leaf keys of a TensorDict (:func:`leaf_keys`),
the batch dims its nested levels have of their own (:func:`nested_batch_dims`,
:func:`set_nested_batch_dims`), and whether an index selects an entry by key
(:func:`is_key_index`).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import torch
from tensordict import (
    NonTensorData,
    NonTensorStack,
    TensorDict,
    TensorDictBase,
    is_tensor_collection,
)

from tdreplay.core.checkpoint import CheckpointError

__all__ = ["TENSOR_KEY", "NestedDims", "NestedKey", "as_key", "empty_levels", "entry_label",
           "is_key_index", "key_path", "leaf_keys", "nested_batch_dims", "set_nested_batch_dims",
           "warn_empty_levels"]

#: A TensorDict key: a name, or a tuple of names for a nested entry.
NestedKey = str | tuple[str, ...]
#: The batch dims the nested TensorDicts of a layout have past their parent's, by path:
#: ``{("agents",): (3,)}`` for an ``"agents"`` TensorDict of batch size ``[*outer, 3]`` (one
#: entry per agent); levels without dims of their own are left out, except the empty ones
#: (``{("e",): ()}`` for an ``"e"`` TensorDict without entries), which hold no leaf a layout
#: would find them by.
NestedDims = dict[tuple[str, ...], tuple[int, ...]]


#: the key a tensor storage keeps the data of plain tensors under (no key of the user's)
TENSOR_KEY = "_tensor"


def entry_label(key: Any) -> str:
    """How an error names the entry ``key``: ``"entry 'obs'"``, or ``"the data"`` for the
    entry of a storage of plain tensors (:data:`TENSOR_KEY`, which the user never named).

    Examples
    --------
    >>> entry_label("obs"), entry_label(("next", "obs")), entry_label(TENSOR_KEY)
    ("entry 'obs'", "entry ('next', 'obs')", 'the data')
    """
    return "the data" if key == TENSOR_KEY else f"entry {key!r}"


def _is_leaf(cls: type) -> bool:
    """Whether entries of type ``cls`` are leaves of a layout: tensors, and non-tensor data
    (``NonTensorData`` / ``NonTensorStack``: strings and other objects in a TensorDict), which
    tensordict's own ``leaves_only`` keys leave out, so that a tensor storage refuses them by
    name (:func:`~._source_checks.check_source`) instead of dropping them without a word."""
    return not is_tensor_collection(cls) or issubclass(cls, (NonTensorData, NonTensorStack))


def leaf_keys(td: TensorDictBase) -> list[NestedKey]:
    """The leaf keys of ``td`` (nested ones as tuples; non-tensor entries included), sorted by
    their string form."""
    return sorted(td.keys(include_nested=True, leaves_only=True, is_leaf=_is_leaf), key=str)


def warn_empty_levels(td: TensorDictBase, storage: str) -> None:
    """Warn (``UserWarning``) that ``storage`` (its class name: a compressed storage, whose
    rows keep tensors) does not keep the empty nested TensorDicts of ``td``, when it has
    some (TorchRL's storages keep them, and so do tdreplay's other storages)."""
    dropped = empty_levels(td)
    if dropped:
        warnings.warn(
            f"{storage}: entries {dropped} are empty TensorDicts, which this storage does not "
            "keep (it stores tensors): what it reads back lacks them (TorchRL's keeps them; "
            "so do a ListStorage, a LazyStackStorage and the tensor storages).", UserWarning,
            stacklevel=4)


def empty_levels(td: TensorDictBase) -> list[NestedKey]:
    """The keys of the nested TensorDicts of ``td`` that hold no entry at all (``"e":
    TensorDict({}, [n])``), which a layout of leaves does not keep, sorted by their string form.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> empty_levels(TensorDict({"a": torch.zeros(2), "e": TensorDict({}, [2]),
    ...                          "f": {"g": TensorDict({}, [2])}}, [2]))
    [('f', 'g'), 'e']
    """
    return sorted((key for key, value in td.items(include_nested=True)
                   if isinstance(value, TensorDictBase) and not _is_leaf(type(value))
                   and next(iter(value.keys()), None) is None), key=str)


def nested_batch_dims(td: TensorDictBase) -> NestedDims:
    """The batch dims each nested TensorDict (or tensorclass) of ``td`` has past its parent's
    (see :data:`NestedDims`), which a storage keeps: TorchRL's multi-agent data nests
    ``[B, n_agents]`` TensorDicts in ``[B]`` ones.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> td = TensorDict({"agents": TensorDict({"obs": torch.zeros(4, 3, 5)}, [4, 3])}, [4])
    >>> nested_batch_dims(td)
    {('agents',): (3,)}
    >>> nested_batch_dims(TensorDict({"a": torch.zeros(4), "e": TensorDict({}, [4])}, [4]))
    {('e',): ()}
    """
    out: NestedDims = {}
    stack: list[tuple[tuple[str, ...], Any]] = [((), td)]  # (TensorDicts and tensorclasses)
    while stack:
        path, node = stack.pop()
        outer = node.batch_dims
        for name, value in node.items():
            if _is_leaf(type(value)):
                continue
            level = path + (name,)
            extra = tuple(value.batch_size[outer:])
            if extra or next(iter(value.keys()), None) is None:
                out[level] = extra
            stack.append((level, value))
    return out


def set_nested_batch_dims(td: TensorDictBase, nested_dims: NestedDims) -> TensorDictBase:
    """``td`` (built level by level with its parent's batch size) with each nested
    TensorDict given its own batch dims ``nested_dims`` back, in place, and the empty levels
    (which no leaf brought back) made; ``CheckpointError`` where its entries do not have
    them.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> td = TensorDict({("agents", "obs"): torch.zeros(4, 3, 5)}, [4])
    >>> set_nested_batch_dims(td, {("agents",): (3,)})["agents"].batch_size
    torch.Size([4, 3])
    >>> empty = set_nested_batch_dims(td, {("agents",): (3,), ("e",): ()})["e"]
    >>> list(empty.keys()), empty.batch_size
    ([], torch.Size([4]))
    """
    for path in sorted(nested_dims, key=len):  # the empty levels (and theirs), outer first
        node = td
        for name in path:
            child = node.get(name, None)
            if child is None:
                child = TensorDict({}, node.batch_size)
                node.set(name, child)
            elif _is_leaf(type(child)):
                raise CheckpointError(f"checkpoint nested level {path} is missing.")
            node = child
    for path in sorted(nested_dims, key=len, reverse=True):  # inner levels first
        node = td.get(as_key(path), None)
        if node is None or _is_leaf(type(node)):
            raise CheckpointError(f"checkpoint nested level {path} is missing.")
        batch = list(td.batch_size)  # its parents' dims and its own
        for depth in range(1, len(path) + 1):
            batch += nested_dims.get(path[:depth], ())
        try:
            node.batch_size = torch.Size(batch)
        except RuntimeError as err:
            raise CheckpointError(f"checkpoint nested level {path} cannot have the batch dims "
                                  f"{nested_dims[path]}: {err}") from err
    return td


def key_path(key: NestedKey) -> tuple[str, ...]:
    """A (nested) key as a tuple of names."""
    return (key,) if isinstance(key, str) else tuple(key)


def as_key(path: Iterable[str]) -> NestedKey:
    """The key of a tuple of names (a plain string for one name)."""
    path = tuple(path)
    return path[0] if len(path) == 1 else path


def is_key_index(index: Any) -> bool:
    """Whether ``index`` selects an entry by its key (a name, or a tuple of names), not rows.

    Examples
    --------
    >>> is_key_index(("next", "obs")), is_key_index((slice(None), 0))
    (True, False)
    """
    return isinstance(index, str) or (isinstance(index, tuple) and bool(index)
                                      and all(isinstance(part, str) for part in index))
