"""Items that are lazy stacks of differently shaped TensorDicts, in a tensor storage.

A ``LazyStackedTensorDict`` stacked inside its items (e.g. batch ``[5, 2]`` stacked along dim
1, ``"a"`` of ``[5, 4, 8]`` in the first TensorDict and ``[5, 3, 8]`` in the second) cannot be
one dense TensorDict. A tensor storage keeps it as TorchRL's does, as one storage per stacked
TensorDict: :func:`split_ragged` views it as a plain TensorDict holding the stacked
TensorDicts under ``"0"``, ``"1"``, ... (each with its own shapes and keys), and
:class:`RaggedStack` stacks what the storage reads back along the same dim. Every item of the
storage then has the same stacked shapes: an item of other shapes is refused, as any entry of
another shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase


@dataclass(frozen=True)
class RaggedStack:
    """How the items of a storage of lazy stacks are stacked.

    Parameters
    ----------
    dim : int
        The stack dim, counted from the end of the batch dims (``-1``: the last one).
    count : int
        How many TensorDicts each item stacks.

    Examples
    --------
    >>> import torch
    >>> td = LazyStackedTensorDict(TensorDict(a=torch.zeros(5, 4), batch_size=[5]),
    ...                            TensorDict(a=torch.ones(5, 3), batch_size=[5]), stack_dim=1)
    >>> flat, stack = split_ragged(td, nbatch=1)
    >>> stack, flat.batch_size, flat["1", "a"].shape
    (RaggedStack(dim=-1, count=2), torch.Size([5]), torch.Size([5, 3]))
    >>> back = stack.restack(flat[:2])
    >>> back.batch_size, back[1, 1]["a"].tolist()
    (torch.Size([2, 2]), [1.0, 1.0, 1.0])
    """

    dim: int
    count: int

    def restack(self, td: TensorDictBase) -> LazyStackedTensorDict:
        """The lazy stack of the TensorDicts ``td`` holds under ``"0"``, ``"1"``, ..."""
        parts = [td.get(str(i)) for i in range(self.count)]
        return LazyStackedTensorDict.lazy_stack(parts, dim=td.batch_dims + 1 + self.dim)

    def describe(self) -> str:
        """The stack as a string a checkpoint's metadata holds (:meth:`parse` reads it)."""
        return f"{self.dim},{self.count}"

    @classmethod
    def parse(cls, text: Any) -> RaggedStack:
        """The stack :meth:`describe` wrote; ``ValueError`` for anything else."""
        try:
            dim, count = (int(v) for v in str(text).split(","))
        except ValueError as err:
            raise ValueError(f"not a lazy stack description: {text!r}.") from err
        if dim >= 0 or count < 1:
            raise ValueError(f"not a lazy stack description: {text!r}.")
        return cls(dim, count)


def _is_ragged(td: LazyStackedTensorDict) -> bool:
    """Whether the stacked TensorDicts differ in their leaf keys or in a leaf's shape."""
    parts = td.tensordicts
    first = parts[0]
    keys = set(first.keys(include_nested=True, leaves_only=True))
    for part in parts[1:]:
        if set(part.keys(include_nested=True, leaves_only=True)) != keys:
            return True
    return any(part.get(key).shape != first.get(key).shape for key in keys for part in parts[1:])


def split_ragged(data: Any, nbatch: int) -> tuple[TensorDict, RaggedStack] | None:
    """``(flat, stack)`` for a lazy stack of differently shaped TensorDicts stacked inside its
    items (past its ``nbatch`` leading dims, those a storage counts); ``None`` for other data
    (a dense lazy stack is read as one TensorDict).

    ``flat`` holds the stacked TensorDicts under ``"0"``, ``"1"``, ... with the stack's batch
    size less the stack dim; ``stack`` says how to stack them back.
    """
    if not isinstance(data, LazyStackedTensorDict) or data.stack_dim < nbatch \
            or not data.tensordicts or not _is_ragged(data):
        return None
    parts = data.tensordicts
    batch = parts[0].batch_size
    flat = TensorDict({str(i): part for i, part in enumerate(parts)}, batch_size=batch,
                      device=data.device)
    return flat, RaggedStack(data.stack_dim - data.batch_dims, len(parts))
