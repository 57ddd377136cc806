"""Whether a trainer's checkpoint holds the parameters its optimizers update.

A loss module that is a plain function (``def loss_module(batch): ... model(...)``) has no
state: the trainer saves the optimizer (its moments) but not the network it steps, and a
resumed run silently pairs the saved moments with fresh weights. :func:`unsaved_parameters`
finds the parameters of the registered optimizers that no saved state holds (the loss
module's, the registered modules'), by the memory of the tensors their ``state_dict`` hold.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ._state import TrainerState, has_state_dict, saves_with_dumps

__all__ = ["unsaved_parameters"]


def _tensors(state: Any) -> Iterator[torch.Tensor]:
    """Every tensor in a (nested) state dict."""
    if isinstance(state, torch.Tensor):
        yield state
    elif isinstance(state, dict):
        for value in state.values():
            yield from _tensors(value)
    elif isinstance(state, (list, tuple)):
        for value in state:
            yield from _tensors(value)


def _optimizer_of(module: Any) -> torch.optim.Optimizer | None:
    """``module`` if it is an optimizer, the optimizer of an ``OptimizerHook`` (what
    ``Trainer(optimizer=...)`` registers), else ``None``."""
    if isinstance(module, torch.optim.Optimizer):
        return module
    inner = getattr(module, "optimizer", None)
    return inner if isinstance(inner, torch.optim.Optimizer) else None


def unsaved_parameters(state: TrainerState) -> list[torch.Tensor]:
    """The parameters of the optimizers registered with the trainer (as modules, or in the
    ``OptimizerHook`` that ``Trainer(optimizer=...)`` registers) that neither the loss module,
    the collector (TorchRL's hold their policy's weights) nor a registered module saves.

    Only objects whose ``state_dict`` is cheap are read (``nn.Module``s, and those that do not
    save themselves to a directory: a replay buffer's would copy its data).

    Examples
    --------
    >>> from tdreplay.trainers._progress import Progress
    >>> net = torch.nn.Linear(1, 1)
    >>> state = TrainerState(Progress(), loss_module=lambda batch: batch, collector=[])
    >>> state.register_module("optimizer", torch.optim.SGD(net.parameters(), lr=0.1))
    >>> len(unsaved_parameters(state))  # the weight and the bias: nothing saves them
    2
    >>> state.register_module("net", net)
    >>> unsaved_parameters(state)
    []
    """
    optimizers = [_optimizer_of(m) for m in state.modules.values()]
    stepped = [p for opt in optimizers if opt is not None
               for group in opt.param_groups for p in group["params"]]
    if not stepped:
        return []
    holders = [state.loss_module, state.collector, *state.modules.values()]
    saved: set[int] = set()
    for holder in holders:
        if _optimizer_of(holder) is not None or not has_state_dict(holder):
            continue
        if not isinstance(holder, torch.nn.Module) and saves_with_dumps(holder):
            continue
        saved.update(t.untyped_storage().data_ptr() for t in _tensors(holder.state_dict()))
    return [p for p in stepped if p.untyped_storage().data_ptr() not in saved]
