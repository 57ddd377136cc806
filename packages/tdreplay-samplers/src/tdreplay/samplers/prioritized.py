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
priority computed for the row it replaced. ``skip_stale_updates=False`` turns the check off. An
update without ``write_generation`` (e.g. priorities of freshly written rows) is applied as is.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from tdreplay.core import Sampler, Storage
from tdreplay.core.utils import as_long_tensor
from tdreplay.core.utils import check_batch_size, check_not_empty

from . import _prioritized_numba as _kernels
from .segment_trees import MinSegmentTree, SumSegmentTree

__all__ = ["PRIORITY_WEIGHT_KEY", "WRITE_GENERATION_KEY", "PrioritizedSampler"]

#: Info entry holding the importance-sampling weights of a sample.
PRIORITY_WEIGHT_KEY = "priority_weight"
#: Info entry holding the write generation of every sampled slot (see the module docstring).
WRITE_GENERATION_KEY = "write_generation"

_REDUCTIONS = ("max", "min", "sum", "mean", "median")
_TINY = float(np.finfo(np.float64).tiny)
_CPU = torch.device("cpu")
_STATE_KEYS = frozenset({"max_capacity", "alpha", "beta", "eps", "priorities", "set_priorities",
                         "max_priority", "write_generation", "write_clock"})


def _check_real(value: Any, name: str, *, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}.")
    value = float(value)
    if not math.isfinite(value) or value < minimum:
        raise ValueError(f"{name} must be a finite number >= {minimum}, got {value}.")
    return value


def _as_priority_tensor(priority: Any) -> torch.Tensor:
    if not isinstance(priority, torch.Tensor):
        if isinstance(priority, np.ndarray):
            priority = torch.from_numpy(priority)
        else:
            try:
                priority = torch.as_tensor(priority)
            except (TypeError, ValueError, RuntimeError) as err:
                raise TypeError(f"priority must be a number, an array or a tensor of real "
                                f"numbers, got {type(priority).__name__}.") from err
    if priority.dtype is torch.bool or priority.is_complex():
        raise TypeError(f"priority must hold real numbers, got dtype {priority.dtype}.")
    return priority.detach()


def _check_priority_values(priority: torch.Tensor) -> None:
    """Raise ``ValueError`` unless every value of the host tensor ``priority`` is finite, >= 0."""
    if not priority.numel():
        return
    lo, hi = torch.aminmax(priority.reshape(-1))
    if not (float(lo) >= 0.0 and float(hi) < math.inf):
        bad = priority[~((priority >= 0) & (priority < math.inf))].reshape(-1)
        raise ValueError(f"priority must be finite and >= 0; got {bad[:5].tolist()}. "
                         "Nothing was updated.")


def _reduce(priority: torch.Tensor, n: int, reduction: str) -> torch.Tensor:
    """Reduce ``priority`` (``n`` items followed by any trailing dims) to ``n`` values."""
    flat = priority.reshape(n, -1)
    if flat.shape[1] == 1:
        return flat[:, 0]
    if reduction == "max":
        return flat.amax(1)
    if reduction == "min":
        return flat.amin(1)
    if reduction == "sum":
        return flat.sum(1)
    if reduction == "mean":
        return flat.mean(1)
    return flat.median(1).values


