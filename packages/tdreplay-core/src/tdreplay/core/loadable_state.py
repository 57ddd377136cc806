"""What a checkpoint's state may hold: the values ``torch.load(weights_only=True)`` reads back.

The states of samplers, writers, transforms and the buffer's generator are written with
``torch.save`` and read back with ``weights_only=True`` (loading a checkpoint runs no code of
its own). That reader refuses numpy arrays and scalars, ``deque``, ``frozenset``, enums,
ranges, slices and any class of yours: a state holding one would be written, committed, and
never read again. :func:`check_loadable_state` finds such a value before anything is written,
and names where it sits.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from typing import Any

import torch

__all__ = ["check_loadable_state"]

#: leaves the weights-only reader takes (tensors and parameters are checked apart)
_LEAVES = (type(None), bool, int, float, complex, str, bytes, bytearray, torch.Size,
           torch.dtype, torch.device, torch.layout)
#: containers it takes (exact types: a subclass pickles as its class)
_MAPPINGS = (dict, OrderedDict, Counter)
_SEQUENCES = (list, tuple, set)


def check_loadable_state(state: Any, what: str) -> None:
    """``TypeError`` naming the entry of ``state`` (``what`` is its name, e.g.
    ``"PrioritizedSampler.state_dict()"``) that ``torch.load(weights_only=True)`` would refuse;
    the types ``torch.serialization.add_safe_globals`` allowed are taken.

    Examples
    --------
    >>> import numpy as np, torch
    >>> check_loadable_state({"count": 3, "rows": torch.arange(2)}, "state")
    >>> check_loadable_state({"seen": {"rows": np.zeros(2)}}, "MySampler.state_dict()")
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: MySampler.state_dict()['seen']['rows'] is a numpy.ndarray, which a checkpoint ...
    """
    allowed: set[Any] | None = None
    stack: list[tuple[str, Any]] = [(what, state)]
    while stack:
        where, value = stack.pop()
        kind = type(value)
        if kind in _LEAVES or isinstance(value, torch.Tensor):
            continue
        if kind in _MAPPINGS:
            stack.extend((f"{where}[{key!r}]", item) for key, item in value.items())
            stack.extend((f"{where} key {key!r}", key) for key in value)
            continue
        if kind in _SEQUENCES:
            stack.extend((f"{where}[{i}]", item) for i, item in enumerate(value))
            continue
        if allowed is None:
            allowed = {entry[0] if isinstance(entry, tuple) else entry
                       for entry in torch.serialization.get_safe_globals()}
        if kind in allowed:
            continue
        name = f"{kind.__module__}.{kind.__qualname__}".removeprefix("builtins.")
        raise TypeError(
            f"{where} is a {name}, which a checkpoint cannot hold: its states are read back "
            "with torch.load(weights_only=True), which refuses it. Keep tensors "
            "(torch.as_tensor) or plain Python values (int, float, str, lists, dicts) in the "
            "state instead.")
