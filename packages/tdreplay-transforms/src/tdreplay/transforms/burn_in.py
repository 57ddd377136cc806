"""``BurnInTransform``: fresh recurrent states for sampled sequences, from their first steps."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase

from tdreplay.core import Transform
from tdreplay.core.transform import NestedKey

from ._utils import keys_arg, require_tensordict, strip_next


class BurnInTransform(Transform):
    """Runs recurrent modules over the first ``burn_in`` steps of each sampled sequence and
    returns the steps after them, the first of which carries the states the modules reached.

    As TorchRL's: stored recurrent states go stale as the network trains (R2D2's burn-in).
    On sample, a batch whose last batch dim is time (``[B, T]``, or ``[T]``: one sequence) is
    split at ``burn_in``; ``modules`` (TensorDict modules that process sequences and write the
    next state under ``("next", key)``, e.g. TorchRL's ``GRUModule`` / ``LSTMModule`` in
    recurrent mode) run over the first part without gradients, on their parameters' device;
    the result is the remaining ``T - burn_in`` steps, whose first step holds, under each
    ``out_keys`` entry, the ``("next", key)`` of the last burnt-in step. The other steps keep
    their stored values; the sample's tensors are not changed in place.

    Parameters
    ----------
    modules : TensorDictModuleBase or sequence of them
        Run in order over the burn-in steps.
    burn_in : int
        Steps to burn in (``0``: samples pass unchanged); shorter than the sequences sampled.
    out_keys : sequence of nested keys, optional
        States to refresh. Defaults to every key the modules write under ``"next"``; a
        ``("next", key)`` given here is read as ``key`` (with a warning, as TorchRL's).

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from tensordict.nn import TensorDictModule
    >>> class RunningSum(torch.nn.Module):   # a toy recurrence: next hidden = hidden + obs
    ...     def forward(self, obs, hidden):
    ...         return hidden[..., :1, :] + obs.cumsum(-2)
    >>> module = TensorDictModule(RunningSum(), in_keys=["obs", "hidden"],
    ...                           out_keys=[("next", "hidden")])
    >>> td = TensorDict({"obs": torch.ones(1, 5, 1), "hidden": torch.zeros(1, 5, 1)}, [1, 5])
    >>> out = BurnInTransform(module, burn_in=3)(td)
    >>> out.batch_size, out["hidden"].squeeze(-1)
    (torch.Size([1, 2]), tensor([[3., 0.]]))
    """

    def __init__(
        self,
        modules: TensorDictModuleBase | Sequence[TensorDictModuleBase],
        burn_in: int,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
    ) -> None:
        modules = [modules] if isinstance(modules, TensorDictModuleBase) else modules
        if not isinstance(modules, Sequence) or not modules or not all(
                isinstance(m, TensorDictModuleBase) for m in modules):
            raise ModulesError("BurnInTransform: modules must be a TensorDictModule or a "
                               f"non-empty sequence of them, got {modules!r}.")
        if isinstance(burn_in, bool) or not isinstance(burn_in, int) or burn_in < 0:
            raise ValueError(f"BurnInTransform: burn_in must be a non-negative int, got "
                             f"{burn_in!r}.")
        super().__init__()
        # (read by the modules, refreshed from them: not pairs, as Transform's own keys are)
        self.in_keys = list(dict.fromkeys(k for m in modules for k in m.in_keys))
        self.out_keys = _state_keys(modules, out_keys)
        self.modules = list(modules)
        self.burn_in = burn_in

    def forward(self, data: TensorDictBase) -> TensorDictBase:
        """The steps after ``burn_in``, their first step holding the burnt-in states."""
        data = require_tensordict(self, data)
        if self.burn_in == 0:
            return data
        if not data.batch_dims or data.batch_size[-1] <= self.burn_in:
            raise ValueError(f"BurnInTransform: burn_in={self.burn_in} needs sequences longer "
                             "than that along the last batch dim, got a batch of size "
                             f"{list(data.batch_size)}.")
        burnt = self._burnt_in(data[..., : self.burn_in])
        rest = data[..., self.burn_in:]
        time = data.batch_dims - 1
        for key in self.out_keys:
            state = burnt.get(("next", *_path(key)), None)
            if state is None:
                raise KeyError(f"BurnInTransform: the modules wrote no {('next', *_path(key))!r}"
                               f" (out_keys {self.out_keys}).")
            last = state.select(time, state.shape[time] - 1)
            value = rest.get(key, None)
            value = (value.clone() if value is not None
                     else last.new_zeros(last.shape[:time] + rest.batch_size[time:]
                                         + last.shape[time:]))
            value.select(time, 0).copy_(last)
            rest.set(key, value)
        return rest

    def _burnt_in(self, steps: TensorDictBase) -> TensorDictBase:
        device = steps.device
        with torch.no_grad():
            for module in self.modules:
                target = _device_of(module)
                steps = module(steps if target is None else steps.to(target))
        return steps if device is None else steps.to(device)

    def inv(self, data: Any) -> Any:
        """Writes are left as they are (the transform acts on samples)."""
        return data

    def __repr__(self) -> str:
        return (f"BurnInTransform(burn_in={self.burn_in}, in_keys={self.in_keys}, "
                f"out_keys={self.out_keys})")


class ModulesError(TypeError, ValueError):
    """``modules`` holds something other than TensorDict modules (a ``ValueError`` too, as
    TorchRL raises)."""


def _state_keys(modules: Sequence[TensorDictModuleBase], out_keys: Any) -> list[NestedKey]:
    """``out_keys`` without a leading ``"next"`` (warned), or what the modules write there."""
    if out_keys is None:
        found = (strip_next(k) for m in modules for k in m.out_keys)
        return list(dict.fromkeys(k for k in found if k is not None))
    keys = []
    for key in keys_arg(out_keys, "out_keys"):
        root = strip_next(key)
        if root is not None:
            warnings.warn(f"BurnInTransform: out_keys entry {key!r} is read as {root!r}: the "
                          "states are taken from the 'next' entries of the burnt-in steps.",
                          UserWarning, stacklevel=3)
        keys.append(key if root is None else root)
    return keys


def _path(key: NestedKey) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else tuple(key)


def _device_of(module: torch.nn.Module) -> torch.device | None:
    """The device of the module's first parameter (``None`` for a module without any)."""
    for parameter in module.parameters():
        return parameter.device
    return None
