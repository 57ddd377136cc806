"""Where slices go: pure functions over a :class:`~._trajectory_index.TrajectoryIndex`.

The shape of a batch of slices, their starts (with ``span`` overhangs), their flat slots, and
the checks of trajectories given up front; shared by the slice samplers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ._storage_entries import whole_ids
from ._trajectory_index import LEN, TrajectoryIndex

__all__ = ["REJECTION_ROUNDS", "ArgumentConflictError", "SliceBatchError", "SliceSizeError",
           "check_static",
           "draw_trajectories",
           "no_trajectory_error", "overhang", "ragged_arange", "slice_shape", "slice_slots",
           "span_starts", "static_cut"]

class ArgumentConflictError(ValueError, RuntimeError):
    """Arguments that exclude each other were given together.

    A ``ValueError``, and the ``RuntimeError`` TorchRL raises in these cases.

    Examples
    --------
    >>> [issubclass(ArgumentConflictError, e) for e in (ValueError, RuntimeError)]
    [True, True]
    """


class SliceBatchError(ValueError, RuntimeError):
    """A batch of slices that cannot be drawn as asked: a batch size that ``num_slices`` /
    ``slice_len`` does not divide, or ``strict_length`` slices longer than the buffer.

    A ``ValueError`` (what tdreplay raised before), and the ``RuntimeError`` TorchRL raises in
    these cases, so ``except RuntimeError:`` written for TorchRL catches it.

    Examples
    --------
    >>> [issubclass(SliceBatchError, e) for e in (ValueError, RuntimeError)]
    [True, True]
    >>> slice_shape(4, None, 3)
    Traceback (most recent call last):
    ...
    tdreplay.samplers._slicing.SliceBatchError: batch_size=4 is not divisible by slice_len=3.
    """


class SliceSizeError(TypeError, ValueError):
    """``num_slices`` and ``slice_len`` given both, or neither: a slice sampler needs exactly one
    of them.

    A ``TypeError`` as TorchRL raises in this case, and a ``ValueError`` as tdreplay raised
    before, so ``except TypeError:`` written for TorchRL catches it and so does older tdreplay
    code's ``except ValueError:``.

    Examples
    --------
    >>> [issubclass(SliceSizeError, e) for e in (TypeError, ValueError)]
    [True, True]
    """


#: Rounds of rejection sampling before falling back to an exact draw among eligible items.
REJECTION_ROUNDS = 8


def slice_shape(batch_size: Any, num_slices: int | None, slice_len: int | None
                ) -> tuple[int, int]:
    """``(num_slices, seq_len)`` of a batch, given one of ``num_slices`` and ``slice_len``.

    Examples
    --------
    >>> slice_shape(12, 3, None), slice_shape(12, None, 3)
    ((3, 4), (4, 3))

    A batch size that is not divisible raises :class:`SliceBatchError` (a ``ValueError`` and
    a ``RuntimeError``, as TorchRL's).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
            or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}.")
    batch_size = int(batch_size)
    if num_slices is not None:
        if batch_size % num_slices:
            raise SliceBatchError(f"batch_size={batch_size} is not divisible by num_slices="
                             f"{num_slices}.")
        return num_slices, batch_size // num_slices
    assert slice_len is not None
    if batch_size % slice_len:
        raise SliceBatchError(f"batch_size={batch_size} is not divisible by slice_len="
                         f"{slice_len}.")
    return batch_size // slice_len, slice_len


