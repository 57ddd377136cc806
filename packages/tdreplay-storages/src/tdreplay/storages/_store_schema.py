"""The structure of a :class:`~tdreplay.storages.StoreStorage`'s rows (:class:`StoreSchema`),
fixed by its first write and checked against every later one, and the conversions of written
data to and from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from tensordict import (
    LazyStackedTensorDict,
    TensorDict,
    TensorDictBase,
    is_tensor_collection,
    is_tensorclass,
)

from tdreplay.core.checkpoint import CheckpointError
from tdreplay.core.utils import DataKindMismatchError

from ._casts import check_cast, dtype_from_str
from ._formats import (
    KIND_TC,
    KIND_TD,
    KIND_TENSOR,
    TENSOR_KEY,
    hold_tensorclass,
    resolve_tensorclass,
)
from ._keys import as_key, key_path
from ._object_values import is_non_tensor
from ._tensorclasses import classes_from_record, classes_record, inner_first

__all__ = ["Entry", "Path_", "StoreSchema", "as_store_rows", "cast_to_schema", "entries_of",
           "schema_of_store"]


Path_ = tuple[str, ...]
#: an entry of a row: ``(row shape, dtype)`` of a tensor, ``None`` for non-tensor data
Entry = tuple[tuple[int, ...], torch.dtype] | None


def entries_of(td: TensorDictBase, lead: int) -> dict[Path_, Entry]:
    """The entries of the rows of ``td`` (``lead`` leading dims are the rows)."""
    out: dict[Path_, Entry] = {}
    for key in td.keys(include_nested=True, leaves_only=False):
        value = td.get(key)
        path = key_path(key)
        if is_non_tensor(value):
            out[path] = None
        elif isinstance(value, torch.Tensor):
            out[path] = (tuple(value.shape[lead:]), value.dtype)
        elif not is_tensor_collection(value):  # pragma: no cover - tensordict holds no other
            raise TypeError(f"entry {key!r} is a {type(value).__name__}: StoreStorage stores "
                            "tensors and non-tensor data.")
    return out


@dataclass(frozen=True)
class StoreSchema:
    """The structure of a row of a :class:`StoreStorage`, fixed by its first write.

    Attributes
    ----------
    kind : str
        ``"tensor"``, ``"tensordict"`` or ``"tensorclass"``: what reads give back.
    tensorclass : type or None
        The tensorclass of the data (``kind == "tensorclass"``).
    row_batch : tuple of int
        The batch dims of a row after the storage's dimension (``()`` for most data).
    entries : dict
        ``{key path: (row shape, dtype)}`` of the tensor entries, ``{key path: None}`` of the
        non-tensor entries (strings and other Python values).
    classes : tuple
        The tensorclasses nested in the data (``td["obs"]`` an ``Obs``), inner levels first.

    Examples
    --------
    >>> td = TensorDict({"obs": torch.zeros(4, 3), "name": ["a", "b", "c", "d"]}, [4])
    >>> schema = StoreSchema.of(td, KIND_TD, None, lead=1)
    >>> schema.entries
    {('obs',): ((3,), torch.float32), ('name',): None}
    """

    kind: str
    tensorclass: type | None
    row_batch: tuple[int, ...]
    entries: dict[Path_, Entry]
    classes: tuple[tuple[Path_, type], ...] = ()

    @classmethod
    def of(cls, td: TensorDictBase, kind: str, tensorclass: type | None, lead: int,
           classes: tuple[tuple[Path_, type], ...] = ()) -> StoreSchema:
        """The schema of the rows of ``td`` (``lead`` leading dims are the rows)."""
        entries = entries_of(td, lead)
        row_batch = tuple(td.batch_size[lead:])
        if row_batch and any(entry is None for entry in entries.values()):
            name = next(p for p, e in entries.items() if e is None)
            raise TypeError(f"entry {as_key(name)!r} is non-tensor data in rows of batch shape "
                            f"{row_batch}: StoreStorage keeps non-tensor entries only in rows "
                            "without batch dims of their own.")
        return cls(kind, tensorclass, row_batch, entries, classes)

    def record(self) -> dict[str, Any]:
        """The schema as JSON-ready values (in ``state_dict`` and checkpoints)."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "tensorclass": (None if self.tensorclass is None
                            else hold_tensorclass(self.tensorclass)),
            "row_batch": list(self.row_batch),
            "entries": [[list(path), None, None] if entry is None
                        else [list(path), list(entry[0]), str(entry[1])]
                        for path, entry in self.entries.items()],
        }
        if self.classes:
            out["nested_tensorclasses"] = classes_record(dict(self.classes))
        return out

    @classmethod
    def from_record(cls, record: Any, where: str) -> StoreSchema:
        """The schema :meth:`record` gave; ``ValueError`` naming ``where`` when it is not one
        (a tensorclass that cannot be imported raises ``CheckpointError``)."""
        try:
            kind = record["kind"]
            if kind not in (KIND_TENSOR, KIND_TD, KIND_TC):
                raise ValueError(f"kind {kind!r}")
            name = record.get("tensorclass")
            tensorclass = None if name is None else resolve_tensorclass(name)
            entries: dict[Path_, Entry] = {}
            for path, shape, dtype in record["entries"]:
                key = tuple(str(p) for p in path)
                entries[key] = None if dtype is None else (
                    tuple(int(s) for s in shape), dtype_from_str(dtype))
            classes = inner_first(classes_from_record(record.get("nested_tensorclasses")))
            return cls(kind, tensorclass, tuple(int(s) for s in record["row_batch"]), entries,
                       classes)
        except CheckpointError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise ValueError(f"{where} does not describe the rows of a StoreStorage "
                             f"({type(err).__name__}: {err}).") from err

    def check(self, other: StoreSchema, what: str) -> None:
        """``TypeError`` / ``KeyError`` / ``ValueError`` naming the entry unless rows of schema
        ``other`` (``what``: the data, a checkpoint) can be written where this one's are.

        New entries are accepted (added to the store, zero-filled in the other rows, as
        TorchRL's store adds them); missing ones are not (the rows would keep old values)."""
        if other.kind != self.kind:
            raise DataKindMismatchError(f"this StoreStorage holds {self.kind} data; {what} is "
                                        f"{other.kind} data.")
        if other.tensorclass is not self.tensorclass:
            raise DataKindMismatchError(
                f"this StoreStorage holds tensorclass "
                f"{getattr(self.tensorclass, '__name__', None)}; {what} is a "
                f"{getattr(other.tensorclass, '__name__', None)}.")
        if other.row_batch != self.row_batch:
            raise ValueError(f"{what} has rows of batch shape {other.row_batch}, expected "
                             f"{self.row_batch} for this StoreStorage.")
        missing = [as_key(p) for p in self.entries if p not in other.entries]
        if missing:
            raise KeyError(f"{what} lacks the entries {missing} of this StoreStorage (a write "
                           "would leave their old values in the rows).")
        for path, entry in other.entries.items():
            held = self.entries.get(path, entry)
            if (held is None) != (entry is None):
                kinds = ("non-tensor", "tensor")
                raise TypeError(f"entry {as_key(path)!r} of {what} is "
                                f"{kinds[entry is not None]} data; this StoreStorage holds "
                                f"{kinds[held is not None]} data there.")
            if held is not None and entry is not None and held[0] != entry[0]:
                raise ValueError(f"entry {as_key(path)!r} of {what} has row shape {entry[0]}, "
                                 f"expected {held[0]} for this StoreStorage.")

    def merged(self, other: StoreSchema) -> StoreSchema:
        """This schema with the new entries of ``other`` (checked by :meth:`check`)."""
        if all(p in self.entries for p in other.entries):
            return self
        return StoreSchema(self.kind, self.tensorclass, self.row_batch,
                           {**other.entries, **self.entries}, self.classes)


