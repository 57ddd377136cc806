"""``Trainer``: a collection loop and an optimisation loop that run hooks at named places."""

from __future__ import annotations

import os
import pickle
import random
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from numbers import Number
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase, is_tensor_collection
from tqdm.auto import tqdm

from tdreplay.core.checkpoint import (
    CheckpointError,
    read_json,
    verify_checkpoint,
    write_checkpoint,
    write_json,
)

from .hooks import LOSS_PREFIX, OptimizerHook, loss_keys

#: Where ops can be registered, in the order a training iteration reaches them.
HOOK_DESTINATIONS: tuple[str, ...] = (
    "batch_process",
    "pre_steps_log",
    "pre_optim_steps",
    "process_optim_batch",
    "post_loss",
    "optimizer",
    "post_optim",
    "post_optim_log",
    "post_steps",
    "post_steps_log",
)

MASK_KEY = ("collector", "mask")
_FILE_SUFFIXES = (".pt", ".pth")
_MODULE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_TRACKED = ("collected_frames", "optim_count", "last_save", "last_log")


def _check_int(value: Any, name: str, *, minimum: int, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        expected = f"an int >= {minimum}" + (" or None" if allow_none else "")
        raise ValueError(f"{name} must be {expected}, got {value!r}.")


def _saves_with_dumps(module: Any) -> bool:
    return callable(getattr(module, "dumps", None)) and callable(getattr(module, "loads", None))


def _has_state_dict(module: Any) -> bool:
    return callable(getattr(module, "state_dict", None)) and callable(
        getattr(module, "load_state_dict", None))


def _to_log_value(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    return value


class Trainer:
    """A training loop with hooks: collect a batch, process it, run optimisation steps, log.

    ``train()`` runs, for every batch the ``collector`` yields::

        batch = batch_process(batch)              # ops may return a new batch
        frames += number of valid frames * frame_skip
        pre_steps_log(batch)                      # ops return a dict of values to log, or None
        if frames > collector.init_random_frames (0 when absent):
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
        save_trainer_file: str | os.PathLike | None = None,
    ) -> None:
        if not isinstance(collector, Iterable):
            raise TypeError(f"collector must be an iterable of TensorDict batches, got "
                            f"{type(collector).__name__}.")
        _check_int(total_frames, "total_frames", minimum=1, allow_none=True)
        _check_int(frame_skip, "frame_skip", minimum=1)
        _check_int(optim_steps_per_batch, "optim_steps_per_batch", minimum=0)
        if not callable(loss_module):
            raise TypeError(f"loss_module must be callable, got {type(loss_module).__name__}.")
        if logger is not None and not callable(getattr(logger, "log_scalar", None)):
            raise TypeError(f"logger must have a log_scalar(name, value, step=...) method, got "
                            f"{type(logger).__name__}.")
        _check_int(seed, "seed", minimum=0, allow_none=True)
        _check_int(save_trainer_interval, "save_trainer_interval", minimum=1)
        _check_int(log_interval, "log_interval", minimum=0)
        if clip_norm is not None and (isinstance(clip_norm, bool)
                                      or not isinstance(clip_norm, Number) or not clip_norm > 0):
            raise ValueError(f"clip_norm must be a positive number or None, got {clip_norm!r}.")

        self.collector = collector
        self.total_frames = total_frames
        self.frame_skip = frame_skip
        self.optim_steps_per_batch = optim_steps_per_batch
        self.loss_module = loss_module
        self.optimizer = optimizer
        self.logger = logger
        self.clip_grad_norm = bool(clip_grad_norm)
        self.clip_norm = clip_norm
        self.progress_bar = bool(progress_bar)
        self.seed = seed
        self.save_trainer_interval = save_trainer_interval
        self.log_interval = log_interval
        self.save_trainer_file = None if save_trainer_file is None else Path(save_trainer_file)

        self._ops: dict[str, list[tuple[Callable[..., Any], dict[str, Any]]]] = {
            dest: [] for dest in HOOK_DESTINATIONS
        }
        self._modules: dict[str, Any] = {}
        self._collected_frames = 0
        self._optim_count = 0
        self._last_save = 0
        self._last_log: dict[str, int] = {}
        self._pbar_values: dict[str, Any] = {}
        self._latest: dict[str, Any] = {}
        self._pbar: Any = None

        if optimizer is not None:
            OptimizerHook(optimizer, clip_grad_norm=clip_grad_norm,
                          clip_norm=clip_norm).register(self)
        if seed is not None:
            self.set_seed()

    # ---- counters ----------------------------------------------------------------------------
    @property
    def collected_frames(self) -> int:
        """Frames collected so far (restored by :meth:`load_state_dict`)."""
        return self._collected_frames

    @property
    def optim_count(self) -> int:
        """Optimisation steps done so far."""
        return self._optim_count

    @property
    def latest_logged(self) -> dict[str, Any]:
        """The last value logged under each name (a copy)."""
        return dict(self._latest)

    def set_seed(self) -> None:
        """Seed torch, numpy, :mod:`random` and the collector with ``seed``."""
        if self.seed is None:
            raise ValueError("set_seed needs the trainer's seed to be set.")
        set_seed = getattr(self.collector, "set_seed", None)
        if callable(set_seed):
            set_seed(self.seed)
        torch.manual_seed(self.seed)
        np.random.seed(self.seed)
        random.seed(self.seed)

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
        if dest not in self._ops:
            raise ValueError(f"unknown hook destination {dest!r}; expected one of "
                             f"{', '.join(HOOK_DESTINATIONS)}.")
        if not callable(op):
            raise TypeError(f"op for {dest!r} must be callable, got {type(op).__name__}.")
        self._ops[dest].append((op, kwargs))

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
        if not isinstance(module_name, str) or not _MODULE_NAME.match(module_name):
            raise ValueError(f"module_name must be a non-empty name of letters, digits, '_', "
                             f"'.', '-' (not starting with '.' or '-'), got {module_name!r}.")
        if module_name in self._modules:
            raise ValueError(f"a module named {module_name!r} is already registered; choose "
                           f"another name.")
        if not (_has_state_dict(module) or _saves_with_dumps(module)):
            raise TypeError(f"module {module_name!r} ({type(module).__name__}) has neither "
                            f"state_dict/load_state_dict nor dumps/loads: it cannot be saved.")
        self._modules[module_name] = module

    @property
    def modules(self) -> dict[str, Any]:
        """Registered modules by name (a copy)."""
        return dict(self._modules)

    # ---- running hooks -----------------------------------------------------------------------
    def _run_data_ops(self, dest: str, data: Any) -> Any:
        for op, kwargs in self._ops[dest]:
            out = op(data, **kwargs)
            if is_tensor_collection(out):
                data = out
        return data

    def _run_plain_ops(self, dest: str) -> None:
        for op, kwargs in self._ops[dest]:
            op(**kwargs)

    def _run_log_ops(self, dest: str, batch: TensorDictBase) -> None:
        for op, kwargs in self._ops[dest]:
            result = op(batch, **kwargs)
            if result is None:
                continue
            if not isinstance(result, Mapping):
                raise TypeError(f"a {dest!r} op must return a dict of values to log or None; "
                                f"{op!r} returned {type(result).__name__}.")
            result = dict(result)
            self._log(log_pbar=bool(result.pop("log_pbar", False)), **result)

    def _log(self, log_pbar: bool = False, **values: Any) -> None:
        for key, value in values.items():
            value = _to_log_value(value)
            self._latest[key] = value
            if log_pbar:
                self._pbar_values[key] = value
            last = self._last_log.get(key)
            if self.logger is not None and (last is None or self._collected_frames - last
                                            >= self.log_interval):
                self._last_log[key] = self._collected_frames
                self.logger.log_scalar(key, value, step=self._collected_frames)

    def _count_frames(self, batch: TensorDictBase) -> int:
        mask = batch.get(MASK_KEY, None)
        frames = int(mask.sum()) if mask is not None else batch.numel()
        return frames * self.frame_skip

    # ---- the loops ---------------------------------------------------------------------------
    def optim_steps(self, batch: TensorDictBase) -> None:
        """Run ``pre_optim_steps`` then ``optim_steps_per_batch`` optimisation steps on ``batch``
        and log the mean of every scalar entry of the losses."""
        if self.optim_steps_per_batch and not self._ops["optimizer"]:
            raise RuntimeError("the trainer has no 'optimizer' op: pass optimizer=... or "
                               "register one with register_op('optimizer', ...).")
        self._run_plain_ops("pre_optim_steps")
        sums: dict[str, float] = {}
        for _ in range(self.optim_steps_per_batch):
            self._optim_count += 1
            sub_batch = self._run_data_ops("process_optim_batch", batch)
            losses = self.loss_module(sub_batch)
            if not is_tensor_collection(losses) or not loss_keys(losses):
                got = list(losses.keys()) if is_tensor_collection(losses) else losses
                raise TypeError(f"loss_module must return a TensorDict with at least one "
                                f"{LOSS_PREFIX!r} entry, got {got!r}.")
            self._attach_sample_outputs(sub_batch, losses)
            for op, kwargs in self._ops["post_loss"]:
                op(sub_batch, **kwargs)
            losses = self._run_data_ops("optimizer", losses).detach()
            self._run_plain_ops("post_optim")
            self._run_log_ops("post_optim_log", sub_batch)
            for key, value in losses.items():
                if isinstance(key, str) and isinstance(value, torch.Tensor) and value.numel() == 1:
                    sums[key] = sums.get(key, 0.0) + float(value)
        if self.optim_steps_per_batch:
            self._log(optim_steps=self._optim_count,
                      **{k: v / self.optim_steps_per_batch for k, v in sums.items()})

    @staticmethod
    def _attach_sample_outputs(sub_batch: TensorDictBase, losses: TensorDictBase) -> None:
        """Write the loss's per-sample outputs (e.g. new priorities) into the sub-batch."""
        if not is_tensor_collection(sub_batch) or not sub_batch.batch_dims:
            return
        shape = sub_batch.batch_size
        for key, value in losses.items():
            if (isinstance(key, str) and not key.startswith(LOSS_PREFIX)
                    and isinstance(value, torch.Tensor) and value.shape[: len(shape)] == shape):
                sub_batch.set(key, value.detach())

    def train(self) -> None:
        """Run the loop until ``total_frames`` frames are collected or the collector ends.

        Continues from :attr:`collected_frames` (so a loaded trainer resumes its count) and
        saves the trainer when it stops, if ``save_trainer_file`` is set.
        """
        if self.optim_steps_per_batch and not self._ops["optimizer"]:
            raise RuntimeError("the trainer has no 'optimizer' op: pass optimizer=... or "
                               "register one with register_op('optimizer', ...).")
        if self.total_frames is not None and self._collected_frames >= self.total_frames:
            return
        init_random_frames = getattr(self.collector, "init_random_frames", 0) or 0
        self._pbar = tqdm(total=self.total_frames, initial=self._collected_frames,
                          disable=not self.progress_bar, unit="frame", dynamic_ncols=True)
        try:
            for batch in self.collector:
                if not is_tensor_collection(batch):
                    raise TypeError(f"the collector must yield TensorDict batches, got "
                                    f"{type(batch).__name__}.")
                batch = self._run_data_ops("batch_process", batch)
                frames = self._count_frames(batch)
                self._collected_frames += frames
                self._run_log_ops("pre_steps_log", batch)
                if self._collected_frames > init_random_frames:
                    self.optim_steps(batch)
                self._run_plain_ops("post_steps")
                self._run_log_ops("post_steps_log", batch)
                self._pbar.update(frames)
                if self._pbar_values:
                    self._pbar.set_postfix(self._pbar_values, refresh=False)
                if self.total_frames is not None and self._collected_frames >= self.total_frames:
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

    # ---- state -------------------------------------------------------------------------------
    def _own_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "collected_frames": self._collected_frames,
            "optim_count": self._optim_count,
            "last_save": self._last_save,
            "last_log": dict(self._last_log),
        }
        if _has_state_dict(self.loss_module):
            state["loss_module"] = self.loss_module.state_dict()
        if _has_state_dict(self.collector):
            state["collector"] = self.collector.state_dict()
        return state

    def state_dict(self) -> dict[str, Any]:
        """Counters, loss module, collector (when it has a state) and every registered module.

        Raises ``TypeError`` when a registered module can only save itself to a directory
        (``dumps`` without ``state_dict``): use :meth:`dumps` then.
        """
        state = self._own_state()
        modules = {}
        for name, module in self._modules.items():
            if not _has_state_dict(module):
                raise TypeError(f"module {name!r} has no state_dict; save the trainer to a "
                                f"directory with dumps() instead.")
            modules[name] = module.state_dict()
        state["modules"] = modules
        return state

    def _check_state(self, state: Mapping[str, Any], module_names: set[str]) -> None:
        if not isinstance(state, Mapping):
            raise ValueError(f"state_dict must be a dict, got {type(state).__name__}.")
        expected = set(_TRACKED) | {"modules"}
        if _has_state_dict(self.loss_module):
            expected.add("loss_module")
        if _has_state_dict(self.collector):
            expected.add("collector")
        missing = expected - set(state)
        if missing:
            raise ValueError(f"trainer state_dict is missing {sorted(missing)}.")
        saved = set(state["modules"])
        if saved != module_names:
            raise ValueError(f"trainer state_dict holds modules {sorted(saved)} but the trainer "
                             f"expects {sorted(module_names)} (register the same modules, under "
                             f"the same names, before loading).")

    def _install_state(self, state: Mapping[str, Any]) -> None:
        if "loss_module" in state:
            self.loss_module.load_state_dict(state["loss_module"])
        if "collector" in state and _has_state_dict(self.collector):
            self.collector.load_state_dict(state["collector"])
        for name, module_state in state["modules"].items():
            self._modules[name].load_state_dict(module_state)
        self._collected_frames = int(state["collected_frames"])
        self._optim_count = int(state["optim_count"])
        self._last_save = int(state["last_save"])
        self._last_log = dict(state["last_log"])

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`; the same modules must be registered under the same names.

        The structure is checked before anything changes.
        """
        self._check_state(state_dict, set(self._modules))
        self._install_state(state_dict)

    def dumps(self, path: str | os.PathLike) -> None:
        """Save the trainer into checkpoint directory ``path``, atomically.

        Layout of the snapshot: ``trainer.json`` (how each module was saved), ``trainer.pt``
        (:func:`torch.save` of the state, with the modules that have no ``dumps``) and
        ``modules/<name>/`` for each registered module with ``dumps`` / ``loads`` (a replay
        buffer writes its own crash-safe checkpoint there). The snapshot is committed with one
        atomic rename: a crash leaves the previous checkpoint loadable.

        Examples
        --------
        >>> import tempfile
        >>> from torch import nn
        >>> from tensordict import TensorDict
        >>> from tdreplay.core import ListStorage, TensorDictReplayBuffer
        >>> def make():
        ...     trainer = Trainer(collector=[], optim_steps_per_batch=0,
        ...                       loss_module=nn.Linear(2, 1), progress_bar=False)
        ...     rb = TensorDictReplayBuffer(storage=ListStorage(10))
        ...     trainer.register_module("replay_buffer", rb)
        ...     return trainer, rb
        >>> trainer, rb = make()
        >>> _ = rb.extend(TensorDict({"obs": torch.arange(3.0)}, [3]))
        >>> with tempfile.TemporaryDirectory() as d:
        ...     trainer.dumps(d)
        ...     restored, restored_rb = make()
        ...     restored.loads(d)
        >>> len(restored_rb), restored_rb.write_count
        (3, 3)
        >>> torch.equal(restored.loss_module.weight, trainer.loss_module.weight)
        True
        """
        with write_checkpoint(path) as snap:
            state = self._own_state()
            state["modules"] = {}
            how: dict[str, str] = {}
            for name, module in self._modules.items():
                if _saves_with_dumps(module):
                    module.dumps(snap / "modules" / name)
                    how[name] = "dumps"
                else:
                    state["modules"][name] = module.state_dict()
                    how[name] = "state_dict"
            torch.save(state, snap / "trainer.pt")
            write_json(snap / "trainer.json", {"trainer": type(self).__name__, "modules": how})

    def loads(self, path: str | os.PathLike) -> None:
        """Restore a checkpoint directory written by :meth:`dumps`.

        Every file is checked (sizes and CRCs) and the saved modules must match the registered
        ones before anything changes; modules saved with ``dumps`` then load themselves (a
        replay buffer validates its files before it changes), and the rest of the state is
        installed. A bad checkpoint raises :class:`~tdreplay.core.CheckpointError`.
        """
        snap = verify_checkpoint(Path(path))
        meta = read_json(snap / "trainer.json")
        how: dict[str, str] = meta.get("modules", {})
        if set(how) != set(self._modules):
            raise CheckpointError(f"checkpoint holds modules {sorted(how)} but the trainer has "
                                  f"{sorted(self._modules)} registered.")
        for name, kind in how.items():
            if kind == "dumps" and not _saves_with_dumps(self._modules[name]):
                raise CheckpointError(f"module {name!r} was saved with dumps, but the registered "
                                      f"{type(self._modules[name]).__name__} has no loads().")
        try:
            state = torch.load(snap / "trainer.pt", weights_only=True)
            self._check_state(state, {n for n, kind in how.items() if kind == "state_dict"})
        except (ValueError, RuntimeError, OSError, pickle.UnpicklingError) as err:
            raise CheckpointError(
                f"trainer state in {str(path)!r} cannot be loaded: {err}") from err
        for name, kind in how.items():
            if kind == "dumps":
                self._modules[name].loads(snap / "modules" / name)
        self._install_state(state)

    def save_trainer(self, force_save: bool = False) -> None:
        """Save to ``save_trainer_file`` when ``save_trainer_interval`` frames have passed since
        the last save, or now with ``force_save``. Does nothing without ``save_trainer_file``."""
        if self.save_trainer_file is None:
            return
        if not force_save and self._collected_frames - self._last_save < self.save_trainer_interval:
            return
        self._last_save = self._collected_frames
        path = self.save_trainer_file
        if path.suffix in _FILE_SUFFIXES:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
            try:
                torch.save(self.state_dict(), tmp)
                os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)
        else:
            self.dumps(path)

    def load_from_file(self, file: str | os.PathLike) -> Trainer:
        """Load what :meth:`save_trainer` wrote: a checkpoint directory or a ``.pt`` file.

        A ``.pt`` file is unpickled (it may hold TensorDicts), so only load files you trust;
        checkpoint directories load tensors only.
        """
        path = Path(file)
        if path.is_dir():
            self.loads(path)
        else:
            if not path.is_file():
                raise FileNotFoundError(f"no trainer checkpoint at {str(path)!r}.")
            self.load_state_dict(torch.load(path, weights_only=False))
        return self

    def __repr__(self) -> str:
        ops = {dest: len(ops) for dest, ops in self._ops.items() if ops}
        return (f"{type(self).__name__}(collected_frames={self._collected_frames}, "
                f"optim_count={self._optim_count}, total_frames={self.total_frames}, "
                f"optim_steps_per_batch={self.optim_steps_per_batch}, ops={ops}, "
                f"modules={list(self._modules)})")
