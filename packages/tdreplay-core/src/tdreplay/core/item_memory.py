"""The memory behind a list storage's items, when they are pickled or checkpointed.

``torch.save`` (and pickling) writes the whole memory behind a tensor. Items that view a much
larger tensor would write all of it: :func:`compact_views` copies those views. Items that are
rows of one batch share it: :func:`saves_shared_memory` says when writing them with
``torch.save`` (which writes a memory once) instead of pickle (once per row) is both needed and
safe. Both read one survey of the items' tensors (:func:`_survey`), which pickling takes once
for the two answers (:func:`compacted_for_saving`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from tensordict import TensorDict, TensorDictBase
from torch.utils._pytree import tree_flatten, tree_map  # noqa: PLC2701 (no public pytree in torch 2.13)

__all__ = ["compact_views", "compacted_for_saving", "saves_shared_memory"]

#: a tensor memory that the items' views of it use less than this fraction of is saved as
#: copies of the views (see compact_views)
_MOSTLY_UNUSED = 0.5
#: the leaves ``torch.save`` writes as pickle would (builtin values and tensors)
_PLAIN_LEAVES = (str, bytes, int, float, bool, complex, type(None), torch.Tensor)
#: the containers it writes as pickle would
_PLAIN_NODES = (list, tuple, dict)


class _Survey(NamedTuple):
    """What the items' tensors make of the memories behind them."""

    #: the memories (``data_ptr``) their views use less than half of: copied when saved
    wasteful: frozenset[int]
    #: whether a memory that is not copied is viewed by more than one tensor
    shared: bool
    #: whether every item holds only builtin values and containers, tensors and tensordict's
    #: TensorDicts
    plain: bool


def _plain_structure(spec: Any) -> bool:
    """Whether a pytree structure holds builtin containers and tensordict's own classes only
    (not a namedtuple or another class of the user's)."""
    node = spec.type
    if node is not None and node not in _PLAIN_NODES and not (
            isinstance(node, type) and issubclass(node, TensorDictBase)
            and node.__module__.split(".")[0] == "tensordict"):
        return False
    return all(_plain_structure(child) for child in spec.children())


def _leaves(item: Any) -> tuple[list[Any], bool]:
    """``(leaves of item, whether item is plain)``: a tensor and a TensorDict of tensors (a
    list storage's common items) read directly, anything else as a pytree."""
    if type(item) is torch.Tensor:
        return [item], True
    if type(item) is TensorDict:
        values = list(item.values(True, True))
        if all(type(value) is torch.Tensor for value in values):
            return values, True
    leaves, spec = tree_flatten(item)
    return leaves, _plain_structure(spec) and all(isinstance(x, _PLAIN_LEAVES) for x in leaves)


def _survey(items: list[Any]) -> _Survey:
    """One pass over every tensor of ``items`` (see :class:`_Survey`)."""
    used: dict[int, int] = {}
    sizes: dict[int, int] = {}
    views: dict[int, int] = {}
    plain = True
    for item in items:
        leaves, item_plain = _leaves(item)
        plain = plain and item_plain
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor) and leaf.layout is torch.strided \
                    and leaf.device.type != "meta":
                memory = leaf.untyped_storage()
                key = memory.data_ptr()
                used[key] = used.get(key, 0) + leaf.numel() * leaf.element_size()
                sizes[key] = memory.nbytes()
                views[key] = views.get(key, 0) + 1
    wasteful = frozenset(key for key, size in sizes.items() if used[key] < _MOSTLY_UNUSED * size)
    shared = any(count > 1 for key, count in views.items() if key not in wasteful)
    return _Survey(wasteful, shared, plain)


def _compacted(items: list[Any], wasteful: frozenset[int]) -> list[Any]:
    """``items`` with their views of the ``wasteful`` memories copied."""
    if not wasteful:
        return items

    def compact(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor) and leaf.layout is torch.strided \
                and leaf.device.type != "meta" \
                and leaf.untyped_storage().data_ptr() in wasteful:
            # (a copy of the values, not of a graph the view may hang from)
            return leaf.detach().clone().requires_grad_(leaf.requires_grad)
        return leaf

    return [tree_map(compact, item) for item in items]


def compact_views(items: list[Any]) -> list[Any]:
    """``items`` with the tensors that view a much larger memory replaced by copies of them.

    ``torch.save`` (and pickling) writes the whole memory behind a tensor: rows of one batch
    share it and are written once, but four rows kept of a 10,000-row batch
    (``rb.add(batch[i])``) would write the whole batch. Where the items' views of a memory use
    less than half of it, those views are copied (the items come back as copies, no longer
    sharing it); anything else is saved as it is. ``items`` itself is not changed.

    Examples
    --------
    >>> batch = torch.zeros(1000, 4)
    >>> kept = compact_views([batch[0], batch[1]])
    >>> kept[0].untyped_storage().nbytes(), kept[0].tolist()
    (16, [0.0, 0.0, 0.0, 0.0])
    >>> rows = list(batch.unbind(0))
    >>> compact_views(rows)[0].untyped_storage().data_ptr() == batch.data_ptr()  # all used
    True
    """
    return _compacted(items, _survey(items).wasteful)


def saves_shared_memory(items: list[Any]) -> bool:
    """Whether ``items`` (once :func:`compact_views` copied their views of much larger
    memories) should be written by ``torch.save``: some tensor memory is viewed by more than
    one of their tensors (rows of one batch), and every item holds only tensors, builtin values
    and containers and tensordict's TensorDicts (``torch.save`` pickles other classes by
    reference, so a class of the user's script would not load in another process where
    cloudpickle sent it by value).

    Examples
    --------
    >>> batch = torch.zeros(4, 2)
    >>> saves_shared_memory(list(batch.unbind(0))), saves_shared_memory([torch.zeros(2)])
    (True, False)
    >>> saves_shared_memory([{"obs": row} for row in batch.unbind(0)])
    True
    """
    survey = _survey(items)
    return survey.plain and survey.shared


def compacted_for_saving(items: list[Any]) -> tuple[list[Any], bool]:
    """``(compact_views(items), saves_shared_memory(items))`` from one survey of the items'
    tensors (what pickling a list storage needs).

    Examples
    --------
    >>> batch = torch.zeros(1000, 4)
    >>> items, shared = compacted_for_saving(list(batch[:2].unbind(0)))
    >>> items[0].untyped_storage().nbytes(), shared  # copied: nothing shared is left
    (16, False)
    """
    survey = _survey(items)
    return _compacted(items, survey.wasteful), survey.plain and survey.shared
