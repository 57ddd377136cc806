"""The parts of a trainer's loop that are plain functions: argument checks, seeding, the
optimisation steps after each collected batch, and counting frames."""

from __future__ import annotations

import os
import random
import warnings
from collections.abc import Callable, Iterable
from numbers import Number
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase, is_tensor_collection

from tdreplay.core.utils import check_count, check_required_count

from ._ops import OpRegistry
from ._progress import Progress, ScalarLog
from .hooks import LOSS_PREFIX, loss_keys

__all__ = ["MASK_KEY", "check_trainer_arguments", "count_frames", "run_optim_steps",
           "seed_everything"]

#: Entry of a collected batch that marks its valid frames (only those are counted).
MASK_KEY = ("collector", "mask")

#: The sample's slots, which the priority update after the loss reads.
_INDEX_KEY = "index"


def check_trainer_arguments(*, collector: Any, total_frames: Any, frame_skip: Any,
                            optim_steps_per_batch: Any, loss_module: Any, logger: Any,
                            clip_norm: Any, seed: Any, save_trainer_interval: Any,
                            log_interval: Any, save_trainer_file: Any = None) -> None:
    """Raise ``TypeError`` / ``ValueError`` naming the first bad argument of ``Trainer``."""
    if not isinstance(collector, Iterable):
        raise TypeError(f"collector must be an iterable of TensorDict batches, got "
                        f"{type(collector).__name__}.")
    check_count(total_frames, "total_frames", 1)
    check_required_count(frame_skip, "frame_skip", 1)
    check_required_count(optim_steps_per_batch, "optim_steps_per_batch", 0)
    if not callable(loss_module):
        raise TypeError(f"loss_module must be callable, got {type(loss_module).__name__}.")
    if logger is not None and not callable(getattr(logger, "log_scalar", None)):
        raise TypeError(f"logger must have a log_scalar(name, value, step=...) method, got "
                        f"{type(logger).__name__}.")
    check_count(seed, "seed", 0)
    if seed is not None and seed >= 2**64:  # (torch and numpy take seeds below 2**64, 2**32)
        raise ValueError(f"seed must be below 2**64 (torch's seeds are 64-bit), got {seed!r}.")
    check_required_count(save_trainer_interval, "save_trainer_interval", 1)
    if save_trainer_file is not None and not isinstance(save_trainer_file, (str, os.PathLike)):
        raise TypeError(f"save_trainer_file must be a str, a path or None, got "
                        f"{type(save_trainer_file).__name__}.")
    check_required_count(log_interval, "log_interval", 0)
    if clip_norm is not None and (isinstance(clip_norm, bool)
                                  or not isinstance(clip_norm, Number) or not clip_norm > 0):  # type: ignore[operator]
        raise ValueError(f"clip_norm must be a positive number or None, got {clip_norm!r}.")


def seed_everything(seed: int, collector: Any) -> None:
    """Seed torch, numpy, :mod:`random` and ``collector`` (its ``set_seed``, when it has one)."""
    set_seed = getattr(collector, "set_seed", None)
    if callable(set_seed):
        set_seed(seed)
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def count_frames(batch: TensorDictBase, frame_skip: int) -> int:
    """Valid frames of ``batch`` (``MASK_KEY`` when present, else all), times ``frame_skip``."""
    mask = batch.get(MASK_KEY, None)
    frames = int(mask.sum()) if mask is not None else batch.numel()
    return frames * frame_skip


def _attach_sample_outputs(sub_batch: TensorDictBase, losses: TensorDictBase) -> None:
    """Write the loss's per-sample outputs (e.g. new priorities) into the sub-batch; an
    ``index`` output other than the sample's own is refused (the priority update after the
    loss would go to its slots). An output with one value per sampled item but fewer dims than
    the sub-batch (``[B]`` for a ``[B, T]`` sample of ``[T]`` items) is not written, with a
    ``UserWarning`` naming it (a priority update then misses it)."""
    if not is_tensor_collection(sub_batch) or not sub_batch.batch_dims:
        return
    shape = sub_batch.batch_size
    for key, value in losses.items():
        if not isinstance(key, str) or key.startswith(LOSS_PREFIX) \
                or not isinstance(value, torch.Tensor):
            continue
        if value.shape[: len(shape)] != shape:
            if value.ndim and value.shape[0] == shape[0] and len(shape) > 1:
                warnings.warn(
                    f"the loss output {key!r} has shape {tuple(value.shape)}, which does not "
                    f"start with the sampled batch's {tuple(shape)}: it is not written into "
                    "the batch, so a priority update reading it there will not find it "
                    "(return one value per step, or expand it).", UserWarning, stacklevel=4)
            continue
        if key == _INDEX_KEY and _INDEX_KEY in sub_batch.keys():
            if not torch.equal(value, sub_batch.get(_INDEX_KEY)):
                raise ValueError(
                    f"the loss returned an {_INDEX_KEY!r} entry other than the sample's: "
                    f"{_INDEX_KEY!r} says which slots the priority update after the loss "
                    "goes to. Give that output another name. The optimizer step was "
                    "not taken.")
            continue
        sub_batch.set(key, value.detach())


def run_optim_steps(batch: TensorDictBase, steps: int, *, ops: OpRegistry,
                    loss_module: Callable[[TensorDictBase], TensorDictBase],
                    progress: Progress, log: ScalarLog) -> None:
    """``pre_optim_steps``, then ``steps`` optimisation steps on ``batch``; logs the mean of
    every scalar entry of the losses (see ``Trainer.optim_steps``). A ``process_optim_batch``
    hook that raises ``StopIteration`` or gives ``None`` (an epoch of the replay buffer is over:
    ``ReplayBufferTrainer(iterate=True)``) ends this batch's steps, as in TorchRL."""
    ops.run_plain("pre_optim_steps")
    sums: dict[str, float] = {}
    done = 0
    for _ in range(steps):
        try:
            sub_batch = ops.run_data("process_optim_batch", batch)
        except StopIteration:
            break
        if sub_batch is None:
            break
        progress.optim_count += 1
        done += 1
        losses = loss_module(sub_batch)
        if not is_tensor_collection(losses) or not loss_keys(losses):
            got = list(losses.keys()) if is_tensor_collection(losses) else losses
            raise TypeError(f"loss_module must return a TensorDict with at least one "
                            f"{LOSS_PREFIX!r} entry, got {got!r}.")
        _attach_sample_outputs(sub_batch, losses)
        ops.run_each("post_loss", sub_batch)
        losses = ops.run_data("optimizer", losses).detach()
        ops.run_plain("post_optim")
        ops.run_log("post_optim_log", sub_batch, log.log)
        for key, value in losses.items():
            if isinstance(key, str) and isinstance(value, torch.Tensor) and value.numel() == 1:
                sums[key] = sums.get(key, 0.0) + float(value)
    if done:
        means: dict[str, Any] = {k: v / done for k, v in sums.items()}
        log.log(optim_steps=progress.optim_count, **means)
