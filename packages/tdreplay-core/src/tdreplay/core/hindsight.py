"""Where hindsight goals come from: :class:`HindsightStrategy` (TorchRL's
``torchrl.data.replay_buffers.her.HindsightStrategy``) and the steps of a storage it picks.

:class:`~tdreplay.core.HERReplayBuffer` relabels a sampled transition with the achieved
goal of another step: a step of the same trajectory (``future``, ``final``, ``episode``) or
any written step (``random``). Trajectories are found in storage order with
:func:`~tdreplay.core.trajectory_bounds.find_start_stop_traj`, as a ring buffer stores them:
a trajectory may go on past the last row of a full storage at row 0, and the newest written
row always ends one (what followed it was overwritten), so a goal never comes from another
trajectory, an older lap of the ring, or an unwritten slot.
"""

from __future__ import annotations

from enum import Enum

import torch

from .trajectory_bounds import find_start_stop_traj, position_in_trajectory

__all__ = ["HindsightStrategy"]


class HindsightStrategy(str, Enum):
    """How :class:`~tdreplay.core.HERReplayBuffer` picks the step whose achieved goal
    replaces a sampled transition's desired goal.

    Attributes
    ----------
    FUTURE
        A step drawn uniformly from the sampled step to the end of its trajectory (the
        sampled step included): the paper's recommended strategy.
    FINAL
        The last step of the trajectory.
    EPISODE
        A step drawn uniformly from the whole trajectory.
    RANDOM
        A step drawn uniformly from every written step of the buffer.

    A string names a strategy too (``HindsightStrategy("final")``).

    Examples
    --------
    >>> HindsightStrategy("future") is HindsightStrategy.FUTURE
    True
    >>> from_start, to_stop = torch.tensor([0, 2]), torch.tensor([3, 0])
    >>> HindsightStrategy.FINAL.offsets(from_start, to_stop).tolist()
    [3, 0]
    >>> off = HindsightStrategy.FUTURE.offsets(from_start, to_stop)
    >>> bool(((off >= 0) & (off <= to_stop)).all())
    True
    """

    FUTURE = "future"
    FINAL = "final"
    EPISODE = "episode"
    RANDOM = "random"

    def __str__(self) -> str:
        return str(self.value)

    @property
    def within_trajectory(self) -> bool:
        """Whether the goal comes from the sampled step's own trajectory (all but RANDOM)."""
        return self is not HindsightStrategy.RANDOM

    def offsets(self, from_start: torch.Tensor, to_stop: torch.Tensor,
                generator: torch.Generator | None = None) -> torch.Tensor:
        """Time offsets, from each sampled step, of the steps its goals come from.

        Parameters
        ----------
        from_start, to_stop : torch.Tensor
            Steps before / after each sampled step in its trajectory (``>= 0``, same shape).
        generator : torch.Generator, optional
            Draws the random offsets (``FUTURE``, ``EPISODE``); the global generator if None.

        Returns
        -------
        torch.Tensor
            ``int64`` offsets in ``[-from_start, to_stop]``: ``[0, to_stop]`` for ``FUTURE``,
            ``to_stop`` for ``FINAL``.

        Raises
        ------
        ValueError
            For ``RANDOM``, whose goals are not bound to a trajectory.
        """
        if self is HindsightStrategy.FINAL:
            return to_stop.to(torch.long).clone()
        if self is HindsightStrategy.RANDOM:
            raise ValueError("HindsightStrategy.RANDOM draws goals from the whole buffer, not at "
                             "offsets within a trajectory.")
        low = torch.zeros_like(from_start) if self is HindsightStrategy.FUTURE else from_start
        span = (low + to_stop + 1).to(torch.float64)
        device = generator.device if generator is not None else span.device
        draw = torch.rand(span.shape, dtype=torch.float64, generator=generator, device=device)
        picked = (draw.to(span.device) * span).to(torch.long)
        picked = torch.minimum(picked, (span - 1).to(torch.long))  # a draw of 1 - eps rounding up
        return picked - low.to(torch.long)


class TrajectoryPositions:
    """Where every written step of a storage sits in its trajectory, recomputed only when
    the end flags or the ring's state change.

    ``positions(end, at_capacity, newest)`` returns ``(from_start, to_stop)``, flat over the
    ``[T, *lanes]`` steps (time along dim 0, as :func:`find_start_stop_traj` reads them). The
    last result is kept with the flags it came from: the next call with equal flags and the
    same ``at_capacity`` / ``newest`` reuses it, whatever changed the storage in between
    (writes, index assignment, ``set_``), so a cached answer is never stale.

    Examples
    --------
    >>> end = torch.tensor([False, True, False, False, False])
    >>> cache = TrajectoryPositions()
    >>> from_start, to_stop = cache.positions(end, at_capacity=True, newest=3)
    >>> from_start.tolist(), to_stop.tolist()
    ([1, 2, 0, 1, 0], [1, 0, 1, 0, 2])
    >>> cache.ends().tolist()
    [1, 3]
    """

    def __init__(self) -> None:
        self._key: tuple[bool, int | None, torch.Size] | None = None
        self._end: torch.Tensor | None = None
        self._from_start = torch.zeros(0, dtype=torch.long)
        self._to_stop = torch.zeros(0, dtype=torch.long)

    def clear(self) -> None:
        """Forget the cached positions."""
        self._key = self._end = None

    def positions(self, end: torch.Tensor, *, at_capacity: bool, newest: int | None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(from_start, to_stop)`` of every step (flat, CPU ``int64``) for the ``[T, *lanes]``
        boolean ``end`` flags; ``newest`` is the row written last of a full ring."""
        end = end.to(device="cpu", dtype=torch.bool)
        key = (bool(at_capacity), newest, end.shape)
        if self._key == key and self._end is not None and torch.equal(self._end, end):
            return self._from_start, self._to_stop
        start, _, lengths = find_start_stop_traj(end=end, at_capacity=at_capacity,
                                                 cursor=newest if at_capacity else None)
        from_start, to_stop = position_in_trajectory(start, lengths, end.shape)
        self._from_start, self._to_stop = from_start.reshape(-1), to_stop.reshape(-1)
        self._key, self._end = key, end.clone()
        return self._from_start, self._to_stop

    def ends(self) -> torch.Tensor | None:
        """Flat slots of the last step of every cached trajectory (sorted), or ``None``
        before the first :meth:`positions`."""
        if self._key is None:
            return None
        return (self._to_stop == 0).nonzero().reshape(-1)
