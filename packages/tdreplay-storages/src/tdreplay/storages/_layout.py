"""Building blocks shared by the tensor storages and the checkpointers (no storage imports).

- nested keys as tuples of names and back (:func:`key_path`, :func:`as_key`), the sorted leaf
  keys of a TensorDict (:func:`leaf_keys`), dtype names (:func:`dtype_from_str`);
- the tree of a storage's keys (:func:`build_tree`), walked to read a source TensorDict's
  leaves in storage order (:func:`leaves_along_tree`) and to build an output TensorDict from
  leaves (:func:`assemble`);
- :class:`TensorLayout`: the preallocated TensorDict of a tensor storage and its leaves, and the
  tensorclasses nested in its data (:mod:`~._tensorclasses`), which its reads give back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from operator import attrgetter
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
from tdreplay.core.utils import as_long_tensor, restore_attributes

from ._casts import check_cast
from ._fast_tensordict import copy_leaves, new_tensordict
from ._host_rows import HostRows
from ._tensorclasses import (
    NestedClasses,
    check_written_classes,
    inner_first,
    nested_tensorclasses,
    with_classes,
)

#: A TensorDict key: a name, or a tuple of names for a nested entry.
NestedKey = str | tuple[str, ...]
#: The batch dims the nested TensorDicts of a layout have past their parent's, by path:
#: ``{("agents",): (3,)}`` for an ``"agents"`` TensorDict of batch size ``[*outer, 3]`` (one
#: entry per agent); levels without dims of their own are left out.
NestedDims = dict[tuple[str, ...], tuple[int, ...]]


def _is_leaf(cls: type) -> bool:
    """Whether entries of type ``cls`` are leaves of a layout: tensors, and non-tensor data
    (``NonTensorData`` / ``NonTensorStack``: strings and other objects in a TensorDict), which
    tensordict's own ``leaves_only`` keys leave out, so that a tensor storage refuses them by
    name (:func:`check_source`) instead of dropping them without a word."""
    return not is_tensor_collection(cls) or issubclass(cls, (NonTensorData, NonTensorStack))


def leaf_keys(td: TensorDictBase) -> list[NestedKey]:
    """The leaf keys of ``td`` (nested ones as tuples; non-tensor entries included), sorted by
    their string form."""
    return sorted(td.keys(include_nested=True, leaves_only=True, is_leaf=_is_leaf), key=str)


def nested_batch_dims(td: TensorDictBase) -> NestedDims:
    """The batch dims each nested TensorDict (or tensorclass) of ``td`` has past its parent's
    (see :data:`NestedDims`), which a storage keeps: TorchRL's multi-agent data nests
    ``[B, n_agents]`` TensorDicts in ``[B]`` ones.

    Examples
    --------
    >>> td = TensorDict({"agents": TensorDict({"obs": torch.zeros(4, 3, 5)}, [4, 3])}, [4])
    >>> nested_batch_dims(td)
    {('agents',): (3,)}
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
            if extra:
                out[level] = extra
            stack.append((level, value))
    return out


def set_nested_batch_dims(td: TensorDictBase, nested_dims: NestedDims) -> TensorDictBase:
    """``td`` (built level by level with its parent's batch size) with each nested
    TensorDict given its own batch dims ``nested_dims`` back, in place; ``CheckpointError``
    where its entries do not have them.

    Examples
    --------
    >>> td = TensorDict({("agents", "obs"): torch.zeros(4, 3, 5)}, [4])
    >>> set_nested_batch_dims(td, {("agents",): (3,)})["agents"].batch_size
    torch.Size([4, 3])
    """
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


def dtype_from_str(name: str) -> torch.dtype:
    """The torch dtype ``str(dtype)`` wrote (``"torch.float32"`` or ``"float32"``).

    Raises ``ValueError`` for a name that is not a torch dtype.
    """
    dtype = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}.")
    return dtype


def _slots_viewable(leaf: torch.Tensor, ndim: int) -> torch.Tensor:
    """``leaf``, or a contiguous copy of it when its ``ndim`` leading dims cannot be flattened
    into one of slots without a copy: the layout reads and writes its flat leaves, which must
    be views of the leaves (of a transposed ``[rows, envs]`` tensor, ``flatten`` copies).

    Examples
    --------
    >>> leaf = torch.zeros(3, 4).t()  # 4 rows of 3 environments, not contiguous
    >>> _slots_viewable(leaf, 2).is_contiguous(), _slots_viewable(leaf, 1) is leaf
    (True, True)
    """
    if ndim == 1:
        return leaf
    try:  # a view or an error: never a copy made only to be compared
        leaf.view(math.prod(leaf.shape[:ndim]), *leaf.shape[ndim:])
    except RuntimeError:
        return leaf.contiguous()
    return leaf


