"""Trajectory queries: :class:`Trajectory`, the :data:`traj` query language,
:func:`iter_trajectories` and :func:`filter_trajectories` (TorchRL's
``torchrl.data.replay_buffers.query``).

A predicate built from :data:`traj` (``(traj.reward.sum() > 100) & (traj.length >= 50)``)
knows which entries it reads (:meth:`TrajectoryPredicate.required_keys`), so
``ReplayBuffer.query`` reads only those (and runs only the transforms that write them) to
decide, then reads the matching trajectories whole. Boundaries come from
:func:`~tdreplay.core.trajectory_bounds.find_start_stop_traj`, as for the slice samplers.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorClass, TensorDictBase, is_tensor_collection, unravel_key

from .trajectories import check_trajectory_ids
from .trajectory_bounds import DEFAULT_DONE_KEYS, find_start_stop_traj
from .utils import check_key

__all__ = ["Trajectory", "TrajectoryPredicate", "filter_trajectories", "iter_trajectories",
           "traj"]

#: entries holding trajectory ids, looked up in this order when no trajectory_key is given
TRAJECTORY_KEYS: tuple[Any, ...] = (("collector", "traj_ids"), "traj_ids", "episode")
#: groups of end flags (OR-ed within the first group found) when no id entry exists
END_KEY_GROUPS: tuple[tuple[Any, ...], ...] = (
    tuple(("next", key) for key in DEFAULT_DONE_KEYS), tuple(DEFAULT_DONE_KEYS))


if TYPE_CHECKING:
    _TensorClassNoCast = TensorClass
else:  # a tensorclass that keeps its values as given (no casting to tensors)
    _TensorClassNoCast = TensorClass["nocast"]


class Trajectory(_TensorClassNoCast):
    """The steps of one trajectory, with its entries as attributes.

    ``trajectory.observation`` reads the root entry, ``trajectory.reward`` /
    ``trajectory.done`` fall back to ``("next", ...)`` when the root has none. Indexing with
    a key reads the data (``trajectory["next", "done"]``); indexing with an int or a slice
    returns a :class:`Trajectory`, and trajectories of different lengths stack with
    :func:`tensordict.lazy_stack`.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> data = TensorDict({"obs": torch.zeros(4, 3),
    ...                    "next": {"reward": torch.ones(4, 1)}}, batch_size=[4])
    >>> t = Trajectory(data)
    >>> t.length, t.obs.shape, float(t.total_reward)
    (4, torch.Size([4, 3]), 4.0)
    >>> t[1:3]
    Trajectory(length=2, keys=['next', 'obs'])
    """

    data: TensorDictBase

    def __post_init__(self) -> None:
        data = self.data
        if data is not None and not is_tensor_collection(data):
            raise TypeError(f"Trajectory expects a TensorDict of the trajectory's steps (batch "
                            f"size [T]), got {type(data).__name__}.")
        if not self.batch_size and data is not None and data.batch_dims:
            if data.batch_dims != 1:
                raise ValueError("Trajectory expects data with a single batch dimension "
                                 f"(time), got batch_size={tuple(data.batch_size)}.")
            self.batch_size = data.batch_size

    @property
    def length(self) -> int:
        """Number of steps."""
        return int(self.batch_size[0])

    @property
    def total_reward(self) -> torch.Tensor:
        """Sum of the rewards (``reward``, else ``("next", "reward")``)."""
        reward = self.get("reward")
        if reward is None:
            raise AttributeError("Trajectory has no entry 'reward' in its data (looked up "
                                 "'reward' and ('next', 'reward')).")
        return reward.sum()  # type: ignore[no-any-return]

    def get(self, key: Any, default: Any = None) -> Any:  # type: ignore[override]
        """The entry ``key`` of the data, else ``("next", key)`` for a plain name, else
        ``default``."""
        value = self.data.get(key, None)
        if value is None and isinstance(key, str):
            value = self.data.get(("next", key), None)
        return default if value is None else value

    def keys(self, *args: Any, **kwargs: Any) -> Any:
        """The keys of the data."""
        return self.data.keys(*args, **kwargs)


_trajectory_cls: Any = Trajectory  # its tensorclass methods are chained to below
_tensorclass_getattr = _trajectory_cls.__getattr__
_tensorclass_getitem = _trajectory_cls.__getitem__


def _trajectory_getattr(self: Trajectory, name: str) -> Any:
    # the tensorclass installs its own __getattr__ after the class body: chain to it
    try:
        return _tensorclass_getattr(self, name)
    except AttributeError:
        if name.startswith("_"):
            raise
        value = self.get(name)
        if value is None:
            keys = sorted(map(str, self.data.keys(include_nested=True, leaves_only=True)))
            raise AttributeError(f"Trajectory has no entry {name!r} in its data (looked up "
                                 f"{name!r} and {('next', name)!r}); keys: {keys}") from None
        return value


def _trajectory_getitem(self: Trajectory, index: Any) -> Any:
    if isinstance(index, str) or (isinstance(index, tuple) and index
                                  and all(isinstance(k, str) for k in index)):
        return self.data[index]
    return _tensorclass_getitem(self, index)


def _trajectory_repr(self: Trajectory) -> str:
    shape = (f"length={self.length}" if len(self.batch_size) == 1
             else f"batch_size={tuple(self.batch_size)}")
    keys = None if self.data is None else sorted(map(str, self.data.keys()))
    return f"Trajectory({shape}, keys={keys})"


_trajectory_cls.__getattr__ = _trajectory_getattr
_trajectory_cls.__getitem__ = _trajectory_getitem
_trajectory_cls.__repr__ = _trajectory_repr

Keys = frozenset[Any] | None  # the entries an expression reads; None: unknown (an opaque callable)


def _union(first: Keys, second: Keys) -> Keys:
    return None if first is None or second is None else first | second


class TrajectoryPredicate:
    """A boolean test of a :class:`Trajectory`, composable with ``&``, ``|`` and ``~``.

    Made by comparing :data:`traj` expressions; ``required_keys()`` says which entries it
    reads (``None`` when unknown).

    Examples
    --------
    >>> p = (traj.reward.sum() > 1.0) & (traj.length >= 5)
    >>> p
    TrajectoryPredicate(((traj.reward.sum() > 1.0) & (traj.length >= 5)))
    >>> sorted(p.required_keys())
    ['reward']
    """

    def __init__(self, fn: Callable[[Trajectory], Any], description: str = "predicate",
                 keys: Keys = None) -> None:
        self.fn = fn
        self.description = description
        self.keys = keys

    def required_keys(self) -> Keys:
        """The entries the predicate reads (``("next", key)`` is tried for a plain name), or
        ``None`` for an opaque callable."""
        return self.keys

    def __call__(self, trajectory: Trajectory) -> bool:
        return bool(self.fn(trajectory))

    def __and__(self, other: TrajectoryPredicate) -> TrajectoryPredicate:
        return TrajectoryPredicate(lambda t: self(t) and other(t),
                                   f"({self.description} & {other.description})",
                                   _union(self.keys, other.keys))

    def __or__(self, other: TrajectoryPredicate) -> TrajectoryPredicate:
        return TrajectoryPredicate(lambda t: self(t) or other(t),
                                   f"({self.description} | {other.description})",
                                   _union(self.keys, other.keys))

    def __invert__(self) -> TrajectoryPredicate:
        return TrajectoryPredicate(lambda t: not self(t), f"~{self.description}", self.keys)

    def __bool__(self) -> bool:
        raise _no_truth_value(self.description)

    def __repr__(self) -> str:
        return f"TrajectoryPredicate({self.description})"


def _ambiguous(description: str) -> TypeError:
    return TypeError(f"{description} compares per-step values and is ambiguous as a trajectory "
                     "filter: reduce it with .any() or .all().")


def _no_truth_value(description: str) -> TypeError:
    """What ``bool(predicate)`` raises: Python's ``and`` / ``or`` / ``not`` and chained
    comparisons (``1 < traj.length < 3``) would keep one side and drop the other silently."""
    return TypeError(
        f"{description} is a trajectory predicate and has no truth value: combine predicates "
        "with &, | and ~ (Python's and / or / not, and chained comparisons such as "
        "1 < traj.length < 3, would keep one side only); write a range as "
        "(traj.length > 1) & (traj.length < 3).")


class StepwisePredicate:
    """A per-step comparison (``traj.reward > 1``), to reduce with :meth:`any` / :meth:`all`."""

    def __init__(self, fn: Callable[[Trajectory], torch.Tensor], description: str,
                 keys: Keys) -> None:
        self.fn = fn
        self.description = description
        self.keys = keys

    def any(self) -> TrajectoryPredicate:
        """True when the comparison holds at some step."""
        return TrajectoryPredicate(lambda t: bool(self.fn(t).any()),
                                   f"{self.description}.any()", self.keys)

    def all(self) -> TrajectoryPredicate:
        """True when the comparison holds at every step."""
        return TrajectoryPredicate(lambda t: bool(self.fn(t).all()),
                                   f"{self.description}.all()", self.keys)

    def required_keys(self) -> Keys:
        return self.keys

    def __call__(self, trajectory: Trajectory | None = None) -> Any:
        raise _ambiguous(self.description)

    def __bool__(self) -> bool:
        raise _no_truth_value(self.description)

    def __repr__(self) -> str:
        return f"StepwisePredicate({self.description})"


class _Comparable:
    """Comparison operators of the :data:`traj` expressions."""

    description: str
    keys: Keys
    result: type

    def value(self, trajectory: Trajectory) -> Any:
        raise NotImplementedError

    def _compare(self, op: Callable[[Any, Any], Any], other: Any, symbol: str) -> Any:
        if isinstance(other, _Comparable):  # two expressions (traj.reward.sum() > traj.length):
            # compared trajectory by trajectory, step by step when either is per step
            result = StepwisePredicate if StepwisePredicate in (self.result, other.result) \
                else TrajectoryPredicate
            return result(lambda t: op(self.value(t), other.value(t)),
                          f"({self.description} {symbol} {other.description})",
                          _union(self.keys, other.keys))
        return self.result(lambda t: op(self.value(t), other),
                           f"({self.description} {symbol} {other!r})", self.keys)

    def __gt__(self, other: Any) -> Any:
        return self._compare(operator.gt, other, ">")

    def __ge__(self, other: Any) -> Any:
        return self._compare(operator.ge, other, ">=")

    def __lt__(self, other: Any) -> Any:
        return self._compare(operator.lt, other, "<")

    def __le__(self, other: Any) -> Any:
        return self._compare(operator.le, other, "<=")

    def __eq__(self, other: Any) -> Any:
        return self._compare(operator.eq, other, "==")

    def __ne__(self, other: Any) -> Any:
        return self._compare(operator.ne, other, "!=")

    __hash__ = None  # type: ignore[assignment]


class ScalarExpr(_Comparable):
    """One value per trajectory (``traj.length``, ``traj.reward.sum()``); compares into a
    :class:`TrajectoryPredicate`."""

    result = TrajectoryPredicate

    def __init__(self, fn: Callable[[Trajectory], Any], description: str, keys: Keys) -> None:
        self.fn = fn
        self.description = description
        self.keys = keys

    def value(self, trajectory: Trajectory) -> Any:
        return self.fn(trajectory)

    def __repr__(self) -> str:
        return f"ScalarExpr({self.description})"


class FieldExpr(_Comparable):
    """An entry of every step (``traj.reward``): reduce it (``.sum()``, ``.mean()``,
    ``.max()``, ``.min()``, ``.first()``, ``.last()``) or compare it step by step."""

    result = StepwisePredicate

    def __init__(self, key: Any, description: str | None = None) -> None:
        self.key = unravel_key(key)
        self.description = description if description is not None else f"traj.{key}"
        self.keys = frozenset({self.key})

    def value(self, trajectory: Trajectory) -> torch.Tensor:
        value = trajectory.get(self.key)
        if value is None:
            raise KeyError(f"entry {self.key!r} is not in the trajectory (looked up the root "
                           "and ('next', ...)).")
        return value  # type: ignore[no-any-return]

    def _reduce(self, fn: Callable[[torch.Tensor], Any], name: str) -> ScalarExpr:
        return ScalarExpr(lambda t: fn(self.value(t)), f"{self.description}.{name}()",
                          self.keys)

    def sum(self) -> ScalarExpr:
        """Sum over the steps."""
        return self._reduce(torch.sum, "sum")

    def mean(self) -> ScalarExpr:
        """Mean over the steps (as floats)."""
        return self._reduce(lambda x: x.float().mean(), "mean")

    def max(self) -> ScalarExpr:
        """Largest value."""
        return self._reduce(torch.max, "max")

    def min(self) -> ScalarExpr:
        """Smallest value."""
        return self._reduce(torch.min, "min")

    def first(self) -> ScalarExpr:
        """Value at the first step."""
        return self._reduce(lambda x: x[0], "first")

    def last(self) -> ScalarExpr:
        """Value at the last step."""
        return self._reduce(lambda x: x[-1], "last")

    def __repr__(self) -> str:
        return f"FieldExpr({self.description})"


class TrajectoryRef:
    """The query language's entry point (:data:`traj`): ``traj.<name>`` / ``traj[key]`` is an
    entry of every step (the root entry, else ``("next", name)``), ``traj.length`` and
    ``traj.total_reward`` one value per trajectory.

    Examples
    --------
    >>> (traj.reward > 10).any()
    TrajectoryPredicate((traj.reward > 10).any())
    >>> (traj[("collector", "mask")] == 1).all().required_keys()
    frozenset({('collector', 'mask')})
    """

    @property
    def length(self) -> ScalarExpr:
        """Number of steps of the trajectory."""
        return ScalarExpr(lambda t: t.length, "traj.length", frozenset())

    @property
    def total_reward(self) -> ScalarExpr:
        """Sum of the rewards of the trajectory."""
        return ScalarExpr(lambda t: t.total_reward, "traj.total_reward", frozenset({"reward"}))

    def __getattr__(self, name: str) -> FieldExpr:
        if name.startswith("_"):
            raise AttributeError(name)
        return FieldExpr(name)

    def __getitem__(self, key: Any) -> FieldExpr:
        return FieldExpr(key, f"traj[{key!r}]")

    def __repr__(self) -> str:
        return "traj"


#: The entry point of the trajectory query language (see :class:`TrajectoryRef`).
traj = TrajectoryRef()


def check_predicate(predicate: Any) -> None:
    """``TypeError`` for a per-step comparison not reduced with ``.any()`` / ``.all()`` and
    for a predicate that is not callable."""
    if isinstance(predicate, StepwisePredicate):
        raise _ambiguous(predicate.description)
    if predicate is not None and not callable(predicate):
        raise TypeError(f"predicate must be callable (e.g. traj.reward.sum() > 1), got "
                        f"{type(predicate).__name__}.")


def _one_per_step(values: torch.Tensor, key: Any, shape: torch.Size) -> torch.Tensor:
    """``values`` (one per step, trailing dims of size 1 aside) shaped as the steps'
    ``shape``; ``ValueError`` naming ``key`` when it holds another number of values a step."""
    if values.numel() != shape.numel() or values.shape[:len(shape)] != shape:
        raise ValueError(f"entry {key!r} has shape {tuple(values.shape)}: splitting steps of "
                         f"batch_size={tuple(shape)} into trajectories needs one value a step "
                         f"(shape {tuple(shape)}, or with trailing dims of size 1).")
    return values.reshape(shape)


def boundary_signal(data: TensorDictBase, trajectory_key: Any = None
                    ) -> tuple[str, torch.Tensor]:
    """``("trajectory", ids)`` or ``("end", flags)``, shaped as ``data``'s batch: what splits
    ``data`` into trajectories. Ids are looked up at ``trajectory_key``, else at
    :data:`TRAJECTORY_KEYS`; without ids the end flags of the first group of
    :data:`END_KEY_GROUPS` found are OR-ed (with a warning: a trajectory whose last step has
    no flag merges with the next one)."""
    trajectory_key = check_key(trajectory_key, "trajectory_key", optional=True)
    shape = data.batch_size
    keys = (trajectory_key,) if trajectory_key is not None else TRAJECTORY_KEYS
    for key in keys:
        ids = data.get(key, None)
        if ids is not None:
            return "trajectory", _one_per_step(check_trajectory_ids(ids, key), key, shape)
    if trajectory_key is not None:
        raise KeyError(f"trajectory_key {trajectory_key!r} is not in the data (keys: "
                       f"{sorted(map(str, data.keys(True, True)))}).")
    for group in END_KEY_GROUPS:
        found = [key for key in group if data.get(key, None) is not None]
        if found:
            end = torch.zeros(shape, dtype=torch.bool, device=data.get(found[0]).device)
            for key in found:
                end = end | _one_per_step(data.get(key), key, shape).to(torch.bool)
            warnings.warn(f"no trajectory id entry found: splitting on the end-of-episode flags "
                          f"{tuple(found)}; a trajectory whose last step carries no flag merges "
                          "with the next one. Store trajectory ids (e.g. ('collector', "
                          "'traj_ids')) or pass trajectory_key.", UserWarning, stacklevel=3)
            return "end", end
    raise KeyError(f"Cannot split data into trajectories: no trajectory ids (looked up "
                   f"{TRAJECTORY_KEYS}) and no end-of-episode flags (looked up "
                   f"{END_KEY_GROUPS}). Pass trajectory_key=...")


def trajectory_bounds(data: TensorDictBase, trajectory_key: Any = None, *,
                      at_capacity: bool = False, cursor: Any = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``find_start_stop_traj`` of ``data`` (time along dim 0), split as
    :func:`boundary_signal` says."""
    kind, signal = boundary_signal(data, trajectory_key)
    if kind == "trajectory":
        return find_start_stop_traj(trajectory=signal, at_capacity=at_capacity, cursor=cursor)
    return find_start_stop_traj(end=signal, at_capacity=at_capacity, cursor=cursor)


