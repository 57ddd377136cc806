"""``PromptGroupSampler``: batches made of whole groups of items sharing a key (TorchRL's
``torchrl.data.replay_buffers.samplers.llm.PromptGroupSampler``), for group-relative objectives
(GRPO) and their replay-enhanced variant (RePO, Li et al. 2025).

The group index (group value -> slots) is built from the stored ``group_key`` entries the first
time the sampler samples and kept until the sampler is told of a write (``extend``, ``add``,
``mark_update``), the storage is another storage or its
:attr:`~tdreplay.core.Storage.revision` moved (a write through any buffer sharing the storage,
an in-place edit, a loaded state). ``cache_groups=False`` rebuilds it at every sample (for
group values edited in the stored tensors behind the storage's back).
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from typing import Any

import numpy as np
import torch
from tensordict import is_tensor_collection

from tdreplay.core import Sampler, Storage
from tdreplay.core.utils import (
    as_long_tensor,
    check_batch_size,
    check_flag,
    check_not_empty,
    check_whole_numbers,
    is_int,
)

from ._list_items import first_unreadable_item

__all__ = ["PromptGroupSampler"]

_STRATEGIES = ("random", "recency", "reward", "variance")
_RECENCY_KEYS = {"position_recency", "recency_clock"}


def _check_key(value: Any, name: str) -> Any:
    """``value`` if it is a nested key (a str, or a non-empty tuple of str), else
    ``TypeError`` naming ``name``."""
    if isinstance(value, str) or (isinstance(value, tuple) and value
                                  and all(isinstance(k, str) for k in value)):
        return value
    raise TypeError(f"{name} must be a str or a non-empty tuple of str (a nested key), got "
                    f"{type(value).__name__} ({value!r}).")


def _check_group_values(values: Any, group_key: Any) -> None:
    """``ValueError`` naming ``group_key`` for floating group values that are not whole
    numbers (NaN never equals itself, so NaN items would each form a group of their own);
    ``TypeError`` for complex ones."""
    if isinstance(values, torch.Tensor):
        check_whole_numbers(values, f"group_key {group_key!r}",
                            "group ids (or strings, or token-id tensors)")


def _list_item_problem(storage: Storage, key: Any) -> str:
    """Which item of a ``ListStorage`` holds no TensorDict, or no ``key`` entry (``""``: none,
    or another storage; see :func:`~._list_items.first_unreadable_item`).

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> from tdreplay.core import ListStorage
    >>> storage = ListStorage(3)
    >>> storage.set([0, 1], [TensorDict({"prompt": torch.tensor(0)}), TensorDict()])
    >>> _list_item_problem(storage, "prompt")
    " (the item at slot 1 has no 'prompt' entry)"
    """
    found = first_unreadable_item(storage, [key])
    if found is None:
        return ""
    slot, missing, kind = found
    if missing is None:
        return f" (the item at slot {slot} is of type {kind}, not a TensorDict)"
    return f" (the item at slot {slot} has no {key!r} entry)"


def _hashable(values: Any) -> list[Any]:
    """One hashable group value per item (lists, e.g. token ids, become tuples)."""
    tolist = isinstance(values, torch.Tensor) or is_tensor_collection(values)
    items = values.tolist() if tolist else list(values)
    return [tuple(v) if isinstance(v, list) else v for v in items]


def max_variance_subset(rewards: torch.Tensor, k: int) -> torch.Tensor:
    """Positions (into ``rewards``) of the ``k`` items whose rewards have the largest variance,
    ties broken by the largest total reward (RePO's choice).

    Such a subset is made of some of the lowest and some of the highest rewards, so the
    ``k + 1`` splits are compared in closed form from prefix sums.

    Examples
    --------
    >>> sorted(max_variance_subset(torch.tensor([2.0, -7.0, 10.0, 1.0]), 3).tolist())
    [0, 1, 2]
    """
    values, order = torch.sort(rewards.double())
    n = values.numel()
    zero = values.new_zeros(1)
    prefix = torch.cat([zero, values.cumsum(0)])
    prefix_sq = torch.cat([zero, values.square().cumsum(0)])
    low = torch.arange(k + 1)
    high = k - low
    totals = prefix[low] + prefix[n] - prefix[n - high]
    variances = (prefix_sq[low] + prefix_sq[n] - prefix_sq[n - high]) / k - (totals / k).square()
    best = torch.isclose(variances, variances.max(), rtol=1e-12, atol=1e-12)
    num_low = int(torch.where(best, totals, totals.new_full((), -torch.inf)).argmax())
    rank = torch.arange(n)
    return order[(rank < num_low) | (rank >= n - (k - num_low))]


class PromptGroupSampler(Sampler):
    """Draws ``samples_per_group`` items from each of ``num_groups`` groups of items sharing the
    value of ``group_key`` (e.g. the prompt), so a batch is laid out group after group.

    Parameters (keyword only)
    -------------------------
    num_groups, samples_per_group : int
        Exactly one of them; the other is ``batch_size`` divided by it (``ValueError`` when
        ``batch_size`` is not a multiple).
    group_key : NestedKey
        Entry holding each item's group (integers, strings, or tensors of token ids; strings
        need a storage of objects, ``LazyStackStorage`` or ``ListStorage``: a tensor storage
        refuses them).
        Defaults to ``"query"``.
    strategy : {"random", "recency", "reward", "variance"}
        Which items of a group: uniformly at random; the most recently written; the highest
        reward; the subset of largest reward variance (ties: largest total reward). Groups are
        always chosen uniformly at random, without replacement.
    reward_key : NestedKey
        Numeric reward (averaged over trailing dims) of the ``"reward"`` and ``"variance"``
        strategies. Defaults to ``("next", "reward")``.
    cache_groups : bool
        Keep the group index between samples (see the module docstring). Defaults to True.

    A group smaller than ``samples_per_group`` (or fewer groups than ``num_groups``) is completed
    by drawing with replacement, with a warning (once). The storage must be one-dimensional
    (``NotImplementedError`` otherwise) and its items must collate into a tensor collection
    (``TypeError`` otherwise): tensor and memmap storages, ``LazyStackStorage``, and a
    ``ListStorage`` of TensorDicts (TorchRL refuses any ``ListStorage``).

    The state (:meth:`state_dict`) is the write order the ``"recency"`` strategy uses; the
    group index is derived data, rebuilt after loading or unpickling.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> from tdreplay.core import ReplayBuffer
    >>> from tdreplay.storages import LazyStackStorage
    >>> rb = ReplayBuffer(storage=LazyStackStorage(100),
    ...                   sampler=PromptGroupSampler(num_groups=2, group_key="prompt"),
    ...                   batch_size=8)
    >>> _ = rb.extend(TensorDict({"prompt": torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]),
    ...                           "reward": torch.arange(12.0)}, batch_size=[12]))
    >>> sample = rb.sample()
    >>> sample.shape, sample["prompt"].unique(return_counts=True)[1].tolist()
    (torch.Size([8]), [4, 4])
    """

    def __init__(self, *, num_groups: int | None = None, samples_per_group: int | None = None,
                 group_key: Any = "query", strategy: str = "random",
                 reward_key: Any = ("next", "reward"), cache_groups: bool = True) -> None:
        if (num_groups is None) == (samples_per_group is None):
            raise TypeError("Exactly one of num_groups or samples_per_group must be provided, "
                            f"got num_groups={num_groups} and "
                            f"samples_per_group={samples_per_group}.")
        name = "num_groups" if num_groups is not None else "samples_per_group"
        value = num_groups if num_groups is not None else samples_per_group
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be a positive integer, got {value!r}.")
        if value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if strategy not in _STRATEGIES:
            raise ValueError(f"Unknown strategy={strategy!r}. Expected one of 'random', "
                             "'recency', 'reward', 'variance'.")
        cache_groups = check_flag(cache_groups, "cache_groups")
        self.num_groups = int(num_groups) if num_groups is not None else None
        self.samples_per_group = int(samples_per_group) if samples_per_group is not None \
            else None
        self.group_key = _check_key(group_key, "group_key")
        self.strategy = strategy
        if strategy in ("reward", "variance") or reward_key is not None:
            reward_key = _check_key(reward_key, "reward_key")
        self.reward_key = reward_key
        self.cache_groups = cache_groups
        self._groups: dict[Any, torch.Tensor] | None = None   # derived: group -> slots
        self._rewards: torch.Tensor | None = None              # derived: one per slot
        self._indexed: tuple[int, int, int] | None = None      # (id, len, revision) indexed
        self._recency: torch.Tensor | None = None               # state: write clock per slot
        self._clock = 0
        self._warned = False

    # ---- shape of a batch --------------------------------------------------------------------
    def batch_shape(self, batch_size: int) -> tuple[int, int]:
        """``(num_groups, samples_per_group)`` of a batch of ``batch_size`` items.

        Examples
        --------
        >>> PromptGroupSampler(num_groups=2).batch_shape(8)
        (2, 4)
        """
        check_batch_size(batch_size)
        per = self.num_groups if self.num_groups is not None else self.samples_per_group
        assert per is not None  # exactly one is set
        if batch_size % per:
            name = "num_groups" if self.num_groups is not None else "samples_per_group"
            raise ValueError(f"batch_size={batch_size} is not divisible by {name}={per}.")
        other = batch_size // per
        return (per, other) if self.num_groups is not None else (other, per)

    # ---- the group index ---------------------------------------------------------------------
    def _invalidate(self) -> None:
        self._groups, self._rewards, self._indexed = None, None, None

    def _build_index(self, storage: Storage) -> dict[Any, torch.Tensor]:
        length = len(storage)
        key = (id(storage), length, storage.revision)
        if self.cache_groups and self._groups is not None and self._indexed == key:
            return self._groups
        data = storage.default_collate(storage[:])
        if not is_tensor_collection(data):
            raise TypeError(f"{type(self).__name__} requires a single-dimensional storage "
                            "whose items collate into a tensor collection (LazyTensorStorage, "
                            "LazyMemmapStorage, LazyStackStorage, a ListStorage of "
                            f"TensorDicts); this storage ({type(storage).__name__}) gives "
                            f"{type(data).__name__}"
                            f"{_list_item_problem(storage, self.group_key)}. Plain ListStorage "
                            "is not supported (a ListStorage must hold TensorDicts).")
        values = data.get(self.group_key, None)
        if values is None:
            raise KeyError(f"{type(self).__name__}: the stored items have no group_key "
                           f"{self.group_key!r} entry"
                           f"{_list_item_problem(storage, self.group_key)}; write data holding "
                           "each item's group under it, or pass the group_key it is stored "
                           "under.")
        _check_group_values(values, self.group_key)
        groups = _hashable(values)
        if len(groups) != length:
            raise RuntimeError(f"Expected group_key={self.group_key!r} to contain one value per "
                               f"storage item, got {len(groups)} values for {length} items.")
        positions: dict[Any, list[int]] = defaultdict(list)
        for slot, group in enumerate(groups):
            positions[group].append(slot)
        index = {g: torch.tensor(p, dtype=torch.long) for g, p in positions.items()}
        rewards = None
        if self.strategy in ("reward", "variance"):
            reward = data.get(self.reward_key)
            if not isinstance(reward, torch.Tensor):
                raise TypeError(f"The {self.strategy!r} strategy requires reward_key="
                                f"{self.reward_key} to hold a tensor, got {type(reward)}.")
            rewards = reward.reshape(reward.shape[0], -1).float().mean(-1).cpu()
        if self.strategy == "recency":
            self._fill_recency(length)
        self._groups, self._rewards, self._indexed = index, rewards, key
        return index

    # ---- recency -----------------------------------------------------------------------------
    def _grow_recency(self, size: int) -> torch.Tensor:
        recency = self._recency if self._recency is not None \
            else torch.empty(0, dtype=torch.long)
        if recency.numel() < size:
            recency = torch.cat([recency, recency.new_full((size - recency.numel(),), -1)])
        self._recency = recency
        return recency

    def _record_writes(self, slots: Any) -> None:
        self._invalidate()
        if self.strategy != "recency":
            return
        flat = as_long_tensor(slots, name="slots").reshape(-1).cpu()
        if not flat.numel():
            return
        if int(flat.min()) < 0:
            raise IndexError(f"slots must be >= 0, got {int(flat.min())}.")
        recency = self._grow_recency(int(flat.max()) + 1)
        recency[flat] = torch.arange(self._clock + 1, self._clock + 1 + flat.numel())
        self._clock += flat.numel()

    def _fill_recency(self, length: int) -> None:
        """Slots written before the sampler was told of them count as older than any known."""
        recency = self._grow_recency(length)[:length]
        missing = (recency < 0).nonzero().reshape(-1)
        if not missing.numel():
            return
        known = recency[recency >= 0]
        stop = int(known.min()) if known.numel() else missing.numel()
        recency[missing] = torch.arange(stop - missing.numel(), stop)
        self._clock = max(self._clock, stop)

    def check_write(self, data: Any) -> None:
        """Refuse floating group ids that are not whole numbers (``0.5``, ``nan``) before they
        are written (``ValueError`` naming ``group_key``): stored, NaN ids would each form a
        group of their own."""
        if is_tensor_collection(data):
            _check_group_values(data.get(self.group_key, None), self.group_key)

    def extend(self, index: torch.Tensor) -> None:
        self._record_writes(index)

    def mark_update(self, index: torch.Tensor, *, storage: Storage | None = None) -> None:
        self._record_writes(index)

    def mark_edited(self, keys: list[Any] | None = None) -> None:
        self._invalidate()

    # ---- sampling ----------------------------------------------------------------------------
    def _warn_small(self) -> None:
        if not self._warned:
            warnings.warn("A group (or the set of groups) was smaller than the requested sample "
                          "size; completing the draw with replacement. Add more data or lower "
                          "num_groups/samples_per_group to avoid this.", stacklevel=4)
            self._warned = True

    def _perm(self, n: int) -> torch.Tensor:
        return torch.randperm(n, generator=self._rng)

    def _randint(self, n: int, k: int) -> torch.Tensor:
        return torch.randint(n, (k,), generator=self._rng)

    def _pick_groups(self, groups: list[Any], k: int) -> list[Any]:
        n = len(groups)
        if n >= k:
            return [groups[i] for i in self._perm(n)[:k].tolist()]
        self._warn_small()
        picked = [groups[i] for i in self._perm(n).tolist()]
        return picked + [groups[i] for i in self._randint(n, k - n).tolist()]

    def _pick_within(self, slots: torch.Tensor, k: int) -> torch.Tensor:
        n = slots.numel()
        if n < k:
            self._warn_small()
            return torch.cat([self._pick_within(slots, n), slots[self._randint(n, k - n)]])
        if self.strategy == "recency":
            assert self._recency is not None  # filled by _build_index
            return slots[torch.argsort(self._recency[slots])[n - k:]]
        if self.strategy == "reward":
            assert self._rewards is not None
            return slots[torch.topk(self._rewards[slots], k).indices]
        if self.strategy == "variance":
            assert self._rewards is not None
            return slots[max_variance_subset(self._rewards[slots], k)]
        return slots[self._perm(n)[:k]]

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[str, Any]]:
        """``batch_size`` slots, ``samples_per_group`` per group, groups one after the other."""
        check_not_empty(storage)
        if storage.ndim > 1:
            raise NotImplementedError(f"{type(self).__name__} only supports single-dimensional "
                                      f"storages, got storage.ndim={storage.ndim}.")
        num_groups, per_group = self.batch_shape(batch_size)
        index = self._build_index(storage)
        chosen = self._pick_groups(list(index), num_groups)
        return torch.cat([self._pick_within(index[g], per_group) for g in chosen]), {}

    # ---- state -------------------------------------------------------------------------------
    def empty(self) -> None:
        self._invalidate()
        self._recency, self._clock, self._warned = None, 0, False

    def state_dict(self) -> dict[str, Any]:
        """``{}``, or with ``"recency"``, the write clock of every slot and the clock."""
        if self.strategy != "recency":
            return {}
        recency = self._recency if self._recency is not None \
            else torch.empty(0, dtype=torch.long)
        return {"position_recency": recency.clone(), "recency_clock": self._clock}

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Raise ``ValueError`` naming the field unless ``state_dict`` can be loaded."""
        if not isinstance(state_dict, dict):
            raise ValueError(f"{type(self).__name__} state_dict must be a dict, got "
                             f"{type(state_dict).__name__}.")
        if not state_dict:
            return
        if set(state_dict) != _RECENCY_KEYS:
            raise ValueError(f"{type(self).__name__} state_dict keys must be "
                             f"{sorted(_RECENCY_KEYS)} (or none), got {sorted(state_dict)}.")
        recency = state_dict["position_recency"]
        if not isinstance(recency, torch.Tensor) or recency.dtype != torch.long \
                or recency.ndim != 1:
            raise ValueError(f"state_dict['position_recency'] must be a 1-d int64 tensor, got "
                             f"{recency!r}.")
        clock = state_dict["recency_clock"]
        if not is_int(clock) or int(clock) < 0:
            raise ValueError(f"state_dict['recency_clock'] must be an int >= 0, got {clock!r}.")
        if recency.numel() and int(recency.max()) > int(clock):
            raise ValueError(f"state_dict['position_recency'] holds write stamps up to "
                             f"{int(recency.max())}, past recency_clock={int(clock)}.")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (checked first); the group index is rebuilt."""
        self.check_state_dict(state_dict)
        recency = state_dict.get("position_recency")
        self._recency = recency.clone().cpu() if recency is not None else None
        self._clock = int(state_dict.get("recency_clock", 0))
        self._invalidate()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_groups=None, _rewards=None, _indexed=None)
        return state

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(num_groups={self.num_groups}, "
                f"samples_per_group={self.samples_per_group}, group_key={self.group_key}, "
                f"strategy={self.strategy!r})")