def build_tree(keys: Sequence[NestedKey]) -> dict[str, Any]:
    """Nested dict mapping each key path to the position of its leaf in ``keys``."""
    tree: dict[str, Any] = {}
    for pos, key in enumerate(keys):
        path = key_path(key)
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = pos
    return tree


def leaves_along_tree(td: TensorDictBase, tree: dict[str, Any],
                      count: int) -> list[torch.Tensor] | None:
    """Leaves of a plain ``TensorDict`` in storage order, walking its entries along ``tree``.

    Checks that ``td`` has exactly the storage's keys at every level. Returns ``None`` when
    ``td`` is not a plain TensorDict or its keys differ (the caller then takes the generic path,
    which also names the mismatched keys).
    """
    out: list[Any] = [None] * count
    stack: list[tuple[Any, dict[str, Any]]] = [(td, tree)]
    while stack:
        node_td, node = stack.pop()
        if type(node_td) is not TensorDict:
            return None
        seen = 0
        for name, value in node_td.items():
            sub = node.get(name)
            if sub is None:
                return None
            seen += 1
            if type(sub) is dict:
                stack.append((value, sub))
            elif isinstance(value, torch.Tensor):
                out[sub] = value
            else:
                return None
        if seen != len(node):
            return None
    return out


def assemble(tree: dict[str, Any], leaves: list[torch.Tensor], batch_size: torch.Size,
             device: torch.device | None, nested_dims: NestedDims | None = None) -> TensorDict:
    """A TensorDict of batch size ``batch_size`` holding ``leaves`` at the keys of ``tree``
    (its nested levels with their own batch dims ``nested_dims``), checked by tensordict's
    constructor (the read path builds with :func:`tensordict_builder` without the checks)."""
    return tensordict_builder(tree, device, _checked_tensordict,
                              nested_dims)(leaves, batch_size)


def _checked_tensordict(source: dict[str, Any], batch_size: torch.Size,
                        device: torch.device | None) -> TensorDict:
    # non_blocking=False: the leaves are already on ``device`` (no transfer to wait for)
    return TensorDict(source, batch_size=batch_size, device=device, non_blocking=False)


def tensordict_builder(tree: dict[str, Any], device: torch.device | None,
                       construct: Callable[..., TensorDict] = new_tensordict,
                       nested_dims: NestedDims | None = None, path: tuple[str, ...] = (),
                       classes: NestedClasses | None = None
                       ) -> Callable[[list[torch.Tensor], torch.Size], TensorDict]:
    """``build(leaves, batch_size)``: a TensorDict of ``leaves`` at the keys of ``tree``, one
    ``construct(source, batch_size, device)`` per level, a nested level with its own batch
    dims of ``nested_dims`` after its parent's, and made the tensorclass ``classes`` names for
    its path (if any); the walk of ``tree`` is done once, here (``path``: where ``tree`` is in
    the whole one), so that a tree without tensorclasses builds as fast as ever. By default
    built without checking the leaves (:func:`~._fast_tensordict.new_tensordict`): they must
    have been cut from a layout's own (leading dims ``batch_size``, on ``device``); the read
    path builds one per sample.

    Examples
    --------
    >>> build = tensordict_builder({"a": 0, "n": {"b": 1}}, None, nested_dims={("n",): (3,)})
    >>> td = build([torch.zeros(2, 3), torch.ones(2, 3)], torch.Size([2]))
    >>> td["n", "b"].tolist()[0], td.batch_size, td["n"].batch_size
    ([1.0, 1.0, 1.0], torch.Size([2]), torch.Size([2, 3]))
    >>> from tensordict import tensorclass
    >>> @tensorclass
    ... class B:
    ...     b: torch.Tensor
    >>> build = tensordict_builder({"a": 0, "n": {"b": 1}}, None, classes={("n",): B})
    >>> type(build([torch.zeros(2), torch.ones(2)], torch.Size([2]))["n"]).__name__
    'B'
    """
    nested_dims = nested_dims or {}
    classes = classes or {}
    entries: list[tuple[str, Any, Any]] = []
    for name, node in tree.items():
        if isinstance(node, dict):
            inner = (*path, name)
            build = tensordict_builder(node, device, construct, nested_dims, inner, classes)
            cls = classes.get(inner)
            if cls is not None:  # a tensorclass level: made from the TensorDict built
                build = partial(_build_tensorclass, cls, build)
            entries.append((name, build, nested_dims.get(inner, ())))
        else:
            entries.append((name, None, node))
    # (a partial pickles with its layout)
    return partial(_build_tensordict, entries, device, construct)