def iter_trajectories(data: TensorDictBase, trajectory_key: Any = None) -> Iterator[Trajectory]:
    """Yield the trajectories of a flat batch of steps, in order, as :class:`Trajectory`
    views of ``data``.

    Steps of a trajectory are consecutive. A trajectory ends where its id changes
    (``trajectory_key``, else ``("collector", "traj_ids")``, ``"traj_ids"`` or
    ``"episode"``), or, without ids, after a step with ``("next", "done")``,
    ``("next", "terminated")`` or ``("next", "truncated")`` set (a ``UserWarning`` says that a
    trajectory without a final flag merges with the next one). The last step always ends one.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> data = TensorDict({"episode": torch.tensor([0, 0, 1, 1, 1])}, batch_size=[5])
    >>> [t.length for t in iter_trajectories(data)]
    [2, 3]
    """
    if not isinstance(data, TensorDictBase):
        raise TypeError(f"iter_trajectories expects a TensorDictBase, got "
                        f"{type(data).__name__}: trajectory queries need TensorDict data.")
    if data.batch_dims != 1:
        raise ValueError("iter_trajectories expects data with a single batch dimension (flat "
                         f"steps), got batch_size={tuple(data.batch_size)}.")
    if data.batch_size[0] == 0:
        return
    start, stop, _ = trajectory_bounds(data, trajectory_key)
    for first, last in zip(start[:, 0].tolist(), stop[:, 0].tolist()):
        yield Trajectory(data[first: last + 1])


def filter_trajectories(data: TensorDictBase,
                        predicate: Callable[[Trajectory], bool] | None = None, *,
                        trajectory_key: Any = None) -> list[Trajectory]:
    """The trajectories of ``data`` (split as :func:`iter_trajectories`) for which
    ``predicate`` holds (all of them when it is ``None``).

    ``predicate`` is a :class:`TrajectoryPredicate` built from :data:`traj` or any callable
    taking a :class:`Trajectory`; an unreduced per-step comparison raises ``TypeError``.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> data = TensorDict({"episode": torch.tensor([0, 0, 1, 1, 1]),
    ...                    "next": {"reward": torch.ones(5, 1)}}, batch_size=[5])
    >>> [t.length for t in filter_trajectories(data, traj.reward.sum() > 2)]
    [3]
    """
    check_predicate(predicate)
    return [t for t in iter_trajectories(data, trajectory_key)
            if predicate is None or predicate(t)]

