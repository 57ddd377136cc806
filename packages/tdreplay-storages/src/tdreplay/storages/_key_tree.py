"""The tree of a storage's keys (imports no storage): nested dicts mapping each key path to the
position of its leaf in storage order (:func:`build_tree`), built once per layout and walked to
read a source TensorDict's leaves in that order (:func:`leaves_along_tree`, the write path's
lookup) and to tell its nested levels from its leaves (:func:`tree_has_level`,
:func:`has_levels`). :mod:`~._td_builders` walks it the other way: leaves into TensorDicts.

Examples
--------
>>> tree = build_tree(["a", ("n", "b")])
>>> tree
{'a': 0, 'n': {'b': 1}}
>>> tree_has_level(tree, ("n",)), tree_has_level(tree, ("a",)), has_levels(tree)
(True, False, True)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from ._keys import NestedKey, key_path

__all__ = ["build_tree", "has_levels", "leaves_along_tree", "tree_has_level"]


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


def tree_has_level(tree: dict[str, Any], path: tuple[str, ...]) -> bool:
    """Whether ``path`` is a nested level of ``tree`` (not a leaf, nor missing)."""
    node: Any = tree
    for name in path:
        if type(node) is not dict:
            return False
        node = node.get(name)
    return type(node) is dict


def has_levels(tree: dict[str, Any]) -> bool:
    """Whether ``tree`` has nested levels (data without any holds no nested tensorclass)."""
    return any(type(node) is dict for node in tree.values())
