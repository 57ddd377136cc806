"""``ReplayBufferTrainer``: the hook that feeds a replay buffer and samples from it."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDictBase, is_tensor_collection, pad

from tdreplay.core import ReplayBuffer, TensorDictReplayBuffer
from tdreplay.core.trajectory_bounds import marked_truncated
from tdreplay.core.utils import NotATensorDictError, check_flag

from .hooks import TrainerHookBase
from .trainer import MASK_KEY

if TYPE_CHECKING:  # pragma: no cover
    from .trainer import Trainer


class ReplayBufferTrainer(TrainerHookBase):
    """Replay buffer hook provider: write collected batches, sample optimisation batches,
    update priorities from the loss.

    Parameters
    ----------
    replay_buffer : ReplayBuffer
        The buffer. A :class:`~tdreplay.core.TensorDictReplayBuffer` with a prioritized sampler
        gets its priorities updated from the loss; a plain ``ReplayBuffer`` with a prioritized
        sampler is refused (``ValueError``: it cannot read priorities from a batch), as TorchRL's.
    batch_size : int, optional
        Size of the sampled batches. Defaults to the buffer's own ``batch_size`` (one of the two
        must be set, unless ``iterate``).
    memmap : bool
        Write each batch through memory-mapped tensors (:meth:`TensorDictBase.memmap`), so a
        storage that keeps references (``ListStorage``) holds it on disk, not in RAM.
    device : torch.device, str or int, optional
        Where sampled batches are placed. Default ``None``: where the buffer returns them.
    flatten_tensordicts : bool
        Flatten collected batches before writing: keep the frames where
        ``("collector", "mask")`` is True; without a mask, reshape the ``[envs, T]`` batch to one
        dimension, first marking the last step of each environment's row as truncated
        (``("next", "truncated")``, and ``("next", "done")`` with it, where the batch has them),
        so the rows of two environments never read as one trajectory. Default ``False``.
    max_dims : sequence of int, optional
        Only when ``flatten_tensordicts`` is False (with it, accepted with a ``UserWarning`` and
        not used, as TorchRL's ignores it): pad each batch dimension ``d`` at its end up
        to ``max_dims[d]`` (``-1``: leave that dimension as it is), so batches of varying shape
        fit one storage. Padded frames are zeros (a mask entry is False there).
    iterate : bool
        Draw optimisation batches by iterating over the buffer (``iter(replay_buffer)``)
        instead of sampling: when an iteration ends, :meth:`sample` raises ``StopIteration``
        and the next call starts a new one. Default ``False``.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> from tdreplay.core import ListStorage
    >>> rb = TensorDictReplayBuffer(storage=ListStorage(100))
    >>> rb_trainer = ReplayBufferTrainer(rb, batch_size=4, flatten_tensordicts=True)
    >>> collected = TensorDict({"obs": torch.arange(6.0).reshape(2, 3),
    ...                         ("collector", "mask"): torch.tensor([[1, 1, 1], [1, 0, 0]]).bool()},
    ...                        [2, 3])
    >>> rb_trainer.extend(collected).batch_size  # what was written
    torch.Size([4])
    >>> len(rb), sorted(rb[:]["obs"].tolist())
    (4, [0.0, 1.0, 2.0, 3.0])
    >>> rb_trainer.sample(collected).batch_size
    torch.Size([4])

    In a trainer, :meth:`register` places the ops (``trainer.register_op("batch_process",
    rb_trainer.extend)``, ``("process_optim_batch", rb_trainer.sample)``,
    ``("post_loss", rb_trainer.update_priority)``) and saves the buffer with the trainer.
    """

    def __init__(
        self,
        replay_buffer: ReplayBuffer,
        batch_size: int | None = None,
        memmap: bool = False,
        device: torch.device | str | int | None = None,
        flatten_tensordicts: bool = False,
        max_dims: Sequence[int] | None = None,
        iterate: bool = False,
    ) -> None:
        memmap = check_flag(memmap, "memmap")
        flatten_tensordicts = check_flag(flatten_tensordicts, "flatten_tensordicts")
        iterate = check_flag(iterate, "iterate")
        if not isinstance(replay_buffer, ReplayBuffer):
            raise TypeError(f"replay_buffer must be a ReplayBuffer, got "
                            f"{type(replay_buffer).__name__}.")
        if replay_buffer.sampler.is_prioritized and not isinstance(replay_buffer,
                                                                   TensorDictReplayBuffer):
            raise ValueError("a prioritized sampler needs a TensorDictReplayBuffer here: the "
                             "hook updates priorities from the loss's batch "
                             "(update_tensordict_priority), which a plain ReplayBuffer lacks.")
        if batch_size is not None and (isinstance(batch_size, bool)
                                       or not isinstance(batch_size, int) or batch_size <= 0):
            raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}.")
        if batch_size is None and replay_buffer.batch_size is None and not iterate:
            raise ValueError("batch_size is None and the replay buffer has no batch_size: set "
                             "one of them.")
        if max_dims is not None:
            if flatten_tensordicts:  # (TorchRL's takes it and ignores it, without a word)
                warnings.warn("max_dims has no effect with flatten_tensordicts=True: batches are "
                              "flattened, not padded (as TorchRL's ReplayBufferTrainer takes "
                              "it).", UserWarning, stacklevel=2)
            if isinstance(max_dims, (str, bytes)) or not isinstance(max_dims, Sequence):
                raise TypeError(f"max_dims must be a sequence of ints (one per batch dim), got "
                                f"{type(max_dims).__name__}.")
            max_dims = tuple(max_dims)
            if not all(isinstance(d, int) and not isinstance(d, bool) and (d == -1 or d > 0)
                       for d in max_dims):
                raise ValueError(f"max_dims must hold positive ints or -1, got {max_dims!r}.")
        self.replay_buffer = replay_buffer
        self.batch_size = batch_size
        self.memmap = memmap
        try:
            self.device = None if device is None else torch.device(device)
        except (RuntimeError, TypeError) as err:
            raise ValueError(f"device must be a torch device (e.g. 'cpu', 'cuda:0') or None, "
                             f"got {device!r}.") from err
        self.flatten_tensordicts = flatten_tensordicts
        self.max_dims = max_dims
        self.iterate = iterate
        self._batches: Iterator[Any] | None = None  # the iteration in progress (iterate=True)

    # ---- the ops -----------------------------------------------------------------------------
    def _flatten(self, batch: TensorDictBase) -> TensorDictBase:
        mask = batch.get(MASK_KEY, None)
        if mask is None:
            return _rows_cut(batch).reshape(-1)
        if mask.dtype != torch.bool or mask.shape != batch.batch_size:
            raise ValueError(f"{MASK_KEY} must be a bool tensor of the batch's shape "
                             f"{tuple(batch.batch_size)}, got {mask.dtype} of shape "
                             f"{tuple(mask.shape)}.")
        return _rows_cut(batch, mask)[mask]

    def _pad(self, batch: TensorDictBase, max_dims: tuple[int, ...]) -> TensorDictBase:
        if len(max_dims) != batch.batch_dims:
            raise ValueError(f"max_dims has {len(max_dims)} entries but the batch has "
                             f"{batch.batch_dims} dimensions {tuple(batch.batch_size)}.")
        pad_size = []
        for d, (size, limit) in enumerate(zip(batch.batch_size, max_dims)):
            if limit != -1 and size > limit:
                raise ValueError(f"batch dimension {d} has size {size}, more than "
                                 f"max_dims[{d}]={limit}.")
            pad_size += [0, 0 if limit == -1 else limit - size]
        return pad(batch, pad_size) if any(pad_size) else batch

    def extend(self, batch: TensorDictBase) -> TensorDictBase:
        """Write ``batch`` into the buffer (flattened or padded first, see the parameters) and
        return what was written, as TorchRL's: registered at ``"batch_process"``, it replaces
        the batch the next ops see. ``batch`` itself is left as it was.

        A batch that is not a TensorDict (a tensor, for a plain ``ReplayBuffer``) is written as
        it is, as TorchRL's; with ``flatten_tensordicts``, ``max_dims`` or ``memmap``, which
        need a TensorDict, it raises ``NotATensorDictError`` (a ``TypeError`` and a
        ``ValueError``) naming the option, and nothing is written.
        """
        if not is_tensor_collection(batch):
            needs = [name for name, on in (("flatten_tensordicts", self.flatten_tensordicts),
                                           ("max_dims", self.max_dims is not None),
                                           ("memmap", self.memmap)) if on]
            if needs:
                raise NotATensorDictError(
                    f"extend: {' and '.join(needs)} need a TensorDict batch, got "
                    f"{type(batch).__name__}.")
            self.replay_buffer.extend(batch)
            return batch
        if self.flatten_tensordicts:
            batch = self._flatten(batch)
        elif self.max_dims is not None:
            batch = self._pad(batch, self.max_dims)
        if self.memmap:
            batch = batch.memmap()
        self.replay_buffer.extend(batch)
        return batch

    def sample(self, batch: TensorDictBase | None = None) -> TensorDictBase:
        """Sample a batch of ``batch_size`` from the buffer (the next batch of the iteration,
        with ``iterate``), placed on ``device`` when one was given.

        ``batch`` (the collected batch the trainer passes) is not used.
        """
        if self.iterate:
            if self._batches is None:
                self._batches = iter(self.replay_buffer)
            try:
                sample = next(self._batches)
            except StopIteration:
                self._batches = None  # (the next call starts a new iteration)
                raise
        else:
            sample = self.replay_buffer.sample(self.batch_size)
        return sample if self.device is None else sample.to(self.device)

    def update_priority(self, batch: TensorDictBase) -> None:
        """Update the priorities of the sampled slots from ``batch[replay_buffer.priority_key]``.

        The trainer runs ``post_loss`` ops on the sub-batch after writing the loss's
        per-sample outputs into it, so this reads the priorities the loss just computed, at
        the slots in ``batch["index"]``. Does nothing for a buffer that is not prioritized.
        """
        if isinstance(self.replay_buffer, TensorDictReplayBuffer):
            self.replay_buffer.update_tensordict_priority(batch)

    # ---- registration and state --------------------------------------------------------------
    def register(self, trainer: Trainer, name: str = "replay_buffer") -> None:
        """Register :meth:`extend` at ``"batch_process"``, :meth:`sample` at
        ``"process_optim_batch"``, :meth:`update_priority` at ``"post_loss"``, and this hook as
        module ``name`` (so the buffer is saved with the trainer).

        To place an op elsewhere, use ``trainer.register_op`` instead.
        """
        trainer.register_op("batch_process", self.extend)
        trainer.register_op("process_optim_batch", self.sample)
        trainer.register_op("post_loss", self.update_priority)
        trainer.register_module(name, self)

    def state_dict(self) -> dict[str, Any]:
        """The buffer's whole state (storage, sampler, writer)."""
        return {"replay_buffer": self.replay_buffer.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not isinstance(state_dict, dict):
            raise TypeError(f"ReplayBufferTrainer state_dict must be a dict, got "
                            f"{type(state_dict).__name__}.")
        if "replay_buffer" not in state_dict:
            raise ValueError("ReplayBufferTrainer state_dict is missing 'replay_buffer'.")
        self.replay_buffer.load_state_dict(state_dict["replay_buffer"])

    def dumps(self, path: str | os.PathLike) -> None:
        """Save the buffer with its own atomic checkpoint format (used by ``Trainer.dumps``)."""
        self.replay_buffer.dumps(path)

    def loads(self, path: str | os.PathLike) -> None:
        """Restore the buffer from :meth:`dumps`; a bad checkpoint leaves it unchanged."""
        self.replay_buffer.loads(path)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(batch_size={self.batch_size}, device={self.device}, "
                f"flatten_tensordicts={self.flatten_tensordicts}, max_dims={self.max_dims}, "
                f"memmap={self.memmap}, iterate={self.iterate}, "
                f"replay_buffer={type(self.replay_buffer).__name__})")


def _rows_cut(batch: TensorDictBase, mask: torch.Tensor | None = None) -> TensorDictBase:
    """``batch`` (``[envs, T]``, time last) with the last step of each environment's row
    marked truncated (and done, which is terminated or truncated), in copies of those entries
    (``batch`` itself unchanged), so that flattened, each row still ends a trajectory. With a
    ``mask`` (the collector's, of the batch's shape), the last step of each run of valid steps
    is marked: the steps the mask drops are not there to end it (in a ``[T]`` batch of one
    environment, all but the batch's last step, which the next batch continues). A batch
    without a ``("next", "truncated")`` entry is returned as it is, as TorchRL does (a done
    flag alone would read as a termination)."""
    truncated = batch.get(("next", "truncated"), None)
    if not batch.batch_dims or not isinstance(truncated, torch.Tensor) \
            or (mask is None and batch.batch_dims < 2):
        return batch
    if mask is None:
        ends: Any = (slice(None),) * (batch.batch_dims - 1) + (-1,)  # each row's last step
    else:  # a valid step whose next one in its row is not (or is the row's last)
        ends = mask.clone()
        ends[..., :-1] &= ~mask[..., 1:]
        if batch.batch_dims == 1:  # (one environment: its last step goes on in the next batch)
            ends[-1] = False
    return marked_truncated(batch, ends)
