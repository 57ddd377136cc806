"""``StreamingSliceSampler``: newly completed windows of the stream first, then uniform slices."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from tdreplay.core import Storage
from tdreplay.core.utils import NestedKey, check_required_count

from ._slice_output import INIT_KEY
from ._slicing import draw_trajectories, slice_shape
from ._storage_entries import ends_array, ids_array, key_name
from ._stream_windows import StreamWindows, WindowLengthError
from .slice import SliceSampler

__all__ = ["StreamingSliceSampler", "WindowLengthError"]


class StreamingSliceSampler(SliceSampler):
    """Slices that serve newly completed windows of the stream first (TorchRL's
    ``StreamingSliceSampler``).

    Written steps are cut, in write order, into non-overlapping windows of ``slice_len``
    consecutive steps that never cross a trajectory boundary (a change of trajectory id, a
    step whose end flag is set, a stored ``is_init`` flag); a window is queued once it is
    complete, and a window left unfinished by one write is continued by the next. ``sample``
    returns queued windows first, oldest first, each once, and fills the rest of the batch with
    uniform slices drawn as :class:`SliceSampler` draws them. A queued window whose slots were
    overwritten before it was sampled is dropped (every slot carries a write count). The queue
    holds at most ``capacity // slice_len`` windows, as many disjoint windows as the buffer can
    hold.

    Windows and uniform slices alike are marked truncated at their last step and, when the
    data has ``is_init``, marked ``init_key`` at their first (see :class:`SliceSampler`).

    Meant for one-dimensional storages written in time order, e.g. one buffer per environment
    stream. A sampler is told which slots were written, not what they hold: writes are cut into
    windows at the next ``sample``, which reads their boundary signals from the storage (the
    storage, its dimensions and its capacity are checked there too, where TorchRL checks them
    on every write). Steps overwritten before the next ``sample`` (more steps written between
    two samples than the buffer holds, or index assignment) can then no longer be read: they
    are taken to hold no boundary, and their windows are dropped. So the windows are TorchRL's
    unless a step overwritten before the next ``sample`` ended a trajectory, or the buffer laps
    between two samples (writes overwritten whole then start the stream anew).

    Parameters
    ----------
    slice_len : int
        Steps of every window and slice; the batch size must be divisible by it.
    end_key, end_keys, traj_key, trajectory_key, cache_values, truncated_key, strict_length,
    pad_output, compile, span, use_gpu
        As :class:`SliceSampler` (``trajectory_key``: an alias of ``traj_key``); they apply
        to the uniform slices, and the trajectory ids and end flags also cut the windows.
        ``strict_length``, ``pad_output`` and ``span`` only change the uniform slices
        (windows are always ``slice_len`` steps).
    init_key : NestedKey or None
        Info entry marking the first step of every window and slice (OR-ed with the stored
        flags; nothing when the data has no such entry). ``None``: the stored flags are left
        untouched (models that reset their state wherever ``is_init`` is set). Defaults to
        ``"is_init"``.

    Examples
    --------
    TorchRL's example: six steps without a boundary make two windows, the first batch.

    >>> from tensordict import TensorDict
    >>> from tdreplay.core import TensorDictReplayBuffer
    >>> from tdreplay.storages import LazyTensorStorage
    >>> rb = TensorDictReplayBuffer(
    ...     storage=LazyTensorStorage(16),
    ...     sampler=StreamingSliceSampler(slice_len=3),
    ...     batch_size=6,
    ... )
    >>> done = torch.zeros(6, 1, dtype=torch.bool)
    >>> _ = rb.extend(TensorDict({"value": torch.arange(6), ("next", "done"): done}, [6]))
    >>> rb.sample()["value"].reshape(2, 3)
    tensor([[0, 1, 2],
            [3, 4, 5]])

    The queue is empty now: the next batch is made of uniform slices. Two more steps
    complete the window that step 6 started.

    >>> rb.sample()["value"].reshape(2, 3).diff(dim=1).eq(1).all().item()
    True
    >>> _ = rb.extend(TensorDict({"value": torch.arange(6, 7), ("next", "done"): done[:1]}, [1]))
    >>> _ = rb.extend(TensorDict({"value": torch.arange(7, 9), ("next", "done"): done[:2]}, [2]))
    >>> rb.sample()["value"].reshape(2, 3)[0].tolist()
    [6, 7, 8]
    """

    stateful_draws = True  # the queue position

    def __init__(
        self,
        *,
        slice_len: int,
        end_key: NestedKey | None = None,
        end_keys: Sequence[NestedKey] | None = None,
        traj_key: NestedKey | None = None,
        trajectory_key: NestedKey | None = None,
        cache_values: bool = False,
        truncated_key: NestedKey | None = ("next", "truncated"),
        init_key: NestedKey | None = INIT_KEY,
        strict_length: bool = True,
        pad_output: bool = False,
        compile: bool | dict = False,
        span: bool | int | tuple[bool | int, bool | int] = False,
        use_gpu: bool | torch.device = False,
    ) -> None:
        length = check_required_count(slice_len, "slice_len", 1)
        super().__init__(slice_len=length, end_key=end_key,
                         end_keys=end_keys, traj_key=traj_key, trajectory_key=trajectory_key,
                         cache_values=cache_values,
                         truncated_key=truncated_key, init_key=init_key,
                         strict_length=strict_length, pad_output=pad_output, compile=compile,
                         span=span, use_gpu=use_gpu)
        self._stream = StreamWindows(length)

    # ---- writes --------------------------------------------------------------------------------
    def extend(self, index: torch.Tensor) -> None:
        super().extend(index)
        self._stream.note_write(index)

    def mark_update(self, index: torch.Tensor, *, storage: Storage | None = None) -> None:
        """Slots overwritten by index assignment: new steps of the stream (as in TorchRL, where
        every write is such an update); their old windows are dropped."""
        super().mark_update(index)
        self._stream.note_write(index)

    def empty(self) -> None:
        super().empty()
        self._stream.reset()

    # ---- sampling ------------------------------------------------------------------------------
    def draw_mark(self) -> int:
        """The queue position: :meth:`undo_draws` queues the windows taken since again."""
        return self._stream.q_start

    def undo_draws(self, mark: int) -> None:
        self._stream.rewind(mark)

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[str, Any]]:
        num_slices, seq_len = slice_shape(batch_size, None, self.slice_len)
        self._check_stream_storage(storage)
        self._check_sampleable(storage, seq_len)
        index = self._sync(storage)
        self._catch_up(storage)
        windows, position = self._stream.take(num_slices)
        k = windows.shape[0]
        slots = torch.from_numpy(windows.reshape(-1))
        ends = np.arange(seq_len - 1, k * seq_len, seq_len)
        padded = self.pad_output and k > 0  # (a mask, all True for windows, as TorchRL)
        if k < num_slices:
            records = draw_trajectories(index, num_slices - k, seq_len, self.strict_length,
                                        self._randint)
            more, more_ends, short = self._cut_slices(index, records, seq_len, self.span)
            slots = torch.cat([slots, more])
            ends = np.concatenate([ends, more_ends + k * seq_len])
            padded = padded or short
        out = self._output(storage, slots, ends, seq_len if padded else None)
        self._stream.q_start = position  # the windows are taken once the batch is made
        return out

    def can_sample(self, storage: Storage, batch_size: int) -> bool:
        """As :meth:`SliceSampler.can_sample` (TorchRL's answer: a stored trajectory can hold
        a slice; queued windows are not counted), and ``False`` for a storage this sampler
        refuses (not one-dimensional, or smaller than a window), where :meth:`sample` raises
        (TorchRL refuses it at the write). Changes nothing: the writes are cut into windows at
        the next :meth:`sample`.

        Examples
        --------
        >>> from tdreplay.storages import LazyTensorStorage
        >>> from tensordict import TensorDict
        >>> storage = LazyTensorStorage(16)
        >>> storage.set(torch.arange(3), TensorDict({"episode": torch.zeros(3)}, [3]))
        >>> sampler = StreamingSliceSampler(slice_len=3, traj_key="episode")
        >>> sampler.can_sample(storage, 3), sampler.can_sample(storage, 6)
        (True, True)
        >>> StreamingSliceSampler(slice_len=4, traj_key="episode").can_sample(storage, 4)
        False
        """
        try:
            self._check_stream_storage(storage)
        except (RuntimeError, ValueError):
            return False
        return super().can_sample(storage, batch_size)

    def _check_stream_storage(self, storage: Storage) -> None:
        ndim = storage.ndim
        if ndim != 1:
            raise RuntimeError(f"{type(self).__name__} requires a one-dimensional storage, got "
                               f"ndim={ndim}.")
        if storage.max_size < self._stream.window:
            raise ValueError(f"the storage holds {storage.max_size} steps, fewer than one "
                             f"slice_len={self.slice_len} window.")

    def _catch_up(self, storage: Storage) -> None:
        """Cut the writes logged since the last batch into windows. Every signal is read
        before the windows change, so a read that fails (e.g. trajectory ids that are not
        whole numbers) changes nothing."""
        to_read, fresh = self._stream.unread()
        if not fresh:
            return
        n = to_read.size
        ids = None
        done = np.zeros(n, dtype=np.bool_)
        init = np.zeros(n, dtype=np.bool_)
        if n:
            slots = torch.from_numpy(to_read)
            assert self._signals is not None  # resolved by _sync
            traj = self._signals[0]
            if traj is not None:
                ids = ids_array(self._gather(storage, traj, slots), key_name(traj))
            for key in self._end_keys:
                flags = self._entries.gather(storage, key, slots)
                if flags is not None:
                    done |= ends_array(flags, key_name(key))
            stored = self._entries.gather(storage, INIT_KEY, slots)
            if stored is not None:
                init = stored.reshape(n, -1).ne(0).any(-1).cpu().numpy()
        self._stream.absorb(fresh, ids=ids, done=done, init=init, capacity=storage.max_size)

    def _gather(self, storage: Storage, key: Any, slots: torch.Tensor) -> torch.Tensor:
        values = self._entries.gather(storage, key, slots)
        assert values is not None  # a resolved signal is stored
        return values

    # ---- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), **self._stream.state_dict()}

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().check_state_dict(state_dict)
        self._stream.check_state_dict(state_dict)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.check_state_dict(state_dict)
        self._load_index(state_dict["index"])
        self._stream.load_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._repr_args()}, span={self.span})"
