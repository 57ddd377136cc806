"""Non-tensor entries of a tensor storage, as values (no storage imports).

A TensorDict holds strings and other objects as ``NonTensorData`` (one value for every element
of its batch) or ``NonTensorStack`` (one value per element). A tensor storage keeps such an
entry in a column of Python objects (a numpy object array); this module turns entries into
such arrays and back, and into JSON for checkpoints:

- :func:`json_value`: a value checked to be JSON (``str``, ``int``, ``float``, ``bool``,
  ``None``, lists and dicts of those), copied; ``TypeError`` naming the entry otherwise. Only
  such values are kept, so that every checkpoint of a tensor storage loads without unpickling
  and gives back equal values.
- :func:`values_of`: a ``NonTensorData`` / ``NonTensorStack`` as an object array of a given
  shape, every value checked; :func:`entry_of`: an object array as what tensordict's
  indexing returns (``NonTensorData`` for one element, a ``NonTensorStack`` for a batch).
- :func:`split_non_tensor` / :func:`add_non_tensor`: the non-tensor entries of a TensorDict
  of rows as JSON-ready data, and back.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase

from tdreplay.core.checkpoint import CheckpointError

from ._layout import NestedKey, as_key, key_path, leaf_keys

__all__ = ["add_non_tensor", "check_non_tensor_rows", "entry_of", "is_non_tensor", "json_value",
           "non_tensor_keys", "put_entry", "split_non_tensor", "values_of"]

#: Types of the JSON values kept as they are (immutable).
_SCALARS = (str, int, float, bool, type(None))
#: What a refusal suggests instead.
_ELSEWHERE = "use ListStorage or LazyStackStorage for other objects"
#: Version of the JSON a checkpoint holds the columns in (:func:`split_non_tensor`).
FORMAT = 1


def is_non_tensor(value: Any) -> bool:
    """Whether ``value`` is a non-tensor entry of a TensorDict (``NonTensorData`` /
    ``NonTensorStack``).

    Examples
    --------
    >>> is_non_tensor(NonTensorData("a")), is_non_tensor(TensorDict())
    (True, False)
    """
    return isinstance(value, (NonTensorData, NonTensorStack))


def non_tensor_keys(td: TensorDictBase) -> list[NestedKey]:
    """The keys of ``td``'s non-tensor entries, sorted as :func:`~._layout.leaf_keys` sorts.

    Examples
    --------
    >>> td = TensorDict({"a": 1.0, "t": "x", ("n", "s"): "y"}, [])
    >>> non_tensor_keys(td)
    [('n', 's'), 't']
    """
    return [key for key in leaf_keys(td) if is_non_tensor(td.get(key))]


def json_value(key: NestedKey, value: Any) -> Any:
    """``value`` (of entry ``key``) copied, checked to be JSON: ``str``, ``int``, ``float``,
    ``bool``, ``None``, and lists and dicts (with string keys) of those. ``TypeError`` naming
    ``key`` otherwise (a tuple too: it would come back from JSON as a list).

    Examples
    --------
    >>> json_value("t", {"a": [1, "b", None]})
    {'a': [1, 'b', None]}
    >>> json_value("t", (1, 2))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: entry 't' holds a value of type tuple ((1, 2)): a tensor storage keeps ...
    """
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is list:
        return [json_value(key, item) for item in value]
    if kind is dict and all(type(name) is str for name in value):
        return {name: json_value(key, item) for name, item in value.items()}
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    raise TypeError(f"entry {key!r} holds a value of type {kind.__name__} ({shown}): a tensor "
                    "storage keeps "
                    "non-tensor values that JSON holds (str, int, float, bool, None, lists and "
                    f"dicts of those, dict keys str); {_ELSEWHERE}.")


def _nested_values(key: NestedKey, nested: Any, shape: tuple[int, ...]) -> np.ndarray:
    """The values of nested lists ``shape`` deep as an object array of ``shape``, checked."""
    out = np.empty(shape, dtype=object)
    flat = out.reshape(-1)
    stack: list[tuple[Any, int]] = [(nested, 0)]
    values: list[Any] = []
    while stack:  # depth first, in order: the values come out row-major
        node, depth = stack.pop()
        if depth == len(shape):
            values.append(node)
            continue
        if type(node) is not list or len(node) != shape[depth]:
            raise ValueError(f"entry {key!r} does not hold {shape} values.")
        stack.extend((item, depth + 1) for item in reversed(node))
    for i, value in enumerate(values):
        flat[i] = json_value(key, value)
    return out


def values_of(key: NestedKey, entry: Any, shape: tuple[int, ...]) -> np.ndarray:
    """The values of ``entry`` (a ``NonTensorData`` / ``NonTensorStack`` of batch size
    ``shape``) as an object array of ``shape``, each checked and copied by :func:`json_value`.
    ``TypeError`` for another kind of entry or a value JSON does not hold, ``ValueError`` for
    another batch size; both name ``key``.

    Examples
    --------
    >>> values_of("t", NonTensorStack("a", "b"), (2,)).tolist()
    ['a', 'b']
    >>> values_of("t", NonTensorData([1], batch_size=[2]), (2,)).tolist()
    [[1], [1]]
    >>> values_of("t", NonTensorStack("a", "b"), (3,))
    Traceback (most recent call last):
    ...
    ValueError: entry 't' has batch size (2,), expected (3,) for this storage.
    """
    if not is_non_tensor(entry):
        raise TypeError(f"entry {key!r} is a {type(entry).__name__}: this storage holds "
                        "non-tensor data (NonTensorData / NonTensorStack) there.")
    if tuple(entry.batch_size) != tuple(shape):
        raise ValueError(f"entry {key!r} has batch size {tuple(entry.batch_size)}, expected "
                         f"{tuple(shape)} for this storage.")
    if isinstance(entry, NonTensorData):
        out = np.empty(shape, dtype=object)
        out.fill(json_value(key, entry.data))  # (one copy, shared: values are never mutated)
        return out
    return _nested_values(key, entry.tolist(), tuple(shape))


def values_from_json(key: NestedKey, nested: Any, shape: tuple[int, ...]) -> np.ndarray:
    """:func:`values_of` for values a checkpoint holds (nested lists ``shape`` deep)."""
    return _nested_values(key, nested, tuple(shape))


def _read_copy(value: Any) -> Any:
    return value if type(value) in _SCALARS else copy.deepcopy(value)


def entry_of(values: np.ndarray, copies: bool) -> NonTensorData | NonTensorStack:
    """``values`` (an object array) as tensordict's indexing returns them: a ``NonTensorData``
    for one element (0-dim), a ``NonTensorStack`` (of stacks, one level a dim) for a batch,
    whatever the values (TorchRL's storages read alike); a ``NonTensorData`` of ``None`` for
    no value of two or more dims (which keeps its batch size, e.g. ``(0, T)``). ``copies``:
    lists and dicts are copied (so that a reader changing them leaves the stored values as
    they were).

    Examples
    --------
    >>> entry_of(np.array(["a", "b"], dtype=object), copies=False).tolist()
    ['a', 'b']
    >>> entry_of(np.array("a", dtype=object), copies=False)
    NonTensorData(data=a, batch_size=torch.Size([]), device=None)
    """
    if values.ndim == 0:
        value = values.item()
        return NonTensorData(data=_read_copy(value) if copies else value)
    if values.ndim == 1:  # (the values as they are: tensordict wraps each, on its fast path)
        items = values.tolist()
        return NonTensorStack(*([_read_copy(v) for v in items] if copies else items))
    if not values.size:
        # no value: a stack of none has batch size (0,), whatever the dims past the first
        # (a clone or a stack of a NonTensorStack of batch size (0, T) gives (0,) too), so a
        # storage's zero rows of [rows, T] values would be saved as (0,): the checkpoint
        # then lays out another storage, or is refused
        return NonTensorData(data=None, batch_size=values.shape)
    return NonTensorStack(*[entry_of(sub, copies) for sub in values])


def put_entry(td: TensorDictBase, key: NestedKey, entry: NonTensorData | NonTensorStack,
              nested_dims: dict[tuple[str, ...], tuple[int, ...]]) -> None:
    """Set ``entry`` at ``key`` of ``td``, making the nested levels it lacks (with their own
    batch dims ``nested_dims`` past their parent's)."""
    path = key_path(key)
    node = td
    for depth in range(1, len(path)):
        child = node.get(path[depth - 1], None)
        if child is None:
            dims = nested_dims.get(path[:depth], ())
            child = TensorDict({}, batch_size=[*node.batch_size, *dims], device=node.device)
            node.set(path[depth - 1], child)
            child = node.get(path[depth - 1])
        node = child
    value: Any = entry  # (a tensorclass: a tensor collection mypy does not see as one)
    node.set(path[-1], value)


def split_non_tensor(td: TensorDictBase) -> tuple[TensorDictBase, dict[str, Any] | None]:
    """``(tensors, columns)``: ``td`` (rows to save) without its non-tensor entries, and those
    as JSON-ready data (``None`` when it has none), which :func:`add_non_tensor` puts back.

    Examples
    --------
    >>> td = TensorDict({"x": [1.0, 2.0], "t": NonTensorStack("a", "b")}, [2])
    >>> tensors, columns = split_non_tensor(td)
    >>> list(tensors.keys()), columns["entries"]
    (['x'], [{'key': ['t'], 'shape': [2], 'values': ['a', 'b']}])
    >>> back = add_non_tensor(tensors.clone(), columns)
    >>> back["t"], back["x"].tolist()
    (LinkedList(['a', 'b']), [1.0, 2.0])
    """
    keys = non_tensor_keys(td)
    if not keys:
        return td, None
    entries = []
    for key in keys:
        entry = td.get(key)
        shape = tuple(entry.batch_size)
        entries.append({"key": list(key_path(key)), "shape": list(shape),
                        "values": values_of(key, entry, shape).tolist()})
    return td.exclude(*keys), {"format": FORMAT, "entries": entries}


def add_non_tensor(td: TensorDictBase, columns: Any) -> TensorDictBase:
    """``td`` with the non-tensor entries ``columns`` (of :func:`split_non_tensor`, read back
    from a checkpoint) set in place; :class:`~tdreplay.core.CheckpointError` when they are
    not what :func:`split_non_tensor` writes."""
    try:
        found = columns.get("format") if isinstance(columns, dict) else None
        if found != FORMAT:
            raise ValueError(f"format {found!r}, expected {FORMAT}")
        for info in columns["entries"]:
            key = as_key(info["key"])
            values = values_from_json(key, info["values"], tuple(info["shape"]))
            put_entry(td, key, entry_of(values, copies=False), {})
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"checkpoint non-tensor entries cannot be read: "
                              f"{type(err).__name__}: {err}") from err
    return td


def check_non_tensor_rows(data: TensorDictBase, refusal: str | None) -> None:
    """:class:`~tdreplay.core.CheckpointError` unless every non-tensor entry of ``data`` (saved
    rows) holds JSON values, or when it has one and ``refusal`` (why the storage keeps no
    non-tensor entries) is given."""
    for key in non_tensor_keys(data):
        entry = data.get(key)
        if refusal is not None:
            raise CheckpointError(f"checkpoint entry {key!r} is a {type(entry).__name__}: "
                                  f"{refusal}.")
        try:
            values_of(key, entry, tuple(entry.batch_size))
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"checkpoint {err}") from err
