"""``PrioritizedSampler``: proportional prioritized replay (Schaul et al., 2016).

Design
------
Priorities live in segment trees (:mod:`tdreplay.samplers.segment_trees`) over the flat
slots of the storage: a sum tree to draw slot ``i`` with probability ``p_i / sum_j p_j`` and a
min tree for the importance-sampling weights. The trees store ``p_i = max((q_i + eps) ** alpha,
tiny)`` where ``q_i`` is the priority given by the user (``tiny`` is the smallest normal float64,
so every written slot keeps a positive probability and the trees never hold a written zero).

Placement. The trees live where the storage lives unless ``device`` says otherwise: a CPU
storage gets numba trees, a CUDA storage torch trees on its device. The sampler is built before
it sees a storage, so the place is settled the first time it does (the buffers below tell it at
construction, a plain ``ReplayBuffer`` at the first ``sample`` or ``update_priority``); trees
created earlier by ``extend`` are moved there once. ``backend`` forces the tree backend (tests
run the torch trees on CPU).

No host sync on devices. With torch trees on an accelerator, :meth:`sample`,
:meth:`~PrioritizedSampler.extend` and :meth:`~PrioritizedSampler.update_priority` only queue
device work: nothing is read back. Checks that need values on the host (``validate``) are
therefore off by default for device trees; see :meth:`~PrioritizedSampler.update_priority`.

Stale updates. Every slot has a *write generation*: the value of a clock that ticks on every
``extend`` / ``mark_update`` call, stored for the slots written (``0`` = never written). A sample
returns the generation of every slot it drew as ``info["write_generation"]`` (TensorDict buffers
carry it in the sample like ``index``). ``update_priority(..., write_generation=g)`` skips the
entries whose slot was rewritten since (generation no longer ``g``), so the new row never gets the
priority computed for the row it replaced. Entries at slots that hold no item any more (the
storage was emptied or restored since the sample; ``empty`` keeps the clock counting, and a
restore never sets it back, so no generation seen before either matches a slot written after
it) are stale too, and skipped, not refused. ``skip_stale_updates=False`` turns the check
off. An update without ``write_generation`` (e.g. priorities of freshly written rows) is
applied as is.
"""

from __future__ import annotations

import math
import warnings
from contextlib import AbstractContextManager
from typing import Any

import torch

from tdreplay.core import Sampler, Storage
from tdreplay.core.utils import as_long_tensor, check_batch_size, check_flag, check_not_empty

from ._priority_checkpoint import PriorityStateDictMixin
from ._priority_exponents import PriorityExponentsMixin
from ._priority_kernels import NumbaKernels, excluded, kernels_for, uniform
from ._priority_state import (
    PriorityState,
    default_priority,
    generation_of,
    grown,
    new_item_leaf,
    new_state,
    placement,
    settle,
)
from ._priority_updates import PriorityUpdateMixin
from ._priority_values import (
    TINY,
    HostPriority,
    check_options,
    host_bounds,
    shown_slots,
    slots_on,
)
from .without_replacement import check_replacement

__all__ = ["PRIORITY_WEIGHT_KEY", "WRITE_GENERATION_KEY", "PrioritizedSampler"]

#: Info entry holding the importance-sampling weights of a sample.
PRIORITY_WEIGHT_KEY = "priority_weight"
#: Info entry holding the write generation of every sampled slot (see the module docstring).
WRITE_GENERATION_KEY = "write_generation"


