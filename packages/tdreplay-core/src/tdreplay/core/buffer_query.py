"""``rb.query(predicate)``: the buffer's trajectories for which a predicate holds.

:class:`QueryMixin` is one of the rooms :class:`~tdreplay.core.ReplayBuffer` is built from. It
splits the stored steps into trajectories (as the slice samplers do: ids, else end flags, the
row written last cutting a full ring), orders them by age, and tests each with the predicate on
the data the read-side transforms make. A :data:`~tdreplay.core.query.traj` predicate names the
entries it reads: only those are read, and only the transforms that can write them run, to
decide; matching trajectories are then read whole, through every transform, as a sample is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch
from tensordict import TensorDictBase, is_tensor_collection, unravel_key

from .query import Trajectory, TrajectoryPredicate, boundary_signal, check_predicate
from .storage import Storage
from .trajectory_bounds import find_start_stop_traj
from .transform import Compose, Transform
from .transform_state import transform_mark, undo_transforms
from .utils import clone_exact
from .writer import RoundRobinWriter, Writer

Bounds = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # start, stop, length
Runs = list[tuple[int, int, int]]  # (lane, first step, length) of each trajectory


def _as_tuple(key: Any) -> tuple[str, ...]:
    key = unravel_key(key)
    return key if isinstance(key, tuple) else (key,)


def _overlap(first: Any, second: Any) -> bool:
    a, b = _as_tuple(first), _as_tuple(second)
    depth = min(len(a), len(b))
    return a[:depth] == b[:depth]


def transform_plan(transforms: Sequence[Transform], required: set[Any]
                   ) -> tuple[list[Transform], set[Any] | None]:
    """The transforms that can change a ``required`` entry (in order) and the entries they
    and the predicate read; ``None`` (read everything, run every transform from there back)
    when a transform does not say what it writes (no ``out_keys``)."""
    kept: list[Transform] = []
    required = set(required)
    for position in range(len(transforms) - 1, -1, -1):
        transform = transforms[position]
        if not transform.out_keys:
            return list(transforms[: position + 1]) + kept[::-1], None
        if any(_overlap(out, req) for out in transform.out_keys for req in required):
            kept.append(transform)
            required.update(unravel_key(k) for k in transform.in_keys)
    return kept[::-1], required


def _run(data: TensorDictBase, transforms: Sequence[Transform]) -> TensorDictBase:
    """``data`` through ``transforms``, on a copy (a transform never writes into storage)."""
    if not transforms:
        return data
    data = clone_exact(data)
    for transform in transforms:
        data = transform(data)
    return data


def _steps(source: TensorDictBase, start: int, length: int) -> TensorDictBase:
    """``length`` steps from ``start``: a view unless they wrap past the end of ``source``."""
    size = source.batch_size[0]
    if start + length <= size:
        return source[start: start + length]
    return source[torch.arange(start, start + length) % size]


def _bounds(kind: str, signal: torch.Tensor, *, at_capacity: bool, cursor: Any = None) -> Bounds:
    if kind == "trajectory":
        return find_start_stop_traj(trajectory=signal, at_capacity=at_capacity, cursor=cursor)
    return find_start_stop_traj(end=signal, at_capacity=at_capacity, cursor=cursor)


class QueryMixin:
    """``query`` (mixed into :class:`~tdreplay.core.ReplayBuffer`)."""

    _storage: Storage
    _writer: Writer
    _transform: Compose
    _lock: AbstractContextManager[Any]

    def query(self, predicate: Callable[[Trajectory], bool] | None = None, *,
              trajectory_key: Any = None) -> list[Trajectory]:
        """The stored trajectories (oldest first; with ``ndim > 1``, lane by lane, oldest first
        within each) for which ``predicate`` holds, as
        :class:`~tdreplay.core.query.Trajectory` objects, through the read-side transforms.

        ``predicate``: a :data:`~tdreplay.core.query.traj` predicate (only the entries it reads
        are read, and only the transforms that write them run, to decide) or any callable
        taking a ``Trajectory`` (every transform runs once on the whole storage); ``None``
        keeps every trajectory. ``trajectory_key``: the entry of trajectory ids (by default
        ``("collector", "traj_ids")``, ``"traj_ids"`` or ``"episode"``, else the
        ``("next", "done" / "terminated" / "truncated")`` flags split the steps). A full
        buffer's oldest trajectory may have lost its first steps; with ``ndim > 1`` time runs
        along the first storage dimension and each lane (environment) is split on its own.
        Trajectories of a tensor storage are views of the stored steps unless a transform
        runs. Needs TensorDict items (``TypeError`` otherwise).

        Examples
        --------
        >>> from tensordict import TensorDict
        >>> from tdreplay.core import ReplayBuffer, ListStorage
        >>> from tdreplay.core.query import traj
        >>> rb = ReplayBuffer(storage=ListStorage(10))
        >>> data = TensorDict({"episode": torch.tensor([0, 0, 0, 1, 1]),
        ...                    "next": {"reward": torch.ones(5, 1)}}, batch_size=[5])
        >>> _ = rb.extend(list(data.unbind(0)))
        >>> [t.length for t in rb.query()], [t.length for t in rb.query(traj.length < 3)]
        ([3, 2], [2])
        """
        check_predicate(predicate)
        with self._lock:
            if len(self._storage) == 0:
                return []
            # transforms with state (VecNorm) are put back if the predicate or one of them raises
            mark = transform_mark(self._transform)
            try:
                return self._select(*self._trajectory_source(trajectory_key), predicate)
            except BaseException:
                undo_transforms(self._transform, mark)
                raise

    def _stored_steps(self) -> TensorDictBase:
        contents = self._storage[:]
        if isinstance(contents, list):
            if not all(is_tensor_collection(item) for item in contents):
                raise TypeError("query needs a tensordict-backed storage (TensorDict items); "
                                f"{type(self._storage).__name__} holds other items.")
            contents = torch.stack(contents)
        if not is_tensor_collection(contents):
            raise TypeError("query needs a tensordict-backed storage (TensorDict items); "
                            f"{type(self._storage).__name__} holds {type(contents).__name__}.")
        return contents  # type: ignore[no-any-return]

    def _last_row(self, rows: int) -> int | None:
        """The row written last, when the writer writes round-robin (in time order): where
        the storage records its writer stopped (also for a buffer built on a written or
        restored storage, whose new writer's cursor knows nothing of it), else the cursor."""
        if not isinstance(self._writer, RoundRobinWriter):
            return None
        last = self._storage.last_written_row
        return int(last) % rows if last is not None else (self._writer.cursor - 1) % rows

    def _trajectory_source(self, trajectory_key: Any) -> tuple[list[TensorDictBase], Runs]:
        """The lanes of stored steps (``[T]`` each, time-first) and the trajectories as
        ``(lane, start, length)``, oldest first within each lane."""
        steps = self._stored_steps()
        rows = steps.batch_size[0]
        capacity = self._storage.rows_capacity
        full = capacity is not None and rows == capacity
        last = self._last_row(rows) if full else None
        lanes = steps.reshape(rows, -1) if steps.batch_dims > 1 else steps.unsqueeze(1)
        kind, signal = boundary_signal(lanes, trajectory_key)
        start, _, length = _bounds(kind, signal, at_capacity=full, cursor=last)
        oldest = (last + 1) % rows if last is not None else 0
        age = (start[:, 0] - oldest) % rows
        order = torch.argsort(start[:, 1] * rows + age)
        runs = [(int(lane), int(first), int(n)) for lane, first, n
                in zip(start[order, 1], start[order, 0], length[order])]
        return list(lanes.unbind(1)), runs

    def _select(self, sources: list[TensorDictBase], runs: Runs,
                predicate: Callable[[Trajectory], bool] | None) -> list[Trajectory]:
        transforms = list(self._transform)
        if predicate is None:
            return [Trajectory(_run(_steps(sources[lane], s, n), transforms))
                    for lane, s, n in runs]
        required = (predicate.required_keys() if isinstance(predicate, TrajectoryPredicate)
                    else None)
        eval_sources, eval_transforms = sources, transforms
        if required is not None:
            wanted = set()
            for key in required:
                wanted.add(unravel_key(key))
                if isinstance(key, str):
                    wanted.add(("next", key))
            eval_transforms, fetch = transform_plan(transforms, wanted)
            if fetch is not None:
                eval_sources = [source.select(*fetch, strict=False) for source in sources]
        complete = eval_sources is sources and len(eval_transforms) == len(transforms)
        if eval_transforms:  # once over each lane, as a sample would
            eval_sources = [_run(source, eval_transforms) for source in eval_sources]
        kept = []
        for lane, start, length in runs:
            candidate = Trajectory(_steps(eval_sources[lane], start, length))
            if not predicate(candidate):
                continue
            kept.append(candidate if complete
                        else Trajectory(_run(_steps(sources[lane], start, length), transforms)))
        return kept