def draw_trajectories(index: TrajectoryIndex, k: int, seq_len: int, strict_length: bool,
                      randint: Callable[[int, int], np.ndarray]) -> np.ndarray:
    """``k`` record ids drawn uniformly among trajectories of at least ``seq_len`` steps (any
    trajectory unless ``strict_length``); ``randint(high, n)`` draws ``n`` ints in ``[0, high)``.
    """
    live = index.live_records()
    m = live.size
    if m == 0:
        raise RuntimeError("the buffer holds no trajectory to sample from.")
    if not strict_length:
        return live[randint(m, k)]
    rec = index.rec
    out: list[np.ndarray] = []
    need = k
    # rejection sampling: exact (accepted draws are uniform over the long-enough
    # trajectories) and O(batch) unless almost every trajectory is too short
    for _ in range(REJECTION_ROUNDS):
        cand = live[randint(m, need + need // 2 + 8)]
        ok = cand[rec[cand, LEN] >= seq_len][:need]
        out.append(ok)
        need -= ok.size
        if need == 0:
            return np.concatenate(out)
    eligible = live[rec[live, LEN] >= seq_len]
    if eligible.size == 0:
        raise no_trajectory_error(index, seq_len)
    out.append(eligible[randint(eligible.size, need)])
    return np.concatenate(out)


def ragged_arange(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(owner, offset)`` of runs of ``lengths`` items laid end to end: the run of each item
    and its place in that run."""
    owner = np.repeat(np.arange(lengths.size), lengths)
    offset = np.arange(owner.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return owner, offset


def slice_slots(index: TrajectoryIndex, lanes: np.ndarray, starts: np.ndarray,
                seq: np.ndarray | None, seq_len: int
                ) -> tuple[torch.Tensor, np.ndarray, np.ndarray | None]:
    """Flat slots of slices laid end to end: slice ``i`` runs along lane ``lanes[i]`` from
    position ``starts[i]`` for ``seq[i]`` steps (``seq_len`` when ``seq`` is ``None``).

    Returns the int64 slots, the place of each slice's last step in them and the slice of each
    step (``None`` when every slice has ``seq_len`` steps: step ``j`` is in slice ``j //
    seq_len``).
    """
    if seq is None or (seq == seq_len).all():
        pos = starts[:, None] + np.arange(seq_len)
        slots = index.slots_of(lanes[:, None], pos).reshape(-1)
        ends = np.arange(seq_len - 1, lanes.size * seq_len, seq_len)
        owner = None
    else:
        owner, offset = ragged_arange(seq)
        ends = np.cumsum(seq) - 1
        slots = index.slots_of(lanes[owner], starts[owner] + offset)
    return torch.from_numpy(np.ascontiguousarray(slots, dtype=np.int64)), ends, owner


def overhang(side: bool | int, seq: np.ndarray) -> np.ndarray:
    """Steps a slice of ``seq`` steps may hang over one trajectory edge, given that side's
    ``span`` (``False``: none, ``True``: all but one step, ``i``: at most ``i``); a slice always
    keeps at least one step, so the overhang is at most ``seq - 1``.

    Examples
    --------
    >>> seq = np.array([1, 3, 4])
    >>> overhang(False, seq).tolist(), overhang(True, seq).tolist(), overhang(2, seq).tolist()
    ([0, 0, 0], [0, 2, 3], [0, 2, 2])
    """
    if side is True:
        return seq - 1
    return np.minimum(int(side), seq - 1)


def span_starts(u: np.ndarray, lengths: np.ndarray, seq: np.ndarray,
                span: tuple[bool | int, bool | int]) -> tuple[np.ndarray, np.ndarray]:
    """Relative slice starts and lengths, overhanging the trajectory as ``span`` allows.

    ``seq`` slices of at most ``lengths`` steps start uniformly (``u`` in ``[0, 1)``) from
    ``-left`` to ``lengths - seq + right``, ``left`` and ``right`` being the :func:`overhang`
    of each side; the part of a slice outside its trajectory is cut off (TorchRL's ``span``
    semantics), so every step of a trajectory is covered by as many starts and every slice
    keeps at least one step (TorchRL's right span lets a start fall one past the last step).

    Examples
    --------
    >>> u = np.array([0.0, 0.99])
    >>> rel, seq = span_starts(u, np.array([4, 4]), np.array([2, 2]), (False, True))
    >>> rel.tolist(), seq.tolist()                                 # starts 0 and 3
    ([0, 3], [2, 1])
    """
    left, right = overhang(span[0], seq), overhang(span[1], seq)
    rel = np.floor(u * (lengths - seq + 1 + left + right)).astype(np.int64) - left
    cut_left = np.maximum(-rel, 0)
    cut_right = np.maximum(rel + seq - lengths, 0)
    return rel + cut_left, seq - cut_left - cut_right


def check_static(value: Any, name: str) -> torch.Tensor | None:
    """``ends`` (bool flags) or ``trajectories`` (int64 ids) given up front, flat on the CPU."""
    if value is None:
        return None
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(value).__name__}.")
    if name == "ends":
        return _end_flags(value)
    if value.dtype is torch.bool:
        raise TypeError(f"{name} must hold integer trajectory ids, got {value.dtype}.")
    return whole_ids(value.reshape(-1), name).cpu()


def _end_flags(ends: torch.Tensor) -> torch.Tensor:
    """``ends`` as flat bool flags on the CPU: bool, or numbers that are all 0 or 1."""
    if ends.dtype is not torch.bool:
        if ends.is_complex() or not ((ends == 0) | (ends == 1)).all():
            raise ValueError(f"ends must hold end flags: bools, or numbers that are 0 or 1; got "
                             f"{ends.dtype} values {ends.reshape(-1)[:5].tolist()}...")
    return ends.reshape(-1).to(torch.bool).cpu()


def static_cut(static: torch.Tensor, ends: bool) -> int:
    """Slot after which a full flat ring is cut when trajectories wrap around its end.

    ``static``: the end flags (``ends``) or the trajectory ids of every slot.
    """
    n = static.numel()
    if ends:
        if bool(static[-1]) or not bool(static.any()):
            return n - 1
        return int(static.nonzero()[-1])
    change = (static[1:] != static[:-1]).nonzero()
    if static[0] != static[-1] or not change.numel():
        return n - 1
    return int(change[-1])


def no_trajectory_error(index: TrajectoryIndex, seq_len: int) -> RuntimeError:
    """The error of a batch for which no trajectory is long enough."""
    lengths = index.rec[index.live_records(), LEN]
    return RuntimeError(
        f"Did not find a single trajectory with sufficient length (length range: "
        f"{int(lengths.min())} - {int(lengths.max())} / required={seq_len}): use shorter "
        "slices or strict_length=False."
    )