class PrioritizedSampler(PriorityExponentsMixin, PriorityStateDictMixin, PriorityUpdateMixin,
                         Sampler):
    """Samples slot ``i`` with probability ``p_i ** alpha / sum_j p_j ** alpha``.

    Parameters
    ----------
    max_capacity : int
        Number of slots of the storage (its ``max_size``). When slots beyond it are written
        (a larger storage), the trees grow to hold them, keeping every priority.
    alpha : float or torch.Tensor
        Priority exponent, ``>= 0``; ``0`` samples uniformly.
    beta : float or torch.Tensor
        Importance-sampling exponent, ``>= 0``: ``info["priority_weight"]`` is
        ``(p_i / p_min) ** -beta`` with ``p = (priority + eps) ** alpha`` the stored priorities,
        i.e. PER's ``(N * P(i)) ** -beta`` normalised by its maximum over the buffer.
        ``alpha`` and ``beta`` may be one-element real tensors, as in TorchRL: :attr:`alpha` /
        :attr:`beta` then read back as tensors (so ``sampler.beta.item()`` works; schedulers
        and checkpoints keep them tensors), see :attr:`beta`.
    eps : float
        Added to every priority before the exponent, so no item has probability 0. With
        ``eps=0`` a priority of ``0`` is stored as ``tiny`` (the item is, in effect, never
        drawn) and is the ``p_min`` of the weights: with ``beta > 0`` every other weight
        underflows to ``0``, and the first such host sample warns (``RuntimeWarning``; TorchRL
        raises ``RuntimeError("non-positive p_min")``).
    dtype : torch.dtype
        Floating dtype of the returned weights (the trees always keep float64).
    reduction : {"max", "min", "sum", "mean", "median"}
        How :meth:`update_priority` reduces the trailing dimensions of multi-dimensional
        priorities (e.g. one TD error per agent) to one priority per slot.
    max_priority_within_buffer : bool
        New items get the current max priority. ``False``: the largest priority ever passed to
        :meth:`update_priority` (``1`` before the first update). ``True``: the largest priority
        among the items still in the buffer, whether set by :meth:`update_priority` or given
        when the item was written (``1`` if none), so it falls when those items are updated
        down or overwritten (the items a write overwrites leave before the new ones get it).
    device : str or torch.device, optional
        Where the trees live; by default where the storage lives (see the module docstring).
    backend : {"numba", "torch"}, optional
        Tree backend; by default numba on CPU and torch elsewhere.
    stratified : bool
        Draw one item from each of ``batch_size`` equal-mass segments of the priority mass (as in
        the PER paper) instead of ``batch_size`` independent draws.
    skip_stale_updates : bool
        Skip the entries of ``update_priority(..., write_generation=...)`` whose slot was
        rewritten since it was sampled. Defaults to True.
    validate : bool, optional
        Check priorities and indices on the host in :meth:`update_priority` and raise on bad
        ones. Defaults to True for CPU trees and False for device trees (checking would need a
        host sync there; bad updates are then dropped on the device instead). Numba trees always
        validate.
    replacement : bool
        TorchRL's: no prioritized sampler draws without replacement, ``False`` raises TypeError.

    Examples
    --------
    >>> from tdreplay.core import ReplayBuffer
    >>> from tdreplay.storages import LazyTensorStorage
    >>> rb = ReplayBuffer(storage=LazyTensorStorage(8),
    ...                   sampler=PrioritizedSampler(8, alpha=1.0, beta=1.0), batch_size=4)
    >>> rb.extend(torch.arange(4.0)).tolist()
    [0, 1, 2, 3]
    >>> rb.update_priority(torch.tensor([0, 1, 2, 3]), torch.tensor([0.0, 0.0, 0.0, 5.0]))
    >>> data, info = rb.sample(return_info=True)
    >>> data.shape, info["priority_weight"].dtype
    (torch.Size([4]), torch.float32)
    >>> rb.sampler.max_priority
    5.0
    >>> round(rb.sampler.total_priority, 6), rb.sampler.min_priority   # sum, min of p_i
    (5.0, 1e-08)
    >>> rb.sampler.draws_written_slots  # CPU trees: the buffer reads their draws unchecked
    True
    """

    is_prioritized = True
    shareable = False  # the trees live in one process: a buffer refuses to share it (issue 17)
    info_keys = (PRIORITY_WEIGHT_KEY, WRITE_GENERATION_KEY)
    update_keys = (WRITE_GENERATION_KEY,)

    def __init__(
        self,
        max_capacity: int,
        alpha: float,
        beta: float,
        eps: float = 1e-8,
        dtype: torch.dtype = torch.float,
        reduction: str = "max",
        max_priority_within_buffer: bool = False,
        device: str | torch.device | None = None,
        *,
        backend: str | None = None,
        stratified: bool = False,
        skip_stale_updates: bool = True,
        validate: bool | None = None,
        replacement: bool = True,
    ) -> None:
        check_replacement(replacement, type(self).__name__, variant=False)
        within_buffer = check_flag(max_priority_within_buffer, "max_priority_within_buffer")
        stratified = check_flag(stratified, "stratified")
        skip_stale_updates = check_flag(skip_stale_updates, "skip_stale_updates")
        self._capacity, self._eps, self._req_device = check_options(
            max_capacity, eps=eps, dtype=dtype, reduction=reduction, backend=backend,
            device=device, validate=validate)
        # the priority state, created on first use (see _ensure_state)
        self._settled = False
        self._state: PriorityState | None = None
        self._clock = 0  # write generation of the last extend
        self._within_buffer = within_buffer
        self.alpha = alpha
        self.beta = beta
        self._dtype = dtype
        self.reduction = reduction
        self._req_backend = backend
        self.stratified = stratified
        self.skip_stale_updates = skip_stale_updates
        self._validate_opt = validate

    # ---- configuration -----------------------------------------------------------------------
    @property
    def max_capacity(self) -> int:
        """Number of slots the trees cover (more than asked for once they grew)."""
        return self._capacity

    @property
    def max_size(self) -> int:
        """TorchRL's name of :attr:`max_capacity` (read-only).

        Examples
        --------
        >>> PrioritizedSampler(5, alpha=0.7, beta=0.5).max_size
        5
        """
        return self._capacity

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the returned weights, as given (read-only; TorchRL's trees are kept in it,
        tdreplay's always in float64).

        Examples
        --------
        >>> PrioritizedSampler(5, alpha=0.7, beta=0.5).dtype
        torch.float32
        """
        return self._dtype

    @property
    def default_priority(self) -> float:
        """Priority a written item gets (TorchRL's ``default_priority``): the max priority,
        ``1.0`` before any :meth:`update_priority` (see :attr:`max_priority`).

        Examples
        --------
        >>> s = PrioritizedSampler(5, alpha=0.7, beta=0.5)
        >>> s.default_priority
        1.0
        >>> s.extend(torch.arange(2))
        >>> s.update_priority(torch.arange(2), torch.tensor([3.0, 0.5]))
        >>> s.default_priority
        3.0
        """
        return self.max_priority

    @property
    def device(self) -> torch.device | None:
        """Device of the trees (``None`` until they exist)."""
        return self._state.device if self._state is not None else None

    @property
    def backend(self) -> str | None:
        """Backend of the trees (``None`` until they exist)."""
        return self._state.backend if self._state is not None else None

    @property
    def max_priority(self) -> float:
        """Priority new items get (before ``eps`` and ``alpha``); reads the device."""
        return float(default_priority(self._state)) if self._state is not None else 1.0

    @property
    def total_priority(self) -> float:
        """Sum of the stored priorities ``p_i = max((priority_i + eps) ** alpha, tiny)`` of the
        written slots: slot ``i`` is drawn with probability ``p_i / total_priority``. Reads the
        device; ``0.0`` before anything is written (see the class example)."""
        return float(self._state.sum_tree.total()) if self._state is not None else 0.0

    @property
    def min_priority(self) -> float:
        """Least stored priority ``p_i`` over the written slots (``inf`` if none): the
        importance weights are ``(p_i / min_priority) ** -beta``. Reads the device."""
        return float(self._state.min_tree.min()) if self._state is not None else math.inf

    _warned_zero = False

    def _warn_zero_priority(self) -> None:
        self._warned_zero = True  # (once per sampler)
        warnings.warn(
            f"PrioritizedSampler: a written slot has priority 0 (eps={self._eps}), the least "
            f"stored priority p_min, so the importance weights (p_i / p_min) ** -beta of every "
            f"other slot are 0. Pass eps > 0 (the default is 1e-8), give that slot a positive "
            f"priority, or use beta=0.", RuntimeWarning, stacklevel=4)

    # ---- placement ---------------------------------------------------------------------------
    def _ensure_state(self, storage: Storage | None = None) -> PriorityState:
        """The priority state; created, or settled where ``storage`` lives the first time one
        is seen."""
        state = self._state
        if storage is not None and not self._settled:
            self._settled = True
            state = self._state = settle(
                state, self._capacity, *placement(self._req_backend,
                                                  self._req_device or storage.device),
                within_buffer=self._within_buffer)
            if len(storage):
                # a storage filled before the sampler saw it (e.g. a dataset): its slots start
                # with the default priority, as if they had been written through the buffer
                # (as TorchRL's, whether a write or a sample comes first)
                self._seed_unseen(len(storage))
                state = self._state  # (grown when the storage holds more than max_capacity)
        elif state is None:
            state = self._state = new_state(self._capacity, *placement(
                self._req_backend, self._req_device), within_buffer=self._within_buffer)
        return state

    def _seed_unseen(self, count: int) -> None:
        """Give the slots ``0 .. count - 1`` never written through this sampler (write
        generation ``0``) the default priority; once, when the sampler first sees its storage
        (a read of the device for device trees)."""
        slots = torch.arange(count)
        if self._clock:  # written before: only the slots it was not told about
            state = self._ensure_state()
            known = min(count, state.capacity)
            seen = state.generation[:known].cpu() != 0
            slots = slots[torch.cat([~seen, torch.ones(count - known, dtype=torch.bool)])]
        self.extend(slots)

    def _fit(self, bounds: tuple[int, int] | None) -> PriorityState:
        """The state, grown to hold written slots of ``bounds`` (see
        :func:`~._priority_state.grown`)."""
        state = self._state = grown(self._ensure_state(), bounds,
                                    within_buffer=self._within_buffer)
        self._capacity = state.capacity
        return state

    def place_for(self, storage: Storage) -> None:
        """Settle the trees where ``storage`` lives (or on ``device``); buffers call this."""
        self._ensure_state(storage)

    # ---- writes ------------------------------------------------------------------------------
    def extend(self, index: torch.Tensor) -> None:
        """Give the written slots ``index`` the current max priority and a new write
        generation."""
        placed = self._placed(index)
        if placed is not None:
            state, index, generation = placed
            self._write_new_items(state, index, generation)

    def _write_new_items(self, state: PriorityState, slots: torch.Tensor,
                         generation: int) -> None:
        """Give the (checked, placed) ``slots`` the default priority and the write generation
        ``generation``. Tracking the max within the buffer, the items the slots held leave it
        first (the new items get the max of the items still in the buffer), and the new items
        hold the default priority as theirs, counted in that max as a priority set by an
        update is (as TorchRL reads the max back from its tree): a later low update of
        another item does not become the priority of every new item while older items still
        hold a higher one."""
        kernels = kernels_for(state)
        if state.max_tree is None:
            kernels.extend(state, slots, new_item_leaf(state, self._alpha, self._eps), generation)
            return
        state.max_tree.update(slots, math.inf)  # (the max tree holds -q: +inf is "none")
        raw = default_priority(state)
        kernels.extend(state, slots, new_item_leaf(state, self._alpha, self._eps), generation)
        state.max_tree.update(slots, -raw)

    def mark_update(self, index: torch.Tensor, *, storage: Storage | None = None) -> None:
        """``rb.mark_update(index)`` (TorchRL's ``mark_update``): the slots ``index`` get the
        current max priority and a new write generation, as :meth:`extend` gives them.

        ``storage`` is TorchRL's keyword. When it is given, it must be a
        :class:`~tdreplay.core.Storage` (``TypeError`` naming ``storage`` otherwise), and every
        slot of ``index`` must be written in it (``IndexError`` naming ``index`` otherwise: a
        priority for a slot that holds no item would be drawn by every later sample); a refused
        call changes nothing. Without ``storage`` (the buffer's call, which checks ``index``
        against its storage first), the slots are taken as they are, as by :meth:`extend`.

        Examples
        --------
        >>> from tdreplay.core import ListStorage
        >>> storage, s = ListStorage(8), PrioritizedSampler(8, alpha=1.0, beta=1.0, eps=0.0)
        >>> storage.set(torch.arange(2), ["a", "b"])
        >>> s.extend(torch.arange(2))
        >>> s.mark_update(torch.tensor([1]), storage=storage)
        >>> try:
        ...     s.mark_update(torch.tensor([5]), storage=storage)
        ... except IndexError as err:
        ...     print(str(err).split("(")[1])
        [5]; it holds 2 written slots, 0 to 1).
        """
        if storage is not None:
            if not isinstance(storage, Storage):
                raise TypeError(f"mark_update: storage must be a tdreplay.core.Storage (or "
                                f"None), got {type(storage).__name__}.")
            slots = as_long_tensor(index, name="index").reshape(-1)
            if slots.numel():
                written = storage.valid_slots_mask(slots)
                if not bool(written.all()):  # (a device read for device slots)
                    bad = slots[~written].unique()
                    shown = shown_slots(bad)
                    count = len(storage)
                    held = f", 0 to {count - 1}" if count else ""
                    raise IndexError(f"mark_update: index holds slots that are not written in "
                                     f"storage ({shown}; it holds {count} written "
                                     f"slots{held}).")
        self.extend(index)

    def mark_rewritten(self, index: torch.Tensor) -> None:
        """Slots rewritten by index assignment (``rb[i] = ...``) keep their priority, as in
        TorchRL; they get a new write generation, so that ``update_priority(...,
        write_generation=...)`` of the items they held is skipped. A slot this sampler holds no
        priority for (never written through it) gets the max priority, as :meth:`extend`
        gives it (a read of the device for device trees). :meth:`mark_update` (TorchRL's
        ``rb.mark_update``) gives the max priority to every slot.

        Examples
        --------
        >>> s = PrioritizedSampler(4, alpha=1.0, beta=1.0, eps=0.0)
        >>> s.extend(torch.arange(2))
        >>> s.update_priority(torch.arange(2), torch.tensor([1.0, 4.0]))
        >>> before = s.slot_generation(torch.arange(3)).tolist()
        >>> s.mark_rewritten(torch.tensor([0, 2]))  # slot 2 was never written here
        >>> s.state_dict()["priorities"].tolist()
        [1.0, 4.0, 4.0, 0.0]
        >>> after = s.slot_generation(torch.arange(3)).tolist()
        >>> after[0] > before[0], after[1] == before[1], after[2] > 0
        (True, True, True)
        >>> s.mark_update(torch.tensor([0]))  # the default (max) priority
        >>> s.state_dict()["priorities"].tolist()
        [4.0, 4.0, 4.0, 0.0]
        """
        placed = self._placed(index)
        if placed is None:
            return
        state, flat, generation = placed
        fresh = state.generation.index_select(0, flat) == 0
        if bool(fresh.any()):  # (a device read)
            self._write_new_items(state, flat[fresh], generation)
        state.generation.index_fill_(0, flat, generation)

    def extend_with_priority(self, index: torch.Tensor, priority: Any, *,
                             storage: Storage | None = None) -> None:
        """:meth:`extend`, then :meth:`update_priority` of the slots ``index`` just written with
        their ``priority`` (what :meth:`check_priority` returned for them, one per slot): on numba
        trees in one kernel pass, which writes each leaf once (the same trees as the two
        calls); otherwise, or in a subclass that overrides either method, the two calls.

        Examples
        --------
        >>> import torch
        >>> s = PrioritizedSampler(8, alpha=1.0, beta=1.0, eps=0.0)
        >>> s.extend_with_priority(torch.arange(3), s.check_priority(torch.tensor([1., 4., 2.])))
        >>> s.state_dict()["priorities"][:4].tolist(), s.max_priority
        ([1.0, 4.0, 2.0, 0.0], 4.0)
        """
        if (type(self).extend is not PrioritizedSampler.extend
                or type(self).update_priority is not PriorityUpdateMixin.update_priority):
            super().extend_with_priority(index, priority, storage=storage)
            return
        placed = self._placed(index)
        if placed is None:
            return
        state, index, generation = placed
        kernels = kernels_for(state)
        if (isinstance(kernels, NumbaKernels) and isinstance(priority, HostPriority)
                and priority.fits(index.numel(), self._alpha, self._eps, self.reduction)):
            kernels.extend_prioritized(state, index, priority, generation)
            return
        # device trees, or priorities to convert again: the extend's write, then the update
        self._write_new_items(state, index, generation)
        self.update_priority(index, priority, storage=storage)

    def _placed(self, slots: Any) -> tuple[PriorityState, torch.Tensor, int] | None:
        """For a write of ``slots``: the state (grown to hold them), the slots (flat, checked,
        on the trees' device) and their new write generation; ``None`` for no slot."""
        slots = as_long_tensor(slots, name="slots").reshape(-1)
        if not slots.numel():
            return None
        bounds = host_bounds(slots) if slots.is_cpu else None  # one pass; device: never read
        state = self._fit(bounds)
        slots = slots_on(slots, state.capacity, state.device, bounds)
        self._clock += 1
        return state, slots, generation_of(self._clock)

    def slot_generation(self, slots: Any) -> torch.Tensor:
        """Current write generation of ``slots`` (``0``: never written), on the tree device."""
        slots = as_long_tensor(slots, name="slots")
        state = self._ensure_state()
        flat = slots.reshape(-1).to(state.device, non_blocking=True)
        return state.generation.index_select(0, flat).reshape(slots.shape).long()

    def empty(self) -> None:
        """Forget every priority; the write clock keeps counting so old generations never match."""
        if self._state is not None:
            self._state = new_state(self._capacity, self._state.backend, self._state.device,
                                    within_buffer=self._within_buffer)

    def excluded(self, slots: torch.Tensor) -> AbstractContextManager[None]:
        """Within the block, ``slots`` cannot be drawn (their sampling mass is ``0``); their
        priorities are restored after it. E.g. slots that cannot start a slice. A priority set
        inside the block (``update_priority``, a write) takes effect at once and is kept: that
        slot can be drawn again. (The buffer holds its lock around its own uses.)

        Examples
        --------
        >>> from tdreplay.core import ListStorage
        >>> storage, s = ListStorage(4), PrioritizedSampler(4, alpha=1.0, beta=1.0)
        >>> storage.set(torch.arange(4), list("abcd"))
        >>> s.extend(torch.arange(4))
        >>> with s.excluded(torch.tensor([0, 1, 2])):
        ...     s.sample(storage, 5)[0].tolist()
        [3, 3, 3, 3, 3]
        >>> s.total_priority == 4 * (1 + s.eps)
        True
        """
        return excluded(self._ensure_state(), slots)

    # ---- sampling ----------------------------------------------------------------------------
    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[str, Any]]:
        """Draw ``batch_size`` slots in proportion to their stored priority.

        Returns ``(index, info)``: ``index`` the int64 slots (on the tree device),
        ``info["priority_weight"]`` the importance weights ``(p_i / p_min) ** -beta`` (``dtype``)
        and ``info["write_generation"]`` the write generation of every drawn slot.
        """
        check_batch_size(batch_size)
        written = check_not_empty(storage)
        state = self._ensure_state(storage)
        if state.device.type == "cpu":
            if not float(state.sum_tree.total()) > 0.0:
                raise RuntimeError("no written slot has a priority: the sampler was not told "
                                   "about the storage's items (extend the buffer through the "
                                   "sampler).")
            # (a stored 0 needs eps == 0: one attribute read on the common path)
            if not self._eps and self._beta and not self._warned_zero \
                    and float(state.min_tree.min()) <= TINY:
                self._warn_zero_priority()
        index, weight, gen = kernels_for(state).draw(
            state, uniform(batch_size, state.device, self._rng), self.stratified, self._beta,
            self._dtype, written)
        return index, {PRIORITY_WEIGHT_KEY: weight, WRITE_GENERATION_KEY: gen}

    @property
    def draws_written_slots(self) -> bool:  # type: ignore[override]
        """True with CPU trees, whose draws are checked as drawn (see the class example); False
        before the trees exist, with device trees, or in a subclass overriding :meth:`sample`."""
        own = type(self).sample is PrioritizedSampler.sample
        return own and self._state is not None and self._state.device.type == "cpu"

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(max_capacity={self._capacity}, alpha={self.alpha!r}, "
                f"beta={self.beta!r}, eps={self._eps}, reduction={self.reduction!r}, "
                f"backend={self.backend}, device={self.device})")
