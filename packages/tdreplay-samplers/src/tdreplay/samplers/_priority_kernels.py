"""Kernels over a :class:`~._priority_state.PriorityState`: one interface, two backends.

:class:`PriorityKernels` is what a prioritized sampler does to its priority state: give written
slots a priority (``extend``), draw slots for uniform numbers (``draw``) and apply a priority
update (``update``). :class:`NumbaKernels` runs each as one fused numba call on the trees' node
arrays (:mod:`._priority_numba`); :class:`TorchKernels` as tensor operations on the trees' device
that never read values back to the host (on CUDA, Triton kernels decide which entries of an
update apply: :mod:`._priority_triton`). Both give identical trees and draws. The kernels keep
no state: everything they read or change is in the state they are given.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import numpy as np
import torch

from . import _priority_numba as fused
from ._host_threads import MIN_SPLIT_ITEMS, thread_count
from ._priority_graphs import StateGraphs
from ._priority_split import SubtreeSplit, split_draw, split_update, split_write
from ._priority_state import PriorityState
from ._priority_triton import kept_updates
from ._priority_values import (
    CPU,
    HostPriority,
    check_priority_values,
    check_stored_priority,
    host_priority,
    leaf_limit,
    leaf_values,
    reduce_priority,
)
from .segment_trees import MinTree, NumbaMinOverSumTree, NumbaMinTree, NumbaSumTree, SumTree
from .segment_trees._torch import update_together

__all__ = ["NumbaKernels", "PriorityKernels", "TorchKernels", "apply_update", "check_drawn",
           "check_host_priority", "check_update", "excluded", "kernels_for", "uniform"]

#: Weight dtypes the numba sample kernel writes directly (others are converted from float64).
_KERNEL_WEIGHTS: dict[torch.dtype, type[np.floating[Any]]] = {torch.float32: np.float32,
                                                               torch.float64: np.float64}


def check_update(state: PriorityState, index: torch.Tensor, raw: torch.Tensor,
                 n_written: int | None, *, reduction: str, alpha: float, eps: float,
                 token: torch.Tensor | None = None) -> None:
    """Raise ``ValueError`` / ``IndexError`` for bad priorities (NaN, infinite, negative, or
    overflowing once raised to ``alpha``) or indices (reads the host).

    An index at an unwritten slot is refused unless the update carries write generations
    (``token``): the item it was computed for is gone then (the storage was emptied or
    restored since the sample), so the entry is stale, and the kernels skip it like the other
    stale ones."""
    raw = raw.to(CPU, torch.float64)
    check_priority_values(raw)
    capacity = state.capacity
    check_stored_priority(reduce_priority(raw, index.numel(), reduction), capacity, alpha, eps)
    index = index.to(CPU)
    lo, hi = torch.aminmax(index)
    if int(lo) < -1 or int(hi) >= capacity:
        bad = index[(index < -1) | (index >= capacity)]
        raise IndexError(f"index must lie in [0, {capacity}) (max_capacity); got "
                         f"{bad[:5].tolist()}. Nothing was updated.")
    if token is not None:
        return
    live = index >= 0
    slot_gen = state.generation.index_select(0, index.clamp_min(0).to(state.device)).to(CPU)
    unwritten = live & (slot_gen == 0)
    if n_written is not None:
        unwritten |= live & (index >= n_written)
    if bool(unwritten.any()):
        raise IndexError(f"index points at unwritten slots {index[unwritten][:5].tolist()}"
                         f"{'' if n_written is None else f' (the storage holds {n_written})'}: "
                         "a priority there would belong to no item (a write replaces it with "
                         "the max priority). Nothing was updated.")


def check_host_priority(values: HostPriority, capacity: int) -> None:
    """Raise ``ValueError`` naming them where the priority ``values`` hold one an update of a
    sampler of ``capacity`` slots refuses (NaN, infinite, negative, or overflowing once raised
    to alpha): the update kernel's check, in one numba pass.

    Examples
    --------
    >>> from tdreplay.samplers._priority_values import host_priority
    >>> check_host_priority(host_priority(torch.tensor([0.5, 2.0]), 2, "max", 1.0, 0.0), 10)
    >>> try:
    ...     check_host_priority(host_priority(torch.tensor([-1.0]), 1, "max", 1.0, 0.0), 10)
    ... except ValueError as err:
    ...     print(str(err)[:40])
    priority must be finite and >= 0; got [-
    """
    raw, _, leaf = values.kernel_arrays()
    if fused.check_values_kernel(raw, leaf, leaf_limit(capacity)) >= 0:
        check_priority_values(values.raw)  # raises, naming the values
        check_stored_priority(values.reduced, capacity, values.alpha, values.eps)
        raise AssertionError("the value kernel refused a priority the host check "
                             "accepts")  # pragma: no cover


def check_drawn(top: int, written: int) -> None:
    """``IndexError`` when ``top``, the largest slot drawn, is not among the ``written`` slots
    of the storage: the trees hold priorities the storage has no item for (it was emptied or
    written without the sampler). What lets buffers read the draws unchecked.

    Examples
    --------
    >>> check_drawn(3, written=4)
    >>> try:
    ...     check_drawn(4, written=4)
    ... except IndexError as err:
    ...     print(str(err)[:46])
    the sampler drew slot 4, but the storage holds
    """
    if top >= written:
        raise IndexError(f"the sampler drew slot {top}, but the storage holds {written} written "
                         "slots: its priorities are out of step with the storage (was the "
                         "storage emptied or written without the sampler?).")


class PriorityKernels(abc.ABC):
    """What a prioritized sampler does to its :class:`~._priority_state.PriorityState`."""

    #: Backend of the states these kernels work on.
    backend: ClassVar[str]

    @abc.abstractmethod
    def extend(self, state: PriorityState, slots: torch.Tensor, leaf: float | torch.Tensor,
               generation: int) -> None:
        """Store ``leaf`` (float64: a float for numba trees, a 0-d tensor for torch trees) and
        the write generation ``generation`` for the checked ``slots`` (on the state's
        device)."""

    @abc.abstractmethod
    def draw(self, state: PriorityState, u: torch.Tensor, stratified: bool, beta: float,
             dtype: torch.dtype, written: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Slots for the uniform draws ``u`` (float64 in ``[0, 1)``), with their importance
        weights ``(p_i / p_min) ** -beta`` (``dtype``, computed in log space so that extreme
        ratios do not overflow) and int64 write generations. ``stratified``: draw ``i`` falls
        in the ``i``-th of ``len(u)`` equal parts of the mass. Draws on the host are checked
        against ``written``, the storage's written slots (:func:`check_drawn`); device draws
        are not (that would wait for the device)."""

    @abc.abstractmethod
    def update(self, state: PriorityState, index: torch.Tensor, raw: torch.Tensor, *,
               reduction: str, alpha: float, eps: float, token: torch.Tensor | None,
               n_written: int | None, prepared: HostPriority | None = None) -> bool:
        """Set the priorities ``raw`` (one per flat ``index``, or rows to reduce) of the slots.

        ``-1`` entries are skipped, and those whose write generation is no longer ``token``
        (when given). Returns ``False``, changing nothing, when the update holds a bad
        priority or index that the kernel found (the caller then raises with
        :func:`check_update`); kernels that do not check return ``True`` and drop bad entries.
        ``prepared``: ``raw`` as a :class:`~._priority_values.HostPriority` of these settings,
        when the caller has it (the numba kernels then convert nothing).
        """


def _numba_trees(state: PriorityState) -> tuple[NumbaSumTree, NumbaMinOverSumTree,
                                                NumbaMinTree | None, np.ndarray]:
    """The trees and the host generation array of a numba state, typed as what they are
    (without ``typing.cast``: a Python call each, twice per prioritized sample and update)."""
    return (state.sum_tree, state.min_tree, state.max_tree,  # type: ignore[return-value]
            state.host_generation)


def _split(offsets: np.ndarray, n_written: int, n: int) -> SubtreeSplit | None:
    """How a write of ``n`` slots into a numba tree is split over threads; ``None``: not split
    (the common call, one kernel call)."""
    parts = thread_count(n) if n >= MIN_SPLIT_ITEMS else 1
    return SubtreeSplit.plan(offsets, n_written, parts) if parts > 1 else None


class NumbaKernels(PriorityKernels):
    """Kernels of numba states: one fused numba call each, checks included in ``update``; a
    large draw or update is split over threads (:mod:`._priority_split`)."""

    backend = "numba"

    def extend(self, state: PriorityState, slots: torch.Tensor, leaf: float | torch.Tensor,
               generation: int) -> None:
        index = slots.contiguous().numpy()
        sum_tree, min_tree, max_tree, gen = _numba_trees(state)
        fused.extend_kernel(
            sum_tree.nodes, min_tree.nodes,
            max_tree.nodes if max_tree is not None else sum_tree.nodes, max_tree is not None,
            sum_tree.offsets, index, float(leaf), gen, generation)

    def draw(self, state: PriorityState, u: torch.Tensor, stratified: bool, beta: float,
             dtype: torch.dtype, written: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # the same draws and float64 operations as the torch kernels: both backends draw the
        # same slots for the same generator state (the weights may differ in the last bit:
        # libm's exp and log against torch's)
        n = u.shape[0]
        # numpy outputs (cheaper to make than tensors), handed over without a copy
        index = np.empty(n, dtype=np.int64)
        weight = np.empty(n, dtype=_KERNEL_WEIGHTS.get(dtype, np.float64))
        gen = np.empty(n, dtype=np.int64)
        sum_tree, min_tree, _, generations = _numba_trees(state)
        parts = thread_count(n) if n >= MIN_SPLIT_ITEMS else 1
        if parts == 1:  # the common call: one kernel call, nothing more
            top = fused.sample_kernel(sum_tree.nodes, sum_tree.offsets, u.numpy(), stratified,
                                      generations, math.log(min_tree.nodes[0]), beta, index,
                                      weight, gen)
        else:  # a large sample: its draws split over threads (the same draws)
            top = split_draw(parts, sum_tree.nodes, sum_tree.offsets, u.numpy(), stratified,
                             generations, math.log(min_tree.nodes[0]), beta, index, weight, gen)
        check_drawn(top, written)
        weights = torch.from_numpy(weight)
        return (torch.from_numpy(index), weights if dtype in _KERNEL_WEIGHTS else
                weights.to(dtype), torch.from_numpy(gen))

    def update(self, state: PriorityState, index: torch.Tensor, raw: torch.Tensor, *,
               reduction: str, alpha: float, eps: float, token: torch.Tensor | None,
               n_written: int | None, prepared: HostPriority | None = None) -> bool:
        index = index.to(CPU).contiguous()
        values = prepared if prepared is not None else host_priority(
            raw, index.numel(), reduction, alpha, eps)
        index_np = index.numpy()
        raw_np, reduced_np, leaf_np = values.kernel_arrays()
        tok = token.to(CPU).contiguous().numpy() if token is not None else index_np
        sum_tree, min_tree, max_tree, gen = _numba_trees(state)
        capacity = state.capacity
        written = capacity if n_written is None else n_written
        max_nodes = max_tree.nodes if max_tree is not None else sum_tree.nodes
        split = _split(sum_tree.offsets, min(capacity, written), index_np.shape[0])
        if split is None:  # the common call: one kernel call, checks included
            code, _, top = fused.update_kernel(
                sum_tree.nodes, min_tree.nodes, max_nodes, max_tree is not None,
                sum_tree.offsets, capacity, written, gen, index_np, raw_np, reduced_np, leaf_np,
                leaf_limit(capacity), tok, token is not None)
        else:  # a large update: in threads, each over its own subtrees
            code, top = split_update(
                split, (sum_tree.nodes, min_tree.nodes, max_nodes, max_tree is not None),
                sum_tree.offsets, capacity, written, gen, (index_np, raw_np, reduced_np, leaf_np),
                leaf_limit(capacity), tok, token is not None)
        if code != fused.OK:
            return False
        if top > float(state.max_priority):
            state.max_priority.fill_(top)
        return True

    def extend_prioritized(self, state: PriorityState, slots: torch.Tensor,
                           values: HostPriority, generation: int) -> None:
        """:meth:`extend` of the (checked) ``slots`` just written, then :meth:`update` of them
        with ``values`` (checked by ``check_priority``, one per slot), in one pass: the same
        trees, generations and max priority."""
        index = slots.contiguous().numpy()
        _, reduced_np, leaf_np = values.kernel_arrays()
        sum_tree, min_tree, max_tree, gen = _numba_trees(state)
        trees = (sum_tree.nodes, min_tree.nodes,
                 max_tree.nodes if max_tree is not None else sum_tree.nodes, max_tree is not None)
        split = _split(sum_tree.offsets, state.capacity, index.shape[0])
        if split is None:
            top = fused.extend_prioritized_kernel(*trees, sum_tree.offsets, gen, index,
                                                  reduced_np, leaf_np, generation)
        else:  # a large write: in threads, each over its own subtrees
            gen[index] = generation
            top = split_write(split, trees, sum_tree.offsets, gen, (index, reduced_np, leaf_np),
                              index, False)
        if top > float(state.max_priority):
            state.max_priority.fill_(top)


class TorchKernels(PriorityKernels):
    """Kernels of torch states: tensor operations only, no host sync on devices."""

    backend = "torch"

    def extend(self, state: PriorityState, slots: torch.Tensor, leaf: float | torch.Tensor,
               generation: int) -> None:
        state.generation.index_fill_(0, slots, generation)
        trees: list[tuple[SumTree | MinTree, Any]] = [(state.sum_tree, leaf)]
        if state.max_tree is not None:
            # a new item has no priority set by update_priority yet
            trees.append((state.max_tree, math.inf))
        # one index conversion for all trees; on CUDA one refresh launch per level for all
        update_together(trees, slots, state.min_tree)

    def draw(self, state: PriorityState, u: torch.Tensor, stratified: bool, beta: float,
             dtype: torch.dtype, written: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        def draw(state: PriorityState, u: torch.Tensor, neg_beta: torch.Tensor | float
                 ) -> tuple[torch.Tensor, ...]:
            return _device_draw(state, u, neg_beta, stratified=stratified, dtype=dtype)

        # on CUDA one graph replay, not ~12 launches
        index, weight, gen = _GRAPHS.call(draw, state, (u.contiguous(), -beta),
                                          (stratified, dtype))
        if index.is_cpu:  # no device sync
            check_drawn(int(index.max()), written)
        return index, weight, gen

    def update(self, state: PriorityState, index: torch.Tensor, raw: torch.Tensor, *,
               reduction: str, alpha: float, eps: float, token: torch.Tensor | None,
               n_written: int | None, prepared: HostPriority | None = None) -> bool:
        dev = state.device
        index = index.to(dev, non_blocking=True).contiguous()
        priority = raw.to(dev, torch.float64, non_blocking=True).contiguous()
        if token is not None:
            token = token.to(dev, torch.int64, non_blocking=True).contiguous()

        def apply(state: PriorityState, index: torch.Tensor, priority: torch.Tensor,
                  token: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
            _apply_update(state, index, priority, token, reduction=reduction, alpha=alpha,
                          eps=eps, n_written=n_written)
            return ()

        # on CUDA one graph replay, not ~35 launches
        _GRAPHS.call(apply, state, (index, priority, token), (reduction, alpha, eps, n_written))
        return True


#: The recorded draws and updates of CUDA states.
_GRAPHS = StateGraphs()


def _device_draw(state: PriorityState, u: torch.Tensor, neg_beta: torch.Tensor | float, *,
                 stratified: bool, dtype: torch.dtype
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:meth:`TorchKernels.draw` without the host check of the slots drawn: no host sync (so it
    can be recorded in a CUDA graph, with ``neg_beta``, ``-beta``, a 0-d float64 tensor there:
    the same float64 product as with the float)."""
    n = u.shape[0]
    if stratified:
        u = (torch.arange(n, dtype=torch.float64, device=state.device) + u) / n
    sum_tree = state.sum_tree
    index = sum_tree.scan_lower_bound(u * sum_tree.total())
    assert isinstance(index, torch.Tensor)
    leaf = sum_tree.get(index)
    assert isinstance(leaf, torch.Tensor)
    log_min = torch.log(torch.as_tensor(state.min_tree.min()))
    weight = torch.exp((torch.log(leaf) - log_min) * neg_beta)
    return index, weight.to(dtype), state.generation.index_select(0, index).long()


def _apply_update(state: PriorityState, index: torch.Tensor, priority: torch.Tensor,
                  token: torch.Tensor | None, *, reduction: str, alpha: float, eps: float,
                  n_written: int | None) -> None:
    """:meth:`TorchKernels.update` of inputs on the state's device, without a host sync (so it
    can be recorded in a CUDA graph): an update holding a bad priority changes nothing; -1,
    out-of-range, unwritten and stale entries are sent to index -1, which the unchecked torch
    trees ignore."""
    kept = None
    if priority.numel() == index.numel():  # one value per index: two kernels on CUDA decide
        priority = priority.reshape(-1)
        kept = kept_updates(state, index, priority, alpha, eps, n_written, token)
    if kept is None:
        priority, kept = _kept_by_tensor_ops(state, index, priority, reduction=reduction,
                                             alpha=alpha, eps=eps, token=token,
                                             n_written=n_written)
    target, leaf, kept_priority = kept
    trees: list[tuple[SumTree | MinTree, torch.Tensor]] = [(state.sum_tree, leaf)]
    if state.max_tree is not None:
        trees.append((state.max_tree, -priority))
    # -1 entries: ignored by the trees, recomputed unchanged by the min over the sums
    update_together(trees, target, state.min_tree)
    torch.maximum(state.max_priority, kept_priority.max(), out=state.max_priority)


def _kept_by_tensor_ops(state: PriorityState, index: torch.Tensor, priority: torch.Tensor, *,
                        reduction: str, alpha: float, eps: float, token: torch.Tensor | None,
                        n_written: int | None
                        ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``(reduced priority, (target, kept_leaf, kept_priority))`` of an update of the device
    state ``state``, as :func:`._priority_triton.kept_updates` decides it (from the same
    inputs), with tensor ops (no host sync)."""
    capacity = state.capacity
    ok = ((priority >= 0) & (priority < math.inf)).all()  # NaN fails both
    priority = reduce_priority(priority, index.numel(), reduction)
    leaf = leaf_values(priority, alpha, eps)
    ok &= (leaf <= leaf_limit(capacity)).all()  # no overflow once raised to alpha
    in_range = (index >= 0) & (index < capacity)
    slot_gen = state.generation.index_select(0, index.clamp(0, capacity - 1))
    keep = in_range & (slot_gen > 0) & ok
    if n_written is not None:
        keep &= index < n_written
    if token is not None:
        keep &= slot_gen == token
    return priority, (torch.where(keep, index, -1), torch.where(keep, leaf, 1.0),
                      torch.where(keep, priority, -math.inf))


_KERNELS: dict[str, PriorityKernels] = {"numba": NumbaKernels(), "torch": TorchKernels()}


def kernels_for(state: PriorityState) -> PriorityKernels:
    """The kernels of ``state``'s backend."""
    return _KERNELS[state.backend]


def uniform(n: int, device: torch.device, generator: torch.Generator | None) -> torch.Tensor:
    """``n`` float64 draws in ``[0, 1)`` on ``device``, from ``generator`` (wherever it is).

    Without a generator, CPU draws come from NumPy's global generator, as TorchRL's
    prioritized sampler draws them (``np.random.seed`` reproduces a TorchRL program's draws);
    device draws from torch's generator of that device.
    """
    if generator is None:
        if device.type == "cpu":
            return torch.from_numpy(np.random.random_sample(n))
        return torch.rand(n, dtype=torch.float64, device=device)
    if generator.device == device:
        return torch.rand(n, dtype=torch.float64, device=device, generator=generator)
    u = torch.rand(n, dtype=torch.float64, device=generator.device, generator=generator)
    return u.to(device, non_blocking=True)


@contextmanager
def excluded(state: PriorityState, slots: torch.Tensor) -> Iterator[None]:
    """Within the block, the sum tree holds ``0`` for ``slots`` (they cannot be drawn); their
    stored priorities are put back after it, except those set inside the block (an update or a
    write gave the slot a priority again: that one stays). The min tree is not told of the
    zeros (the weight normaliser stays the least stored priority), but is refreshed after the
    restore, in case an update inside the block recomputed it from them."""
    slots = slots.to(state.device)
    sum_tree = state.sum_tree
    saved = sum_tree.get(slots)
    sum_tree.update(slots, torch.zeros_like(saved) if isinstance(saved, torch.Tensor) else 0.0)
    try:
        yield
    finally:
        now = sum_tree.get(slots)
        if isinstance(now, torch.Tensor):
            kept: Any = torch.where(now != 0, now, torch.as_tensor(saved))
        else:
            kept = np.where(np.asarray(now) != 0, now, saved)
        sum_tree.update(slots, kept)
        state.min_tree.refresh(slots)


def apply_update(state: PriorityState, index: torch.Tensor, raw: torch.Tensor, *,
                 validate: bool, reduction: str, alpha: float, eps: float,
                 token: torch.Tensor | None, n_written: int | None,
                 prepared: HostPriority | None = None) -> None:
    """Check (``validate``, or what the kernels check) and apply a priority update: the
    arguments are those of :meth:`PriorityKernels.update`. Raises, changing nothing, on a bad
    priority or index (see :func:`check_update`); entries at unwritten slots of an update with
    write generations (``token``) are stale and skipped, as those of rewritten slots."""
    if state.backend != "numba" and validate:
        check_update(state, index, raw, n_written, reduction=reduction, alpha=alpha, eps=eps,
                     token=token)
    if not kernels_for(state).update(state, index, raw, reduction=reduction, alpha=alpha,
                                     eps=eps, token=token, n_written=n_written,
                                     prepared=prepared):
        # raises, with a detailed message
        check_update(state, index, raw, n_written, reduction=reduction, alpha=alpha, eps=eps,
                     token=token)
        raise AssertionError("the update kernel refused the update but the host check found "
                             "nothing wrong")  # pragma: no cover