def _build_tensorclass(cls: Any, build: Callable[[list[torch.Tensor], torch.Size], TensorDict],
                       leaves: list[torch.Tensor], batch_size: torch.Size) -> Any:
    return cls.from_tensordict(build(leaves, batch_size))


def _build_tensordict(entries: list[tuple[str, Any, Any]], device: torch.device | None,
                      construct: Callable[..., TensorDict], leaves: list[torch.Tensor],
                      batch_size: torch.Size) -> TensorDict:
    source: dict[str, Any] = {}
    for name, nested, position_or_dims in entries:
        if nested is None:
            source[name] = leaves[position_or_dims]
        else:  # a nested level, with its own batch dims (if any) after ours
            source[name] = nested(leaves, batch_size + position_or_dims
                                  if position_or_dims else batch_size)
    return construct(source, batch_size, device)


def _rows_in_range(rows: torch.Tensor, cap: int) -> tuple[torch.Tensor, int]:
    """``rows`` (1-D) checked against ``cap`` rows, negative ones counted from the end, and the
    highest row (``-1`` for no rows)."""
    if not rows.numel():
        return rows, -1
    lo, top = (int(v) for v in torch.aminmax(rows))  # one pass for the check and the top row
    if top >= cap or lo < -cap:
        raise IndexError(f"rows out of range for a storage of {cap} rows.")
    if lo < 0:  # negative rows count from the end
        rows = rows % cap
        top = int(rows.max())
    return rows, top


#: ``(shape, dtype)`` of a tensor, read in one call (the write path's check).
_SHAPE_DTYPE = attrgetter("shape", "dtype")