def as_store_rows(data: Any, lead: int) -> tuple[TensorDictBase, str, type | None, Any]:
    """``(td, kind, tensorclass, source)`` of data to write (``lead``: 1 for a batch of rows,
    0 for one row); ``TypeError`` naming ``data`` for what the storage cannot hold."""
    if isinstance(data, list):
        if not lead:
            raise TypeError("data for one row must be a tensor, a TensorDict or a tensorclass, "
                            "got a list.")
        if not data:
            raise ValueError("data is an empty list: nothing to write.")
        if all(isinstance(x, torch.Tensor) and not is_tensor_collection(x) for x in data):
            data = torch.stack(data)
        elif all(is_tensor_collection(x) for x in data):
            data = torch.stack(data)  # tensorclasses stay tensorclasses
        else:
            raise TypeError("data is a list of "
                            f"{sorted({type(x).__name__ for x in data})}: StoreStorage stores "
                            "tensors, TensorDicts and tensorclasses (a list of one of them).")
    if is_tensorclass(data):
        # to_dict shares the tensors (to_tensordict would copy them)
        td = TensorDict(data.to_dict(retain_none=False), batch_size=data.batch_size)
        return td, KIND_TC, type(data), data
    if isinstance(data, LazyStackedTensorDict):
        try:
            return data.contiguous(), KIND_TD, None, data
        except RuntimeError as err:
            raise TypeError(f"data is a lazy stack of differently shaped TensorDicts ({err}): a "
                            "StoreStorage row has one shape; use LazyStackStorage.") from err
    if isinstance(data, TensorDictBase):
        return data, KIND_TD, None, data
    if isinstance(data, torch.Tensor):
        if data.ndim < lead:
            raise ValueError(f"data has shape {tuple(data.shape)}; a batch of rows needs a "
                             "leading dimension.")
        return TensorDict({TENSOR_KEY: data}, batch_size=data.shape[:lead]), KIND_TENSOR, None, \
            data
    raise TypeError(f"StoreStorage stores tensors, TensorDicts and tensorclasses; data is a "
                    f"{type(data).__name__}.")


def cast_to_schema(td: TensorDictBase, schema: StoreSchema) -> TensorDictBase:
    """``td`` with its tensor entries cast to the dtypes of ``schema`` (lossy casts refused:
    see :mod:`~tdreplay.storages._casts`); ``td`` itself when nothing changes."""
    out = None
    for path, entry in schema.entries.items():
        if entry is None:
            continue
        key = as_key(path)
        value = td.get(key, None)
        if isinstance(value, torch.Tensor) and value.dtype != entry[1]:
            check_cast(key, value, entry[1])
            if out is None:
                out = td.copy()
            out.set(key, value.to(entry[1]))
    return td if out is None else out


def schema_of_store(store: Any) -> StoreSchema:
    """The schema of the rows of ``store``, read from its first row (for a state without
    one, as TorchRL's are): a tensor storage's rows hold the one key ``"_tensor"``."""
    row = store[slice(0, 1)]
    keys = list(row.keys(include_nested=True, leaves_only=False))
    kind = KIND_TENSOR if keys == [TENSOR_KEY] else KIND_TD
    return StoreSchema.of(row, kind, None, 1)
