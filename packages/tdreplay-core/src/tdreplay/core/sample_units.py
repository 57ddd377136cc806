"""What each sampled anchor becomes: :class:`SampleUnit`, :class:`Transition`,
:class:`Sequence` (TorchRL's ``torchrl.data.replay_buffers.sample_units``).

A buffer built with ``sample_unit=`` draws anchors with its sampler, then lets the unit expand
them (under the buffer's lock, before the storage is read): the batch is read at the expanded
index, ``info["index"]`` reports it, and what the unit adds to ``info`` (masks, the anchor of
every record) becomes entries of TensorDict samples.
"""

from __future__ import annotations

import abc
from typing import Any, Literal

import torch
from tensordict import is_tensor_collection

from .storage import Storage
from .trajectory_bounds import find_start_stop_traj, position_in_trajectory
from .utils import check_key, check_required_count

__all__ = ["SampleUnit", "Sequence", "Transition"]

Index = Any  # a tensor of slots, or a tuple of coordinate tensors (one per storage dim)
_BOUNDARIES = ("pad", "stop", "include_reset")


class SampleUnit(abc.ABC):
    """Expands the anchors a sampler drew into the records of the batch.

    ``expand(index, info, storage)`` gets the anchors (a tensor of slots, or a tuple of
    coordinate tensors), the sampler's ``info`` and the storage, and returns the records'
    index and the info, per-anchor entries kept aligned with the records. It never changes
    the storage.

    Examples
    --------
    >>> class Twice(SampleUnit):
    ...     def expand(self, index, info, storage):
    ...         return index.repeat_interleave(2), dict(info)
    >>> from tdreplay.core import ReplayBuffer
    >>> rb = ReplayBuffer(batch_size=3, sample_unit=Twice())
    >>> _ = rb.extend([torch.tensor(i) for i in range(5)])
    >>> batch = rb.sample()
    >>> batch.shape, bool((batch[0::2] == batch[1::2]).all())
    (torch.Size([6]), True)
    """

    @abc.abstractmethod
    def expand(self, index: Index, info: dict[str, Any], storage: Storage
               ) -> tuple[Index, dict[str, Any]]:
        """The records' index and info for the anchors ``index``."""

    def anchor_priority(self, data: Any, priority: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(anchors, priorities)`` to update for the per-record ``priority`` of a sampled
        batch ``data``, or ``None`` (the default) to update the records' own index."""
        return None


class Transition(SampleUnit):
    """Every anchor is one record: the default of a buffer (``sample_unit=None``).

    Examples
    --------
    >>> from tdreplay.core import ListStorage
    >>> Transition().expand(torch.tensor([3, 1]), {}, ListStorage(4))
    (tensor([3, 1]), {})
    """

    def expand(self, index: Index, info: dict[str, Any], storage: Storage
               ) -> tuple[Index, dict[str, Any]]:
        return index, info


class Sequence(SampleUnit):
    """Each anchor becomes a window of ``burn_in + length + bootstrap`` records around it.

    The window holds ``burn_in`` records before the anchor, the ``length`` records of the
    learning region from the anchor on, then ``bootstrap`` records, ``dilation`` storage
    steps apart. ``info`` gains, per record, ``sequence_id`` (which anchor), ``step_in_sequence``,
    ``learning_mask`` (the learning region), ``validity_mask`` (a real step of the anchor's
    episode) and ``anchor_index``; per-anchor entries (e.g. ``priority_weight``) are repeated
    over the window. With a prioritized sampler,
    ``TensorDictReplayBuffer.update_tensordict_priority`` updates the anchors, with the max
    priority over the valid records of each.

    Parameters
    ----------
    length : int
        Records of the learning region (>= 1).
    episode_boundary : {"pad", "stop", "include_reset"}
        At the end of an episode: ``"pad"`` repeats the last step (marked invalid),
        ``"stop"`` moves the window back to end at the boundary (as ``"pad"`` when the episode
        is too short), ``"include_reset"`` goes on into the next episode. No window crosses
        the ring's write seam or reads unwritten slots (those records are clamped, invalid).
    done_key : NestedKey or None
        The end-of-episode flag (``("next", "done")``); ``None``: the written steps are one
        episode. Burn-in records before the episode's start are clamped to it, invalid.
    burn_in, bootstrap : int
        Records before the anchor / after the learning region (>= 0).
    dilation : int
        Storage steps between consecutive records of a window (>= 1).

    Needs a tensor storage of TensorDicts (e.g. ``LazyTensorStorage``); with ``ndim > 1`` time
    is the first storage dimension and windows stay in their lane. The ring's newest row
    comes from the storage's ``last_written_row``.

    Examples
    --------
    (needs ``tdreplay-storages``; skipped here, run by the sampling guide)

    >>> from tensordict import TensorDict
    >>> from tdreplay.core import TensorDictReplayBuffer
    >>> from tdreplay.storages import LazyTensorStorage  # doctest: +SKIP
    >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10),  # doctest: +SKIP
    ...                             batch_size=2, sample_unit=Sequence(length=3))
    >>> done = torch.zeros(10, 1, dtype=torch.bool)
    >>> done[4] = done[9] = True
    >>> data = TensorDict({"obs": torch.arange(10.), ("next", "done"): done}, [10])
    >>> _ = rb.extend(data)  # doctest: +SKIP
    >>> rb.sample()["obs"].shape  # doctest: +SKIP
    torch.Size([6])
    >>> unit = Sequence(length=2, burn_in=1, bootstrap=1)
    >>> index, info = unit.expand(torch.tensor([5]), {}, rb.storage)  # doctest: +SKIP
    >>> index.tolist(), info["learning_mask"].tolist()  # doctest: +SKIP
    ([5, 5, 6, 7], [False, True, True, False])
    """

    def __init__(self, length: int,
                 episode_boundary: Literal["pad", "stop", "include_reset"] = "pad",
                 done_key: Any = ("next", "done"), burn_in: int = 0, bootstrap: int = 0,
                 dilation: int = 1) -> None:
        self.length = check_required_count(length, "length", 1)
        if episode_boundary not in _BOUNDARIES:
            raise ValueError(f"episode_boundary must be one of {_BOUNDARIES}, got "
                             f"{episode_boundary!r}.")
        self.episode_boundary = episode_boundary
        self.done_key = check_key(tuple(done_key) if isinstance(done_key, list) else done_key,
                                  "done_key", optional=True)
        self.burn_in = check_required_count(burn_in, "burn_in", 0)
        self.bootstrap = check_required_count(bootstrap, "bootstrap", 0)
        self.dilation = check_required_count(dilation, "dilation", 1)

    @property
    def window(self) -> int:
        """Records per anchor: ``burn_in + length + bootstrap``."""
        return self.burn_in + self.length + self.bootstrap

    def _steps(self, storage: Storage) -> Any:
        if storage.shape is None:  # nothing written yet
            raise TypeError(f"{type(self).__name__} needs a TensorDict-backed TensorStorage "
                            "(e.g. LazyTensorStorage written with TensorDicts) to find episode "
                            f"boundaries; got {type(storage).__name__}.")
        steps = storage[:]
        if not is_tensor_collection(steps):
            raise TypeError(f"{type(self).__name__} needs a storage that reads as one "
                            f"TensorDict (to read {self.done_key!r}), e.g. LazyTensorStorage "
                            f"written with TensorDicts; {type(storage).__name__} reads as "
                            f"{type(steps).__name__}.")
        return steps

    def _end_flags(self, steps: Any, device: torch.device) -> torch.Tensor:
        shape = steps.batch_size
        if self.done_key is None:
            return torch.zeros(shape, dtype=torch.bool, device=device)
        done = steps.get(self.done_key, None)
        if done is None:
            raise KeyError(f"done_key {self.done_key!r} is not in the storage; pass the entry "
                           "that flags episode ends, or done_key=None.")
        return torch.as_tensor(done).reshape(shape).to(device=device, dtype=torch.bool)

    def expand(self, index: Index, info: dict[str, Any], storage: Storage
               ) -> tuple[Index, dict[str, Any]]:
        steps = self._steps(storage)
        shape = steps.batch_size  # [T, *lanes]
        rows = shape[0]
        as_tuple = isinstance(index, tuple)
        anchor = torch.stack([torch.as_tensor(i) for i in index], -1) if as_tuple \
            else torch.as_tensor(index)
        device = anchor.device
        if len(shape) > 1 and not as_tuple:  # flat slots -> [B, ndim] coordinates
            anchor = torch.stack(torch.unravel_index(anchor.reshape(-1), tuple(shape)), -1)
        coords = anchor.reshape(-1, len(shape)) if len(shape) > 1 else anchor.reshape(-1, 1)
        count, total = coords.shape[0], self.window
        time = coords[:, 0]

        full = storage.rows_capacity is not None and rows == storage.rows_capacity
        last = storage.last_written_row
        newest = (last % rows) if last is not None and full else rows - 1
        steps_of_window = torch.arange(total, device=device)
        offset = ((steps_of_window - self.burn_in) * self.dilation).expand(count, total)
        if self.episode_boundary == "include_reset":
            oldest = (newest + 1) % rows if full else 0
            ahead, behind = (newest - time) % rows, (time - oldest) % rows
            shift = torch.zeros_like(time)
        else:
            end = self._end_flags(steps, torch.device("cpu"))
            start, _, lengths = find_start_stop_traj(end=end, at_capacity=full,
                                                     cursor=newest if full else None)
            from_start, to_stop = position_in_trajectory(start, lengths, end.shape)
            flat = torch.zeros_like(time, device="cpu")
            for dim, size in enumerate(shape):
                flat = flat * size + coords[:, dim].cpu()
            behind = from_start.reshape(-1)[flat].to(device)
            ahead = to_stop.reshape(-1)[flat].to(device)
            shift = torch.zeros_like(time)
            if self.episode_boundary == "stop":
                need = self.dilation * (self.length + self.bootstrap - 1) - ahead
                shift = torch.minimum(need.clamp(min=0), behind)
                ahead, behind = ahead + shift, behind - shift
        valid = (offset <= ahead[:, None]) & (offset >= -behind[:, None])
        clamped = torch.maximum(torch.minimum(offset, ahead[:, None]), -behind[:, None])
        record_time = (time - shift)[:, None] + clamped
        record_time = record_time % rows

        out = {key: (value if torch.as_tensor(value).ndim == 0
                     else torch.as_tensor(value).repeat_interleave(total, 0))
               for key, value in info.items()}
        learning = (steps_of_window >= self.burn_in) & (steps_of_window < self.burn_in
                                                        + self.length)
        out["sequence_id"] = torch.arange(count, device=device).repeat_interleave(total)
        out["step_in_sequence"] = steps_of_window.repeat(count)
        out["learning_mask"] = learning.repeat(count)
        out["anchor_index"] = anchor.repeat_interleave(total, 0)
        out["validity_mask"] = valid.reshape(-1)
        if len(shape) == 1:
            return record_time.reshape(-1), out
        lanes = coords[:, 1:][:, None, :].expand(count, total, len(shape) - 1)
        records = torch.cat([record_time[..., None], lanes], -1).reshape(-1, len(shape))
        if as_tuple:
            return tuple(records.unbind(-1)), out
        return _ravel(records, shape), out

    def anchor_priority(self, data: Any, priority: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor] | None:
        anchor = data.get("anchor_index", None)
        if anchor is None:
            return None
        priority = torch.as_tensor(priority).reshape(-1)
        anchor = anchor.reshape(priority.shape[0], -1)
        valid = data.get("validity_mask", None)
        if valid is not None:
            keep = valid.reshape(-1).to(torch.bool)
            anchor, priority = anchor[keep], priority[keep]
        unique, inverse = torch.unique(anchor, dim=0, return_inverse=True)
        reduced = torch.full((unique.shape[0],), float("-inf"), dtype=torch.float64)
        reduced = reduced.scatter_reduce(0, inverse, priority.to(torch.float64), "amax")
        unique = unique[:, 0] if unique.shape[1] == 1 else unique
        return unique, reduced.to(priority.dtype)


def _ravel(coords: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    flat = torch.zeros(coords.shape[0], dtype=torch.long, device=coords.device)
    for dim, size in enumerate(shape):
        flat = flat * size + coords[:, dim]
    return flat
