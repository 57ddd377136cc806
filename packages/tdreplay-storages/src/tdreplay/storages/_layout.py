""":class:`TensorLayout`: the preallocated TensorDict of a tensor storage and its leaves, read and
written by rows (no storage imports); :func:`with_new_entries`: a layout grown by the entries
of data it lacks.

Its collaborators, each with a job of its own: the keys (:mod:`~._keys`) and their tree
(:mod:`~._key_tree`), the TensorDicts built from leaves (:mod:`~._td_builders`), the checks of
the data written (:mod:`~._source_checks`) and the write path (:mod:`~._row_writes`), the rows'
numpy views (:mod:`~._host_rows`), the tensorclasses nested in the data
(:mod:`~._level_classes`), in-place edits of entries (:mod:`~._entry_edits`). The names other
modules import from here are re-exported (see ``__all__``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from tdreplay.core.utils import restore_attributes

from ._casts import dtype_from_str
from ._entry_edits import Edit, checked_updates, entry_edit, index_edit
from ._fast_tensordict import copy_leaves
from ._host_rows import HostRows
from ._key_tree import build_tree, has_levels, leaves_along_tree
from ._keys import (
    NestedDims,
    NestedKey,
    as_key,
    key_path,
    leaf_keys,
    nested_batch_dims,
    set_nested_batch_dims,
)
from ._level_classes import LevelClasses
from ._row_writes import before_write, write_rows
from ._source_checks import SourceCheck, check_source, check_storable, copyable_sources
from ._td_builders import (
    ItemNames,
    allocated_tensordict,
    assemble,
    item_dim_names,
    tensordict_builder,
)
from ._tensorclasses import NestedClasses, nested_tensorclasses

__all__ = [
    "NestedDims", "NestedKey", "TensorLayout", "with_new_entries",
    # re-exported: the modules that import them from here need no edit
    "Edit", "as_key", "assemble", "build_tree", "checked_updates", "dtype_from_str", "key_path",
    "leaf_keys", "nested_batch_dims", "set_nested_batch_dims", "tensordict_builder",
]

#: What :meth:`TensorLayout._view_leaves` makes again from the leaves: not pickled (pickle and
#: deepcopy would give the views memory of their own, writes going where reads never look).
_VIEWS = ("td", "_build_td", "flat_leaves", "host_rows", "has_levels", "levels", "is_level",
          "check_classes", "sources", "source_leaves")


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


def _own_memory_per_element(key: NestedKey, leaf: torch.Tensor) -> torch.Tensor:
    """``leaf`` (the storage's tensor of entry ``key``), refused with a ``ValueError`` when
    elements share memory (an expanded tensor, ``proto.expand(n)``, or overlapping windows,
    ``x.unfold(0, 3, 1)``: fewer memory locations than elements), where a write of one row
    would change others; detached when it requires grad (a storage holds data: writes into
    it would be recorded in a graph, or refused for a leaf).

    Examples
    --------
    >>> _own_memory_per_element("obs", torch.zeros(3).expand(4, 3))
    Traceback (most recent call last):
    ...
    ValueError: entry 'obs' of the storage's tensors shares memory between elements (shape ...
    """
    span = 1 + sum((size - 1) * abs(stride) for size, stride in zip(leaf.shape, leaf.stride()))
    if leaf.numel() > 1 and span < leaf.numel():
        raise ValueError(f"entry {key!r} of the storage's tensors shares memory between "
                         f"elements (shape {tuple(leaf.shape)}, strides {tuple(leaf.stride())}: "
                         f"{leaf.numel()} elements in {span} locations, e.g. an expanded "
                         "tensor), so writing one row would change others; pass a copy with "
                         "memory of its own (.clone(), or allocate with torch.zeros).")
    return leaf.detach() if leaf.requires_grad else leaf


class TensorLayout:
    """The tensors of a tensor storage: its TensorDict and its leaves in storage order, read
    (:meth:`gather`, :meth:`read_index`) and written (:meth:`write`) by rows; the data written
    is checked by :attr:`sources` (a :class:`~._source_checks.SourceCheck`) and :attr:`levels`
    (a :class:`~._level_classes.LevelClasses`: the tensorclasses nested in the data).

    Parameters
    ----------
    td : TensorDictBase
        Batch shape ``[rows, *inner, *item_batch]``; its leaves become the storage's tensors
        (moved to ``device`` when elsewhere). Batch dims past the ``ndim`` leading ones are
        the batch dims of every item (an item added with batch size ``[10]`` reads back with
        it, and with their names, :attr:`item_names`).
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
        """A layout of shape ``shape`` (``[rows, *inner]``) for data like ``td``, its leaves
        allocated by ``allocate`` (see :func:`~._td_builders.allocated_tensordict`).
        ``classes``: the tensorclasses nested in the data (``None``: those of ``td``)."""
        allocated = allocated_tensordict(td, shape, skip, allocate, device)
        return cls(allocated, ndim, device,
                   nested_tensorclasses(td) if classes is None else classes)

    def __init__(self, td: TensorDictBase, ndim: int, device: torch.device,
                 classes: NestedClasses | None = None) -> None:
        keys = leaf_keys(td)
        leaves = []
        for key in keys:
            leaf = _own_memory_per_element(key, check_source(key, td.get(key)))
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
        #: the names of the items' own batch dims, which reads give back (``None``: unnamed)
        self.item_names: ItemNames = item_dim_names(td, ndim)
        self._view_leaves(td.batch_size)
        self.shape = self.td.batch_size[:ndim]
        #: batch dims of every item, after the ``ndim`` leading ones (``[]`` for most data)
        self.item_batch = self.td.batch_size[ndim:]
        self.rows = self.shape[0]
        self.inner = self.shape[1:]
        self.row_numel = self.inner.numel()
        #: rows from this one on were neither written nor zeroed (leaves allocated unfilled, see
        #: :func:`~._row_writes.before_write`); ``None``: every row holds data or zeros
        self.unfilled_from: int | None = None

    def _view_leaves(self, batch_size: torch.Size) -> None:
        """Make what sees :attr:`leaves`' memory or is worked out from them once (:data:`_VIEWS`):
        the TensorDict over them (batch size ``batch_size``), the builder of those read, their
        flat and numpy views (:attr:`host_rows`), the checks of :attr:`sources`."""
        self.td = assemble(self.tree, self.leaves, batch_size, self.device, self.nested_dims,
                           self.item_names)
        self._build_td = tensordict_builder(self.tree, self.device,
                                            nested_dims=self.nested_dims,
                                            classes=self.nested_classes,
                                            item_names=self.item_names)
        #: whether the data has nested levels (without, it can hold no nested tensorclass)
        self.has_levels = has_levels(self.tree)
        #: the checks and reads of :attr:`nested_classes`, whose ``is_level`` and ``check``
        #: are this layout's :meth:`is_level <._level_classes.LevelClasses.is_level>` and
        #: :meth:`check_classes <._level_classes.LevelClasses.check>`
        self.levels = LevelClasses(self.tree, self.nested_classes)
        self.is_level = self.levels.is_level
        self.check_classes = self.levels.check
        #: the leaves with the ``ndim`` leading dimensions flattened into one of slots: views of
        #: the leaves' memory (see :func:`_slots_viewable`)
        self.flat_leaves = [leaf.flatten(0, self.ndim - 1) if self.ndim > 1 else leaf
                            for leaf in self.leaves]
        #: reads and writes rows of the flat leaves on the host (:meth:`gather`, :meth:`copy_rows`)
        self.host_rows = HostRows(self.flat_leaves)
        #: the keys, shapes and dtypes the data written must have
        self.sources = SourceCheck(self.keys, self.tree, self.leaves, self.ndim)
        #: the leaves of data to write, checked (bound here: no call more on the write paths)
        self.source_leaves = self.sources.source_leaves

    @property
    def consolidated(self) -> bool:
        """Whether the leaves are views of one buffer (:meth:`consolidate`)."""
        return self.td.is_consolidated()

    def consolidate(self) -> None:
        """Move every leaf into one buffer (tensordict's ``consolidate()``, which copies them):
        :attr:`td` becomes the consolidated TensorDict and the leaves views of its buffer.

        Examples
        --------
        >>> layout = TensorLayout(TensorDict({"a": torch.zeros(4), "b": torch.ones(4, 2)}, [4]),
        ...                       ndim=1, device=torch.device("cpu"))
        >>> layout.consolidate()
        >>> layout.consolidated, len({leaf.untyped_storage().data_ptr() for leaf in layout.leaves})
        (True, 1)
        """
        self._adopt(self.td.consolidate())

    def _adopt(self, td: TensorDictBase) -> None:
        """Make ``td`` (of this layout's keys) :attr:`td`, its leaves :attr:`leaves`."""
        self.leaves = [td.get(key) for key in self.keys]
        self._view_leaves(td.batch_size)
        self.td = td  # (the consolidated TensorDict itself: it records its buffer)

    def __getstate__(self) -> dict[str, Any]:
        # the leaves alone are copied, the views made again; a consolidated layout's
        # TensorDict instead (pickled as one buffer: the leaves would each carry all of it)
        state = self.__dict__.copy()
        for name in _VIEWS:
            del state[name]
        state["batch_size"] = self.td.batch_size
        if self.consolidated:
            state["leaves"] = None
            state["consolidated_td"] = self.td
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        batch_size = state.pop("batch_size")
        consolidated = state.pop("consolidated_td", None)
        state.setdefault("nested_dims", {})  # (pickled before nested levels kept their dims)
        state.setdefault("nested_classes", {})  # (pickled before nested classes were kept)
        state.setdefault("item_names", None)  # (pickled before the names were kept)
        state.pop("_expected", None)  # (pickled when the write checks were kept here)
        restore_attributes(self, state)
        if consolidated is not None:  # (a deep copy of it is not consolidated: made again)
            self._adopt(consolidated if consolidated.is_consolidated()
                        else consolidated.consolidate())
        else:
            self._view_leaves(batch_size)

    # ---- reads ---------------------------------------------------------------------------------
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
        return self.levels.read_back(self._read_rows(rows, index), index)

    def _read_rows(self, rows: int, index: Any) -> Any:
        """``index`` of the first ``rows`` rows of :attr:`td` (plain TensorDicts)."""
        return self.td[:rows][index]

    # ---- checks of the data written (see sources, levels) --------------------------------------
    def matching_leaves(self, td: TensorDictBase) -> list[torch.Tensor] | None:
        """Leaves of ``td`` in storage order when it is a plain TensorDict with exactly the
        storage's keys (shapes unchecked), else ``None``."""
        return leaves_along_tree(td, self.tree, len(self.keys))

    def check_rows_compatible(self, data: TensorDictBase, rows: int) -> None:
        """Raise :class:`~tdreplay.core.CheckpointError` unless ``rows`` rows fit and ``data`` has
        this layout's keys, row shapes (after the leading dimension) and dtypes."""
        self.sources.check_rows_compatible(data, rows, self.rows)

    # ---- writes ---------------------------------------------------------------------------------
    #: ``write(rows, td, leaves, single)``: :func:`~._row_writes.write_rows` (the write path,
    #: bound here as a method: no call more per write)
    write = write_rows

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
        copy_leaves([leaf[start:stop] for leaf in self.leaves],  # copy_ broadcasts
                    copyable_sources(self.keys, src))
        return True

    def index_copy_rows(self, rows: torch.Tensor, src: Sequence[torch.Tensor]) -> None:
        """Copy ``src`` (leaves in storage order, one row per entry of ``rows``) into ``rows``."""
        for leaf, s in zip(self.leaves, copyable_sources(self.keys, src)):
            leaf.index_copy_(0, rows, s.to(leaf.device, leaf.dtype))

    def write_index(self, rows: int, index: Any, td: TensorDictBase) -> None:
        """Write ``td`` at ``index`` of the first ``rows`` rows (TensorDict indexing), every
        entry checked before any is written (:meth:`index_edit`)."""
        self.index_edit(rows, index, td).write()

    def index_edit(self, rows: int, index: Any, td: TensorDictBase) -> Edit:
        """The checked write of ``td`` at ``index`` of the first ``rows`` rows (see
        :func:`~._entry_edits.index_edit`), to be run."""
        return index_edit(self.td, self.key_set, rows, index, td)

    def install_rows(self, rows: int, data: TensorDictBase) -> None:
        """Make ``data`` (checked by :meth:`check_rows_compatible`) the first ``rows`` rows."""
        if rows:
            before_write(self, 0, rows)
            self.copy_rows(0, rows, [data.get(k) for k in self.keys])

    # ---- in-place edits (see _entry_edits) -----------------------------------------------------
    def entry_edit(self, key: NestedKey, value: Any, rows: int, index: Any = None) -> Edit:
        """The in-place write of ``value`` into entry ``key`` of the first ``rows`` rows (at
        ``index`` of those rows when given), checked, to be run: ``KeyError`` / ``ValueError``
        before anything is written (see :func:`~._entry_edits.entry_edit`)."""
        return entry_edit(self.td, self.keys, key, value, rows, index)

    def object_updates(self, data: TensorDictBase, rows: int,
                       keys_to_update: Any = None) -> Callable[[], None] | None:
        """What ``update_`` writes into non-tensor entries, checked: ``None`` (none here)."""
        return None


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
    for key, source in zip(new, sources):  # (new entries are laid out in their dtypes)
        check_storable(key, source.dtype)
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
