"""Priority updates of a prioritized sampler: ``update_priority`` and ``check_priority``.

:class:`PriorityUpdateMixin` is the room of :class:`~.prioritized.PrioritizedSampler` that sets
priorities: it checks them (on the host when ``validate`` is on, see
:func:`~._priority_kernels.apply_update`) and hands them to the kernels of the state's backend.
Priorities a buffer checks before writing the rows they come with (``check_priority``) are
returned as the numba kernels take them (:class:`~._priority_values.HostPriority`), so the
update after the write does not convert them again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tdreplay.core import Storage

from ._priority_kernels import apply_update, check_host_priority
from ._priority_state import PriorityState
from ._priority_values import HostPriority, as_priority_tensor, host_priority, prepare_update

__all__ = ["PriorityUpdateMixin"]


class PriorityUpdateMixin:
    """Setting and checking priorities (mixed into ``PrioritizedSampler``)."""

    _state: PriorityState | None
    _capacity: int
    _alpha: float
    _eps: float
    _validate_opt: bool | None
    reduction: str
    skip_stale_updates: bool
    _ensure_state: Callable[..., PriorityState]

    @property
    def validate(self) -> bool:
        """Whether :meth:`update_priority` checks its inputs on the host and raises."""
        state = self._state
        if state is None or state.backend == "numba":
            return True
        if self._validate_opt is not None:
            return self._validate_opt
        return state.device.type == "cpu"

    def update_priority(
        self,
        index: Any,
        priority: Any,
        *,
        storage: Storage | None = None,
        write_generation: Any = None,
    ) -> None:
        """Set the priorities of the slots ``index``.

        Parameters
        ----------
        index : int, sequence or integer tensor
            Flat slots (as in ``info["index"]`` / ``sample["index"]``); entries equal to ``-1``
            are skipped (TorchRL's max-value writer marks rows it did not write that way).
        priority : number, array or tensor
            Real numbers (any float or int dtype): a scalar, one per index, or one per index
            followed by trailing dims reduced with ``reduction``; or what
            :meth:`check_priority` returned for them (applied without converting them again).
        storage : Storage, optional
            The buffer's storage (passed by the buffers): slots at or beyond ``len(storage)``
            are unwritten.
        write_generation : integer tensor, optional
            ``info["write_generation"]`` of the sample the priorities were computed for; with
            ``skip_stale_updates``, entries whose slot was rewritten since are skipped, and so
            are those at slots that hold no item any more (the storage was emptied or
            restored since the sample): the other entries apply, nothing raises.

        Raises
        ------
        ValueError
            (``validate`` on) a priority is NaN, infinite or negative, or overflows once raised
            to ``alpha`` (see :func:`~._priority_values.check_stored_priority`); shapes neither
            match nor broadcast (``[2, 3]`` priorities for ``[3, 2]`` indices).
        IndexError
            (``validate`` on) an index is out of ``[0, max_capacity)``, or (without
            ``write_generation`` checked) points at an unwritten slot.
        TypeError
            ``index`` or ``priority`` is not numeric.

        Nothing changes when an error is raised. Without ``validate`` (device trees), an update
        holding a bad priority changes nothing and bad indices are ignored, with no host sync.
        """
        prepared = None
        if isinstance(priority, HostPriority):  # what check_priority returned
            prepared, priority = priority, priority.raw
        index, raw, token = prepare_update(
            index, priority, write_generation if self.skip_stale_updates else None)
        if not index.numel():
            return
        if prepared is not None and not prepared.fits(index.numel(), self._alpha, self._eps,
                                                      self.reduction):
            prepared = None  # settings changed since the check, or other items: convert again
        state = self._ensure_state(storage)  # never grows: written slots are within
        apply_update(state, index, raw, validate=self.validate, reduction=self.reduction,
                     alpha=self._alpha, eps=self._eps, token=token,
                     n_written=len(storage) if storage is not None else None, prepared=prepared)

    def check_priority(self, priority: Any) -> Any:
        """Raise as :meth:`update_priority` would on these priority values, changing nothing;
        return them in the form :meth:`update_priority` takes without converting them again.

        Buffers call it before writing rows whose priorities come with the data, and then
        update with what it returned. Only checks when ``validate`` is on (device trees drop
        bad updates on the device instead).

        Examples
        --------
        >>> import torch
        >>> from tdreplay.samplers import PrioritizedSampler
        >>> s = PrioritizedSampler(4, alpha=1.0, beta=1.0)
        >>> s.extend(torch.arange(2))
        >>> checked = s.check_priority(torch.tensor([3.0, 5.0]))
        >>> s.update_priority(torch.arange(2), checked)
        >>> s.max_priority
        5.0
        >>> try:
        ...     s.check_priority(torch.tensor([1.0, float("nan")]))
        ... except ValueError as err:
        ...     print(str(err)[:30])
        priority must be finite and >=
        """
        priority = as_priority_tensor(priority)
        state = self._state
        if state is not None and not self.validate:
            return priority  # no copy back from a device
        values = host_priority(priority, priority.shape[0] if priority.ndim else 1,
                               self.reduction, self._alpha, self._eps)
        check_host_priority(values, self._capacity)
        # device trees take the values where they are
        return values if state is None or state.backend == "numba" else priority
