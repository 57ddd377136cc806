"""Checks and conversions of the extension API: what components of other packages call.

Storages, samplers, writers and transforms written outside ``tdreplay.core`` (the sibling
packages, or a user's own) validate their arguments with these helpers, so every component
raises the same errors with the same messages. They are public and versioned with core.

Examples
--------
>>> import torch
>>> from tdreplay.core.utils import as_long_tensor, check_batch_size, normalize_keys
>>> as_long_tensor([3, 1]).tolist(), check_batch_size(8), normalize_keys(["a", ("b", "c")], "keys")
([3, 1], 8, ['a', ('b', 'c')])
>>> check_batch_size(0)
Traceback (most recent call last):
...
ValueError: batch_size must be a positive int, got 0.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence, Sized
from contextlib import contextmanager
from typing import Any, Literal, TypeGuard, TypeVar, cast, overload

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase, is_tensor_collection, unravel_key
from torch.utils._pytree import tree_leaves  # noqa: PLC2701 (no public pytree in torch 2.13)

INT_TYPES = (int, np.integer)

T = TypeVar("T")

#: A TensorDict key: a string, or a tuple of strings for a nested entry.
NestedKey = str | tuple[str, ...]

__all__ = [
    "INT_TYPES",
    "NestedKey",
    "BatchlessDataError",
    "DataKindMismatchError",
    "DimExtendError",
    "NotATensorDictError",
    "ShapeMismatchError",
    "as_long_tensor",
    "check_batch_size",
    "check_count",
    "check_required_count",
    "check_flag",
    "check_instance",
    "check_key",
    "check_not_empty",
    "check_state_counter",
    "check_whole_numbers",
    "clone_exact",
    "ensure_tensordict",
    "errors_named",
    "is_int",
    "leading_dim",
    "normalize_keys",
    "patch_entries",
    "range_tensor",
    "restore_attributes",
    "slice_leading",
    "take_rows",
]


@contextmanager
def errors_named(what: str) -> Iterator[None]:
    """A ``ValueError`` raised in the block gets ``what`` (the argument or entry the callee
    read under another name) before its message; its class is kept.

    Examples
    --------
    >>> try:
    ...     with errors_named("data['td_error']"):
    ...         raise ValueError("priority must be finite")
    ... except ValueError as err:
    ...     print(err)
    data['td_error']: priority must be finite
    """
    try:
        yield
    except ValueError as err:
        err.args = (f"{what}: {err}", *err.args[1:])
        raise


def is_int(index: object) -> TypeGuard[int | np.integer[Any] | torch.Tensor]:
    """Return True for a Python/numpy integer or a 0-d integer tensor."""
    if isinstance(index, INT_TYPES) and not isinstance(index, bool):
        return True
    return (
        isinstance(index, torch.Tensor)
        and index.ndim == 0
        and not index.is_floating_point()
        and index.dtype is not torch.bool
    )


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _int64(value: Any, name: str) -> int:
    """``int(value)``; ``IndexError`` naming ``name`` when it does not fit in int64."""
    out = int(value)
    if not _INT64_MIN <= out <= _INT64_MAX:
        raise IndexError(f"{name} holds {out}, which does not fit in int64: indices must lie "
                         "in [-2**63, 2**63).")
    return out


def as_long_tensor(index: Any, *, name: str = "index", device: Any = None) -> torch.Tensor:
    """Convert an int, a sequence of ints, a numpy array or a tensor into an int64 tensor.

    Raises ``TypeError`` naming ``name`` when the value is not an integer index, and
    ``IndexError`` naming it when a value does not fit in int64 (e.g. ``2**64``, or a uint64
    value of ``2**63`` or more), instead of wrapping it around.

    Examples
    --------
    >>> as_long_tensor([2, 0]).tolist(), as_long_tensor(np.uint8(7)).tolist()
    ([2, 0], 7)
    >>> as_long_tensor(2**64, name="index")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    IndexError: index holds 18446744073709551616, which does not fit in int64: ...
    """
    if isinstance(index, torch.Tensor):
        if index.is_floating_point() or index.dtype is torch.bool or index.is_complex():
            raise TypeError(f"{name} must hold integers, got a tensor of dtype {index.dtype}.")
        if index.dtype is torch.uint64:
            signed = index.view(torch.long)  # the same bits: values >= 2**63 read negative
            if bool((signed < 0).any()):
                big = index[signed < 0].reshape(-1)[0].item()
                _int64(big, name)
            out = signed
        else:
            out = index.to(torch.long)
    elif isinstance(index, np.ndarray):
        if not np.issubdtype(index.dtype, np.integer):
            raise TypeError(f"{name} must hold integers, got an array of dtype {index.dtype}.")
        if np.issubdtype(index.dtype, np.unsignedinteger) and index.size \
                and int(index.max()) > _INT64_MAX:
            _int64(index.max(), name)
        out = torch.from_numpy(index.astype(np.int64, copy=False))
    elif is_int(index):
        out = torch.tensor(_int64(index, name), dtype=torch.long)
    elif isinstance(index, Sequence) and not isinstance(index, (str, bytes)):
        if not all(is_int(i) for i in index):
            raise TypeError(f"{name} must be a sequence of integers, got {index!r}.")
        out = torch.tensor([_int64(i, name) for i in index], dtype=torch.long)
    else:
        raise TypeError(f"{name} must be an int, a sequence of ints or an integer tensor, "
                        f"got {type(index).__name__}.")
    if device is not None:
        out = out.to(device)
    return out


def leading_dim(data: Any) -> int:
    """Number of items along the leading (batch) dimension of ``data``.

    A TensorDict counts its first batch dimension, a tensor its first dimension, a list its
    length and a tuple (a pytree) the first dimension of its leaves.
    """
    # a plain TensorDict is recognised at once (the hot path); is_tensor_collection also
    # covers tensorclasses and lazy stacks
    if type(data) is TensorDict or is_tensor_collection(data):
        batch_size = data.batch_size  # (a property: read once)
        if not batch_size:
            raise BatchlessDataError("extend expects data with at least one batch dimension, "
                                     "got a TensorDict with an empty batch_size; use add() for "
                                     "one item.")
        return int(batch_size[0])
    if isinstance(data, torch.Tensor):
        if data.ndim == 0:
            raise BatchlessDataError("extend expects data with a leading batch dimension, got "
                                     "a 0-d tensor; use add() for one item.")
        return data.shape[0]
    if isinstance(data, list):
        return len(data)
    leaves = tree_leaves(data)
    if not leaves:
        raise ValueError(f"cannot find a batch dimension in data of type {type(data).__name__}.")
    sizes = {leaf.shape[0] if isinstance(leaf, torch.Tensor) and leaf.ndim else None
             for leaf in leaves}
    size = next(iter(sizes)) if len(sizes) == 1 else None
    if size is None:
        raise ValueError("every leaf of a pytree passed to extend must share the same leading "
                         f"dimension, got leading sizes {sorted(map(str, sizes))}.")
    return int(size)


@overload
def check_flag(value: Any, name: str, *, allow_none: Literal[False] = ...) -> bool: ...


@overload
def check_flag(value: Any, name: str, *, allow_none: bool) -> bool | None: ...


def check_flag(value: Any, name: str, *, allow_none: bool = False) -> bool | None:
    """Return ``value`` as a Python bool; raise a ``TypeError`` naming ``name`` unless it is a
    ``bool`` or a ``numpy.bool_`` (or ``None``, returned as is, with ``allow_none``: for the
    arguments where ``None`` means "the default").

    The boolean arguments of every component go through this check, so ``"yes"``, ``"False"``
    (a non-empty string, truthy), ``1`` or ``None`` are refused instead of being taken as
    truthy. Call it before anything is changed, so a refused call leaves the object as it was.

    Examples
    --------
    >>> check_flag(True, "strict_length"), check_flag(np.bool_(False), "shuffle")
    (True, False)
    >>> check_flag("False", "strict_length")
    Traceback (most recent call last):
    ...
    TypeError: strict_length must be a bool, got str ('False').
    >>> check_flag(None, "delayed_init", allow_none=True) is None
    True
    >>> check_flag(0, "delayed_init", allow_none=True)
    Traceback (most recent call last):
    ...
    TypeError: delayed_init must be a bool or None, got int (0).
    """
    if type(value) is bool:  # the common case, one check
        return value
    if value is None and allow_none:
        return None
    if not isinstance(value, (bool, np.bool_)):
        expected = "a bool or None" if allow_none else "a bool"
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__} ({value!r}).")
    return bool(value)


def check_instance(value: object, kind: type[T], name: str) -> T:
    """Return ``value``; raise a ``TypeError`` naming ``name`` unless it is a ``kind`` instance."""
    if not isinstance(value, kind):
        raise TypeError(f"{name} must be a {kind.__name__} instance, got {type(value).__name__}.")
    return value


def check_whole_numbers(values: torch.Tensor, what: str, kind: str) -> None:
    """Refuse ``values`` unless they are integers, bools, or floats holding whole finite
    numbers (ids written as floats): ``TypeError`` for complex ones, ``ValueError`` naming
    ``what`` and the first value that is not one otherwise. ``kind`` says what the values are
    (``"trajectory ids"``, ``"policy versions"``). Changes nothing.

    Examples
    --------
    >>> check_whole_numbers(torch.tensor([0.0, 3.0]), "the key 'episode'", "ids")
    >>> check_whole_numbers(torch.tensor([0.0, 0.5]), "the key 'episode'", "ids")
    Traceback (most recent call last):
    ...
    ValueError: the key 'episode' must hold whole-number ids: found 0.5.
    """
    if values.is_complex():
        raise TypeError(f"{what} must hold integer {kind}, got {values.dtype}.")
    if values.is_floating_point():
        wide = values.detach().to(torch.float64)
        bad = ~torch.isfinite(wide) | (wide != torch.trunc(wide))
        if bool(bad.any()):
            raise ValueError(f"{what} must hold whole-number {kind}: found "
                             f"{wide[bad].reshape(-1)[0].item()!r}.")


class ShapeMismatchError(ValueError, RuntimeError):
    """Data whose shape does not fit where it goes (a batch of another number of environments
    than a multi-dimensional storage holds, relabelled values of another shape): a
    ``ValueError`` like tdreplay's other refused data, and a ``RuntimeError`` as TorchRL raises
    there (``except RuntimeError:`` written for TorchRL keeps working).

    Examples
    --------
    >>> issubclass(ShapeMismatchError, ValueError), issubclass(ShapeMismatchError, RuntimeError)
    (True, True)
    """


class BatchlessDataError(ValueError, TypeError):
    """``extend`` of data without a batch dimension (a 0-d tensor, a TensorDict with an empty
    batch size): a ``ValueError`` like tdreplay's other refused data, and the ``TypeError``
    TorchRL raises there (``len()`` of a 0-d tensor), so ``except TypeError:`` written for
    TorchRL keeps working.

    Examples
    --------
    >>> try:
    ...     leading_dim(torch.tensor(1.0))
    ... except TypeError as err:  # what a TorchRL program catches
    ...     print(type(err).__name__, isinstance(err, ValueError))
    BatchlessDataError True
    """


class DimExtendError(ValueError, IndexError):
    """Data with fewer batch dims than a buffer's ``dim_extend`` needs (a ``[B]`` batch for a
    storage of ``ndim=2``): a ``ValueError``, and the ``IndexError`` TorchRL raises there.

    Examples
    --------
    >>> issubclass(DimExtendError, ValueError), issubclass(DimExtendError, IndexError)
    (True, True)
    """


class DataKindMismatchError(TypeError, ValueError, RuntimeError):
    """Data of another kind than a storage holds (a dict or a tensor written where
    TensorDicts are stored, another tensorclass, ...): a ``TypeError``, and the ``ValueError``
    or ``RuntimeError`` TorchRL raises there depending on the kinds (``except`` clauses
    written for TorchRL keep working).

    Examples
    --------
    >>> [issubclass(DataKindMismatchError, kind) for kind in (TypeError, ValueError,
    ...                                                         RuntimeError)]
    [True, True, True]
    """


class NotATensorDictError(TypeError, ValueError):
    """Data that must be a TensorDict (or tensorclass) is not: a ``TypeError`` and, as TorchRL's
    ``TensorDictReplayBuffer.extend`` raises, a ``ValueError``.

    Examples
    --------
    >>> try:
    ...     ensure_tensordict([1, 2])
    ... except ValueError as err:  # what a TorchRL program catches
    ...     print(type(err).__name__, isinstance(err, TypeError))
    NotATensorDictError True
    """


class NotATensorDictUpdateError(NotATensorDictError, AttributeError):
    """``update_tensordict_priority`` of data that is not a TensorDict: a
    :class:`NotATensorDictError` and the ``AttributeError`` TorchRL's raises there (it reads
    ``data.get``), so that ``except AttributeError:`` written for TorchRL keeps working.

    Examples
    --------
    >>> try:
    ...     ensure_update_tensordict(None)
    ... except AttributeError as err:  # what a TorchRL program catches
    ...     print(type(err).__name__, isinstance(err, TypeError))
    NotATensorDictUpdateError True
    """


def ensure_update_tensordict(data: Any) -> TensorDictBase:
    """Raise a :class:`NotATensorDictUpdateError` unless ``data`` (what a priority update
    reads) is a tensor collection."""
    if not is_tensor_collection(data):
        raise NotATensorDictUpdateError(f"data must be a TensorDict, got "
                                        f"{type(data).__name__}.")
    return cast(TensorDictBase, data)


def ensure_tensordict(data: Any, name: str = "data") -> TensorDictBase:
    """Raise a :class:`NotATensorDictError` naming ``name`` unless ``data`` is a tensor
    collection."""
    if not is_tensor_collection(data):
        raise NotATensorDictError(f"{name} must be a TensorDict (or tensorclass), got "
                                  f"{type(data).__name__}.")
    return cast(TensorDictBase, data)


def range_tensor(rows: range) -> torch.Tensor:
    """``rows`` as an int64 tensor; an empty range as an empty tensor (``torch.arange`` refuses
    bounds that do not follow the step's sign, e.g. the rows of an empty slice ``[5:2]``).

    Examples
    --------
    >>> range_tensor(range(2, 8, 3)).tolist(), range_tensor(range(5, 2)).tolist()
    ([2, 5], [])
    """
    if not len(rows):
        return torch.empty(0, dtype=torch.long)
    return torch.arange(rows.start, rows.stop, rows.step)


def clone_exact(data: T) -> T:
    """A copy of ``data`` (a tensor or a tensor collection) bit for bit, with memory of its own.

    ``TensorDict.clone()`` is not bit-exact in tensordict 0.15: on a TensorDict with a device it
    copies plain tensors with a fused ``x + 0``, which turns ``-0.0`` into ``+0.0`` (and quiets
    signalling NaNs). This copies every tensor leaf with :meth:`torch.Tensor.clone` instead;
    the structure (class, batch size, device, names, non-tensor entries) is the collection's.

    Examples
    --------
    >>> td = TensorDict({"x": torch.tensor([-0.0, 1.0])}, [2], device="cpu")
    >>> copy = clone_exact(td)
    >>> torch.signbit(copy["x"]).tolist(), copy["x"].data_ptr() != td["x"].data_ptr()
    ([True, False], True)
    >>> torch.signbit(clone_exact(torch.tensor(-0.0))).item()
    True
    """
    if isinstance(data, torch.Tensor):
        return cast(T, data.clone())
    if not is_tensor_collection(data):
        raise TypeError(f"clone_exact copies tensors and tensor collections, got "
                        f"{type(data).__name__}.")
    if cast(TensorDictBase, data).device is None:  # (clone copies leaf by leaf: exact, faster)
        return cast(T, cast(TensorDictBase, data).clone())
    return cast(T, cast(TensorDictBase, data).apply(torch.Tensor.clone, filter_empty=False))


def take_rows(data: Any, index: torch.Tensor) -> Any:
    """The items ``index`` (a 1-d int64 tensor) of a batch along its first dim: a tensor, a
    tensor collection, or a list / tuple / dict of them (a tuple's and a dict's parts are
    batches themselves, a list's elements are its items).

    Tensors, and TensorDicts of tensors, are read with ``index_select`` per leaf: advanced
    indexing (``t[index]``) of a small batch runs a parallel kernel that costs up to 40x more
    on a machine whose cores are busy (530 us against 13 us for 256 x 32 floats on 2 loaded
    cores). A collection holding non-tensor entries (which ``apply`` would leave out) or of
    another class is indexed whole, as ``data[index]`` reads it.

    Examples
    --------
    >>> take_rows(torch.tensor([10, 11, 12]), torch.tensor([2, 0])).tolist()
    [12, 10]
    >>> from tensordict import NonTensorStack
    >>> td = TensorDict({"x": torch.arange(3), "name": NonTensorStack("a", "b", "c")}, [3])
    >>> rows = take_rows(td, torch.tensor([2, 0]))
    >>> rows["x"].tolist(), list(rows["name"])
    ([2, 0], ['c', 'a'])
    >>> take_rows(({"a": torch.arange(3)}, ["p", "q", "r"]), torch.tensor([1]))
    ({'a': tensor([1])}, ['q'])
    """
    if isinstance(data, torch.Tensor):
        return data.index_select(0, index.to(data.device))
    if is_tensor_collection(data):
        if type(data) is TensorDict:
            taken = data.apply(lambda leaf: leaf.index_select(0, index.to(leaf.device)),
                               batch_size=[index.numel(), *data.batch_size[1:]])
            if taken is not None and len(taken.keys(True)) == len(data.keys(True)):
                return taken
        return data[index]
    if isinstance(data, list):
        return [data[i] for i in index.tolist()]
    if isinstance(data, tuple):
        return tuple(take_rows(part, index) for part in data)
    if isinstance(data, dict):
        return {key: take_rows(value, index) for key, value in data.items()}
    raise TypeError(f"cannot take rows of a batch of type {type(data).__name__} (expected "
                    "tensors, tensor collections, lists, tuples or dicts of them).")


def slice_leading(data: Any, sl: slice) -> Any:
    """Slice ``data`` along its leading dimension (lists, tensors, TensorDicts and pytrees)."""
    if isinstance(data, list) or isinstance(data, torch.Tensor) or is_tensor_collection(data):
        return data[sl]
    from torch.utils._pytree import tree_map  # noqa: PLC2701 (no public pytree in torch 2.13)

    return tree_map(lambda x: x[sl] if isinstance(x, torch.Tensor) else x, data)


def check_batch_size(batch_size: Any) -> int:
    """Return ``batch_size`` as a Python int; raise a ``ValueError`` unless it is a positive
    int (a Python or numpy integer; bools are refused).

    Examples
    --------
    >>> check_batch_size(32), check_batch_size(np.int64(4))
    (32, 4)
    >>> check_batch_size(True)
    Traceback (most recent call last):
    ...
    ValueError: batch_size must be a positive int, got True.
    """
    if type(batch_size) is int and batch_size > 0:  # the common case, one check
        return batch_size
    if not isinstance(batch_size, INT_TYPES) or isinstance(batch_size, (bool, np.bool_)) \
            or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}.")
    return int(batch_size)


def check_count(value: Any, name: str, minimum: int) -> int | None:
    """``None``, or ``value`` as a Python int >= ``minimum`` (from a Python or numpy integer;
    bools are refused): ``TypeError`` naming ``name`` for another type, ``ValueError`` below
    ``minimum``. What a buffer checks its ``batch_size`` and ``prefetch`` with.

    Examples
    --------
    >>> check_count(np.int64(4), "batch_size", 1), check_count(None, "batch_size", 1)
    (4, None)
    >>> check_count(1.5, "batch_size", 1)
    Traceback (most recent call last):
    ...
    TypeError: batch_size must be an int or None, got float (1.5).
    """
    if type(value) is int and value >= minimum:  # the common case, one check
        return value
    if value is None:
        return None
    return _checked_count(value, name, minimum, "an int or None")


def check_required_count(value: Any, name: str, minimum: int) -> int:
    """:func:`check_count` of a count that cannot be ``None`` (a window's length, a chunk
    size): ``TypeError`` naming ``name`` for ``None`` too.

    Examples
    --------
    >>> check_required_count(np.int64(3), "length", 1)
    3
    >>> check_required_count(None, "length", 1)
    Traceback (most recent call last):
    ...
    TypeError: length must be an int, got NoneType (None).
    >>> check_required_count(0, "length", 1)
    Traceback (most recent call last):
    ...
    ValueError: length must be >= 1, got 0.
    """
    if type(value) is int and value >= minimum:
        return value
    return _checked_count(value, name, minimum, "an int")


def _checked_count(value: Any, name: str, minimum: int, kind: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, INT_TYPES):
        raise TypeError(f"{name} must be {kind}, got {type(value).__name__} ({value!r}).")
    count = int(value)
    if count < minimum:  # (TorchRL's refusals of a negative count say "non-negative")
        raise ValueError(f"{name} must be >= {minimum}, got {count}"
                         + (": a non-negative int." if minimum == 0 else "."))
    return count


def check_state_counter(value: Any, field: str, owner: str) -> int:
    """``value`` (an entry of a saved state) as an int >= 0; ``ValueError`` naming
    ``owner``'s ``state_dict[field]`` otherwise. For the counters and cursors components
    check before a buffer loads any of its parts.

    Examples
    --------
    >>> check_state_counter(torch.tensor(3), "cursor", "RoundRobinWriter")
    3
    >>> check_state_counter(True, "age", "TensorDictMaxValueWriter")
    Traceback (most recent call last):
    ...
    ValueError: TensorDictMaxValueWriter state_dict['age'] must be an int, got bool (True).
    """
    if not is_int(value):
        raise ValueError(f"{owner} state_dict[{field!r}] must be an int, got "
                         f"{type(value).__name__} ({value!r}).")
    if int(value) < 0:
        raise ValueError(f"{owner} state_dict[{field!r}] is {int(value)}; it must be >= 0.")
    return int(value)


def check_not_empty(storage: Sized) -> int:
    """Return ``len(storage)``; raise a ``RuntimeError`` when nothing is written yet.

    Examples
    --------
    >>> check_not_empty([1, 2])
    2
    """
    n = len(storage)
    if n == 0:
        raise RuntimeError("Cannot sample from an empty storage: the replay buffer holds no "
                           "items yet, extend it first.")
    return n


@overload
def check_key(value: Any, name: str, *, optional: Literal[False] = ...) -> NestedKey: ...


@overload
def check_key(value: Any, name: str, *, optional: bool) -> NestedKey | None: ...


def check_key(value: Any, name: str, *, optional: bool = False) -> NestedKey | None:
    """``value`` as one nested key (a str, or a flat tuple of str: ``("next", "done")``;
    ``("a", ("b", "c"))`` is flattened, a one-element tuple becomes its str); a ``TypeError``
    naming ``name`` otherwise (tensordict's own errors name no argument). ``None`` is
    returned as is when ``optional``.

    Examples
    --------
    >>> check_key(("next", ("agent", "done")), "done_key")
    ('next', 'agent', 'done')
    >>> check_key(("obs",), "in_key"), check_key(None, "traj_key", optional=True)
    ('obs', None)
    >>> check_key(5, "done_key")
    Traceback (most recent call last):
    ...
    TypeError: done_key must be a str or a tuple of str, got 5.
    """
    if value is None and optional:
        return None
    try:
        if not isinstance(value, (str, tuple)) or value == ():
            raise TypeError("not a key")
        key = unravel_key(value)
        if not isinstance(key, str) and not (key and all(isinstance(k, str) for k in key)):
            raise TypeError("not a key")  # (unravel_key gives () for ("a", 5))
    except Exception:  # (tensordict raises several types for a malformed key)
        raise TypeError(f"{name} must be a str or a tuple of str"
                        f"{' or None' if optional else ''}, got {value!r}.") from None
    return key  # (unravel_key makes a one-element tuple its str)


def normalize_keys(keys: Any, name: str) -> list[NestedKey]:
    """``keys`` (``None``, one key or a sequence of keys) as a list of keys.

    A one-element tuple key becomes its string; anything but str or tuple-of-str raises a
    ``TypeError`` naming ``name``.

    Examples
    --------
    >>> normalize_keys(None, "in_keys"), normalize_keys("obs", "in_keys")
    ([], ['obs'])
    >>> normalize_keys([("next",), ("next", "obs")], "in_keys")
    ['next', ('next', 'obs')]
    """
    if keys is None:
        return []
    if isinstance(keys, (str, tuple)):
        keys = [keys]
    out: list[NestedKey] = []
    for key in keys:
        if isinstance(key, str):
            out.append(key)
        elif isinstance(key, tuple) and key and all(isinstance(k, str) for k in key):
            out.append(key[0] if len(key) == 1 else key)
        else:
            raise TypeError(f"{name} must hold str or tuple-of-str keys, got {key!r}.")
    return out


def patch_entries(patch: Any) -> list[tuple[Any, Any]]:
    """The ``(key, value)`` pairs of a conditional-update ``patch``: a mapping of keys to
    tensors, or a TensorDict (its leaves, nested keys as tuples); ``TypeError`` naming
    ``patch`` for anything else. Values are not checked here.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> patch_entries(TensorDict({"a": {"b": torch.zeros(2)}}, [2]))[0][0]
    ('a', 'b')
    >>> patch_entries({"r": torch.ones(1)})[0][0]
    'r'
    """
    if isinstance(patch, TensorDictBase):
        return list(patch.items(include_nested=True, leaves_only=True))
    if isinstance(patch, Mapping):
        return list(patch.items())
    raise TypeError(f"patch must be a mapping of keys to tensors or a TensorDict, got "
                    f"{type(patch).__name__}.")


def restore_attributes(obj: object, state: Mapping[str, Any]) -> None:
    """Set each ``name: value`` of ``state`` as an attribute of ``obj``: what a ``__setstate__``
    does with a pickled ``__dict__``, without reading ``obj.__dict__``.

    CPython 3.11 reads the attributes of an object whose ``__dict__`` was never read as such
    about four times faster than those of one whose was (``obj.__dict__.update(state)``, or
    unpickling without a ``__setstate__``): a copy of a storage, sampler or buffer restored
    with this reads its attributes as fast as the original on the hot paths.

    Examples
    --------
    >>> class Point:
    ...     def __setstate__(self, state):
    ...         restore_attributes(self, state)
    >>> p = Point.__new__(Point)
    >>> p.__setstate__({"x": 1, "y": 2})
    >>> p.x + p.y
    3
    """
    for name, value in state.items():
        object.__setattr__(obj, name, value)
