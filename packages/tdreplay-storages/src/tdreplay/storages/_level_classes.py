"""The tensorclasses at the nested levels of one layout's data (imports no storage): which paths
are levels, the check that data written reads back as the classes it was written with, and the
reads that give them back (:class:`LevelClasses`, built on :mod:`~._tensorclasses`' functions).
"""

from __future__ import annotations

from typing import Any

from tensordict import TensorDictBase

from ._key_tree import tree_has_level
from ._keys import is_key_index
from ._tensorclasses import NestedClasses, check_written_classes, inner_first, with_classes

__all__ = ["LevelClasses"]


class LevelClasses:
    """The tensorclass held at each nested level of a layout's data.

    Parameters
    ----------
    tree : dict
        The layout's :func:`tree of keys <._key_tree.build_tree>`.
    classes : dict
        The tensorclass of each nested level (:data:`~._tensorclasses.NestedClasses`).

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict, tensorclass
    >>> @tensorclass
    ... class Obs:
    ...     pos: torch.Tensor
    >>> levels = LevelClasses({"obs": {"pos": 0}}, {("obs",): Obs})
    >>> levels.is_level(("obs",)), levels.is_level(("obs", "pos"))
    (True, False)
    >>> type(levels.read_back(TensorDict(obs=TensorDict(pos=torch.zeros(2))), 0)["obs"]).__name__
    'Obs'
    """

    def __init__(self, tree: dict[str, Any], classes: NestedClasses) -> None:
        self.tree = tree
        self.classes = classes
        #: ``classes`` in the order :func:`~._tensorclasses.with_classes` makes them
        self.inner_first = inner_first(classes)

    def is_level(self, path: tuple[str, ...]) -> bool:
        """Whether ``path`` is a nested level (not a leaf) of the layout's data."""
        return tree_has_level(self.tree, path)

    def check(self, classes: NestedClasses) -> None:
        """Refuse (``TypeError`` naming the entry, see
        :func:`~._tensorclasses.check_written_classes`) a write of data whose nested
        tensorclasses ``classes`` would read back as other classes from this layout.

        Examples
        --------
        >>> import torch
        >>> from tensordict import tensorclass
        >>> @tensorclass
        ... class Obs:
        ...     pos: torch.Tensor
        >>> LevelClasses({"obs": {"pos": 0}}, {}).check({("obs",): Obs})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: entry 'obs' is tensorclass Obs, but this storage holds a TensorDict there: ...
        """
        if classes or self.classes:
            check_written_classes(self.classes, classes, self.is_level)

    def read_back(self, out: Any, index: Any) -> Any:
        """``out``, what TensorDict indexing of the layout's rows at ``index`` gave, its nested
        levels made their tensorclasses (when it is a TensorDict of rows, not an entry)."""
        classes = self.inner_first
        if classes and isinstance(out, TensorDictBase) and not is_key_index(index):
            return with_classes(out, classes)
        return out
