"""An ensemble that lists one member several times (``ReplayBufferEnsemble(a, a, b)``, say, to
draw from ``a`` twice as often) loads one state into it once per position: the positions' saved
states must then be the same state. A checkpoint of an ensemble of different members (``a``,
``c``) loaded into ``(a, a)`` would otherwise leave ``a`` with ``c``'s rows and drop ``a``'s,
without an error.

``state_dict`` entries are compared (:func:`same_state`); a ``dumps`` checkpoint records which
positions held one member (``same_as`` in its ``ensemble.json``, :func:`repeat_record`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tensordict import is_tensor_collection

from tdreplay.core.checkpoint import CheckpointError


def repeat_record(members: Sequence[Any]) -> list[int]:
    """For each position, the first position that holds the same member object.

    Examples
    --------
    >>> a, b = object(), object()
    >>> repeat_record([a, b, a])
    [0, 1, 0]
    """
    first: dict[int, int] = {}
    return [first.setdefault(id(member), i) for i, member in enumerate(members)]


def check_repeated_entries(members: Sequence[Any], state_dict: dict[str, Any],
                           kind: str) -> None:
    """``ValueError`` unless the entries of ``state_dict`` at positions holding one member are
    the same state (what a save of this ensemble holds)."""
    for i, first in enumerate(repeat_record(members)):
        if first != i and not same_state(state_dict[str(first)], state_dict[str(i)]):
            raise ValueError(
                f"{kind} members {first} and {i} are one object, but the state_dict holds two "
                f"different states for them ({first!r} and {i!r}): loading both would keep "
                f"the second and lose the first. Load it into an ensemble of as many distinct "
                "members as it was saved from.")


def check_repeated_record(members: Sequence[Any], saved: Any, where: str, kind: str) -> None:
    """``CheckpointError`` unless the checkpoint's ``same_as`` record (``saved``; ``None`` in
    checkpoints of older versions) shows the same member at every pair of positions where
    this ensemble has one member: their saved states are then one state."""
    current = repeat_record(members)
    if current == list(range(len(members))):
        return  # (distinct members: any checkpoint of as many members loads)
    for i, first in enumerate(current):
        if first != i and (not isinstance(saved, list) or len(saved) != len(current)
                           or saved[i] != saved[first]):
            raise CheckpointError(
                f"{kind} members {first} and {i} are one object, but the checkpoint in {where} "
                f"was not saved from one member at those positions: loading both would keep "
                f"member {i}'s state and lose member {first}'s. Load it into an ensemble of as "
                "many distinct members as it was saved from.")


def same_state(a: Any, b: Any) -> bool:
    """Whether two saved states hold the same values (dicts, sequences, tensors, arrays,
    TensorDicts and plain values, compared exactly).

    Examples
    --------
    >>> same_state({"x": torch.arange(3), "n": 2}, {"x": torch.arange(3), "n": 2})
    True
    >>> same_state({"x": torch.arange(3)}, {"x": torch.arange(3.0)})  # another dtype
    False
    """
    if isinstance(a, dict) or isinstance(b, dict):
        return (isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys()
                and all(same_state(a[key], b[key]) for key in a))
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (type(a) is type(b) and len(a) == len(b)
                and all(same_state(x, y) for x, y in zip(a, b)))
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and a.shape == b.shape
                and bool(torch.equal(a.cpu(), b.cpu())))
    if is_tensor_collection(a) or is_tensor_collection(b):
        return (is_tensor_collection(a) and is_tensor_collection(b)
                and same_state(a.to_dict(), b.to_dict()))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and bool(np.array_equal(a, b)))
    try:
        return bool(a == b)
    except (TypeError, ValueError, RuntimeError):  # (values that do not compare to one bool)
        return a is b
