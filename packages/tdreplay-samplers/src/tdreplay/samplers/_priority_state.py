"""The priority state of a prioritized sampler, as plain data, and its host form.

:class:`PriorityState` holds everything a prioritized sampler knows about its slots: the sum
and min trees of the stored priorities, the optional max tree, the write generation of every
slot and the largest priority ever set. It has no behaviour of its own: the kernels
(:mod:`._priority_kernels`) read and change it, and :class:`~.prioritized.PrioritizedSampler`
composes the two. A state lives on one backend and device; :func:`export_state` copies it to the
host (what ``state_dict`` saves and what :func:`new_state` rebuilds from, on any backend).
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np
import torch

from tdreplay.core.utils import restore_attributes

from ._priority_values import TINY, check_real, leaf_limit, leaf_values
from .segment_trees import (
    MinOverSumTree,
    MinTree,
    SumTree,
    make_min_over_sum,
    make_min_tree,
    make_sum_tree,
)
from .segment_trees._memory import host_array

__all__ = ["GENERATION_PERIOD", "STATE_KEYS", "HostState", "PriorityState", "check_state_dict",
           "default_priority", "empty_host_state", "export_state", "generation_of", "grown",
           "host_from_state_dict", "new_item_leaf", "new_state", "padded", "placement",
           "realphaed", "settle", "to_state_dict"]

_CPU = torch.device("cpu")

#: Write generations are stored as int32: the clock's value wraps around to ``1`` after this
#: many ticks (``0`` stays "never written"). A stale update is then missed only for a slot
#: rewritten a multiple of 2**31 - 1 writes after it was sampled.
GENERATION_PERIOD = 2**31 - 1

#: Keys of a prioritized sampler's ``state_dict``.
STATE_KEYS = frozenset({"max_capacity", "alpha", "beta", "eps", "priorities", "set_priorities",
                        "max_priority", "write_generation", "write_clock"})


class HostState(TypedDict):
    """The per-slot state on the host: what :func:`export_state` returns."""

    priorities: torch.Tensor  # float64 [capacity]: stored priorities, 0 where unwritten
    set_priorities: torch.Tensor  # float64 [capacity]: priorities set by updates, -inf if none
    write_generation: torch.Tensor  # int64 [capacity]: 0 where never written
    max_priority: float  # largest priority ever set (-inf before the first update)


@dataclass
class PriorityState:
    """Per-slot priority state on one backend and device (plain data; see the module docstring).

    ``sum_tree`` holds the stored priorities ``p_i`` (``0`` where unwritten; written slots
    hold ``p_i >= tiny > 0``); ``min_tree`` their minimum over the written slots, without a
    copy of the leaves (a :class:`~.segment_trees.MinOverSumTree` of ``sum_tree``: ``~1.2``
    bytes per slot instead of ``~9.6``; every change to the sum tree's leaves is followed by
    ``min_tree.refresh`` of the same slots); ``max_tree`` (``max_priority_within_buffer``
    only) is a min tree of ``-q_i`` over the priorities ``q_i`` set by updates;
    ``generation`` the write generation of every slot on ``device`` (``host_generation``: its
    numpy view for the numba kernels, ``None`` on devices); ``max_priority`` a 0-d float64
    tensor on ``device``.

    Examples
    --------
    >>> state = new_state(4, "numba", torch.device("cpu"), within_buffer=False)
    >>> state.capacity, state.backend, float(state.sum_tree.total()), state.max_tree is None
    (4, 'numba', 0.0, True)
    """

    backend: str
    device: torch.device
    sum_tree: SumTree
    min_tree: MinOverSumTree
    max_tree: MinTree | None
    generation: torch.Tensor
    host_generation: np.ndarray | None
    max_priority: torch.Tensor

    @property
    def capacity(self) -> int:
        """Number of slots."""
        return self.sum_tree.capacity

    def __setstate__(self, state: dict[str, Any]) -> None:
        # a state pickled before the min tree read the sum tree's leaves holds a full MinTree
        # of the same values: rebuild the minimum from the sum tree instead
        restore_attributes(self, state)
        if not isinstance(self.min_tree, MinOverSumTree):
            self.min_tree = make_min_over_sum(self.sum_tree)
        if self.host_generation is not None:
            # pickle and deepcopy copy the tensor and its numpy view apart: the kernels would
            # advance a copy that samples and state_dict never read. One memory again.
            self.host_generation = self.generation.numpy()


def empty_host_state(capacity: int) -> HostState:
    """The host state of ``capacity`` slots never written."""
    return {"priorities": torch.zeros(capacity, dtype=torch.float64),
            "set_priorities": torch.full((capacity,), -math.inf, dtype=torch.float64),
            "write_generation": torch.zeros(capacity, dtype=torch.long),
            "max_priority": -math.inf}


def new_state(capacity: int, backend: str, device: torch.device, *, within_buffer: bool,
              host: HostState | None = None) -> PriorityState:
    """A state of ``capacity`` slots on ``backend`` / ``device``: empty, or a copy of ``host``."""
    kw: dict[str, Any] = {"backend": backend, "device": device}
    if backend == "torch":
        kw["validate"] = False  # the sampler checks inputs itself, without syncing devices
    sum_tree = make_sum_tree(capacity, **kw)
    max_tree = make_min_tree(capacity, **kw) if within_buffer else None
    # on huge pages (host_array; torch does not ask for them): the kernels read the
    # generations of random slots. int32: 4 bytes per slot (see GENERATION_PERIOD)
    gen = torch.from_numpy(host_array(capacity, np.int32))
    max_priority = -math.inf
    if host is not None:
        leaves = host["priorities"]
        sum_tree.load_state_dict({"capacity": capacity, "values": leaves})
        if max_tree is not None:
            max_tree.load_state_dict({"capacity": capacity, "values": -host["set_priorities"]})
        # a copy (the caller's state stays its own), wrapped as the clock wraps (a state saved
        # with int64 generations beyond the period)
        gen.copy_(generation_of(host["write_generation"]))
        max_priority = host["max_priority"]
    gen = gen.to(device)
    min_tree = make_min_over_sum(sum_tree)  # built from the leaves just loaded
    return PriorityState(
        backend=backend, device=device, sum_tree=sum_tree, min_tree=min_tree, max_tree=max_tree,
        generation=gen, host_generation=gen.numpy() if backend == "numba" else None,
        max_priority=torch.tensor(max_priority, dtype=torch.float64, device=device))


def export_state(state: PriorityState) -> HostState:
    """A host copy of ``state`` (what :func:`new_state` takes)."""
    set_priorities = (-state.max_tree.state_dict()["values"] if state.max_tree is not None
                      else torch.full((state.capacity,), -math.inf, dtype=torch.float64))
    return {"priorities": state.sum_tree.state_dict()["values"],
            "set_priorities": set_priorities,
            "write_generation": state.generation.to(_CPU, torch.long),
            "max_priority": float(state.max_priority)}


def generation_of(clock: Any) -> Any:
    """The stored write generation of a clock value (int or integer tensor): the clock wrapped
    into ``[1, GENERATION_PERIOD]``, ``0`` (never written) kept.

    Examples
    --------
    >>> generation_of(5), generation_of(GENERATION_PERIOD + 1)
    (5, 1)
    >>> generation_of(torch.tensor([0, 3, 2**40])).tolist()
    [0, 3, 512]
    """
    if isinstance(clock, torch.Tensor):
        return torch.where(clock > 0, (clock - 1) % GENERATION_PERIOD + 1, 0)
    return (clock - 1) % GENERATION_PERIOD + 1 if clock > 0 else 0


def padded(host: HostState, capacity: int) -> HostState:
    """``host`` with unwritten slots appended up to ``capacity`` (itself if it has as many).

    Examples
    --------
    >>> host = padded(empty_host_state(2), 3)
    >>> host["priorities"].shape, host["write_generation"].tolist()
    (torch.Size([3]), [0, 0, 0])
    """
    extra = capacity - host["priorities"].shape[0]
    if extra <= 0:
        return host
    pad = empty_host_state(extra)
    return {"priorities": torch.cat([host["priorities"], pad["priorities"]]),
            "set_priorities": torch.cat([host["set_priorities"], pad["set_priorities"]]),
            "write_generation": torch.cat([host["write_generation"], pad["write_generation"]]),
            "max_priority": host["max_priority"]}


def realphaed(state: PriorityState, old_alpha: float, new_alpha: float, eps: float, *,
              within_buffer: bool) -> PriorityState:
    """``state`` with its stored priorities ``(q + eps) ** old_alpha`` rewritten as
    ``(q + eps) ** new_alpha`` (TorchRL's ``alpha`` setter): a new state on the same backend and
    device, or ``state`` itself when nothing is written or the exponent is unchanged. One pass
    over the slots; the raw priorities (the max priority, the max tree) do not depend on alpha.

    Each slot gets what a fresh write of its priority at ``new_alpha`` would store
    (:func:`~._priority_values.leaf_values`), its ``q + eps`` read back from the stored value
    by :func:`_base_of_leaves`.

    With ``old_alpha == 0`` every written slot stores ``1`` and the priorities cannot be
    recovered: the state is kept (sampling stays uniform over those slots until their
    priorities are set again) and a ``UserWarning`` says so, as TorchRL's.

    Examples
    --------
    >>> state = new_state(3, "torch", torch.device("cpu"), within_buffer=False)
    >>> state.sum_tree[torch.tensor([0, 1])] = torch.tensor([2.0, 4.0], dtype=torch.float64)
    >>> state.min_tree.refresh(torch.tensor([0, 1]))
    >>> squared = realphaed(state, 1.0, 2.0, 0.0, within_buffer=False)
    >>> float(squared.sum_tree.total()), float(squared.min_tree.min())  # 2**2 + 4**2, 2**2
    (20.0, 4.0)
    """
    if old_alpha == new_alpha:
        return state
    host = export_state(state)
    leaves = host["priorities"]
    written = leaves > 0
    if not bool(written.any()):
        return state
    if old_alpha == 0:
        warnings.warn(
            "Changing alpha away from 0 on a prioritized sampler that holds priorities: with "
            "alpha == 0 every written slot stores 1, so their priorities cannot be recovered. "
            "Sampling stays uniform over those slots until their priorities are updated.",
            stacklevel=3)
        return state
    base = _base_of_leaves(leaves[written], old_alpha)
    rewritten = leaf_values(base - eps, new_alpha, eps)
    limit = leaf_limit(state.capacity)
    # (one pass in the common case: a scheduler changes alpha at every step)
    over = base[~(rewritten <= limit) & (leaves[written] < limit)] \
        if not float(rewritten.max()) <= limit else base[:0]
    if over.numel():  # (a leaf at the limit already was lowered to it)
        warnings.warn(f"alpha={new_alpha} raises priorities {over[:5].tolist()} (plus eps) past "
                      f"{limit:.4g}, the largest that {state.capacity} slots can sum in "
                      "float64: they are stored at that limit (and do not come back if alpha "
                      "is lowered again).", stacklevel=4)
    rewritten.clamp_max_(limit)
    host["priorities"] = leaves.masked_scatter(written, rewritten)
    return new_state(state.capacity, state.backend, state.device, within_buffer=within_buffer,
                     host=host)


def _base_of_leaves(leaves: torch.Tensor, alpha: float) -> torch.Tensor:
    """``q + eps`` of written slots from their stored ``max((q + eps) ** alpha, tiny)``
    (``alpha > 0``).

    A leaf at the clamp ``tiny`` stands for ``q + eps == 0`` (a zero priority with
    ``eps == 0``): it gives ``0``, not ``tiny ** (1 / alpha)``, so it is rewritten as a fresh
    write of that zero would be. A nonzero ``q + eps`` whose power fell below ``tiny`` (or a
    leaf at the upper limit :func:`~._priority_values.leaf_limit`) cannot be told apart: the
    stored values do not keep it.

    Examples
    --------
    >>> tiny = float(np.finfo(np.float64).tiny)
    >>> _base_of_leaves(torch.tensor([tiny, 4.0], dtype=torch.float64), 2.0).tolist()
    [0.0, 2.0]
    """
    return torch.where(leaves > TINY, leaves.pow(1.0 / alpha), 0.0)


def grown(state: PriorityState, bounds: tuple[int, int] | None, *,
          within_buffer: bool) -> PriorityState:
    """``state``, or a copy with more slots (at least twice as many) when written host slots of
    ``bounds`` (their ``(least, largest)``, :func:`~._priority_values.host_bounds`) go beyond
    its capacity: a storage larger than ``max_capacity`` (TorchRL's C++ trees round the
    capacity up to a power of two and write past it; here the trees grow, keeping every
    priority). Slots on a device are not read (no host sync; ``bounds`` is ``None``): they
    never grow the state.

    Examples
    --------
    >>> state = new_state(4, "torch", torch.device("cpu"), within_buffer=False)
    >>> grown(state, (0, 5), within_buffer=False).capacity
    8
    >>> grown(state, (3, 3), within_buffer=False) is state
    True
    """
    if bounds is None:
        return state
    low, high = bounds
    needed = high + 1
    if needed <= state.capacity or low < 0:  # negative slots: refused by the caller
        return state
    capacity = max(needed, 2 * state.capacity)
    host = padded(export_state(state), capacity)
    limit = leaf_limit(capacity)
    over = host["priorities"] > limit
    if bool(over.any()):  # (more slots, a lower limit: their sum must stay finite)
        warnings.warn(f"the priority trees grew to {capacity} slots, whose stored priorities "
                      f"must stay <= {limit:.4g} to sum in float64: slots "
                      f"{over.nonzero().reshape(-1)[:5].tolist()} were lowered to it.",
                      stacklevel=4)
        host["priorities"] = host["priorities"].clamp_max(limit)
    return new_state(capacity, state.backend, state.device, within_buffer=within_buffer,
                     host=host)


def check_state_dict(state_dict: Any, within_buffer: bool, owner: str) -> None:
    """Raise ``ValueError`` unless ``state_dict`` is a prioritized sampler state that a sampler
    ``owner`` (tracking the max within the buffer or not) can load. A state of another
    ``max_capacity`` loads too: the sampler takes the larger of the two (no slot is lost)."""
    if not isinstance(state_dict, dict) or set(state_dict) != STATE_KEYS:
        got = sorted(state_dict) if isinstance(state_dict, dict) else type(state_dict).__name__
        raise ValueError(f"{owner} state_dict must have the keys {sorted(STATE_KEYS)}, got "
                         f"{got}.")
    cap = state_dict["max_capacity"]
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ValueError(f"state_dict['max_capacity'] must be an int >= 1, got {cap!r}.")
    for key in ("alpha", "beta", "eps"):
        check_real(state_dict[key], f"state_dict[{key!r}]")
    leaves = state_dict["priorities"]
    if not isinstance(leaves, torch.Tensor) or leaves.shape != (cap,) \
            or leaves.dtype is not torch.float64:
        raise ValueError(f"state_dict['priorities'] must be a float64 tensor of shape ({cap},).")
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
            or max_priority == math.inf or -math.inf < max_priority < 0:
        raise ValueError(f"state_dict['max_priority'] must be a float >= 0 (-inf before the "
                         f"first priority is set), got {max_priority!r}.")
    set_priorities = state_dict["set_priorities"]
    if within_buffer:
        if not isinstance(set_priorities, torch.Tensor) or set_priorities.shape != (cap,) \
                or set_priorities.dtype is not torch.float64:
            raise ValueError("this sampler tracks the max priority within the buffer but "
                             "state_dict['set_priorities'] is not a float64 tensor of shape "
                             f"({cap},).")
        # a raw priority set (>= 0, finite) or -inf where none was
        if not bool(((set_priorities == -math.inf)
                     | ((set_priorities >= 0) & (set_priorities < math.inf))).all()):
            raise ValueError("state_dict['set_priorities'] holds NaN, infinite or negative "
                             "values (a priority set is finite and >= 0; -inf: none).")
    elif set_priorities is not None:
        raise ValueError("state_dict comes from a sampler with max_priority_within_buffer=True "
                         "but this one has max_priority_within_buffer=False.")


def default_priority(state: PriorityState) -> torch.Tensor:
    """Priority of new items (0-d float64 tensor on the state's device): the max priority set
    (in the buffer, with a max tree), ``1`` before any."""
    return _or_one(torch.as_tensor(_max_set(state), dtype=torch.float64, device=state.device))


def _max_set(state: PriorityState) -> float | torch.Tensor:
    """The largest priority set so far (``-inf``: none), by the max tree (the max within the
    buffer) or the running max: a float from numba trees, a 0-d tensor otherwise."""
    return -state.max_tree.min() if state.max_tree is not None else state.max_priority


def _or_one(current: torch.Tensor) -> torch.Tensor:
    """``current`` (0-d float64), or ``1`` where no priority was set (``-inf``)."""
    return torch.where(current > -math.inf, current, 1.0)


def new_item_leaf(state: PriorityState, alpha: float, eps: float) -> float | torch.Tensor:
    """Stored value (leaf) of a new item: :func:`~._priority_values.leaf_values` of
    :func:`default_priority`, at most :func:`~._priority_values.leaf_limit` (an alpha raised
    since may overflow the max priority).

    Numba trees get a float, computed once per max priority, alpha, eps and capacity (the last
    16 are kept, :func:`_host_leaf`): the five 0-d tensor operations cost a buffer's ``extend``
    30-40 us in its write path, and the max priority seldom changes between writes.
    Torch trees get a 0-d float64 tensor (on a device: no host sync).

    Examples
    --------
    >>> state = new_state(4, "numba", torch.device("cpu"), within_buffer=False)
    >>> new_item_leaf(state, 0.5, 0.0)  # no priority set yet: 1 ** 0.5
    1.0
    """
    if state.backend == "numba":
        return _host_leaf(float(_max_set(state)), alpha, eps, state.capacity)
    return leaf_values(default_priority(state), alpha, eps).clamp_max_(leaf_limit(state.capacity))


@functools.lru_cache(maxsize=16)
def _host_leaf(current: float, alpha: float, eps: float, capacity: int) -> float:
    """:func:`new_item_leaf` of a host state whose max priority is ``current`` (``-inf``: none
    set), computed with the same torch operations as the torch trees' (torch's ``pow`` rounds
    some exponents otherwise than the C library's: ``x * x * x`` for ``3``)."""
    priority = _or_one(torch.tensor(current, dtype=torch.float64))
    return float(leaf_values(priority, alpha, eps).clamp_max_(leaf_limit(capacity)))


def to_state_dict(host: HostState, *, alpha: float, beta: float, eps: float,
                  within_buffer: bool, clock: int) -> dict[str, Any]:
    """A sampler's ``state_dict`` (keys :data:`STATE_KEYS`) from its host state and settings."""
    return {
        "max_capacity": host["priorities"].shape[0],
        "alpha": alpha,
        "beta": beta,
        "eps": eps,
        "priorities": host["priorities"],
        "set_priorities": host["set_priorities"] if within_buffer else None,
        "max_priority": host["max_priority"],
        "write_generation": host["write_generation"],
        "write_clock": clock,
    }


def host_from_state_dict(state_dict: dict[str, Any], within_buffer: bool) -> HostState:
    """The host state of a ``state_dict`` that :func:`check_state_dict` accepted."""
    cap = state_dict["max_capacity"]
    return {
        "priorities": state_dict["priorities"],
        "set_priorities": (state_dict["set_priorities"] if within_buffer
                           else torch.full((cap,), -math.inf, dtype=torch.float64)),
        "write_generation": state_dict["write_generation"],
        "max_priority": state_dict["max_priority"],
    }


def placement(backend: str | None, device: torch.device | None) -> tuple[str, torch.device]:
    """``(backend, device)`` of a state asked for ``backend`` on ``device`` (``None``: CPU):
    numba on CPU and torch elsewhere unless ``backend`` says; numba states live on CPU.

    Examples
    --------
    >>> placement(None, None), placement("torch", None)
    (('numba', device(type='cpu')), ('torch', device(type='cpu')))
    """
    device = device or _CPU
    backend = backend or ("numba" if device.type == "cpu" else "torch")
    return backend, (_CPU if backend == "numba" else device)


def settle(state: PriorityState | None, capacity: int, backend: str, device: torch.device, *,
           within_buffer: bool) -> PriorityState:
    """``state`` on ``backend`` / ``device``: itself when it is there already, else a copy
    moved there (a new empty state when ``state`` is ``None``)."""
    if state is not None and (backend, device) == (state.backend, state.device):
        return state
    host = export_state(state) if state is not None else None
    return new_state(capacity, backend, device, within_buffer=within_buffer, host=host)
