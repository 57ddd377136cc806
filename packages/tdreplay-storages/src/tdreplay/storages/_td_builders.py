"""TensorDicts built from leaves in storage order (imports no storage): a layout's own
TensorDict, checked by tensordict's constructor (:func:`assemble`; of leaves allocated for
data like another: :func:`allocated_tensordict`), and the builder its read path makes once and
calls on every sample (:func:`tensordict_builder`: the walk of the :mod:`tree of keys
<._key_tree>` done beforehand, no checks, the nested tensorclasses made).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from ._fast_tensordict import new_tensordict
from ._key_tree import build_tree, tree_has_level
from ._keys import NestedDims, NestedKey, leaf_keys, nested_batch_dims
from ._source_checks import check_source
from ._tensorclasses import NestedClasses

__all__ = ["ItemNames", "allocated_tensordict", "assemble", "item_dim_names", "tensordict_builder",
           "with_empty_levels"]

#: The names of an item's own batch dims (TensorDict ``names``, e.g. ``("time",)`` for items
#: added with batch size ``[10]`` and names ``["time"]``), which a storage keeps and its reads
#: give back, as TorchRL's do; ``None`` when none of them is named (the storage's own dims are
#: never named).
ItemNames = tuple[str | None, ...] | None


def item_dim_names(td: TensorDictBase, skip: int) -> ItemNames:
    """The names of ``td``'s batch dims past its ``skip`` leading ones (:data:`ItemNames`).

    Examples
    --------
    >>> td = TensorDict({"a": torch.zeros(2, 3)}, [2, 3], names=[None, "time"])
    >>> item_dim_names(td, 1), item_dim_names(TensorDict({}, [2, 3]), 1)
    (('time',), None)
    """
    names = tuple(td.names[skip:])
    return names if any(name is not None for name in names) else None


def assemble(tree: dict[str, Any], leaves: list[torch.Tensor], batch_size: torch.Size,
             device: torch.device | None, nested_dims: NestedDims | None = None,
             item_names: ItemNames = None) -> TensorDict:
    """A TensorDict of batch size ``batch_size`` holding ``leaves`` at the keys of ``tree``
    (its nested levels with their own batch dims ``nested_dims``, its last dims named
    ``item_names``), checked by tensordict's constructor (the read path builds with
    :func:`tensordict_builder` without the checks).

    Examples
    --------
    >>> td = assemble({"a": 0, "n": {"b": 1}}, [torch.zeros(2), torch.ones(2, 3)],
    ...               torch.Size([2]), None, {("n",): (3,)})
    >>> td["n"].batch_size
    torch.Size([2, 3])
    """
    return tensordict_builder(tree, device, _checked_tensordict, nested_dims,
                              item_names=item_names)(leaves, batch_size)


def allocated_tensordict(td: TensorDictBase, shape: torch.Size, skip: int,
                         allocate: Callable[[torch.Size, torch.dtype, NestedKey], torch.Tensor],
                         device: torch.device) -> TensorDict:
    """A TensorDict of batch size ``shape + td.batch_size[skip:]`` for data like ``td``: each
    leaf of ``td`` gets a tensor ``allocate(shape + leaf.shape[skip:], leaf.dtype, key)``,
    after every entry is checked (:func:`~._source_checks.check_source`: ``TypeError`` for one
    that is not a tensor); nested levels keep their own batch dims. The batch dims of ``td``
    past ``skip`` stay batch dims of every item, with their names, as TorchRL keeps them.

    Examples
    --------
    >>> td = TensorDict({"a": torch.ones(2, 3)}, [2])
    >>> out = allocated_tensordict(td, torch.Size([5]), 1, lambda s, d, k: torch.zeros(s, dtype=d),
    ...                            torch.device("cpu"))
    >>> out["a"].shape, out.batch_size
    (torch.Size([5, 3]), torch.Size([5]))
    >>> td = TensorDict({"a": torch.ones(2, 3)}, [2, 3], names=[None, "time"])
    >>> allocated_tensordict(td, torch.Size([5]), 1, lambda s, d, k: torch.zeros(s, dtype=d),
    ...                      torch.device("cpu")).names
    [None, 'time']
    """
    keys = leaf_keys(td)
    # all before allocating any (dtypes: checked by the write that lays out, not a restore)
    sources = [check_source(key, td.get(key)) for key in keys]
    leaves = [allocate(shape + x.shape[skip:], x.dtype, key) for key, x in zip(keys, sources)]
    return assemble(build_tree(keys), leaves, shape + td.batch_size[skip:], device,
                    nested_batch_dims(td), item_dim_names(td, skip))


def _checked_tensordict(source: dict[str, Any], batch_size: torch.Size,
                        device: torch.device | None) -> TensorDict:
    # non_blocking=False: the leaves are already on ``device`` (no transfer to wait for)
    return TensorDict(source, batch_size=batch_size, device=device, non_blocking=False)


def tensordict_builder(tree: dict[str, Any], device: torch.device | None,
                       construct: Callable[..., TensorDict] = new_tensordict,
                       nested_dims: NestedDims | None = None, path: tuple[str, ...] = (),
                       classes: NestedClasses | None = None, item_names: ItemNames = None
                       ) -> Callable[[list[torch.Tensor], torch.Size], TensorDict]:
    """``build(leaves, batch_size)``: a TensorDict of ``leaves`` at the keys of ``tree``, one
    ``construct(source, batch_size, device)`` per level, a nested level with its own batch
    dims of ``nested_dims`` after its parent's, and made the tensorclass ``classes`` names for
    its path (if any); its last batch dims named ``item_names`` (if any: the others unnamed);
    the walk of ``tree`` is done once, here (``path``: where ``tree`` is in the whole one), so
    that a tree without tensorclasses or names builds as fast as ever. By default
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
    >>> build = tensordict_builder({"a": 0}, None, item_names=("time",))
    >>> build([torch.zeros(2, 3)], torch.Size([2, 3])).names
    [None, 'time']
    """
    nested_dims = nested_dims or {}
    classes = classes or {}
    if not path:
        tree = with_empty_levels(tree, nested_dims)
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
    build_level = partial(_build_tensordict, entries, device, construct)
    return partial(_named, item_names, build_level) if item_names else build_level


def with_empty_levels(tree: dict[str, Any], nested_dims: NestedDims) -> dict[str, Any]:
    """``tree`` with a node for each level of ``nested_dims`` it lacks (the empty nested
    TensorDicts, which no leaf's key names; see :data:`~._keys.NestedDims`), itself when
    none is missing.

    Examples
    --------
    >>> with_empty_levels({"a": 0}, {("f", "g"): ()})
    {'a': 0, 'f': {'g': {}}}
    """
    missing = [path for path in nested_dims if not tree_has_level(tree, path)]
    if not missing:
        return tree
    tree = copy.deepcopy(tree)
    for path in missing:
        node = tree
        for name in path:
            node = node.setdefault(name, {})
    return tree


def _build_tensorclass(cls: Any, build: Callable[[list[torch.Tensor], torch.Size], TensorDict],
                       leaves: list[torch.Tensor], batch_size: torch.Size) -> Any:
    return cls.from_tensordict(build(leaves, batch_size))


def _named(item_names: tuple[str | None, ...],
           build: Callable[[list[torch.Tensor], torch.Size], TensorDict],
           leaves: list[torch.Tensor], batch_size: torch.Size) -> TensorDict:
    td = build(leaves, batch_size)
    td.names = [None] * (len(batch_size) - len(item_names)) + list(item_names)
    return td


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
