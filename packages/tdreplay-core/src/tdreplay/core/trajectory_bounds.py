"""Where the trajectories of a storage start and stop: :func:`find_start_stop_traj`.

The storage-order companion of :func:`~tdreplay.core.split_trajectories`: it reads trajectory
ids or end-of-trajectory flags laid out as a ring buffer stores them (time along dim 0, a
trajectory may span the wrap point of a full storage, the row written last cuts the ring) and
returns indices, leaving the data untouched. Queries (:mod:`tdreplay.core.query`) and the
:class:`~tdreplay.core.sample_units.Sequence` sample unit find their boundaries with it, as
TorchRL's ``SliceSampler`` does.
"""

from __future__ import annotations

from typing import Any

import torch

from .utils import check_flag, is_int

__all__ = ["DEFAULT_DONE_KEYS", "find_start_stop_traj", "marked_truncated",
           "position_in_trajectory"]

#: The end-of-trajectory entries of TorchRL's TED format (read under ``"next"``): a trajectory
#: ends where any of them is set. The default of ``TED2Flat`` and of the TED checkpointers.
DEFAULT_DONE_KEYS: tuple[str, ...] = ("done", "truncated", "terminated")


def marked_truncated(batch: Any, ends: Any) -> Any:
    """A shallow copy of the TensorDict ``batch`` whose steps at ``ends`` (an index of its
    batch dims: a bool mask, an int, a tuple) are marked truncated, and done (terminated or
    truncated): new tensors for ``("next", "truncated")`` and ``("next", "done")``, the entries
    of them it has. ``batch`` itself is unchanged. What code that cuts a stored run of steps
    short (a copy that stops inside an episode, rows flattened one after the other) marks, so
    that the next steps written do not continue the episode.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> batch = TensorDict({"next": {"truncated": torch.zeros(3, 1, dtype=torch.bool),
    ...                              "done": torch.zeros(3, 1, dtype=torch.bool)}}, [3])
    >>> marked_truncated(batch, -1)["next", "done"].reshape(-1).tolist()
    [False, False, True]
    >>> bool(batch["next", "done"].any())  # (unchanged)
    False
    """
    out = batch.copy()  # (shallow: the flags set below are new tensors)
    for key in (("next", "truncated"), ("next", "done")):
        flag = batch.get(key, None)
        if isinstance(flag, torch.Tensor):
            flag = flag.clone()
            flag[ends] = True
            out.set(key, flag)
    return out


def _last_cursor(cursor: Any, steps: int) -> int:
    """The row written last, from an int, a tensor (its last element) or a range, in
    ``[-steps, steps)`` as TorchRL indexes with it (``IndexError`` naming ``cursor`` else)."""
    if isinstance(cursor, torch.Tensor):
        flat = cursor.reshape(-1)
        if not flat.numel():
            raise RuntimeError("cursor must not be an empty tensor.")
        cursor = flat[-1].item()
    elif isinstance(cursor, range):
        if not len(cursor):
            raise RuntimeError("cursor must not be an empty range.")
        cursor = cursor[-1]
    if not is_int(cursor):
        raise RuntimeError(f"cursor must be an int, a tensor of ints or a range, got "
                           f"{type(cursor).__name__}.")
    if not -steps <= int(cursor) < steps:
        raise IndexError(f"cursor {int(cursor)} is outside the {steps} steps of the input "
                         f"(it names the row written last).")
    return int(cursor)


def end_flags(*, trajectory: torch.Tensor | None = None, end: torch.Tensor | None = None,
              at_capacity: bool, cursor: Any = None) -> torch.Tensor:
    """``[T, *B]`` boolean flags set on the last step of every trajectory (see
    :func:`find_start_stop_traj` for the arguments); every column has at least one."""
    if (trajectory is None) == (end is None):
        raise TypeError("Exactly one of trajectory and end must be given, got "
                        f"trajectory={trajectory} and end={end}.")
    at_capacity = check_flag(at_capacity, "at_capacity")
    signal = trajectory if trajectory is not None else end
    assert signal is not None
    if not isinstance(signal, torch.Tensor):
        raise TypeError(f"trajectory / end must be a tensor, got {type(signal).__name__}.")
    if signal.ndim == 0:
        raise RuntimeError("the trajectory ids / end flags must have at least one dimension "
                           "(time).")
    if signal.shape[0] == 0:
        raise RuntimeError("cannot find trajectory boundaries in an empty (T=0) input.")
    if trajectory is not None:
        changes = trajectory[:-1] != trajectory[1:]
        last = (trajectory[-1:] != trajectory[:1]) if at_capacity \
            else torch.ones_like(trajectory[:1], dtype=torch.bool)
        flags = torch.cat([changes, last], 0)
    else:
        assert end is not None
        flags = end.to(torch.bool).clone()
        if not at_capacity:
            flags[-1] = True
    if at_capacity:
        if cursor is not None:
            flags[_last_cursor(cursor, flags.shape[0])] = True
        # a column without any end is one trajectory: cut it after its last row
        flags[-1] |= ~flags.any(0)
    return flags


