"""``Trainer``: a collection loop and an optimisation loop that run hooks at named places."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase, is_tensor_collection
from tqdm.auto import tqdm

from tdreplay.core.utils import check_flag

from ._checkpoint import CheckpointMethods
from ._loop import (
    MASK_KEY,
    check_trainer_arguments,
    count_frames,
    run_optim_steps,
    seed_everything,
)
from ._ops import HOOK_DESTINATIONS, OpRegistry
from ._progress import Progress, ScalarLog
from ._saved_parameters import unsaved_parameters
from ._state import TrainerState
from .hooks import OptimizerHook

__all__ = ["HOOK_DESTINATIONS", "MASK_KEY", "Trainer"]



class Trainer(CheckpointMethods):
    """A training loop with hooks: collect a batch, process it, run optimisation steps, log.

    ``train()`` runs, for every batch the ``collector`` yields::

        batch = batch_process(batch)              # ops may return a new batch
        frames += number of valid frames * frame_skip
        pre_steps_log(batch)                      # ops return a dict of values to log, or None
        if frames >= collector.init_random_frames (0 when absent; TorchRL's test):
            pre_optim_steps()
            repeat optim_steps_per_batch times:
                sub_batch = process_optim_batch(batch)   # ops may return a new sub-batch
                losses = loss_module(sub_batch)
                post_loss(sub_batch)                     # sees the loss's per-sample outputs
                losses = optimizer(losses)               # default: backward, clip, step
                post_optim()
                post_optim_log(sub_batch)
            log the mean of each scalar loss entry and ``optim_steps``
        post_steps()
        post_steps_log(batch)
        save the trainer every ``save_trainer_interval`` frames (and at the end)

    Parameters
    ----------
    collector : iterable of TensorDict
        The data source: each item is one collected batch. ``("collector", "mask")``, when
        present, marks the valid frames (only those are counted). Optional methods used when
        present: ``set_seed(seed)``, ``state_dict()`` / ``load_state_dict()`` (saved with the
        trainer), ``shutdown()`` (called by :meth:`shutdown`), attribute ``init_random_frames``.
    total_frames : int, optional
        Stop once this many frames have been collected (counted across resumes). ``None`` runs
        until the collector is exhausted.
    frame_skip : int
        Each collected frame counts as this many frames.
    optim_steps_per_batch : int
        Optimisation steps after each collected batch.
    loss_module : callable
        ``loss_module(sub_batch) -> TensorDict`` whose ``"loss_*"`` entries (scalars) are summed
        and minimised. Other entries with the sub-batch's leading shape (for instance
        ``"td_error"``, the new priorities) are written into the sub-batch before the
        ``post_loss`` ops run, so a priority update finds them whether the loss returns them or
        writes them into its input (as TorchRL losses do). Its ``state_dict`` is saved.
    optimizer : torch.optim.Optimizer, optional
        When given, an :class:`~tdreplay.trainers.OptimizerHook` is registered as the
        ``"optimizer"`` op and as module ``"optimizer"`` (its state is checkpointed). Without
        it, register an ``"optimizer"`` op yourself before training.
    logger : object, optional
        Anything with ``log_scalar(name, value, step=...)``; gets every logged value at most
        once per ``log_interval`` frames per name.
    clip_grad_norm, clip_norm
        Gradient clipping of the default optimizer op (see
        :class:`~tdreplay.trainers.OptimizerHook`); ``clip_norm=None`` does not clip.
    progress_bar : bool
        Show a tqdm bar of collected frames, with the values logged with ``log_pbar=True``.
    seed : int, optional
        Seeds torch, numpy, :mod:`random` and the collector (``collector.set_seed``).
    save_trainer_interval : int
        Frames between two saves to ``save_trainer_file``.
    log_interval : int
        Frames between two calls of the logger for the same name.
    save_trainer_file : str or path, optional
        Where :meth:`save_trainer` writes. A path ending in ``.pt`` / ``.pth`` is one
        :func:`torch.save` file of :meth:`state_dict`; any other path is an atomic checkpoint
        directory (see :meth:`dumps`), where registered modules that have ``dumps`` / ``loads``
        (replay buffers) save themselves with their own crash-safe format.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> from torch import nn
    >>> _ = torch.manual_seed(0)
    >>> x = torch.linspace(-1, 1, 8).unsqueeze(-1)
    >>> collector = [TensorDict({"x": x, "y": 3 * x}, [8]) for _ in range(50)]
    >>> model = nn.Linear(1, 1)
    >>> def loss_module(batch):
    ...     return TensorDict({"loss_mse": ((model(batch["x"]) - batch["y"]) ** 2).mean()}, [])
    >>> trainer = Trainer(collector=collector, optim_steps_per_batch=4, loss_module=loss_module,
    ...                   optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
    ...                   progress_bar=False)
    >>> trainer.train()
    >>> trainer.collected_frames, trainer.optim_count, round(model.weight.item(), 2)
    (400, 200, 3.0)
    """

    def __init__(
        self,
        *,
        collector: Iterable[TensorDictBase],
        total_frames: int | None = None,
        frame_skip: int = 1,
        optim_steps_per_batch: int,
        loss_module: Callable[[TensorDictBase], TensorDictBase],
        optimizer: torch.optim.Optimizer | None = None,
        logger: Any = None,
        clip_grad_norm: bool = True,
        clip_norm: float | None = None,
        progress_bar: bool = True,
        seed: int | None = None,
        save_trainer_interval: int = 10000,
        log_interval: int = 10000,
        save_trainer_file: str | os.PathLike[str] | None = None,
    ) -> None:
        clip_grad_norm = check_flag(clip_grad_norm, "clip_grad_norm")
        progress_bar = check_flag(progress_bar, "progress_bar")
        check_trainer_arguments(
            collector=collector, total_frames=total_frames, frame_skip=frame_skip,
            optim_steps_per_batch=optim_steps_per_batch, loss_module=loss_module, logger=logger,
            clip_norm=clip_norm, seed=seed, save_trainer_interval=save_trainer_interval,
            log_interval=log_interval, save_trainer_file=save_trainer_file)
        self.collector = collector
        self.total_frames = total_frames
        self.frame_skip = frame_skip
        self.optim_steps_per_batch = optim_steps_per_batch
        self.optimizer = optimizer
        self.clip_grad_norm = clip_grad_norm
        self.clip_norm = clip_norm
        self.progress_bar = progress_bar
        self.seed = seed
        self.save_trainer_interval = save_trainer_interval
        self.save_trainer_file = None if save_trainer_file is None else Path(save_trainer_file)

        self._ops = OpRegistry()
        self._progress = Progress()
        self._log = ScalarLog(logger, log_interval, self._progress)
        self._state = TrainerState(self._progress, loss_module, collector)
        self._pbar: Any = None

        if optimizer is not None:
            OptimizerHook(optimizer, clip_grad_norm=clip_grad_norm,
                          clip_norm=clip_norm).register(self)
        if seed is not None:
            self.set_seed()

    # ---- settings and counters -----------------------------------------------------------------
    @property
    def loss_module(self) -> Callable[[TensorDictBase], TensorDictBase]:
        """The loss: ``loss_module(sub_batch) -> TensorDict`` (saved with the trainer)."""
        return self._state.loss_module

    @loss_module.setter
    def loss_module(self, value: Callable[[TensorDictBase], TensorDictBase]) -> None:
        self._state.loss_module = value

    @property
    def logger(self) -> Any:
        """What gets the logged values (``log_scalar(name, value, step=...)``), or ``None``."""
        return self._log.logger

    @logger.setter
    def logger(self, value: Any) -> None:
        self._log.logger = value

    @property
    def log_interval(self) -> int:
        """Frames between two calls of the logger for the same name."""
        return self._log.log_interval

    @log_interval.setter
    def log_interval(self, value: int) -> None:
        self._log.log_interval = value

    @property
    def collected_frames(self) -> int:
        """Frames collected so far (restored by :meth:`load_state_dict`)."""
        return self._progress.collected_frames

    @property
    def optim_count(self) -> int:
        """Optimisation steps done so far."""
        return self._progress.optim_count

    @property
    def latest_logged(self) -> dict[str, Any]:
        """The last value logged under each name (a copy)."""
        return self._log.latest

    @property
    def pbar_values(self) -> dict[str, Any]:
        """The values logged with ``log_pbar=True``, shown on the progress bar (a copy)."""
        return self._log.pbar_values

    def set_seed(self) -> None:
        """Seed torch, numpy, :mod:`random` and the collector with ``seed``."""
        if self.seed is None:
            raise ValueError("set_seed needs the trainer's seed to be set.")
        seed_everything(self.seed, self.collector)

    # ---- registration ------------------------------------------------------------------------
    def register_op(self, dest: str, op: Callable[..., Any], **kwargs: Any) -> None:
        """Run ``op`` at place ``dest`` of every iteration; ``kwargs`` are passed on each call.

        Ops of one place run in registration order. What they receive and what their return
        value does:

        - ``"batch_process"`` ``op(batch)``: a returned TensorDict replaces the batch.
        - ``"process_optim_batch"`` ``op(batch)``: the first op gets the collected batch, each
          next one the previous op's returned TensorDict; the last result is the sub-batch.
        - ``"post_loss"`` ``op(sub_batch)``: return ignored.
        - ``"optimizer"`` ``op(losses)``: a returned TensorDict replaces the losses.
        - ``"pre_optim_steps"``, ``"post_optim"``, ``"post_steps"`` ``op()``: return ignored.
        - ``"pre_steps_log"``, ``"post_steps_log"`` ``op(batch)``, ``"post_optim_log"``
          ``op(sub_batch)``: return a dict of values to log, or None; its boolean entry
          ``"log_pbar"`` shows the values on the progress bar.

        Raises
        ------
        ValueError
            When ``dest`` is not one of :data:`HOOK_DESTINATIONS`.

        Examples
        --------
        >>> trainer = Trainer(collector=[], optim_steps_per_batch=0, loss_module=lambda td: td,
        ...                   progress_bar=False)
        >>> trainer.register_op("post_steps", print, end="!\\n")
        >>> trainer.register_op("after_everything", print)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: unknown hook destination 'after_everything'; expected one of batch_process, ...
        """
        self._ops.register(dest, op, **kwargs)

    def registered_ops(self, dest: str) -> list[Callable[..., Any]]:
        """The ops registered at ``dest``, in the order they run (a new list).

        Examples
        --------
        >>> trainer = Trainer(collector=[], optim_steps_per_batch=0, loss_module=lambda td: td,
        ...                   progress_bar=False)
        >>> trainer.register_op("post_steps", print)
        >>> trainer.registered_ops("post_steps") == [print], trainer.registered_ops("post_loss")
        (True, [])
        """
        return self._ops.ops(dest)

    def register_module(self, module_name: str, module: Any) -> None:
        """Save ``module`` with the trainer under ``module_name``.

        ``module`` needs ``state_dict`` / ``load_state_dict``, or ``dumps(path)`` /
        ``loads(path)`` (used in checkpoint directories in preference to ``state_dict``, so a
        replay buffer writes its own crash-safe format).

        Examples
        --------
        >>> trainer = Trainer(collector=[], optim_steps_per_batch=0, loss_module=lambda td: td,
        ...                   progress_bar=False)
        >>> trainer.register_module("scale", torch.nn.Linear(1, 1))
        >>> trainer.register_module("scale", torch.nn.Linear(1, 1))
        Traceback (most recent call last):
        ...
        ValueError: a module named 'scale' is already registered; choose another name.
        """
        self._state.register_module(module_name, module)

    @property
    def modules(self) -> dict[str, Any]:
        """Registered modules by name (a copy)."""
        return self._state.modules

    # ---- the loops ---------------------------------------------------------------------------
    def _check_optimizer(self) -> None:
        if self.optim_steps_per_batch and not self._ops.has("optimizer"):
            raise RuntimeError("the trainer has no 'optimizer' op: pass optimizer=... or "
                               "register one with register_op('optimizer', ...).")

    def _check_parameters_saved(self) -> None:
        """With ``save_trainer_file``: ``ValueError`` before training when the checkpoints
        would miss parameters the optimizer updates (see :mod:`._saved_parameters`)."""
        if self.save_trainer_file is None:
            return
        missing = unsaved_parameters(self._state)
        if missing:
            shapes = ", ".join(str(tuple(p.shape)) for p in missing[:4])
            raise ValueError(
                f"the optimizer updates {len(missing)} parameter tensors ({shapes}"
                f"{', ...' if len(missing) > 4 else ''}) that the trainer's checkpoints would "
                "not hold: the loss module is not an nn.Module holding them and no registered "
                "module does, so a resumed run would pair the saved optimizer state with fresh "
                "weights. Register the network first: trainer.register_module('model', model) "
                "(or pass an nn.Module as loss_module).")

    def optim_steps(self, batch: TensorDictBase) -> None:
        """Run ``pre_optim_steps`` then ``optim_steps_per_batch`` optimisation steps on ``batch``
        and log the mean of every scalar entry of the losses."""
        self._check_optimizer()
        run_optim_steps(batch, self.optim_steps_per_batch, ops=self._ops,
                        loss_module=self.loss_module, progress=self._progress, log=self._log)

    def train(self) -> None:
        """Run the loop until ``total_frames`` frames are collected or the collector ends.

        Continues from :attr:`collected_frames` (so a loaded trainer resumes its count) and
        saves the trainer when it stops, if ``save_trainer_file`` is set.
        """
        self._check_optimizer()
        self._check_parameters_saved()
        progress, ops, log = self._progress, self._ops, self._log
        if self.total_frames is not None and progress.collected_frames >= self.total_frames:
            return
        init_random_frames = getattr(self.collector, "init_random_frames", 0) or 0
        self._pbar = tqdm(total=self.total_frames, initial=progress.collected_frames,
                          disable=not self.progress_bar, unit="frame", dynamic_ncols=True)
        try:
            for batch in self.collector:
                if not is_tensor_collection(batch):
                    raise TypeError(f"the collector must yield TensorDict batches, got "
                                    f"{type(batch).__name__}.")
                batch = ops.run_data("batch_process", batch)
                frames = count_frames(batch, self.frame_skip)
                progress.collected_frames += frames
                ops.run_log("pre_steps_log", batch, log.log)
                if progress.collected_frames >= init_random_frames:
                    self.optim_steps(batch)
                ops.run_plain("post_steps")
                ops.run_log("post_steps_log", batch, log.log)
                self._pbar.update(frames)
                pbar_values = log.pbar_values
                if pbar_values:
                    self._pbar.set_postfix(pbar_values, refresh=False)
                if self.total_frames is not None \
                        and progress.collected_frames >= self.total_frames:
                    break
                self.save_trainer()
            self.save_trainer(force_save=True)
        finally:
            self._pbar.close()
            self._pbar = None

    def write(self, message: str) -> None:
        """Print ``message`` without breaking the progress bar (for hooks that report)."""
        if self._pbar is not None and not self._pbar.disable:
            self._pbar.write(message)
        else:
            print(message, flush=True)

    def shutdown(self) -> None:
        """Shut the collector down (when it has a ``shutdown`` method)."""
        shutdown = getattr(self.collector, "shutdown", None)
        if callable(shutdown):
            shutdown()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(collected_frames={self.collected_frames}, "
                f"optim_count={self.optim_count}, total_frames={self.total_frames}, "
                f"optim_steps_per_batch={self.optim_steps_per_batch}, ops={self._ops.counts()}, "
                f"modules={list(self._state.modules)})")
