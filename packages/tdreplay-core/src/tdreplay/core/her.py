"""Hindsight experience replay: :class:`HERReplayBuffer` (TorchRL's
``torchrl.data.replay_buffers.her``).

Andrychowicz et al., "Hindsight Experience Replay", NeurIPS 2017
(https://arxiv.org/abs/1707.01495). The buffer stores transitions as they came; a sample
relabels a fraction of the batch with goals the agent did achieve and recomputes their reward
with the user's function. Which steps the goals come from is
:class:`~tdreplay.core.HindsightStrategy`'s job; trajectories are found with core's
trajectory utilities (:mod:`tdreplay.core.trajectory_bounds`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal, cast

import numpy as np
import torch
from tensordict import TensorDictBase, is_tensor_collection, unravel_key

from ._stateful import StateDictCheckpointMixin
from .hindsight import HindsightStrategy, TrajectoryPositions
from .replay_buffer import TensorDictReplayBuffer
from .sampler import Sampler
from .utils import ShapeMismatchError, check_key

__all__ = ["HERReplayBuffer"]

NestedKey = Any  # a str or a tuple of str


def _as_tuple(key: NestedKey) -> tuple[str, ...]:
    return key if isinstance(key, tuple) else (key,)


def _check_ratio(value: Any) -> float:
    """``her_ratio`` as a float in ``[0, 1]``; ``TypeError`` / ``ValueError`` naming it."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise TypeError(f"her_ratio must be a float in [0, 1], got {type(value).__name__} "
                        f"({value!r}).")
    ratio = float(value)
    if math.isnan(ratio) or not 0.0 <= ratio <= 1.0:
        raise ValueError(f"her_ratio must be in [0, 1], got {value!r}.")
    return ratio


def _check_strategy(value: Any) -> HindsightStrategy:
    try:
        return HindsightStrategy(value)
    except ValueError:
        raise ValueError(f"strategy must be one of {[s.value for s in HindsightStrategy]} or a "
                         f"HindsightStrategy, got {value!r}.") from None


def _replace_rows(data: TensorDictBase, key: NestedKey, rows: int, value: torch.Tensor,
                  name: str) -> None:
    """Set ``data[key][:rows] = value`` out of place (the sampled batch may share tensors with
    the storage); :class:`~tdreplay.core.utils.ShapeMismatchError` (a ``ValueError`` and a
    ``RuntimeError``, as TorchRL raises) naming ``name`` when ``value`` does not fit."""
    old = data.get(key)
    target = old[:rows]
    if value.numel() != target.numel() or (value.ndim and value.shape[0] != rows):
        raise ShapeMismatchError(f"{name} gave values of shape {tuple(value.shape)} for the {rows} "
                         f"relabelled rows of {key!r}, whose shape is {tuple(target.shape)}.")
    new = old.clone()
    new[:rows] = value.reshape(target.shape).to(device=old.device, dtype=old.dtype)
    data.set(key, new)


class HERSettings(StateDictCheckpointMixin):
    """The relabelling settings of an :class:`HERReplayBuffer` as a checkpointed component:
    ``dumps`` saves them with the storage, sampler and writer, for information (``loads``
    checks the entry and keeps the buffer's own settings, as TorchRL's)."""

    def __init__(self, buffer: HERReplayBuffer) -> None:
        self.buffer = buffer

    def state_dict(self) -> dict[str, Any]:
        return self.buffer.her_state_dict()

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.buffer.check_her_state_dict(state_dict)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.buffer.load_her_state_dict(state_dict)