def _start_stop(flags: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(start, stop, lengths)`` from end flags where every column has an end."""
    steps = flags.shape[0]
    # stops sorted by batch coordinates, then time (TorchRL's order): time swapped to the last
    # dim for nonzero(), then its column swapped back to the front
    stop = flags.transpose(0, -1).nonzero()
    if flags.ndim > 1:
        stop[:, [0, -1]] = stop[:, [-1, 0]].clone()
    dev = flags.device
    start = stop.clone()
    after = (stop[:, 0] + 1) % steps
    # the start of a trajectory is the step after the previous stop of its column; the first
    # stop of a column starts after the column's last stop (the wrap point)
    same = (stop[1:, 1:] == stop[:-1, 1:]).all(-1) if stop.shape[0] > 1 \
        else torch.zeros(0, dtype=torch.bool, device=dev)
    first = torch.cat([torch.ones(1, dtype=torch.bool, device=dev), ~same])
    group = first.cumsum(0) - 1
    last_of_group = torch.zeros(int(group[-1]) + 1, dtype=torch.long, device=dev)
    last_of_group[group] = torch.arange(stop.shape[0], device=dev)
    previous = torch.arange(stop.shape[0], device=dev) - 1
    previous[first] = last_of_group[group[first]]
    start[:, 0] = after[previous]
    lengths = stop[:, 0] - start[:, 0] + 1
    lengths = torch.where(lengths <= 0, lengths + steps, lengths)
    return start, stop, lengths


def find_start_stop_traj(
    *,
    trajectory: torch.Tensor | None = None,
    end: torch.Tensor | None = None,
    at_capacity: bool,
    cursor: int | torch.Tensor | range | None = None,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Find the trajectories of a storage from trajectory ids or end-of-trajectory flags.

    Parameters
    ----------
    trajectory : torch.Tensor, optional
        Trajectory ids in storage order, time along dim 0 (shape ``[T, *B]``): a trajectory
        ends where the id changes. Exactly one of ``trajectory`` and ``end``.
    end : torch.Tensor, optional
        Boolean end flags in storage order (``[T, *B]``), set on the last step of a
        trajectory. Not modified.
    at_capacity : bool
        Whether the storage is full and used as a ring: a trajectory without an end before the
        last row goes on at row 0. When False, the last row always ends a trajectory.
    cursor : int, torch.Tensor or range, optional
        The row written last (the last element of a tensor or range), in ``[-T, T)``. With
        ``at_capacity``, it ends a trajectory: what followed it was overwritten.
    device : torch.device, optional
        Where to compute; the results come back on the input's device.

    Returns
    -------
    tuple of torch.Tensor
        ``(start, stop, lengths)``: ``start`` / ``stop`` are ``[N, 1 + len(B)]`` (time of the
        first / last step, then the batch coordinates), ``lengths`` is ``[N]``. A trajectory
        that spans the wrap point has ``start[i, 0] > stop[i, 0]``. Trajectories are ordered
        by batch coordinates, then by their stop.

    Raises
    ------
    TypeError
        Neither or both of ``trajectory`` and ``end``; an ``at_capacity`` that is not a bool.
    IndexError
        A ``cursor`` outside ``[-T, T)`` (as TorchRL's indexing).
    RuntimeError
        An empty input (``T == 0``), or an empty ``cursor``.

    Examples
    --------
    >>> end = torch.zeros(10, dtype=torch.bool)
    >>> end[2] = end[7] = True
    >>> start, stop, lengths = find_start_stop_traj(end=end, at_capacity=True, cursor=4)
    >>> start.squeeze(-1).tolist(), stop.squeeze(-1).tolist(), lengths.tolist()
    ([8, 3, 5], [2, 4, 7], [5, 2, 3])
    >>> ids = torch.tensor([5, 5, 5, 0, 0, 1, 1, 1, 5, 5])
    >>> find_start_stop_traj(trajectory=ids, at_capacity=True)[2].tolist()
    [5, 2, 3]
    """
    signal = trajectory if trajectory is not None else end
    home = signal.device if isinstance(signal, torch.Tensor) else None
    flags = end_flags(trajectory=trajectory, end=end, at_capacity=at_capacity, cursor=cursor)
    if device is not None:
        flags = flags.to(device)
    out = _start_stop(flags)
    if home is not None:
        out = tuple(t.to(home) for t in out)  # type: ignore[assignment]
    return out


def position_in_trajectory(start: torch.Tensor, lengths: torch.Tensor, shape: torch.Size
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """For every step of a ``[T, *B]`` storage, the steps before it and after it in its
    trajectory: ``(from_start, to_stop)``, both of shape ``shape``.

    ``start`` and ``lengths`` are what :func:`find_start_stop_traj` returned for that storage
    (every step belongs to exactly one trajectory).

    Examples
    --------
    >>> end = torch.tensor([False, True, False, False, True])
    >>> start, _, lengths = find_start_stop_traj(end=end, at_capacity=False)
    >>> [t.tolist() for t in position_in_trajectory(start, lengths, end.shape)]
    [[0, 1, 0, 1, 2], [1, 0, 2, 1, 0]]
    """
    steps = shape[0]
    lanes = shape[1:]
    total = int(lengths.sum())
    offsets = torch.arange(total) - torch.repeat_interleave(lengths.cumsum(0) - lengths, lengths)
    owner = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
    time = (start[owner, 0] + offsets) % steps
    flat = time
    for dim, size in enumerate(lanes, start=1):
        flat = flat * size + start[owner, dim]
    from_start = torch.empty(shape, dtype=torch.long).reshape(-1)
    to_stop = torch.empty_like(from_start)
    from_start[flat] = offsets
    to_stop[flat] = lengths[owner] - 1 - offsets
    return from_start.reshape(shape), to_stop.reshape(shape)
