"""``state_dict`` / ``check_state_dict`` / ``load_state_dict`` of a prioritized sampler.

:class:`PriorityStateDictMixin` is the room of :class:`~.prioritized.PrioritizedSampler` that
saves and restores its :class:`~._priority_state.PriorityState` (host tensors, see
:func:`~._priority_state.to_state_dict`). A state saved by a sampler whose trees grew (a
storage larger than ``max_capacity``) loads into a new sampler of the original size: the
sampler takes the larger capacity, so no slot is lost.
"""

from __future__ import annotations

from typing import Any

import torch

from ._priority_state import (
    PriorityState,
    check_state_dict,
    empty_host_state,
    export_state,
    host_from_state_dict,
    new_state,
    padded,
    placement,
    to_state_dict,
)
from ._priority_values import shown_slots

__all__ = ["PriorityStateDictMixin"]


class PriorityStateDictMixin:
    """Saving and restoring the priority state (mixed into ``PrioritizedSampler``)."""

    _state: PriorityState | None
    _capacity: int
    _within_buffer: bool
    _req_backend: str | None
    _req_device: torch.device | None
    _clock: int
    _alpha: float
    _beta: float
    _alpha_tensor: torch.Tensor | None  # alpha / beta as given, when given as tensors
    _beta_tensor: torch.Tensor | None
    _eps: float

    def state_dict(self) -> dict[str, Any]:
        """Priorities, generations, max priority, ``alpha``/``beta``/``eps`` (host tensors;
        ``alpha`` / ``beta`` are copies of the tensors given, when they were tensors)."""
        host = (export_state(self._state) if self._state is not None
                else empty_host_state(self._capacity))
        state = to_state_dict(host, alpha=self._alpha, beta=self._beta, eps=self._eps,
                              within_buffer=self._within_buffer, clock=self._clock)
        for key, tensor in (("alpha", self._alpha_tensor), ("beta", self._beta_tensor)):
            if tensor is not None:
                state[key] = tensor.clone()
        return state

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Raise ``ValueError`` unless ``state_dict`` can be loaded into this sampler."""
        check_state_dict(state_dict, self._within_buffer, type(self).__name__)

    def check_saved_slots(self, state_dict: dict[str, Any], slots: int) -> None:
        """Raise ``ValueError`` when ``state_dict`` (accepted by :meth:`check_state_dict`)
        holds a priority for a slot past the ``slots`` written slots of the storage state it
        is restored with (each sample would draw slots the storage lacks).

        Examples
        --------
        >>> import torch
        >>> from tdreplay.samplers import PrioritizedSampler
        >>> s = PrioritizedSampler(8, alpha=0.7, beta=0.5)
        >>> s.extend(torch.arange(6))
        >>> s.check_saved_slots(s.state_dict(), slots=6)
        >>> s.check_saved_slots(s.state_dict(), slots=3)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: PrioritizedSampler state_dict holds priorities for slots [3, 4, 5], past ...
        """
        written = (state_dict["priorities"] > 0) | (state_dict["write_generation"] != 0)
        past = written[slots:].nonzero().reshape(-1) + slots
        if past.numel():
            shown = shown_slots(past)
            raise ValueError(f"{type(self).__name__} state_dict holds priorities for slots "
                             f"{shown}, past the {slots} written slots of the storage state it "
                             "is restored with (a sampler state of another buffer?).")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output; checks everything before changing anything."""
        self.check_state_dict(state_dict)
        state = self._state
        backend, device = ((state.backend, state.device) if state is not None
                           else placement(self._req_backend, self._req_device))
        capacity = max(self._capacity, state_dict["max_capacity"])
        host = padded(host_from_state_dict(state_dict, self._within_buffer), capacity)
        if state is not None and self._clock:
            host = {**host, "write_generation": _past_handed_out(
                host["write_generation"], state.generation, capacity)}
        self._state = new_state(capacity, backend, device, within_buffer=self._within_buffer,
                                host=host)
        self._capacity = capacity
        # never back: a generation handed out before the restore must not match a slot
        # written after it
        self._clock = max(self._clock, state_dict["write_clock"],
                          int(host["write_generation"].max()))
        self._alpha = float(state_dict["alpha"])
        self._beta = float(state_dict["beta"])
        self._alpha_tensor, self._beta_tensor = (
            value.detach().clone() if isinstance(value, torch.Tensor) else None
            for value in (state_dict["alpha"], state_dict["beta"]))
        self._eps = float(state_dict["eps"])


def _past_handed_out(saved: torch.Tensor, live: torch.Tensor, capacity: int) -> torch.Tensor:
    """The saved write generations of a restore into a sampler that handed some out, moved
    past them: every written slot's by the least shift that puts each slot this sampler had
    written past its current generation (a batch drawn before the restore, which a learner
    may still hold, carries at most the current one: its update is skipped, as the restored
    slot holds another row). One shift keeps their order; a sampler restoring its own last
    checkpoint moves them by one, however many restores follow each other.

    Examples
    --------
    >>> _past_handed_out(torch.tensor([5, 1, 0, 3]), torch.tensor([2, 4, 7, 0]), 4).tolist()
    [9, 5, 0, 7]
    """
    now = torch.zeros(capacity, dtype=torch.long)
    known = min(capacity, live.numel())
    now[:known] = live[:known].to("cpu", torch.long)
    both = (now > 0) & (saved > 0)
    if not bool(both.any()):
        return saved
    shift = max(int((now[both] - saved[both]).max()) + 1, 0)
    return torch.where(saved > 0, saved + shift, saved)