class HERReplayBuffer(TensorDictReplayBuffer):
    """A TensorDict replay buffer that relabels goals at sample time (hindsight experience
    replay).

    The first ``int(batch_size * her_ratio)`` transitions of every sampled batch get, under
    ``goal_key`` (and ``("next", goal_key)`` when stored), the ``achieved_goal_key`` entry of a
    step the ``strategy`` picks, and their ``reward_key`` entry becomes
    ``reward_fn(relabelled_rows)``; the other transitions are returned as stored. The storage
    is never changed. Relabelling happens before the read-side transforms, which see the new
    goals and rewards.

    Trajectories end where ``end_key`` or its ``"terminated"`` / ``"truncated"`` siblings are
    set, at the newest written step (a full ring's write cursor: goals never mix the newest
    and the oldest steps), and at the last written step; a trajectory written across the end
    of a full storage goes on at row 0. With ``ndim > 1`` time is the storage's first
    dimension and goals stay in their lane. The trajectory positions are cached and reused
    while the stored end flags are unchanged.

    Parameters
    ----------
    reward_fn : callable
        Gets the relabelled rows (a TensorDict, the new ``goal_key`` set) and returns their
        reward, shaped ``[n, 1]`` or ``[n]`` (any shape with the stored entry's elements).
    her_ratio : float
        Fraction of each batch to relabel, in ``[0, 1]`` (default 0.8).
    strategy : HindsightStrategy or str
        ``"future"`` (default), ``"final"``, ``"episode"`` or ``"random"``.
    goal_key, achieved_goal_key : NestedKey
        The desired goal (``"desired_goal"``) and the achieved goal (``"achieved_goal"``);
        the goal of a relabelled transition is the source step's ``achieved_goal_key``
        (``("next", "achieved_goal")`` takes the goal reached *after* the source step).
    reward_key : NestedKey
        Where the reward is (``("next", "reward")``).
    end_key : NestedKey
        The end-of-trajectory flag (``("next", "done")``).
    sampler : Sampler, optional
        Draws the transitions (``RandomSampler`` by default); relabelling applies on top.
    **kwargs
        As :class:`~tdreplay.core.TensorDictReplayBuffer` (``storage``: a tensor storage of
        TensorDicts, e.g. ``LazyTensorStorage``; ``generator``: also draws the goals).

    Raises
    ------
    TypeError, ValueError
        A bad argument (the message names it); nothing is built.
    KeyError
        At ``sample``, when the storage lacks ``goal_key``, ``achieved_goal_key``,
        ``reward_key`` or (strategies within a trajectory) every end flag.

    Examples
    --------
    (needs ``tdreplay-storages``; skipped here, run by the sampling guide)

    >>> from tensordict import TensorDict
    >>> from tdreplay.storages import LazyTensorStorage  # doctest: +SKIP
    >>> def reward_fn(td):
    ...     return (td["achieved_goal"] == td["desired_goal"]).all(-1, keepdim=True).float()
    >>> rb = HERReplayBuffer(reward_fn=reward_fn, storage=LazyTensorStorage(100),  # doctest: +SKIP
    ...                      batch_size=4, her_ratio=1.0, strategy="final")
    >>> steps = TensorDict({
    ...     "desired_goal": torch.zeros(4, 1), "achieved_goal": torch.arange(4.).view(4, 1),
    ...     "next": {"reward": torch.zeros(4, 1),
    ...              "done": torch.tensor([[False], [True], [False], [True]])}}, [4])
    >>> _ = rb.extend(steps)  # doctest: +SKIP
    >>> batch = rb.sample()  # doctest: +SKIP
    >>> final = torch.where(batch["index"] < 2, 1., 3.)[:, None]  # doctest: +SKIP
    >>> bool((batch["desired_goal"] == final).all())  # doctest: +SKIP
    True
    >>> batch["next", "reward"].shape  # doctest: +SKIP
    torch.Size([4, 1])
    """

    def __init__(
        self,
        reward_fn: Callable[[TensorDictBase], torch.Tensor],
        *,
        her_ratio: float = 0.8,
        strategy: HindsightStrategy | Literal["future", "final", "episode", "random"] = "future",
        goal_key: NestedKey = "desired_goal",
        achieved_goal_key: NestedKey = "achieved_goal",
        reward_key: NestedKey = ("next", "reward"),
        end_key: NestedKey = ("next", "done"),
        sampler: Sampler | None = None,
        **kwargs: Any,
    ) -> None:
        if not callable(reward_fn):
            raise TypeError(f"reward_fn must be callable, got {type(reward_fn).__name__}.")
        ratio, chosen = _check_ratio(her_ratio), _check_strategy(strategy)
        keys = {name: check_key(value, name) for name, value in (
            ("goal_key", goal_key), ("achieved_goal_key", achieved_goal_key),
            ("reward_key", reward_key), ("end_key", end_key))}
        super().__init__(sampler=sampler, **kwargs)
        self.reward_fn = reward_fn
        self._her_ratio, self._strategy = ratio, chosen
        self._goal_key: NestedKey = keys["goal_key"]
        self._achieved_goal_key: NestedKey = keys["achieved_goal_key"]
        self._reward_key: NestedKey = keys["reward_key"]
        self._end_key: NestedKey = keys["end_key"]
        self._positions = TrajectoryPositions()

    # ---- settings --------------------------------------------------------------------------------
    @property
    def her_ratio(self) -> float:
        """Fraction of each sampled batch that is relabelled (settable, checked)."""
        return self._her_ratio

    @her_ratio.setter
    def her_ratio(self, value: float) -> None:
        self._her_ratio = _check_ratio(value)

    @property
    def strategy(self) -> HindsightStrategy:
        """Where the goals come from (settable from a string, checked)."""
        return self._strategy

    @strategy.setter
    def strategy(self, value: HindsightStrategy | str) -> None:
        self._strategy = _check_strategy(value)

    @property
    def goal_key(self) -> NestedKey:
        """The entry relabelled with a new goal (settable to a str or a tuple of str;
        ``TypeError`` naming it otherwise, nothing changed)."""
        return self._goal_key

    @goal_key.setter
    def goal_key(self, value: NestedKey) -> None:
        self._goal_key = check_key(value, "goal_key")

    @property
    def achieved_goal_key(self) -> NestedKey:
        """The entry the new goals are read from (settable, checked as ``goal_key``)."""
        return self._achieved_goal_key

    @achieved_goal_key.setter
    def achieved_goal_key(self, value: NestedKey) -> None:
        self._achieved_goal_key = check_key(value, "achieved_goal_key")

    @property
    def reward_key(self) -> NestedKey:
        """The entry ``reward_fn`` rewrites (settable, checked as ``goal_key``)."""
        return self._reward_key

    @reward_key.setter
    def reward_key(self, value: NestedKey) -> None:
        self._reward_key = check_key(value, "reward_key")

    @property
    def end_key(self) -> NestedKey:
        """The flag that ends a trajectory (settable, checked as ``goal_key``).

        Examples
        --------
        >>> rb = HERReplayBuffer(lambda td: td["next", "reward"])
        >>> rb.end_key = None
        Traceback (most recent call last):
        ...
        TypeError: end_key must be a str or a tuple of str, got None.
        >>> rb.end_key = ("next", "terminated")
        >>> rb.end_key
        ('next', 'terminated')
        """
        return self._end_key

    @end_key.setter
    def end_key(self, value: NestedKey) -> None:
        self._end_key = check_key(value, "end_key")

    @property
    def end_keys(self) -> list[NestedKey]:
        """The flags that end a trajectory: ``end_key`` and its ``"terminated"`` and
        ``"truncated"`` siblings (those that are stored count)."""
        parent = _as_tuple(self.end_key)[:-1]
        siblings = [unravel_key((*parent, name)) for name in ("terminated", "truncated")]
        return [self.end_key] + [key for key in siblings if key != self.end_key]

    # ---- sampling --------------------------------------------------------------------------------
    def _steps(self) -> TensorDictBase:
        steps = self._storage[:]  # (a LazyStackStorage's rows: one lazy stack of them)
        if not is_tensor_collection(steps):
            raise TypeError(f"HERReplayBuffer needs a storage of TensorDicts (e.g. "
                            f"LazyTensorStorage, LazyStackStorage) to read goals and trajectory"
                            f" ends; its {type(self._storage).__name__} holds "
                            f"{type(steps).__name__} rows.")
        return cast(TensorDictBase, steps)

    def _check_keys(self, steps: TensorDictBase) -> None:
        missing = [f"{name}={key!r}" for name, key in (
            ("goal_key", self.goal_key), ("achieved_goal_key", self.achieved_goal_key),
            ("reward_key", self.reward_key)) if steps.get(key, None) is None]
        if missing:
            raise KeyError(f"HERReplayBuffer cannot relabel: {', '.join(missing)} not in the "
                           "storage; store these entries in every transition, or pass the "
                           "keys where they are.")

    def _end_flags(self, steps: TensorDictBase) -> torch.Tensor:
        shape = steps.batch_size
        flags = [steps.get(key, None) for key in self.end_keys]
        present = [torch.as_tensor(f).reshape(*shape, -1).to("cpu", torch.bool).any(-1)
                   for f in flags if f is not None]
        if not present:
            raise KeyError(f"end_key {self.end_key!r} (nor its siblings "
                           f"{self.end_keys[1:]!r}) is not in the storage: HERReplayBuffer "
                           "needs it to find trajectories (or use strategy='random').")
        ended = present[0]
        for more in present[1:]:
            ended = ended | more
        return ended

    def _goal_slots(self, steps: TensorDictBase, slots: torch.Tensor) -> torch.Tensor:
        """Flat slots of the steps whose achieved goals relabel the sampled ``slots``."""
        shape = steps.batch_size
        total, rows = shape.numel(), shape[0]
        lanes = total // rows
        rng = self._rng
        if not self._strategy.within_trajectory:
            device = rng.device if rng is not None else None
            return torch.randint(total, slots.shape, generator=rng, device=device).cpu()
        full = self._storage.rows_capacity is not None and rows == self._storage.rows_capacity
        last = self._storage.last_written_row
        newest = last % rows if full and last is not None else None
        from_start, to_stop = self._positions.positions(self._end_flags(steps),
                                                        at_capacity=full, newest=newest)
        offsets = self._strategy.offsets(from_start[slots], to_stop[slots], generator=rng)
        time = (slots // lanes + offsets.cpu()) % rows
        return time * lanes + slots % lanes

    def _read_sampled(self, index: Any, info: dict[str, Any]) -> tuple[Any, Any]:
        data, _ = super()._read_sampled(index, info)
        if isinstance(index, tuple):  # coordinates, one tensor per storage dim
            coords = [torch.as_tensor(i).reshape(-1).cpu() for i in index]
        else:
            coords = [torch.as_tensor(index).reshape(-1).cpu()]
        relabel = int(coords[0].shape[0] * self._her_ratio)
        if relabel == 0:
            return data, None
        steps = self._steps()
        self._check_keys(steps)
        shape = steps.batch_size
        slots = coords[0][:relabel].to(torch.long)
        if len(coords) > 1:  # ravel (time, *lanes) coordinates into flat slots
            for dim, coord in enumerate(coords[1:], start=1):
                slots = slots * shape[dim] + coord[:relabel]
        source = self._goal_slots(steps, slots)
        achieved = steps.get(self.achieved_goal_key)
        flat = achieved.reshape(shape.numel(), *achieved.shape[len(shape):])
        return data, (relabel, flat[source.to(flat.device)])

    def _complete_sample(self, data: Any, info: dict[str, Any], extra: Any) -> Any:
        if extra is None:
            return data
        relabel, goals = extra
        if data.is_locked:
            data.unlock_()
        _replace_rows(data, self.goal_key, relabel, goals,
                      f"achieved_goal_key {self.achieved_goal_key!r}")
        next_goal = unravel_key(("next", *_as_tuple(self.goal_key)))
        if _as_tuple(self.goal_key)[0] != "next" and data.get(next_goal, None) is not None:
            _replace_rows(data, next_goal, relabel, goals,
                          f"achieved_goal_key {self.achieved_goal_key!r}")
        reward = self.reward_fn(data[:relabel])
        if not isinstance(reward, torch.Tensor):
            raise TypeError(f"reward_fn must return a tensor, got {type(reward).__name__}.")
        _replace_rows(data, self.reward_key, relabel, reward, "reward_fn")
        return data

    # ---- state -----------------------------------------------------------------------------------
    def her_state_dict(self) -> dict[str, Any]:
        """The relabelling settings, saved by :meth:`state_dict` under ``"_her"`` (as
        TorchRL's) and by :meth:`dumps` for information: a restore keeps the settings the
        buffer was built with (or set since), as TorchRL's, as it keeps its ``batch_size``.
        ``reward_fn`` is code and is not saved.

        ``episode_ends_cache`` (TorchRL's field) holds the flat slots that ended a trajectory
        at the last relabelling sample (``None`` before one); it is informational too: a
        restored buffer finds the trajectories again from its restored data.
        """
        return {"goal_key": self.goal_key, "achieved_goal_key": self.achieved_goal_key,
                "reward_key": self.reward_key, "end_key": self.end_key,
                "her_ratio": self._her_ratio, "strategy": self._strategy.value,
                "episode_ends_cache": self._positions.ends()}

    def check_her_state_dict(self, state: Any) -> None:
        """Raise ``ValueError`` unless ``state`` (TorchRL's ``"_her"`` entry) is a dict; its
        settings are not restored (:meth:`her_state_dict`). Changes nothing."""
        if not isinstance(state, dict):
            raise ValueError(f"state_dict['_her'] must be a dict, got {type(state).__name__}.")

    def load_her_state_dict(self, state: dict[str, Any]) -> None:
        """Take a restored ``"_her"`` entry (checked first): the buffer keeps its own
        settings, as TorchRL's; the trajectories are found again from the restored data."""
        self.check_her_state_dict(state)
        with self._lock:
            self._positions.clear()

    def state_dict(self) -> dict[str, Any]:
        """As :class:`~tdreplay.core.TensorDictReplayBuffer`, plus ``"_her"``: the relabelling
        settings (:meth:`her_state_dict`)."""
        out = super().state_dict()
        out["_her"] = self.her_state_dict()
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (``state_dict`` is not modified); the ``"_her"``
        settings are checked with every other part before anything changes."""
        if not isinstance(state_dict, dict):
            raise TypeError(f"state_dict must be a dict, got {type(state_dict).__name__}.")
        rest = {key: value for key, value in state_dict.items() if key != "_her"}
        her = state_dict.get("_her")
        if her is not None:
            self.check_her_state_dict(her)
        super().load_state_dict(rest)
        if her is not None:
            self.load_her_state_dict(her)

    def _components(self) -> dict[str, Any]:
        parts: dict[str, Any] = super()._components()
        parts["her"] = HERSettings(self)
        return parts

    def empty(self, empty_write_count: bool = True) -> None:
        with self._lock:
            super().empty(empty_write_count)
            self._positions.clear()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(strategy={self._strategy.value!r}, "
                f"her_ratio={self._her_ratio}, goal_key={self.goal_key!r}, "
                f"achieved_goal_key={self.achieved_goal_key!r}, reward_key={self.reward_key!r}, "
                f"end_key={self.end_key!r}, storage={self._storage!r}, "
                f"sampler={self._sampler!r}, batch_size={self._batch_size})")
