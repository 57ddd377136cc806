"""The exponents of a prioritized sampler, ``alpha`` and ``beta`` (and ``eps``), as given.

As TorchRL's, an exponent given as a one-element tensor reads back as a tensor (of that value,
dtype and device), a number as a float. The sampler computes with the float
(:func:`~._priority_values.check_real` read it once, when it was set); the tensor is kept to be
handed back and saved in checkpoints.
"""

from __future__ import annotations

from typing import Any

import torch

from ._priority_state import PriorityState, realphaed
from ._priority_values import check_real

__all__ = ["PriorityExponentsMixin"]


def _kept(value: Any) -> torch.Tensor | None:
    """A copy of ``value`` (an exponent :func:`check_real` accepted) to read back when it is a
    tensor, as TorchRL keeps it; ``None`` for a number."""
    return value.detach().clone() if isinstance(value, torch.Tensor) else None


def _given(value: float, tensor: torch.Tensor | None) -> float | torch.Tensor:
    """An exponent as it was given: ``value``, or a copy of ``tensor``."""
    return value if tensor is None else tensor.clone()


class PriorityExponentsMixin:
    """``alpha``, ``beta`` and ``eps`` of :class:`~tdreplay.samplers.PrioritizedSampler`."""

    _alpha: float
    _beta: float
    _eps: float
    _state: PriorityState | None
    _within_buffer: Any
    # alpha / beta as given, when given as tensors (class defaults: samplers pickled before)
    _alpha_tensor: torch.Tensor | None = None
    _beta_tensor: torch.Tensor | None = None

    # (the getters are typed ``Any``: a float, or a tensor when one was given, see beta)
    @property
    def alpha(self) -> Any:
        """Priority exponent (settable, e.g. by a scheduler). Setting it rewrites the stored
        ``(q + eps) ** old`` of the written slots as ``(q + eps) ** new`` (as TorchRL's; see
        :func:`~._priority_state.realphaed`), so sampling follows it at once. A float, or a
        one-element tensor when a tensor was given (see :attr:`beta`)."""
        return _given(self._alpha, self._alpha_tensor)

    @alpha.setter
    def alpha(self, value: float | torch.Tensor) -> None:
        alpha = check_real(value, "alpha")
        if self._state is not None:
            self._state = realphaed(self._state, self._alpha, alpha, self._eps,
                                    within_buffer=self._within_buffer)
        self._alpha, self._alpha_tensor = alpha, _kept(value)

    @property
    def beta(self) -> Any:
        """Importance-sampling exponent (settable, e.g. to anneal it towards 1).

        A float, or, when a one-element real tensor was given (to the constructor, by
        assignment, by a scheduler or by :meth:`load_state_dict`), a tensor of that value, dtype
        and device, as TorchRL keeps it. The value is read when it is set: change it by
        assigning (``sampler.beta = ...``); each read returns a copy, so changing the returned
        tensor in place changes nothing. The same holds for :attr:`alpha`.

        Examples
        --------
        >>> import torch
        >>> from tdreplay.samplers import PrioritizedSampler
        >>> s = PrioritizedSampler(10, alpha=torch.tensor(0.7), beta=torch.tensor(0.4))
        >>> s.alpha, s.beta
        (tensor(0.7000), tensor(0.4000))
        >>> round(s.beta.item(), 6)
        0.4
        >>> s.beta = 0.5  # a float reads back as a float
        >>> s.beta
        0.5
        >>> s.state_dict()["alpha"]  # checkpoints keep the tensor
        tensor(0.7000)
        """
        return _given(self._beta, self._beta_tensor)

    @beta.setter
    def beta(self, value: float | torch.Tensor) -> None:
        self._beta, self._beta_tensor = check_real(value, "beta"), _kept(value)

    @property
    def eps(self) -> float:
        """Added to every priority before the exponent."""
        return self._eps
