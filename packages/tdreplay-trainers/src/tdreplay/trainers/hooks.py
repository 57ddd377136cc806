"""Hook base class and the optimizer hook of the :class:`~tdreplay.trainers.Trainer`."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDictBase, is_tensor_collection
from torch import nn

from tdreplay.core.utils import check_flag

if TYPE_CHECKING:  # pragma: no cover
    from .trainer import Trainer

LOSS_PREFIX = "loss_"


class TrainerHookBase(abc.ABC):
    """A reusable trainer hook: it checkpoints itself and registers itself at default places.

    Subclasses implement :meth:`state_dict`, :meth:`load_state_dict` and :meth:`register`
    (which calls :meth:`Trainer.register_op <tdreplay.trainers.Trainer.register_op>` for each
    place and :meth:`Trainer.register_module <tdreplay.trainers.Trainer.register_module>` so the
    hook is saved with the trainer).

    Examples
    --------
    >>> class CountBatches(TrainerHookBase):
    ...     def __init__(self):
    ...         self.count = 0
    ...     def __call__(self, batch):
    ...         self.count += 1
    ...     def state_dict(self):
    ...         return {"count": self.count}
    ...     def load_state_dict(self, state_dict):
    ...         self.count = state_dict["count"]
    ...     def register(self, trainer, name="count_batches"):
    ...         trainer.register_op("batch_process", self)
    ...         trainer.register_module(name, self)
    >>> hook = CountBatches()
    >>> hook(None); hook.state_dict()
    {'count': 1}
    """

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """State saved with the trainer."""

    @abc.abstractmethod
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    @abc.abstractmethod
    def register(self, trainer: Trainer, name: str) -> None:
        """Register the hook's ops in ``trainer`` at their default places, and the hook itself
        as module ``name``."""


def loss_keys(losses: TensorDictBase) -> list[str]:
    """Top-level keys of ``losses`` that name loss terms (they start with ``"loss_"``)."""
    return [key for key in losses.keys() if isinstance(key, str) and key.startswith(LOSS_PREFIX)]


class OptimizerHook(TrainerHookBase):
    """The ``"optimizer"`` op: sum the loss terms, backpropagate, clip, step, zero the gradients.

    The :class:`~tdreplay.trainers.Trainer` builds one when it is given an ``optimizer``; build
    one yourself for several optimizers (one per group of loss terms).

    Parameters
    ----------
    optimizer : torch.optim.Optimizer
        The optimizer to step.
    loss_components : sequence of str, optional
        Entries of the loss TensorDict to sum. Defaults to every entry starting with ``"loss_"``.
    clip_grad_norm : bool
        ``True``: clip the total gradient norm to ``clip_norm``; ``False``: clamp every partial
        derivative to ``[-clip_norm, clip_norm]``.
    clip_norm : float, optional
        The clipping threshold; ``None`` (default) leaves the gradients unclipped.
    grad_norm_key : str
        Entry of the returned TensorDict holding the total gradient norm (before clipping).

    Calling the hook with the loss TensorDict returns a detached copy of it with the gradient
    norm added.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> param = nn.Parameter(torch.tensor([3.0]))
    >>> hook = OptimizerHook(torch.optim.SGD([param], lr=0.5))
    >>> out = hook(TensorDict({"loss_square": (param ** 2).sum()}, []))
    >>> round(param.item(), 4), round(out["grad_norm"].item(), 4), out["loss_square"].requires_grad
    (0.0, 6.0, False)
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        loss_components: Sequence[str] | None = None,
        *,
        clip_grad_norm: bool = True,
        clip_norm: float | None = None,
        grad_norm_key: str = "grad_norm",
    ) -> None:
        clip_grad_norm = check_flag(clip_grad_norm, "clip_grad_norm")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}."
            )
        if loss_components is not None:
            if isinstance(loss_components, str) or not all(
                isinstance(k, str) for k in loss_components
            ):
                raise TypeError("loss_components must be a sequence of str keys or None.")
            if not loss_components:
                raise ValueError(
                    "loss_components must not be empty; pass None to sum every 'loss_*' entry."
                )
        if clip_norm is not None and (isinstance(clip_norm, bool) or not clip_norm > 0):
            raise ValueError(f"clip_norm must be a positive number or None, got {clip_norm!r}.")
        if not isinstance(grad_norm_key, str) or not grad_norm_key:
            raise TypeError(f"grad_norm_key must be a non-empty str (the losses' entry that gets "
                            f"the gradient norm), got {grad_norm_key!r}.")
        self.optimizer = optimizer
        self.loss_components = None if loss_components is None else list(loss_components)
        self.clip_grad_norm = clip_grad_norm
        self.clip_norm = None if clip_norm is None else float(clip_norm)
        self.grad_norm_key = grad_norm_key

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def _clip(self) -> float:
        params = [p for p in self._params() if p.grad is not None]
        if not params:
            return 0.0
        if self.clip_norm is not None and self.clip_grad_norm:
            return float(nn.utils.clip_grad_norm_(params, self.clip_norm))
        norm = float(torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(grad.detach()) for p in params
                         if (grad := p.grad) is not None])))
        if self.clip_norm is not None:
            nn.utils.clip_grad_value_(params, self.clip_norm)
        return norm

    def __call__(self, losses: TensorDictBase) -> TensorDictBase:
        if not is_tensor_collection(losses):
            raise TypeError(f"the optimizer op expects the loss TensorDict, got "
                            f"{type(losses).__name__}.")
        keys = self.loss_components if self.loss_components is not None else loss_keys(losses)
        missing = [k for k in keys if k not in losses.keys()]
        if missing or not keys:
            raise KeyError(
                f"the loss TensorDict has no loss term to optimise (looked for "
                f"{missing or 'entries starting with ' + repr(LOSS_PREFIX)}; it has "
                f"{sorted(map(str, losses.keys()))})."
            )
        terms = [losses.get(k) for k in keys]
        for key, term in zip(keys, terms):
            if not isinstance(term, torch.Tensor) or term.numel() != 1:
                raise ValueError(f"loss term {key!r} must be a scalar tensor, got "
                                 f"{getattr(term, 'shape', type(term).__name__)}.")
        total = sum(term.reshape(()) for term in terms)
        total.backward()
        grad_norm = self._clip()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        out = losses.detach()
        out.set(self.grad_norm_key, torch.tensor(grad_norm))
        return out

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state (moments, step counts), so a resumed run continues exactly."""
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "optimizer" not in state_dict:
            raise ValueError("OptimizerHook state_dict is missing 'optimizer'.")
        self.optimizer.load_state_dict(state_dict["optimizer"])

    def register(self, trainer: Trainer, name: str = "optimizer") -> None:
        """Register as the trainer's ``"optimizer"`` op and as module ``name``."""
        trainer.register_op("optimizer", self)
        trainer.register_module(name, self)
