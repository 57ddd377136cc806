"""Contiguous tensor storages: :class:`TensorStorage` and :class:`LazyTensorStorage`.

Data of any supported kind (TensorDict, tensor, tensorclass, pytree of tensors) is kept as a
TensorDict of preallocated leaves with batch shape ``[rows, *inner]``. The hot paths (``set``
of a contiguous block, ``get`` of sampled slots) work on the leaf tensors directly
(one ``copy_`` / ``index_select`` per leaf) and build the output TensorDict without the
generic TensorDict indexing machinery.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase, is_tensor_collection, is_tensorclass
from torch.utils._pytree import tree_flatten, tree_unflatten

from tdreplay.core import Storage, StorageCheckpointerBase
from tdreplay.core.utils import as_long_tensor, is_int

_KIND_TD = "tensordict"
_KIND_TENSOR = "tensor"
_KIND_PYTREE = "pytree"
_KIND_TC = "tensorclass"
_TENSOR_KEY = "_tensor"


def _leaf_keys(td: TensorDictBase) -> list[Any]:
    return sorted(td.keys(include_nested=True, leaves_only=True), key=str)


def _key_path(key: Any) -> tuple[str, ...]:
    """A (nested) key as a tuple of names."""
    return (key,) if isinstance(key, str) else tuple(key)


def _as_key(path: Iterable[str]) -> Any:
    """The key of a tuple of names (a plain string for one name)."""
    path = tuple(path)
    return path[0] if len(path) == 1 else path


def _build_tree(keys: Sequence[Any]) -> dict:
    """Nested dict mapping each key path to the position of its leaf."""
    tree: dict = {}
    for pos, key in enumerate(keys):
        path = _key_path(key)
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = pos
    return tree


def _leaves_along_tree(td: TensorDictBase, tree: dict, count: int) -> list[torch.Tensor] | None:
    """Leaves of a plain ``TensorDict`` in storage order, walking its own dicts along ``tree``.

    Checks that ``td`` has exactly the storage's keys at every level. Returns ``None`` when
    ``td`` is not a plain TensorDict or its keys differ (the caller then takes the generic path,
    which also names the mismatched keys).
    """
    out: list[Any] = [None] * count
    stack = [(td, tree)]
    while stack:
        node_td, node = stack.pop()
        if type(node_td) is not TensorDict:
            return None
        entries = node_td._tensordict
        if len(entries) != len(node):
            return None
        for name, sub in node.items():
            value = entries.get(name)
            if value is None:
                return None
            if type(sub) is dict:
                stack.append((value, sub))
            elif isinstance(value, torch.Tensor):
                out[sub] = value
            else:
                return None
    return out


def _assemble(tree: dict, leaves: list[torch.Tensor], batch_size: torch.Size,
              device: torch.device | None) -> TensorDict:
    source = {}
    for name, node in tree.items():
        if isinstance(node, dict):
            source[name] = _assemble(node, leaves, batch_size, device)
        else:
            source[name] = leaves[node]
    return TensorDict._new_unsafe(source=source, batch_size=batch_size, device=device)


class TensorStorageCheckpointer(StorageCheckpointerBase):
    """Saves a tensor storage's written rows as memory-mapped files (TensorDict's format).

    Only the written rows are saved; loading checks the layout (keys, shapes, ``max_size``,
    ``ndim``) against the target storage before anything changes.
    """

    def dumps(self, storage: TensorStorage, path: Any) -> None:
        from tdreplay.core.checkpoint import write_json

        from .checkpointers import file_table

        meta = storage._layout_meta()
        meta["checkpointer"] = type(self).__name__
        if storage.initialized:
            written = storage._td[: storage._len_rows]
            written = storage.apply_save_hooks(written)
            written.memmap(path / "data", num_threads=0)
            meta["files"] = file_table(path / "data")
        write_json(path / "storage.json", meta)

    def prepare_load(self, storage: TensorStorage, path: Any) -> Any:
        from tdreplay.core.checkpoint import CheckpointError, read_json

        from .checkpointers import _check_meta, _check_written_by, check_file_table

        meta = read_json(path / "storage.json")
        _check_written_by(meta, self)
        _check_meta(storage, meta)
        if not meta["initialized"]:
            return storage.empty
        # sizes first: load_memmap would zero-extend a truncated file
        check_file_table(path / "data", meta.get("files", {}))
        try:
            loaded = TensorDict.load_memmap(path / "data")
        except (OSError, KeyError, ValueError, TypeError, RuntimeError) as err:
            raise CheckpointError(f"cannot read the tensor storage checkpoint in {str(path)!r}: "
                                  f"{type(err).__name__}: {err}") from err
        loaded = storage.apply_load_hooks(loaded)
        storage._check_layout_compatible(meta, loaded)

        def commit() -> None:
            storage._install(meta, loaded)

        return commit


class TensorStorage(Storage):
    """A storage over preallocated tensors (a TensorDict, a tensor, a tensorclass or a pytree).

    Parameters
    ----------
    storage : TensorDict, Tensor, tensorclass or pytree of tensors, optional
        Existing data to wrap; its leading ``ndim`` dimensions are the capacity and it counts as
        fully written (datasets use this). ``None`` for a lazy storage laid out on first write.
    max_size : int, optional
        Capacity in slots; defaults to the number of slots of ``storage``.
    device : str or torch.device
        Where lazily created data lives. Defaults to ``"cpu"``.
    ndim : int
        How many leading dimensions count towards the capacity. With ``ndim=2`` and data of
        batch shape ``[B, T]``, the storage has shape ``[max_size // T, T]`` and ``extend``
        writes ``B`` rows of ``T`` steps.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> s = TensorStorage(TensorDict({"x": torch.arange(4)}, [4]))
    >>> len(s), s.get(torch.tensor([3, 1]))["x"].tolist()
    (4, [3, 1])
    """

    def __init__(
        self,
        storage: Any = None,
        max_size: int | None = None,
        *,
        device: str | torch.device = "cpu",
        ndim: int = 1,
        checkpointer: StorageCheckpointerBase | None = None,
    ) -> None:
        if not isinstance(ndim, int) or isinstance(ndim, bool) or ndim < 1:
            raise ValueError(f"ndim must be a positive int, got {ndim!r}.")
        if storage is not None:
            td, kind, extra = self._to_td(storage, batched=True, ndim=ndim)
            if td.batch_dims < ndim:
                raise ValueError(f"storage has {td.batch_dims} batch dims, fewer than ndim={ndim}.")
            slots = math.prod(td.batch_size[:ndim])
            if max_size is None:
                max_size = slots
            elif max_size != slots:
                raise ValueError(f"max_size={max_size} does not match the storage passed, which "
                                 f"has {slots} slots (batch shape {tuple(td.batch_size[:ndim])}).")
        if max_size is None:
            raise ValueError("max_size must be given when no storage is passed.")
        super().__init__(max_size, checkpointer)
        self.ndim = ndim
        self._device = torch.device(device) if device is not None else torch.device("cpu")
        self._td: TensorDict | None = None
        self._len_rows = 0
        self._kind = _KIND_TD
        self._treespec: Any = None
        self._tc_cls: Any = None
        if storage is not None:
            self._set_kind(kind, extra)
            self._adopt(td)
            self._len_rows = self._td.batch_size[0]

    _default_checkpointer = TensorStorageCheckpointer

    # ---- converting inputs -----------------------------------------------------------------------
    @staticmethod
    def _to_td(data: Any, batched: bool, ndim: int = 1) -> tuple[TensorDictBase, str, Any]:
        """View ``data`` as a TensorDict; returns ``(td, kind, extra)``.

        Tensors and pytrees get ``ndim`` batch dimensions (``ndim - 1`` for one item), the
        leading dimensions a storage of that ``ndim`` counts in its capacity.
        """
        if is_tensorclass(data):
            return data._tensordict, _KIND_TC, type(data)
        if is_tensor_collection(data):
            return data, _KIND_TD, None
        nbatch = ndim if batched else ndim - 1
        if isinstance(data, torch.Tensor):
            if data.ndim < nbatch:
                raise ValueError(f"data has shape {tuple(data.shape)}; a storage with ndim={ndim} "
                                 f"needs at least {nbatch} leading dims.")
            td = TensorDict._new_unsafe(source={_TENSOR_KEY: data},
                                        batch_size=data.shape[:nbatch], device=None)
            return td, _KIND_TENSOR, None
        if isinstance(data, list):
            if not data:
                raise ValueError("cannot write an empty list to a TensorStorage.")
            return TensorStorage._to_td(torch.stack(data) if isinstance(data[0], torch.Tensor)
                                        else TensorDict.maybe_dense_stack(data)
                                        if is_tensor_collection(data[0])
                                        else _stack_pytrees(data), batched=True, ndim=ndim)
        leaves, spec = tree_flatten(data)
        if not leaves or not all(isinstance(x, torch.Tensor) for x in leaves):
            raise TypeError(f"a TensorStorage holds tensors, TensorDicts, tensorclasses or pytrees "
                            f"of tensors; got {type(data).__name__}.")
        bs = leaves[0].shape[:nbatch]
        if any(x.shape[:nbatch] != bs or x.ndim < nbatch for x in leaves):
            raise ValueError(f"every leaf of the pytree must share its {nbatch} leading dims, got "
                             f"shapes {[tuple(x.shape) for x in leaves]}.")
        td = TensorDict._new_unsafe(source={str(i): x for i, x in enumerate(leaves)},
                                    batch_size=bs, device=None)
        return td, _KIND_PYTREE, spec

    def _set_kind(self, kind: str, extra: Any) -> None:
        self._kind = kind
        self._treespec = extra if kind == _KIND_PYTREE else None
        self._tc_cls = extra if kind == _KIND_TC else None

    def _extra(self) -> Any:
        """The pytree structure or tensorclass of the stored data (``None`` otherwise)."""
        return self._treespec if self._kind == _KIND_PYTREE else self._tc_cls

    def _raise_kind_mismatch(self, kind: str, extra: Any) -> None:
        if kind != self._kind:
            raise TypeError(f"this storage holds {self._kind} data; got {kind} data.")
        if kind == _KIND_TC:
            raise TypeError(f"this storage holds {self._tc_cls.__name__} tensorclass data; got "
                            f"{extra.__name__}.")
        raise ValueError(f"data has pytree structure {extra}, but this storage holds "
                         f"{self._treespec}.")

    def _from_td(self, td: TensorDictBase) -> Any:
        if self._kind == _KIND_TD:
            return td
        if self._kind == _KIND_TENSOR:
            return td.get(_TENSOR_KEY)
        if self._kind == _KIND_TC:
            return self._tc_cls._from_tensordict(td)
        return tree_unflatten([td.get(str(i)) for i in range(len(self._keys))], self._treespec)

    # ---- layout ----------------------------------------------------------------------------------
    @property
    def initialized(self) -> bool:
        return self._td is not None

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def shape(self) -> torch.Size | None:
        """Storage shape ``[rows, *inner]`` (``None`` before a lazy storage's first write)."""
        return None if self._td is None else self._td.batch_size

    @property
    def rows_capacity(self) -> int | None:
        return None if self._td is None else self._td.batch_size[0]

    @property
    def row_numel(self) -> int:
        return 1 if self._td is None else math.prod(self._td.batch_size[1:])

    def rows_capacity_for(self, data: Any, batched: bool) -> int:
        if self._td is not None:
            return self._td.batch_size[0]
        td, _, _ = self._to_td(data, batched=batched, ndim=self.ndim)
        inner = td.batch_size[1 if batched else 0: (self.ndim if batched else self.ndim - 1)]
        rows = self.max_size // max(math.prod(inner), 1)
        if rows < 1:
            raise ValueError(f"max_size={self.max_size} is smaller than one row of "
                             f"{math.prod(inner)} slots (inner shape {tuple(inner)}).")
        return rows

    def rows_to_slots(self, rows: torch.Tensor) -> torch.Tensor:
        numel = self.row_numel
        if numel == 1:
            return rows
        inner = self._td.batch_size[1:]
        return (rows.reshape(rows.shape + (1,)) * numel
                + torch.arange(numel, device=rows.device)).reshape(rows.shape + inner)

    def _create(self, td: TensorDictBase, batched: bool) -> None:
        """Lay out the storage from the first data written (one item or a batch)."""
        lead = int(batched)
        if td.batch_dims < lead + self.ndim - 1:
            raise ValueError(f"data has {td.batch_dims} batch dims; a storage with "
                             f"ndim={self.ndim} needs at least {lead + self.ndim - 1}.")
        inner = td.batch_size[lead: lead + self.ndim - 1]
        shape = torch.Size([self.rows_capacity_for(td, batched), *inner])
        skip = lead + len(inner)
        keys = _leaf_keys(td)
        leaves = []
        for key in keys:
            x = td.get(key)
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"entry {key!r} is a {type(x).__name__}: a TensorStorage holds "
                                "tensors only (use LazyStackStorage or ListStorage otherwise).")
            leaves.append(self._allocate(shape + x.shape[skip:], x.dtype, key))
        self._adopt(_assemble(_build_tree(keys), leaves, shape, self._device))
        self._len_rows = 0

    def _allocate(self, shape: torch.Size, dtype: torch.dtype, key: Any = None) -> torch.Tensor:
        """Allocate the leaf of entry ``key`` (memory-mapped storages override this)."""
        return torch.zeros(shape, dtype=dtype, device=self._device)

    def _adopt(self, td: TensorDictBase) -> None:
        """Use ``td`` (batch shape ``[rows, *inner, ...]``) as the storage's tensors."""
        keys = _leaf_keys(td)
        leaves = []
        for key in keys:
            leaf = td.get(key)
            if not isinstance(leaf, torch.Tensor):
                raise TypeError(f"entry {key!r} is a {type(leaf).__name__}: a TensorStorage holds "
                                "tensors only (use LazyStackStorage or ListStorage otherwise).")
            leaves.append(leaf if leaf.device == self._device else leaf.to(self._device))
        self._keys = keys
        self._leaves = leaves
        self._tree = _build_tree(keys)
        self._td = _assemble(self._tree, leaves, td.batch_size[: self.ndim], self._device)
        self._flat_leaves = [leaf.flatten(0, self.ndim - 1) if self.ndim > 1 else leaf
                             for leaf in leaves]
        self._key_set = set(keys)
        self._inner = self._td.batch_size[1:]
        # (lead dims, full shape of every source leaf) of the last write: see _source_leaves
        self._expected_shapes: tuple[tuple[int, ...] | None, list[torch.Size]] = (None, [])

    # ---- writing ---------------------------------------------------------------------------------
    def _source_leaves(self, td: TensorDictBase, lead: tuple[int, ...]) -> list[torch.Tensor]:
        """Leaves of ``td`` in storage order, after checking keys and shapes."""
        out = _leaves_along_tree(td, self._tree, len(self._keys))
        if out is None:
            out = self._leaves_by_key(td)
        cached_lead, expected = self._expected_shapes
        if cached_lead != lead:  # writes mostly repeat one batch size: keep its shapes
            expected = [torch.Size((*lead, *leaf.shape[self.ndim:])) for leaf in self._leaves]
            self._expected_shapes = (lead, expected)
        if [src.shape for src in out] != expected:
            for key, src, shape in zip(self._keys, out, expected):
                if src.shape != shape:
                    raise ValueError(f"entry {key!r} has shape {tuple(src.shape)}, expected "
                                     f"{tuple(shape)} for this storage.")
        return out

    def _leaves_by_key(self, td: TensorDictBase) -> list[torch.Tensor]:
        """Generic (slower) leaf lookup for any tensor collection; names mismatched keys."""
        keys = td.keys(include_nested=True, leaves_only=True)
        if len(keys) != len(self._keys) or not all(k in self._key_set for k in keys):
            got = set(keys)
            missing = sorted(map(str, self._key_set - got))
            extra = sorted(map(str, got - self._key_set))
            raise KeyError(f"data keys do not match the storage: missing {missing}, unexpected "
                           f"{extra}.")
        return [td.get(key) for key in self._keys]

    def set(self, rows: int | slice | torch.Tensor | Sequence[int], data: Any) -> None:
        single = is_int(rows)
        td, kind, extra = self._to_td(data, batched=not single, ndim=self.ndim)
        if self._td is None:
            self._set_kind(kind, extra)
            self._create(td, batched=not single)
        elif kind != self._kind or (extra is not None and extra != self._extra()):
            self._raise_kind_mismatch(kind, extra)
        cap = self._td.batch_size[0]
        if single:
            row = int(rows)
            if not -cap <= row < cap:
                raise IndexError(f"row {row} out of range for a storage of {cap} rows.")
            row %= cap
            src = self._source_leaves(td, tuple(self._inner))
            torch._foreach_copy_([leaf[row] for leaf in self._leaves], src)
            self._len_rows = max(self._len_rows, row + 1)
            return
        if isinstance(rows, slice):
            start, stop, step = rows.indices(cap)
            if step != 1:
                rows = torch.arange(start, stop, step)
            else:
                src = self._source_leaves(td, (stop - start, *self._inner))
                torch._foreach_copy_([leaf[start:stop] for leaf in self._leaves], src)
                self._len_rows = max(self._len_rows, stop)
                return
        rows = as_long_tensor(rows, name="rows").reshape(-1)
        if rows.numel():  # one pass for the range check and the new length
            lo, top = (int(v) for v in torch.aminmax(rows))
            if top >= cap or lo < -cap:
                raise IndexError(f"rows out of range for a storage of {cap} rows.")
            if lo < 0:  # negative rows count from the end
                rows = rows % cap
                top = int(rows.max())
        src = self._source_leaves(td, (rows.numel(), *self._inner))
        rows_dev = rows.to(self._device)
        for leaf, s in zip(self._leaves, src):
            leaf.index_copy_(0, rows_dev, s.to(leaf.device, leaf.dtype))
        if rows.numel():
            self._len_rows = max(self._len_rows, top + 1)

    def __setitem__(self, index: Any, value: Any) -> None:
        if isinstance(index, tuple) and self._td is not None:
            td, _, _ = self._to_td(value, batched=True, ndim=self.ndim)
            self._td[: self._len_rows][index] = td
            return
        super().__setitem__(index, value)

    # ---- reading ---------------------------------------------------------------------------------
    def get(self, slots: int | torch.Tensor) -> Any:
        if self._td is None:
            raise RuntimeError("cannot read from a storage that was never written.")
        if is_int(slots):
            slots = torch.tensor(int(slots))
        elif not isinstance(slots, torch.Tensor):
            slots = as_long_tensor(slots, name="slots")
        n = len(self)
        if slots.numel() and slots.device.type == "cpu":
            lo, hi = torch.aminmax(slots)
            if int(lo) < 0 or int(hi) >= n:
                raise IndexError(f"slots must lie in [0, {n}) (the written slots), got values in "
                                 f"[{int(lo)}, {int(hi)}].")
        if slots.device != self._device:
            slots = slots.to(self._device)
        flat = slots.reshape(-1)
        shape = slots.shape
        leaves = [torch.index_select(leaf, 0, flat) for leaf in self._flat_leaves]
        if shape != flat.shape:
            leaves = [leaf.reshape(shape + leaf.shape[1:]) for leaf in leaves]
        return self._from_td(_assemble(self._tree, leaves, shape, self._td.device))

    def __getitem__(self, index: Any) -> Any:
        if self._td is None:
            raise RuntimeError("cannot read from a storage that was never written.")
        return self._from_td(self._td[: self._len_rows][index])

    def __len__(self) -> int:
        return self._len_rows * self.row_numel

    # ---- in-place edits --------------------------------------------------------------------------
    def set_key(self, key: Any, value: Any, index: Any = None) -> None:
        if self._td is None:
            raise RuntimeError("the storage is empty: nothing to set.")
        leaf = self._td.get(key, None)
        if leaf is None:
            raise KeyError(f"key {key!r} is not in the storage (keys: "
                           f"{[str(k) for k in self._keys]}).")
        written = leaf[: self._len_rows]
        value = torch.as_tensor(value, dtype=leaf.dtype, device=leaf.device)
        try:  # a value that does not fit raises before anything is written
            if index is None:
                written.copy_(value.expand_as(written))
            else:
                written[index] = value
        except (RuntimeError, IndexError) as err:
            where = "the written rows" if index is None else f"index {index!r}"
            raise ValueError(f"value of shape {tuple(value.shape)} for key {key!r} does not fit "
                             f"{where} of entry shape {tuple(written.shape)}: {err}") from err

    def update_(self, data: Any, clone: bool = False, keys_to_update: Any = None) -> None:
        if self._td is None:
            raise RuntimeError("the storage is empty: nothing to update.")
        if isinstance(data, dict):
            data = TensorDict(data, batch_size=[self._len_rows, *self._inner])
        if clone:
            data = data.clone()
        self._td[: self._len_rows].update_(data, keys_to_update=keys_to_update)

    # ---- lifecycle -------------------------------------------------------------------------------
    def empty(self) -> None:
        self._len_rows = 0

    def state_dict(self) -> dict[str, Any]:
        return {
            "initialized": self._td is not None,
            "len_rows": self._len_rows,
            "storage": None if self._td is None else self._td[: self._len_rows].clone(),
            "kind": self._kind,
            **self._kind_meta(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for key in ("initialized", "len_rows", "storage"):
            if key not in state_dict:
                raise ValueError(f"TensorStorage state_dict is missing {key!r}.")
        if not state_dict["initialized"]:
            self._len_rows = 0
            return
        data = state_dict["storage"]
        meta = self._layout_meta()
        meta.update(len_rows=int(state_dict["len_rows"]), kind=state_dict.get("kind", self._kind),
                    treespec=state_dict.get("treespec"), tensorclass=state_dict.get("tensorclass"))
        self._check_layout_compatible(meta, data)
        self._install(meta, data)

    def _layout_meta(self) -> dict[str, Any]:
        return {
            "class": type(self).__name__,
            "max_size": self.max_size,
            "ndim": self.ndim,
            "initialized": self._td is not None,
            "len_rows": self._len_rows,
            "rows": None if self._td is None else self._td.batch_size[0],
            "kind": self._kind,
            **self._kind_meta(),
        }

    def _kind_meta(self) -> dict[str, str | None]:
        """The pytree structure / tensorclass of the data, as strings a checkpoint can hold."""
        from torch.utils._pytree import treespec_dumps

        cls = self._tc_cls
        return {
            "treespec": treespec_dumps(self._treespec) if self._treespec is not None else None,
            "tensorclass": None if cls is None else f"{cls.__module__}:{cls.__qualname__}",
        }

    @staticmethod
    def _resolve_kind_extra(meta: dict[str, Any]) -> Any:
        """The treespec or tensorclass a checkpoint's metadata names (``None`` for other kinds)."""
        import importlib

        from torch.utils._pytree import treespec_loads

        from tdreplay.core.checkpoint import CheckpointError

        kind = meta.get("kind", _KIND_TD)
        if kind == _KIND_PYTREE:
            if not meta.get("treespec"):
                raise CheckpointError("checkpoint holds pytree data but no pytree structure.")
            return treespec_loads(meta["treespec"])
        if kind == _KIND_TC:
            path = meta.get("tensorclass") or ""
            module, _, qualname = path.partition(":")
            try:
                obj: Any = importlib.import_module(module)
                for part in qualname.split("."):
                    obj = getattr(obj, part)
            except (ImportError, AttributeError, ValueError) as err:
                raise CheckpointError(
                    f"checkpoint holds tensorclass {path!r}, which cannot be imported here ("
                    f"{err}); define it at module level, or write one item to the storage first."
                ) from err
            if not is_tensorclass(obj):
                raise CheckpointError(f"checkpoint tensorclass {path!r} is not a tensorclass.")
            return obj
        return None

    def _check_layout_compatible(self, meta: dict[str, Any], data: TensorDictBase) -> None:
        from tdreplay.core.checkpoint import CheckpointError

        if data.batch_size[0] != meta["len_rows"]:
            raise CheckpointError(f"checkpoint data holds {data.batch_size[0]} rows, its metadata "
                                  f"says {meta['len_rows']}.")
        if self._td is None:
            self._resolve_kind_extra(meta)
            return
        if meta.get("kind", self._kind) != self._kind:
            raise CheckpointError(f"checkpoint holds {meta['kind']} data, this storage "
                                  f"{self._kind}.")
        ours = self._kind_meta()
        for name in ("treespec", "tensorclass"):
            if ours[name] is not None and meta.get(name) != ours[name]:
                raise CheckpointError(f"checkpoint {name} {meta.get(name)!r} differs from this "
                                      f"storage's {ours[name]!r}.")
        if meta["len_rows"] > self._td.batch_size[0]:
            raise CheckpointError(f"checkpoint holds {meta['len_rows']} rows, more than this "
                                  f"storage's {self._td.batch_size[0]}.")
        keys = set(_leaf_keys(data))
        if keys != self._key_set:
            raise CheckpointError(
                f"checkpoint keys {sorted(map(str, keys))} differ from the storage keys "
                f"{sorted(map(str, self._key_set))}."
            )
        for key, leaf in zip(self._keys, self._leaves):
            src = data.get(key)
            if src.shape[1:] != leaf.shape[1:]:
                raise CheckpointError(f"checkpoint entry {key!r} has row shape "
                                      f"{tuple(src.shape[1:])}, the storage "
                                      f"{tuple(leaf.shape[1:])}.")
            if src.dtype != leaf.dtype:
                raise CheckpointError(f"checkpoint entry {key!r} has dtype {src.dtype}, the "
                                      f"storage {leaf.dtype}.")

    def _install(self, meta: dict[str, Any], data: TensorDictBase) -> None:
        if self._td is None:
            self._set_kind(meta.get("kind", _KIND_TD), self._resolve_kind_extra(meta))
            self._create(data, batched=True)
        n = int(meta["len_rows"])
        if n:
            torch._foreach_copy_([leaf[:n] for leaf in self._leaves],
                                 [data.get(k) for k in self._keys])
        self._len_rows = n

    def __repr__(self) -> str:
        shape = None if self._td is None else tuple(self._td.batch_size)
        return (f"{type(self).__name__}(max_size={self.max_size}, ndim={self.ndim}, shape={shape}, "
                f"len={len(self)}, device={self._device})")


def _stack_pytrees(items: list[Any]) -> Any:
    flats, specs = zip(*(tree_flatten(x) for x in items))
    if not flats[0] or not all(isinstance(x, torch.Tensor) for leaves in flats for x in leaves):
        raise TypeError(f"a TensorStorage holds tensors, TensorDicts, tensorclasses or pytrees of "
                        f"tensors; got a list of {type(items[0]).__name__}.")
    if any(spec != specs[0] for spec in specs):
        raise ValueError("the items of a list written to a TensorStorage must share one pytree "
                         "structure.")
    return tree_unflatten([torch.stack(group) for group in zip(*flats)], specs[0])


class LazyTensorStorage(TensorStorage):
    """A :class:`TensorStorage` whose tensors are allocated from the first write.

    Parameters
    ----------
    max_size : int
        Capacity in slots.
    device : str or torch.device
        Where the data lives (``"cpu"`` by default; ``"cuda"`` keeps the whole buffer on GPU).
    ndim : int
        Leading dimensions counted in the capacity (see :class:`TensorStorage`).

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> s = LazyTensorStorage(100, ndim=2)
    >>> s.set(slice(0, 2), TensorDict({"obs": torch.zeros(2, 10, 3)}, [2, 10]))
    >>> s.shape, len(s)
    (torch.Size([10, 10]), 20)
    """

    def __init__(
        self,
        max_size: int,
        *,
        device: str | torch.device = "cpu",
        ndim: int = 1,
        checkpointer: StorageCheckpointerBase | None = None,
    ) -> None:
        super().__init__(None, max_size, device=device, ndim=ndim, checkpointer=checkpointer)
