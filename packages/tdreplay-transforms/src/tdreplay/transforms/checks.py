"""Whole-TensorDict transforms of a sample: ``FiniteTensorDictCheck``, ``PinMemoryTransform``."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from tdreplay.core import Transform

from ._utils import require_tensordict


class FiniteTensorDictCheck(Transform):
    """Raises a ``ValueError`` on sample when an entry holds a NaN or an infinity.

    Every tensor entry is checked (non-floating entries are always finite). The sample passes
    through unchanged. Appended with ``invert=True`` it checks writes instead.

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> check = FiniteTensorDictCheck()
    >>> _ = check(TensorDict({"obs": torch.zeros(2)}, [2]))
    >>> try:
    ...     check(TensorDict({"obs": torch.tensor([0.0, float("nan")])}, [2]))
    ... except ValueError as err:
    ...     print(err)
    Encountered a non-finite tensor: entry 'obs'.
    """

    def __init__(self) -> None:
        super().__init__()

    def forward(self, data: TensorDictBase) -> TensorDictBase:
        require_tensordict(self, data)
        for key, value in data.items(True, True):
            if isinstance(value, torch.Tensor) and not bool(value.isfinite().all()):
                raise ValueError(f"Encountered a non-finite tensor: entry {key!r}.")
        return data

    def __repr__(self) -> str:
        return "FiniteTensorDictCheck()"


class PinMemoryTransform(Transform):
    """Pins the sample's memory (faster, asynchronous copies to a CUDA device).

    Without CUDA there is nothing to pin for, and the sample passes through unchanged (as a
    buffer's own ``pin_memory=True`` does).

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> out = PinMemoryTransform()(TensorDict({"obs": torch.zeros(2)}, [2]))
    >>> out["obs"].is_pinned() == torch.cuda.is_available()
    True
    """

    def __init__(self) -> None:
        super().__init__()

    def forward(self, data: TensorDictBase) -> TensorDictBase:
        require_tensordict(self, data)
        if not torch.cuda.is_available():
            return data
        return data.pin_memory()

    def __repr__(self) -> str:
        return "PinMemoryTransform()"