class PrioritizedSampler(Sampler):
    """Samples slot ``i`` with probability ``p_i ** alpha / sum_j p_j ** alpha``.

    Parameters
    ----------
    max_capacity : int
        Number of slots of the storage (its ``max_size``).
    alpha : float
        Priority exponent, ``>= 0``; ``0`` samples uniformly.
    beta : float
        Importance-sampling exponent, ``>= 0``: ``info["priority_weight"]`` is
        ``(p_i / p_min) ** -beta`` with ``p = (priority + eps) ** alpha`` the stored priorities,
        i.e. PER's ``(N * P(i)) ** -beta`` normalised by its maximum over the buffer.
    eps : float
        Added to every priority before the exponent, so no item has probability 0.
    dtype : torch.dtype
        Floating dtype of the returned weights (the trees always keep float64).
    reduction : {"max", "min", "sum", "mean", "median"}
        How :meth:`update_priority` reduces the trailing dimensions of multi-dimensional
        priorities (e.g. one TD error per agent) to one priority per slot.
    max_priority_within_buffer : bool
        New items get the current max priority. ``False``: the largest priority ever passed to
        :meth:`update_priority` (``1`` before the first update). ``True``: the largest priority
        set by :meth:`update_priority` among the items still in the buffer (``1`` if none),
        so it falls when those items are updated or overwritten.
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

    Notes
    -----
    :meth:`sample` returns ``info["priority_weight"]`` (the importance weights, ``dtype``) and
    ``info["write_generation"]`` (pass it back to :meth:`update_priority` so that priorities of
    rows overwritten since the sample are skipped; TensorDict buffers do it for you). New items
    get the max priority; ``-1`` in an update's index is skipped (TorchRL's marker of rows not
    written).

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
    """

    is_prioritized = True
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
        *,
        device: str | torch.device | None = None,
        backend: str | None = None,
        stratified: bool = False,
        skip_stale_updates: bool = True,
        validate: bool | None = None,
    ) -> None:
        if isinstance(max_capacity, bool) or not isinstance(max_capacity, (int, np.integer)) \
                or max_capacity <= 0:
            raise ValueError(f"max_capacity must be a positive int, got {max_capacity!r}.")
        self._capacity = int(max_capacity)
        self.alpha = alpha
        self.beta = beta
        self._eps = _check_real(eps, "eps")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}.")
        self._dtype = dtype
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}.")
        self.reduction = reduction
        self._within_buffer = bool(max_priority_within_buffer)
        if backend not in (None, "numba", "torch"):
            raise ValueError(f"backend must be 'numba', 'torch' or None, got {backend!r}.")
        self._req_device = None if device is None else torch.device(device)
        if backend == "numba" and self._req_device is not None and self._req_device.type != "cpu":
            raise ValueError(f"the numba backend keeps its trees on CPU; got device={device!r} "
                             "(use backend='torch' or None for device trees).")
        self._req_backend = backend
        self.stratified = bool(stratified)
        self.skip_stale_updates = bool(skip_stale_updates)
        if validate not in (None, True, False):
            raise TypeError(f"validate must be a bool or None, got {validate!r}.")
        self._validate_opt = validate
        # trees and per-slot state, created on first use (see _ensure_trees)
        self._settled = False
        self._backend: str | None = None
        self._device: torch.device | None = None
        self._sum: Any = None
        self._min: Any = None
        self._max: Any = None  # min tree of -priority (max_priority_within_buffer only)
        self._gen: torch.Tensor | None = None
        self._max_priority: torch.Tensor | None = None  # -inf until the first update
        self._clock = 0

    # ---- configuration -----------------------------------------------------------------------
    @property
    def max_capacity(self) -> int:
        """Number of slots the trees cover."""
        return self._capacity

    @property
    def alpha(self) -> float:
        """Priority exponent (settable; applies to priorities set from then on)."""
        return self._alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        self._alpha = _check_real(value, "alpha")

    @property
    def beta(self) -> float:
        """Importance-sampling exponent (settable, e.g. to anneal it towards 1)."""
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        self._beta = _check_real(value, "beta")

    @property
    def eps(self) -> float:
        """Added to every priority before the exponent."""
        return self._eps

    @property
    def device(self) -> torch.device | None:
        """Device of the trees (``None`` until they exist)."""
        return self._device

    @property
    def backend(self) -> str | None:
        """Backend of the trees (``None`` until they exist)."""
        return self._backend

    @property
    def validate(self) -> bool:
        """Whether :meth:`update_priority` checks its inputs on the host and raises."""
        if self._backend == "numba" or self._device is None:
            return True
        if self._validate_opt is not None:
            return self._validate_opt
        return self._device.type == "cpu"

    @property
    def max_priority(self) -> float:
        """Priority new items get (before ``eps`` and ``alpha``); reads the device."""
        return float(self._default_priority()) if self._sum is not None else 1.0

    # ---- placement ---------------------------------------------------------------------------
    def _target(self, storage_device: torch.device | None) -> tuple[str, torch.device]:
        device = self._req_device or storage_device or _CPU
        backend = self._req_backend or ("numba" if device.type == "cpu" else "torch")
        return backend, (_CPU if backend == "numba" else device)

    def _ensure_trees(self, storage: Storage | None = None) -> None:
        """Create the trees, or settle them where ``storage`` lives the first time one is seen."""
        if storage is not None and not self._settled:
            target = self._target(torch.device(getattr(storage, "device", _CPU)))
            self._settled = True
            if self._sum is None:
                self._install(*target, None)
            elif target != (self._backend, self._device):
                self._install(*target, self._export())
            if self._clock == 0 and len(storage):
                # a storage filled before the sampler saw it (e.g. a dataset): its slots start
                # with the default priority, as if they had been written through the buffer
                self.extend(torch.arange(len(storage)))
        elif self._sum is None:
            self._install(*self._target(None), None)

    def place_for(self, storage: Storage) -> None:
        """Settle the trees where ``storage`` lives (or on ``device``); buffers call this."""
        self._ensure_trees(storage)

    def _install(self, backend: str, device: torch.device, state: dict[str, Any] | None) -> None:
        """(Re)create the trees on ``device`` from a host ``state`` (empty trees if None)."""
        kw: dict[str, Any] = {"backend": backend, "device": device}
        if backend == "torch":
            kw["validate"] = False  # the sampler checks inputs itself, without syncing devices
        cap = self._capacity
        sum_tree, min_tree = SumSegmentTree(cap, **kw), MinSegmentTree(cap, **kw)
        max_tree = MinSegmentTree(cap, **kw) if self._within_buffer else None
        # numpy allocates large arrays with huge pages where the OS offers them (torch does not):
        # the kernels read the generations of random slots
        gen = torch.from_numpy(np.zeros(cap, dtype=np.int64))
        max_priority = -math.inf
        if state is not None:
            leaves = state["priorities"]
            sum_tree.load_state_dict({"capacity": cap, "values": leaves})
            min_tree.load_state_dict({"capacity": cap, "values": torch.where(
                leaves > 0, leaves, math.inf)})
            if max_tree is not None:
                max_tree.load_state_dict({"capacity": cap, "values": -state["set_priorities"]})
            gen.copy_(state["write_generation"])  # a copy: the caller's state stays its own
            max_priority = state["max_priority"]
        self._backend, self._device = backend, device
        self._sum, self._min, self._max = sum_tree, min_tree, max_tree
        self._gen = gen.to(device)
        self._gen_np = self._gen.numpy() if backend == "numba" else None  # kernels' view
        self._max_priority = torch.tensor(max_priority, dtype=torch.float64, device=device)

    def _export(self) -> dict[str, Any]:
        """Host copy of the per-slot state (what :meth:`_install` takes)."""
        cap = self._capacity
        if self._sum is None:
            return {"priorities": torch.zeros(cap, dtype=torch.float64),
                    "set_priorities": torch.full((cap,), -math.inf, dtype=torch.float64),
                    "write_generation": torch.zeros(cap, dtype=torch.long),
                    "max_priority": -math.inf}
        return {
            "priorities": self._sum.state_dict()["values"],
            "set_priorities": (-self._max.state_dict()["values"] if self._max is not None
                               else torch.full((cap,), -math.inf, dtype=torch.float64)),
            "write_generation": self._gen.cpu().clone(),
            "max_priority": float(self._max_priority),
        }

    # ---- priorities --------------------------------------------------------------------------
    def _default_priority(self) -> torch.Tensor:
        """Priority of new items (0-d float64 tensor on the tree device)."""
        if self._max is not None:
            current = -self._max.min()
            current = torch.as_tensor(current, dtype=torch.float64, device=self._device)
        else:
            current = self._max_priority
        return torch.where(current > -math.inf, current, 1.0)

    def _leaf(self, priority: torch.Tensor) -> torch.Tensor:
        """Stored value of raw priorities: ``max((priority + eps) ** alpha, tiny)``."""
        return torch.pow(priority + self._eps, self._alpha).clamp_min_(_TINY)

    # ---- writes ------------------------------------------------------------------------------
    def extend(self, slots: torch.Tensor) -> None:
        """Give the written ``slots`` the current max priority and a new write generation."""
        slots = as_long_tensor(slots, name="slots").reshape(-1)
        if not slots.numel():
            return
        self._ensure_trees()
        # checked wherever they are on the host (before or after the move), never on a device
        checked = slots.device.type == "cpu"
        if checked:
            self._check_slots(slots)
        slots = slots.to(self._device, non_blocking=True)
        if not checked and slots.device.type == "cpu":
            self._check_slots(slots)
        leaf = self._leaf(self._default_priority())
        if self._backend == "numba":
            self._extend_numba(slots, float(leaf))
        else:
            self._sum.update(slots, leaf)
            self._min.update(slots, leaf)
            if self._max is not None:
                # a new item has no priority set by update_priority yet
                self._max.update(slots, math.inf)
        self._clock += 1
        self._gen.index_fill_(0, slots, self._clock)

    def _check_slots(self, slots: torch.Tensor) -> None:
        """Raise ``IndexError`` unless every host slot lies in ``[0, max_capacity)``."""
        lo, hi = torch.aminmax(slots)
        if int(lo) < 0 or int(hi) >= self._capacity:
            raise IndexError(f"slots must lie in [0, {self._capacity}) (max_capacity), got "
                             f"values in [{int(lo)}, {int(hi)}].")

    def _extend_numba(self, slots: torch.Tensor, leaf: float) -> None:
        """The tree writes of :meth:`extend` on numba trees: the kernels directly, since the
        slots are already checked (the trees' own ``update`` would check them again)."""
        index = slots.contiguous().numpy()
        values = np.full(index.shape[0], leaf)
        offsets = self._sum._offsets
        _kernels.update_sum(self._sum._tree, offsets, index, values)
        _kernels.update_min(self._min._tree, offsets, index, values)
        if self._max is not None:
            # a new item has no priority set by update_priority yet
            values.fill(math.inf)
            _kernels.update_min(self._max._tree, offsets, index, values)

    def slot_generation(self, slots: Any) -> torch.Tensor:
        """Current write generation of ``slots`` (``0``: never written), on the tree device."""
        slots = as_long_tensor(slots, name="slots")
        self._ensure_trees()
        flat = slots.reshape(-1).to(self._device, non_blocking=True)
        return self._gen.index_select(0, flat).reshape(slots.shape)

    def item_info(self, slots: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{"write_generation": ...}`` of ``slots`` as they are now."""
        return {WRITE_GENERATION_KEY: self.slot_generation(slots)}

    def empty(self) -> None:
        """Forget every priority; the write clock keeps counting so old generations never match."""
        if self._sum is not None:
            clock = self._clock
            self._install(self._backend, self._device, None)
            self._clock = clock

    # ---- sampling ----------------------------------------------------------------------------
    def _uniform(self, batch_size: int) -> torch.Tensor:
        """``batch_size`` float64 draws in ``[0, 1)`` on the tree device, from ``self._rng``."""
        gen, device = self._rng, self._device
        if gen is None:
            return torch.rand(batch_size, dtype=torch.float64, device=device)
        if gen.device == device:
            return torch.rand(batch_size, dtype=torch.float64, device=device, generator=gen)
        u = torch.rand(batch_size, dtype=torch.float64, device=gen.device, generator=gen)
        return u.to(device, non_blocking=True)

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[str, Any]]:
        """Draw ``batch_size`` slots in proportion to their stored priority.

        Returns ``(index, info)``: ``index`` the int64 slots (on the tree device),
        ``info["priority_weight"]`` the importance weights ``(p_i / p_min) ** -beta`` (``dtype``)
        and ``info["write_generation"]`` the write generation of every drawn slot.
        """
        check_batch_size(batch_size)
        check_not_empty(storage)
        self._ensure_trees(storage)
        if self._device.type == "cpu" and not float(self._sum.total()) > 0.0:
            raise RuntimeError("no written slot has a priority: the sampler was not told about "
                               "the storage's items (extend the buffer through the sampler).")
        if self._backend == "numba":
            index, leaf, gen = self._draw_numba(batch_size)
            log_p_min = math.log(self._min.min())
        else:
            u = self._uniform(batch_size)
            if self.stratified:
                u = (torch.arange(batch_size, dtype=torch.float64, device=self._device) + u) \
                    / batch_size
            index = self._sum.scan_lower_bound(u * self._sum.total())
            leaf = self._sum.get(index)
            gen = self._gen.index_select(0, index)
            log_p_min = torch.log(self._min.min())
        # (p_i / p_min) ** -beta, in log space so that extreme ratios do not overflow
        weight = torch.exp((torch.log(leaf) - log_p_min) * -self._beta)
        return index, {PRIORITY_WEIGHT_KEY: weight.to(self._dtype), WRITE_GENERATION_KEY: gen}

    def _draw_numba(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Slots, stored priorities and generations of one draw, in one numba kernel call.

        The same draws and float64 operations as the torch path: both backends draw the same
        slots for the same generator state.
        """
        u = self._uniform(batch_size)
        index = torch.empty(batch_size, dtype=torch.long)
        leaf = torch.empty(batch_size, dtype=torch.float64)
        gen = torch.empty(batch_size, dtype=torch.long)
        _kernels.sample_kernel(self._sum._tree, self._sum._offsets, u.numpy(), self.stratified,
                               self._gen_np, index.numpy(), leaf.numpy(), gen.numpy())
        return index, leaf, gen

    # ---- priority updates --------------------------------------------------------------------
    def _prepare_priority(self, index: torch.Tensor, priority: Any) -> torch.Tensor:
        """Priorities as a flat float tensor matching the flat ``index`` (trailing dims reduced)."""
        priority = _as_priority_tensor(priority)
        n = index.numel()
        if priority.ndim == 0:
            return priority.reshape(1).expand(n)
        if priority.shape == index.shape:
            return priority.reshape(-1)
        if priority.ndim > index.ndim and priority.shape[: index.ndim] == index.shape:
            return priority.reshape(n, -1)  # reduced after the checks
        if priority.numel() == n:
            return priority.reshape(-1)
        raise ValueError(f"priority of shape {tuple(priority.shape)} does not match index of shape "
                         f"{tuple(index.shape)}: expected a scalar, the index shape, or the index "
                         "shape followed by trailing dims to reduce.")

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
            followed by trailing dims reduced with ``reduction``.
        storage : Storage, optional
            The buffer's storage (passed by the buffers): slots at or beyond ``len(storage)``
            are unwritten.
        write_generation : integer tensor, optional
            ``info["write_generation"]`` of the sample the priorities were computed for; with
            ``skip_stale_updates``, entries whose slot was rewritten since are skipped.

        Raises
        ------
        ValueError
            (``validate`` on) a priority is NaN, infinite or negative, or shapes do not match.
        IndexError
            (``validate`` on) an index is out of ``[0, max_capacity)`` or points at an
            unwritten slot.
        TypeError
            ``index`` or ``priority`` is not numeric.

        Nothing changes when an error is raised. Without ``validate`` (device trees), an update
        holding a bad priority changes nothing and bad indices are ignored, with no host sync.
        """
        index = as_long_tensor(index, name="index")
        flat_priority = self._prepare_priority(index, priority)
        token = None
        if write_generation is not None and self.skip_stale_updates:
            token = as_long_tensor(write_generation, name="write_generation")
            if token.numel() != index.numel():
                raise ValueError(f"write_generation of shape {tuple(token.shape)} does not match "
                                 f"index of shape {tuple(index.shape)}.")
            token = token.reshape(-1)
        index = index.reshape(-1)
        if not index.numel():
            return
        self._ensure_trees(storage)
        n_written = len(storage) if storage is not None else None
        if self._backend == "numba":
            self._update_numba(index, flat_priority, token, n_written)
            return
        if self.validate:
            self._check_update(index, flat_priority, n_written)
        self._update_masked(index, flat_priority, token, n_written)

    def check_priority(self, priority: Any) -> None:
        """Raise as :meth:`update_priority` would on these priority values, changing nothing.

        Buffers call it before writing rows whose priorities come with the data. Only checks
        when ``validate`` is on (device trees drop bad updates on the device instead).
        """
        priority = _as_priority_tensor(priority)
        if self._sum is None or self.validate:
            _check_priority_values(priority.to(_CPU, torch.float64))

    def _reduced(self, priority: torch.Tensor, n: int) -> torch.Tensor:
        return _reduce(priority, n, self.reduction) if priority.ndim > 1 else priority

    def _check_update(self, index: torch.Tensor, raw: torch.Tensor, n_written: int | None
                      ) -> None:
        """Raise ``ValueError`` / ``IndexError`` for bad priorities or indices (reads the host)."""
        _check_priority_values(raw.to(_CPU, torch.float64))
        index = index.to(_CPU)
        lo, hi = torch.aminmax(index)
        if int(lo) < -1 or int(hi) >= self._capacity:
            bad = index[(index < -1) | (index >= self._capacity)]
            raise IndexError(f"index must lie in [0, {self._capacity}) (max_capacity); got "
                             f"{bad[:5].tolist()}. Nothing was updated.")
        live = index >= 0
        slot_gen = self._gen.index_select(0, index.clamp_min(0).to(self._device)).to(_CPU)
        unwritten = live & (slot_gen == 0)
        if n_written is not None:
            unwritten |= live & (index >= n_written)
        if bool(unwritten.any()):
            raise IndexError(f"index points at unwritten slots {index[unwritten][:5].tolist()}"
                             f"{'' if n_written is None else f' (the storage holds {n_written})'}. "
                             "Nothing was updated.")

    def _update_numba(self, index: torch.Tensor, priority: torch.Tensor,
                      token: torch.Tensor | None, n_written: int | None) -> None:
        """:meth:`update_priority` on numba trees: checks and writes in one kernel call."""
        index = index.to(_CPU).contiguous()
        raw = priority.to(_CPU, torch.float64).contiguous()
        reduced = self._reduced(raw, index.numel())
        leaf = self._leaf(reduced)  # torch's pow, as on the torch path: identical trees
        tok = (token.to(_CPU).contiguous() if token is not None else index).numpy()
        max_nodes = self._max._tree if self._max is not None else self._min._tree
        code, _, top = _kernels.update_kernel(
            self._sum._tree, self._min._tree, max_nodes, self._max is not None, self._sum._offsets,
            self._capacity, self._capacity if n_written is None else n_written, self._gen_np,
            index.numpy(), raw.reshape(-1).numpy(), reduced.numpy(), leaf.numpy(), tok,
            token is not None)
        if code != _kernels.OK:
            self._check_update(index, raw, n_written)  # raises, with a detailed message
            raise AssertionError(f"update_kernel refused the update (code {code}) but the "
                                 "host check found nothing wrong")  # pragma: no cover
        if top > float(self._max_priority):
            self._max_priority.fill_(top)

    def _update_masked(self, index: torch.Tensor, priority: torch.Tensor,
                       token: torch.Tensor | None, n_written: int | None) -> None:
        """Update of torch trees with tensor masks only (no host sync on devices).

        An update holding a bad priority changes nothing; -1, out-of-range, unwritten and stale
        entries are sent to index -1, which the unchecked torch trees ignore.
        """
        dev = self._device
        index = index.to(dev, non_blocking=True)
        priority = priority.to(dev, torch.float64, non_blocking=True)
        ok = ((priority >= 0) & (priority < math.inf)).all()  # NaN fails both
        priority = self._reduced(priority, index.numel())
        in_range = (index >= 0) & (index < self._capacity)
        slot_gen = self._gen.index_select(0, index.clamp(0, self._capacity - 1))
        keep = in_range & (slot_gen > 0) & ok
        if n_written is not None:
            keep &= index < n_written
        if token is not None:
            keep &= slot_gen == token.to(dev, non_blocking=True)
        target = torch.where(keep, index, -1)  # -1: ignored by the unchecked torch trees
        leaf = self._leaf(torch.where(keep, priority, 1.0))
        self._sum.update(target, leaf)
        self._min.update(target, leaf)
        if self._max is not None:
            self._max.update(target, -priority)
        top = torch.where(keep, priority, -math.inf).max()
        self._max_priority = torch.maximum(self._max_priority, top)

    # ---- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Priorities, generations, max priority, ``alpha``/``beta``/``eps`` (host tensors)."""
        state = self._export()
        return {
            "max_capacity": self._capacity,
            "alpha": self._alpha,
            "beta": self._beta,
            "eps": self._eps,
            "priorities": state["priorities"],
            "set_priorities": state["set_priorities"] if self._within_buffer else None,
            "max_priority": state["max_priority"],
            "write_generation": state["write_generation"],
            "write_clock": self._clock,
        }

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Raise ``ValueError`` unless ``state_dict`` can be loaded into this sampler."""
        if not isinstance(state_dict, dict) or set(state_dict) != _STATE_KEYS:
            got = sorted(state_dict) if isinstance(state_dict, dict) else type(state_dict).__name__
            raise ValueError(f"{type(self).__name__} state_dict must have the keys "
                             f"{sorted(_STATE_KEYS)}, got {got}.")
        cap = state_dict["max_capacity"]
        if cap != self._capacity:
            raise ValueError(f"state_dict is for max_capacity={cap}, this sampler has "
                             f"max_capacity={self._capacity}.")
        for key in ("alpha", "beta", "eps"):
            _check_real(state_dict[key], f"state_dict[{key!r}]")
        leaves = state_dict["priorities"]
        if not isinstance(leaves, torch.Tensor) or leaves.shape != (cap,) \
                or leaves.dtype is not torch.float64:
            raise ValueError(f"state_dict['priorities'] must be a float64 tensor of shape "
                             f"({cap},).")
        if not bool(((leaves >= 0) & (leaves < math.inf)).all()):
            raise ValueError("state_dict['priorities'] holds NaN, infinite or negative values.")
        gen = state_dict["write_generation"]
        if not isinstance(gen, torch.Tensor) or gen.shape != (cap,) or gen.dtype is not torch.long:
            raise ValueError(f"state_dict['write_generation'] must be an int64 tensor of shape "
                             f"({cap},).")
        clock = state_dict["write_clock"]
        if isinstance(clock, bool) or not isinstance(clock, int) or clock < 0 \
                or (gen.numel() and int(gen.max()) > clock) or int(gen.min()) < 0:
            raise ValueError("state_dict['write_clock'] must be an int >= every write generation.")
        if bool(((leaves > 0) != (gen > 0)).any()):
            raise ValueError("state_dict['priorities'] and ['write_generation'] disagree on which "
                             "slots are written.")
        max_priority = state_dict["max_priority"]
        if not isinstance(max_priority, float) or math.isnan(max_priority) \
                or max_priority == math.inf:
            raise ValueError(f"state_dict['max_priority'] must be a float, got {max_priority!r}.")
        set_priorities = state_dict["set_priorities"]
        if self._within_buffer:
            if not isinstance(set_priorities, torch.Tensor) or set_priorities.shape != (cap,) \
                    or set_priorities.dtype is not torch.float64:
                raise ValueError("this sampler tracks the max priority within the buffer but "
                                 "state_dict['set_priorities'] is not a float64 tensor of shape "
                                 f"({cap},).")
        elif set_priorities is not None:
            raise ValueError("state_dict comes from a sampler with max_priority_within_buffer=True "
                             "but this one has max_priority_within_buffer=False.")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output; checks everything before changing anything."""
        self.check_state_dict(state_dict)
        self._apply_state(state_dict)

    def _apply_state(self, state_dict: dict[str, Any]) -> None:
        """Install a state that :meth:`check_state_dict` accepted (not checked again)."""
        if self._sum is None:
            backend, device = self._target(None)
        else:
            backend, device = self._backend, self._device
        cap = self._capacity
        state = {
            "priorities": state_dict["priorities"],
            "set_priorities": (state_dict["set_priorities"] if self._within_buffer
                               else torch.full((cap,), -math.inf, dtype=torch.float64)),
            "write_generation": state_dict["write_generation"],
            "max_priority": state_dict["max_priority"],
        }
        self._install(backend, device, state)
        self._clock = state_dict["write_clock"]
        self._alpha = float(state_dict["alpha"])
        self._beta = float(state_dict["beta"])
        self._eps = float(state_dict["eps"])

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(max_capacity={self._capacity}, alpha={self._alpha}, "
                f"beta={self._beta}, eps={self._eps}, reduction={self.reduction!r}, "
                f"backend={self._backend}, device={self._device})")