def check_source(key: NestedKey, value: Any) -> torch.Tensor:
    """``value``, the entry ``key`` of data to store, checked to be a tensor holding data:
    ``TypeError`` for anything else, ``ValueError`` for a meta-device tensor (shape only).

    Examples
    --------
    >>> check_source("obs", torch.zeros(2, device="meta"))
    Traceback (most recent call last):
    ...
    ValueError: entry 'obs' is a meta tensor (a shape without data): a storage holds data; ...
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"entry {key!r} is a {type(value).__name__}: this storage holds a "
                        "tensor there (use LazyStackStorage or ListStorage for data of any "
                        "kind).")
    if value.is_meta:
        raise ValueError(f"entry {key!r} is a meta tensor (a shape without data): a storage "
                         "holds data; write tensors on a real device.")
    return value


class TensorLayout:
    """The tensors of a tensor storage: its TensorDict and its leaves in storage order.

    Parameters
    ----------
    td : TensorDictBase
        Batch shape ``[rows, *inner, *item_batch]``; its leaves become the storage's tensors
        (moved to ``device`` when elsewhere). Batch dims past the ``ndim`` leading ones are
        the batch dims of every item (an item added with batch size ``[10]`` reads back with
        it).
    ndim : int
        Leading dimensions counted in the storage's capacity (``rows`` and ``inner``).
    device : torch.device
        Where the storage's tensors live.
    classes : dict, optional
        The tensorclass of each nested level of the data (:data:`~._tensorclasses.NestedClasses`):
        reads (:meth:`gather`, :meth:`read_index`) give those levels back as their classes.
        ``None``: those nested in ``td`` itself.

    Examples
    --------
    >>> layout = TensorLayout(TensorDict({"b": torch.zeros(4, 2), ("a", "c"): torch.ones(4)}, [4]),
    ...                       ndim=1, device=torch.device("cpu"))
    >>> layout.keys, layout.rows, layout.row_numel
    ([('a', 'c'), 'b'], 4, 1)
    """

    #: the keys of the non-tensor entries kept beside the tensors (see
    #: :class:`~._object_layout.ObjectLayout`, whose methods below take them in too)
    object_key_set: frozenset[NestedKey] = frozenset()

    @classmethod
    def allocate(cls, td: TensorDictBase, shape: torch.Size, skip: int,
                 allocate: Callable[[torch.Size, torch.dtype, NestedKey], torch.Tensor],
                 ndim: int, device: torch.device,
                 classes: NestedClasses | None = None) -> TensorLayout:
        """A layout of shape ``shape`` (``[rows, *inner]``) for data like ``td``.

        Each leaf of ``td`` gets a tensor ``allocate(shape + leaf.shape[skip:], leaf.dtype,
        key)``; ``TypeError`` for an entry that is not a tensor. The batch dims of ``td`` past
        ``skip`` stay batch dims of every item (:attr:`item_batch`), as TorchRL keeps them.
        ``classes``: the tensorclasses nested in the data (``None``: those of ``td``).
        """
        keys = leaf_keys(td)
        sources = [check_source(key, td.get(key)) for key in keys]  # all before allocating any
        leaves = [allocate(shape + x.shape[skip:], x.dtype, key) for key, x in zip(keys, sources)]
        batch = shape + td.batch_size[skip:]
        if classes is None:
            classes = nested_tensorclasses(td)
        return cls(assemble(build_tree(keys), leaves, batch, device, nested_batch_dims(td)),
                   ndim, device, classes)

    def __init__(self, td: TensorDictBase, ndim: int, device: torch.device,
                 classes: NestedClasses | None = None) -> None:
        keys = leaf_keys(td)
        leaves = []
        for key in keys:
            leaf = check_source(key, td.get(key))
            leaves.append(_slots_viewable(leaf if leaf.device == device else leaf.to(device),
                                          ndim))
        self.ndim = ndim
        self.device = device
        self.keys = keys
        self.key_set = set(keys)
        self.leaves = leaves
        self.tree = build_tree(keys)
        #: the batch dims of its nested TensorDicts past their parent's (e.g. agents)
        self.nested_dims = nested_batch_dims(td)
        #: the tensorclass of each nested level of the data (``{}``: plain TensorDicts), which
        #: reads give back (see :mod:`~._tensorclasses`)
        self.nested_classes: NestedClasses = dict(nested_tensorclasses(td) if classes is None
                                                  else classes)
        self._view_leaves(td.batch_size)
        self.shape = self.td.batch_size[:ndim]
        #: batch dims of every item, after the ``ndim`` leading ones (``[]`` for most data)
        self.item_batch = self.td.batch_size[ndim:]
        self.rows = self.shape[0]
        self.inner = self.shape[1:]
        self.row_numel = self.inner.numel()
        #: rows from this one on were neither written nor zeroed (leaves allocated unfilled, see
        #: :meth:`before_write`); ``None``: every row holds data or zeros
        self.unfilled_from: int | None = None
        # (lead dims, [(full shape, dtype) of every source leaf], [its full shape]) of the
        # last write: see _expected_for
        self._expected: tuple[tuple[int, ...] | None, list[tuple[torch.Size, torch.dtype]],
                              list[torch.Size]] = (None, [], [])

    def _view_leaves(self, batch_size: torch.Size) -> None:
        """Make what sees :attr:`leaves`' memory: the TensorDict over them (batch size
        ``batch_size``), their flattened views and the numpy views of :attr:`host_rows`."""
        self.td = assemble(self.tree, self.leaves, batch_size, self.device, self.nested_dims)
        self._build_td = tensordict_builder(self.tree, self.device,
                                            nested_dims=self.nested_dims,
                                            classes=self.nested_classes)
        #: :attr:`nested_classes` in the order :func:`~._tensorclasses.with_classes` makes them
        self._classes_inner_first = inner_first(self.nested_classes)
        #: whether the data has nested levels (without, it can hold no nested tensorclass)
        self.has_levels = any(type(node) is dict for node in self.tree.values())
        #: the leaves with the ``ndim`` leading dimensions flattened into one of slots: views of
        #: the leaves' memory (see :func:`_slots_viewable`)
        self.flat_leaves = [leaf.flatten(0, self.ndim - 1) if self.ndim > 1 else leaf
                            for leaf in self.leaves]
        #: reads and writes rows of the flat leaves on the host (:meth:`gather`,
        #: :meth:`copy_rows`)
        self.host_rows = HostRows(self.flat_leaves)

    def __getstate__(self) -> dict[str, Any]:
        # pickle and deepcopy would give the views of the leaves memory of their own (writes
        # going where reads never look): the leaves alone are copied, the views made again
        state = self.__dict__.copy()
        for name in ("td", "_build_td", "flat_leaves", "host_rows", "_classes_inner_first",
                     "has_levels"):
            del state[name]
        state["batch_size"] = self.td.batch_size
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        batch_size = state.pop("batch_size")
        state.setdefault("nested_dims", {})  # (pickled before nested levels kept their dims)
        state.setdefault("nested_classes", {})  # (pickled before nested classes were kept)
        restore_attributes(self, state)
        self._view_leaves(batch_size)

    def gather(self, slots: torch.Tensor) -> TensorDict:
        """The items at ``slots`` (an int64 tensor of flat slots, any shape) as a TensorDict of
        batch size ``slots.shape`` (and the items' own batch dims): one row gather per leaf
        (:class:`~._host_rows.HostRows`), no check of the slots.

        Examples
        --------
        >>> layout = TensorLayout(TensorDict({"a": torch.arange(4)}, [4]), ndim=1,
        ...                       device=torch.device("cpu"))
        >>> layout.gather(torch.tensor([[3, 0]]))["a"].tolist()
        [[3, 0]]
        """
        if slots.device != self.device:
            slots = slots.to(self.device)
        shape = slots.shape
        if len(shape) == 1:
            leaves = self.host_rows.take(slots)
        else:
            leaves = [rows.reshape(shape + rows.shape[1:])
                      for rows in self.host_rows.take(slots.reshape(-1))]
        return self.build(leaves, shape)

    def before_write(self, start: int, stop: int) -> None:
        """Rows ``[start, stop)`` are about to be written: in a layout allocated unfilled
        (:attr:`unfilled_from` set), zero the never-written rows below ``start`` the write would
        leave behind, so that every row below the written count holds data or zeros.

        Examples
        --------
        >>> layout = TensorLayout(TensorDict({"a": torch.full((6,), 9)}, [6]), ndim=1,
        ...                       device=torch.device("cpu"))
        >>> layout.unfilled_from = 0  # as if allocated unfilled: nothing written yet
        >>> layout.before_write(3, 4)
        >>> layout.leaves[0].tolist(), layout.unfilled_from
        ([0, 0, 0, 9, 9, 9], 4)
        >>> layout.before_write(5, 6)  # the top row: rows 4 zeroed, none left unfilled
        >>> layout.leaves[0].tolist(), layout.unfilled_from
        ([0, 0, 0, 9, 0, 9], None)
        """
        low = self.unfilled_from
        if low is None or stop <= low:
            return
        if start > low:
            self.zero_rows(low, start)
        # every row written or zeroed once the top one is: no check on later writes
        self.unfilled_from = stop if stop < self.rows else None

    def build(self, leaves: list[torch.Tensor], lead: torch.Size) -> TensorDict:
        """A TensorDict of ``leaves`` (one per key, in storage order, each of shape ``lead +``
        its own) at the storage's keys: batch size ``lead`` and the items' own batch dims.

        Examples
        --------
        >>> layout = TensorLayout(TensorDict({"a": torch.zeros(4, 2)}, [4]), ndim=1,
        ...                       device=torch.device("cpu"))
        >>> layout.build([torch.ones(3, 2)], torch.Size([3])).batch_size
        torch.Size([3])
        """
        item_batch = self.item_batch
        return self._build_td(leaves, lead + item_batch if item_batch else lead)

    def rows_view(self, rows: int) -> TensorDictBase:
        """The first ``rows`` rows as a TensorDict: a view of the leaves."""
        return self.td[:rows]

    def read_index(self, rows: int, index: Any) -> Any:
        """``index`` of the first ``rows`` rows (TensorDict indexing), its nested levels made
        their tensorclasses (:attr:`nested_classes`).

        Examples
        --------
        >>> from tensordict import tensorclass
        >>> @tensorclass
        ... class Obs:
        ...     pos: torch.Tensor
        >>> layout = TensorLayout(TensorDict({("obs", "pos"): torch.arange(4)}, [4]), ndim=1,
        ...                       device=torch.device("cpu"), classes={("obs",): Obs})
        >>> out = layout.read_index(3, slice(1, None))
        >>> type(out["obs"]).__name__, out["obs"].pos.tolist()
        ('Obs', [1, 2])
        """
        out = self._read_rows(rows, index)
        classes = self._classes_inner_first
        if classes and isinstance(out, TensorDictBase) and not _is_key_index(index):
            return with_classes(out, classes)
        return out

    def _read_rows(self, rows: int, index: Any) -> Any:
        """``index`` of the first ``rows`` rows of :attr:`td` (plain TensorDicts)."""
        return self.td[:rows][index]

    # ---- nested tensorclasses ------------------------------------------------------------------
    def is_level(self, path: tuple[str, ...]) -> bool:
        """Whether ``path`` is a nested level (not a leaf) of the layout's data."""
        node: Any = self.tree
        for name in path:
            if type(node) is not dict:
                return False
            node = node.get(name)
        return type(node) is dict

    def check_classes(self, classes: NestedClasses) -> None:
        """Refuse (``TypeError`` naming the entry, see
        :func:`~._tensorclasses.check_written_classes`) a write of data whose nested
        tensorclasses ``classes`` would read back as other classes from this layout.

        Examples
        --------
        >>> from tensordict import tensorclass
        >>> @tensorclass
        ... class Obs:
        ...     pos: torch.Tensor
        >>> layout = TensorLayout(TensorDict({("obs", "pos"): torch.zeros(4)}, [4]), ndim=1,
        ...                       device=torch.device("cpu"))
        >>> layout.check_classes({("obs",): Obs})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: entry 'obs' is tensorclass Obs, but this storage holds a TensorDict there: ...
        """
        if classes or self.nested_classes:
            check_written_classes(self.nested_classes, classes, self.is_level)

    def write_index(self, rows: int, index: Any, td: TensorDictBase) -> None:
        """Write ``td`` at ``index`` of the first ``rows`` rows (TensorDict indexing)."""
        self.td[:rows][index] = td

    def install_rows(self, rows: int, data: TensorDictBase) -> None:
        """Make ``data`` (checked by :meth:`check_rows_compatible`) the first ``rows`` rows."""
        if rows:
            self.before_write(0, rows)
            self.copy_rows(0, rows, [data.get(k) for k in self.keys])

    def object_updates(self, data: TensorDictBase, rows: int,
                       keys_to_update: Any = None) -> Callable[[], None] | None:
        """What ``update_`` writes into non-tensor entries, checked: ``None`` (none here)."""
        return None

    def matching_leaves(self, td: TensorDictBase) -> list[torch.Tensor] | None:
        """Leaves of ``td`` in storage order when it is a plain TensorDict with exactly the
        storage's keys (shapes unchecked), else ``None``."""
        return leaves_along_tree(td, self.tree, len(self.keys))

    def source_leaves(self, td: TensorDictBase, lead: tuple[int, ...],
                      leaves: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
        """Leaves of ``td`` in storage order, after checking keys and shapes.

        ``lead`` is the expected shape before each leaf's own dimensions (``[n, *inner]`` for
        ``n`` rows); ``leaves``: what :meth:`matching_leaves` returned for ``td``, if known.
        Raises ``KeyError`` naming missing / unexpected keys, ``ValueError``
        naming an entry of another shape, and what :func:`~tdreplay.storages._casts.check_cast`
        raises for an entry of another dtype whose cast would lose values. Data of the
        expected shapes and dtypes costs one comparison (the hot path).
        """
        out = leaves if leaves is not None else leaves_along_tree(td, self.tree, len(self.keys))
        if out is None:
            out = self.leaves_by_key(td)
        expected, _ = self._expected_for(lead)
        # one comparison on the hot path; the checks only where something differs
        if list(map(_SHAPE_DTYPE, out)) != expected:
            for key, src, (shape, dtype) in zip(self.keys, out, expected):
                check_source(key, src)
                if src.shape != shape:
                    raise ValueError(f"entry {key!r} has shape {tuple(src.shape)}, expected "
                                     f"{tuple(shape)} for this storage.")
                if src.dtype is not dtype:
                    check_cast(key, src, dtype)
        return out

    def _expected_for(self, lead: tuple[int, ...]
                      ) -> tuple[list[tuple[torch.Size, torch.dtype]], list[torch.Size]]:
        """``([(shape, dtype) of every source leaf], [its shape])`` for a write whose leaves
        start with the dims ``lead``: ``lead`` + each leaf's own dims (kept for the last
        ``lead``: writes mostly repeat one batch size)."""
        cached_lead, expected, shapes = self._expected
        if cached_lead != lead:
            expected = [(torch.Size((*lead, *leaf.shape[self.ndim:])), leaf.dtype)
                        for leaf in self.leaves]
            shapes = [shape for shape, _ in expected]
            self._expected = (lead, expected, shapes)
        return expected, shapes

    def leaves_by_key(self, td: TensorDictBase) -> list[torch.Tensor]:
        """Generic (slower) leaf lookup for any tensor collection; names mismatched keys."""
        keys = leaf_keys(td)
        for key in keys:  # a string entry is refused by name, not left behind
            if key not in self.key_set:
                check_source(key, td.get(key))
        if len(keys) != len(self.keys) or not all(k in self.key_set for k in keys):
            got = set(keys)
            missing = sorted(map(str, self.key_set - got))
            extra = sorted(map(str, got - self.key_set))
            raise KeyError(f"data keys do not match the storage: missing {missing}, unexpected "
                           f"{extra}.")
        return [td.get(key) for key in self.keys]

    def check_rows_compatible(self, data: TensorDictBase, rows: int) -> None:
        """Raise :class:`~tdreplay.core.CheckpointError` unless ``rows`` rows fit and ``data`` has
        this layout's keys, row shapes (after the leading dimension) and dtypes."""
        if rows > self.rows:
            raise CheckpointError(f"checkpoint holds {rows} rows, more than this storage's "
                                  f"{self.rows}.")
        keys = set(leaf_keys(data))
        if keys != self.key_set:
            raise CheckpointError(
                f"checkpoint keys {sorted(map(str, keys))} differ from the storage keys "
                f"{sorted(map(str, self.key_set))}."
            )
        for key, leaf in zip(self.keys, self.leaves):
            src = data.get(key)
            if src.shape[1:] != leaf.shape[1:]:
                raise CheckpointError(f"checkpoint entry {key!r} has row shape "
                                      f"{tuple(src.shape[1:])}, the storage "
                                      f"{tuple(leaf.shape[1:])}.")
            if src.dtype != leaf.dtype:
                raise CheckpointError(f"checkpoint entry {key!r} has dtype {src.dtype}, the "
                                      f"storage {leaf.dtype}.")

    def copy_rows(self, start: int, stop: int, src: Sequence[torch.Tensor],
                  shapes: Sequence[tuple[int, ...]] | None = None) -> bool:
        """Copy ``src`` (leaves in storage order; of one row, without its leading dim, when
        ``stop == start + 1``) into rows ``[start, stop)`` of every leaf: through the leaves'
        numpy views where they and ``src`` have them, else with torch. Returns True.

        ``shapes``: ``src`` is unchecked; it is copied (through numpy) only when every source
        has exactly its shape in ``shapes`` and its leaf's dtype, else nothing is written and
        the result is False (the caller then checks it).
        """
        numel = self.row_numel
        if self.host_rows.put(start * numel, stop * numel, src, shapes):
            return True
        if shapes is not None:
            return False
        copy_leaves([leaf[start:stop] for leaf in self.leaves], src)  # copy_ broadcasts
        return True

    def write_run(self, start: int, stop: int, td: TensorDictBase,
                  leaves: list[torch.Tensor] | None, lead: tuple[int, ...] | None = None) -> None:
        """Write the batch ``td`` (``leaves``: of :meth:`matching_leaves`, if known) at rows
        ``[start, stop)``, checked as :meth:`source_leaves` checks it. ``lead``: the shape before
        each leaf's own dims (``[stop - start, *inner]`` by default; ``inner`` for one item
        without a leading dim at ``stop == start + 1``).

        The common write (the storage's keys, dtypes and shapes, on the host) is checked by
        the numpy copy itself (:meth:`copy_rows` with the shapes it must have); anything
        else is checked and named by :meth:`source_leaves` first.

        Examples
        --------
        >>> layout = TensorLayout(TensorDict({"a": torch.zeros(4, 2)}, [4]), ndim=1,
        ...                       device=torch.device("cpu"))
        >>> batch = TensorDict({"a": torch.ones(2, 2)}, [2])
        >>> layout.write_run(1, 3, batch, layout.matching_leaves(batch))
        >>> layout.leaves[0][:, 0].tolist()
        [0.0, 1.0, 1.0, 0.0]
        >>> layout.write_run(0, 2, TensorDict({"a": torch.ones(2, 1)}, [2]), None)
        Traceback (most recent call last):
        ...
        ValueError: entry 'a' has shape (2, 1), expected (2, 2) for this storage.
        """
        if lead is None:
            lead = (stop - start, *self.inner)
        if leaves is not None:
            _, shapes = self._expected_for(lead)
            if self.copy_rows(start, stop, leaves, shapes):
                self.before_write(start, stop)  # (rows below ``start`` only: in any order)
                return
        src = self.source_leaves(td, lead, leaves)
        self.before_write(start, stop)
        self.copy_rows(start, stop, src)

    def write(self, rows: Any, td: TensorDictBase, leaves: list[torch.Tensor] | None,
              single: bool) -> tuple[int | None, int | None]:
        """Write ``td`` at ``rows`` (one item at an int row, else a batch at a slice or at row
        indices; negative rows count from the end) after checking it (:meth:`source_leaves`,
        with ``leaves`` of :meth:`matching_leaves` if known). Returns ``(top, last)``: the row
        count the write reaches (``None`` when it writes no row) and the row written last
        (``None``: none).

        Examples
        --------
        >>> layout = TensorLayout(TensorDict({"a": torch.zeros(5)}, [5]), ndim=1,
        ...                       device=torch.device("cpu"))
        >>> layout.write(torch.tensor([3, -5]), TensorDict({"a": torch.ones(2)}, [2]), None,
        ...              single=False)
        (4, 0)
        >>> layout.leaves[0].tolist()
        [1.0, 0.0, 0.0, 1.0, 0.0]
        """
        cap = self.rows
        if single:
            row = int(rows)
            if not -cap <= row < cap:
                raise IndexError(f"row {row} out of range for a storage of {cap} rows.")
            row %= cap
            self.write_run(row, row + 1, td, leaves, lead=self.inner)
            return row + 1, row
        if isinstance(rows, slice):
            start, stop, step = rows.indices(cap)
            if step != 1:
                rows = torch.arange(start, stop, step)
            else:
                self.write_run(start, stop, td, leaves)
                return stop, (stop - 1 if stop > start else None)
        rows, top = _rows_in_range(as_long_tensor(rows, name="rows").reshape(-1), cap)
        src = self.source_leaves(td, (rows.numel(), *self.inner), leaves)
        self.before_write(top + 1, top + 1)  # rows in any order: all below the top one
        self.index_copy_rows(rows.to(self.device), src)
        return (top + 1, int(rows[-1])) if rows.numel() else (None, None)

    def zero_rows(self, start: int, stop: int) -> None:
        """Zero rows ``[start, stop)`` of every leaf."""
        for leaf in self.leaves:
            leaf[start:stop].zero_()

    def index_copy_rows(self, rows: torch.Tensor, src: Sequence[torch.Tensor]) -> None:
        """Copy ``src`` (leaves in storage order, one row per entry of ``rows``) into ``rows``."""
        for leaf, s in zip(self.leaves, src):
            leaf.index_copy_(0, rows, s.to(leaf.device, leaf.dtype))

    def set_entry(self, key: NestedKey, value: Any, rows: int, index: Any = None) -> None:
        """Set entry ``key`` of the first ``rows`` rows to ``value`` in place (at ``index`` of
        those rows when given); ``KeyError`` / ``ValueError`` before anything is written."""
        leaf = self.td.get(key, None)
        if leaf is None:
            raise KeyError(f"key {key!r} is not in the storage (keys: "
                           f"{[str(k) for k in self.keys]}).")
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


def _is_key_index(index: Any) -> bool:
    """Whether ``index`` selects an entry by its key (a name, or a tuple of names), not rows."""
    return isinstance(index, str) or (isinstance(index, tuple) and bool(index)
                                      and all(isinstance(part, str) for part in index))


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


def checked_updates(layout: TensorLayout, rows: TensorDictBase, data: Any,
                    keys_to_update: Any = None) -> dict[NestedKey, torch.Tensor]:
    """The values ``update_`` writes into the written ``rows`` of ``layout``: each entry of
    ``data`` the storage has (and ``keys_to_update`` names, a name standing for the entries
    under it), checked by :func:`fitting_value`; every one checked before the caller writes
    any. Entries the storage lacks are skipped, as ``TensorDict.update_`` skips them.

    Examples
    --------
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


def with_new_entries(layout: TensorLayout, td: TensorDictBase, allocate: Any, skip: int,
                     device: torch.device, classes: NestedClasses | None = None) -> TensorLayout:
    """``layout`` with the entries of ``td`` (data about to be written) that it lacks, each
    allocated (zero-filled) for every row, as TorchRL's tensor storages add them; ``layout``
    itself when ``td`` brings no new entry or lacks one of the storage's (then the write
    refuses it naming the keys). ``skip``: the batch dims of ``td`` before an item's own.
    ``classes``: the tensorclasses nested in the data (``None``: those of ``td``); those of
    new levels are added to the layout's. An entry added inside a level the layout holds as
    a tensorclass is refused (``ValueError``: not one of its fields), as TorchRL refuses it.

    Examples
    --------
    >>> from tensordict import tensorclass
    >>> @tensorclass
    ... class Obs:
    ...     pos: torch.Tensor
    >>> layout = TensorLayout(TensorDict({"r": torch.zeros(4)}, [4]), ndim=1,
    ...                       device=torch.device("cpu"))
    >>> data = TensorDict(r=torch.ones(2), obs=Obs(pos=torch.ones(2), batch_size=[2]),
    ...                   batch_size=[2])
    >>> grown = with_new_entries(layout, data, lambda shape, dtype, key: torch.zeros(shape),
    ...                          1, torch.device("cpu"))
    >>> grown.keys, grown.nested_classes == {("obs",): Obs}
    ([('obs', 'pos'), 'r'], True)
    """
    keys = leaf_keys(td)
    new = [key for key in keys if key not in layout.key_set]
    if not new or not layout.key_set <= set(keys):
        return layout
    held = layout.nested_classes
    for key in new:
        path = key_path(key)
        for depth in range(1, len(path)):
            cls = held.get(path[:depth])
            if cls is not None:
                raise ValueError(f"entry {key!r} is not a field of tensorclass {cls.__name__}, "
                                 f"which this storage holds at {as_key(path[:depth])!r} "
                                 "(nothing was written).")
    sources = [check_source(key, td.get(key)) for key in new]  # all before allocating any
    full = layout.td.copy()
    for key, x in zip(new, sources):
        full.set(key, allocate(layout.shape + x.shape[skip:], x.dtype, key))
    if classes is None:
        classes = nested_tensorclasses(td)
    # the classes of new levels join the layout's (those of its levels stay as they are)
    added = {path: cls for path, cls in classes.items() if not layout.is_level(path)}
    grown = TensorLayout(full, layout.ndim, device, {**held, **added})
    grown.unfilled_from = layout.unfilled_from  # the same leaves (and zeros in the new ones)
    return grown
