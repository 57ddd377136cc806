"""``TrainerState``: what a trainer saves (progress, loss module, collector, registered
modules) and how: a state dict, a ``.pt`` file, or an atomic checkpoint directory."""

from __future__ import annotations

import copy
import glob
import os
import pickle
import re
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from tdreplay.core.checkpoint import (
    CheckpointError,
    read_json,
    save_torch_file,
    verify_checkpoint,
    write_checkpoint,
    write_json,
)

from ._progress import Progress

__all__ = ["TrainerState", "has_state_dict", "saves_with_dumps"]

_MODULE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_TRACKED = ("collected_frames", "optim_count", "last_save", "last_log")


def saves_with_dumps(module: Any) -> bool:
    """True when ``module`` saves itself to a directory (``dumps`` / ``loads``)."""
    return callable(getattr(module, "dumps", None)) and callable(getattr(module, "loads", None))


def has_state_dict(module: Any) -> bool:
    """True when ``module`` has ``state_dict`` / ``load_state_dict``."""
    return callable(getattr(module, "state_dict", None)) and callable(
        getattr(module, "load_state_dict", None))


class TrainerState:
    """The saved part of a trainer: ``progress``, ``loss_module`` and ``collector`` (when they
    have a state) and the registered modules. See :class:`~tdreplay.trainers.Trainer`.

    Examples
    --------
    >>> state = TrainerState(Progress(collected_frames=8), loss_module=torch.nn.Linear(1, 1),
    ...                      collector=[])
    >>> state.register_module("head", torch.nn.Linear(1, 1))
    >>> sd = state.state_dict()
    >>> sd["collected_frames"], sorted(sd["modules"])
    (8, ['head'])
    """

    def __init__(self, progress: Progress, loss_module: Any, collector: Any) -> None:
        self.progress = progress
        self.loss_module = loss_module
        self.collector = collector
        self._modules: dict[str, Any] = {}

    @property
    def modules(self) -> dict[str, Any]:
        """Registered modules by name (a copy)."""
        return dict(self._modules)

    def register_module(self, module_name: str, module: Any) -> None:
        """Save ``module`` under ``module_name`` (see ``Trainer.register_module``)."""
        if not isinstance(module_name, str) or not _MODULE_NAME.match(module_name):
            raise ValueError(f"module_name must be a non-empty name of letters, digits, '_', "
                             f"'.', '-' (not starting with '.' or '-'), got {module_name!r}.")
        if module_name in self._modules:
            raise ValueError(f"a module named {module_name!r} is already registered; choose "
                           f"another name.")
        if not (has_state_dict(module) or saves_with_dumps(module)):
            raise TypeError(f"module {module_name!r} ({type(module).__name__}) has neither "
                            f"state_dict/load_state_dict nor dumps/loads: it cannot be saved.")
        self._modules[module_name] = module

    # ---- state dicts ---------------------------------------------------------------------------
    def _own_state(self) -> dict[str, Any]:
        progress = self.progress
        state: dict[str, Any] = {
            "collected_frames": progress.collected_frames,
            "optim_count": progress.optim_count,
            "last_save": progress.last_save,
            "last_log": dict(progress.last_log),
        }
        if has_state_dict(self.loss_module):
            state["loss_module"] = self.loss_module.state_dict()
        if has_state_dict(self.collector):
            state["collector"] = self.collector.state_dict()
        return state

    def state_dict(self) -> dict[str, Any]:
        """Progress, loss module, collector and every module (``TypeError`` for a module that
        only saves itself to a directory)."""
        state = self._own_state()
        modules = {}
        for name, module in self._modules.items():
            if not has_state_dict(module):
                raise TypeError(f"module {name!r} has no state_dict; save the trainer to a "
                                f"directory with dumps() instead.")
            modules[name] = module.state_dict()
        state["modules"] = modules
        return state

    def _check_state(self, state: Mapping[str, Any], module_names: set[str]) -> None:
        if not isinstance(state, Mapping):
            raise ValueError(f"state_dict must be a dict, got {type(state).__name__}.")
        expected = set(_TRACKED) | {"modules"}
        if has_state_dict(self.loss_module):
            expected.add("loss_module")
        if has_state_dict(self.collector):
            expected.add("collector")
        missing = expected - set(state)
        if missing:
            raise ValueError(f"trainer state_dict is missing {sorted(missing)}.")
        saved = set(state["modules"])
        if saved != module_names:
            raise ValueError(f"trainer state_dict holds modules {sorted(saved)} but the trainer "
                             f"expects {sorted(module_names)} (register the same modules, under "
                             f"the same names, before loading).")

    def _install_state(self, state: Mapping[str, Any],
                       loaders: Mapping[str, Any] | None = None) -> None:
        """Install ``state`` (checked by :meth:`_check_state`), all or nothing: the loss module,
        the collector and the modules restored from a state dict first, each one's current
        state kept aside (a copy); then the modules that save themselves (``dumps`` / ``loads``:
        replay buffers, all or nothing on their own), from ``loaders[name]()`` or their state
        dict; then the counters. A failure puts the first ones back as they were and
        propagates."""
        loaders = dict(loaders or {})
        light: list[tuple[Any, Any]] = []  # (object, state to load)
        if "loss_module" in state:
            light.append((self.loss_module, state["loss_module"]))
        if "collector" in state and has_state_dict(self.collector):
            light.append((self.collector, state["collector"]))
        for name, module_state in state["modules"].items():
            module = self._modules[name]
            if saves_with_dumps(module):
                loaders.setdefault(name, lambda m=module, st=module_state: m.load_state_dict(st))
            else:
                light.append((module, module_state))
        kept = [(obj, copy.deepcopy(obj.state_dict())) for obj, _ in light]
        try:
            for obj, obj_state in light:
                obj.load_state_dict(obj_state)
            for load in loaders.values():
                load()
        except BaseException:
            for obj, old in reversed(kept):
                obj.load_state_dict(old)
            raise
        progress = self.progress
        progress.collected_frames = int(state["collected_frames"])
        progress.optim_count = int(state["optim_count"])
        progress.last_save = int(state["last_save"])
        progress.last_log = dict(state["last_log"])

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (its structure checked before anything changes; a
        module that refuses its state leaves every module as it was)."""
        self._check_state(state_dict, set(self._modules))
        self._install_state(state_dict)

    # ---- files -----------------------------------------------------------------------------
    def dumps(self, path: str | os.PathLike[str], trainer_name: str) -> None:
        """Write the checkpoint directory ``path`` atomically (``Trainer.dumps``)."""
        with write_checkpoint(path) as snap:
            state = self._own_state()
            state["modules"] = {}
            how: dict[str, str] = {}
            for name, module in self._modules.items():
                if saves_with_dumps(module):
                    module.dumps(snap / "modules" / name)
                    how[name] = "dumps"
                else:
                    state["modules"][name] = module.state_dict()
                    how[name] = "state_dict"
            save_torch_file(state, snap / "trainer.pt", what="the trainer's state")
            write_json(snap / "trainer.json", {"trainer": trainer_name, "modules": how})

    def loads(self, path: str | os.PathLike[str]) -> None:
        """Restore a checkpoint directory written by :meth:`dumps` (``Trainer.loads``)."""
        snap = verify_checkpoint(Path(path))
        meta = read_json(snap / "trainer.json")
        how: dict[str, str] = meta.get("modules", {})
        if set(how) != set(self._modules):
            raise CheckpointError(f"checkpoint holds modules {sorted(how)} but the trainer has "
                                  f"{sorted(self._modules)} registered.")
        for name, kind in how.items():
            if kind == "dumps" and not saves_with_dumps(self._modules[name]):
                raise CheckpointError(f"module {name!r} was saved with dumps, but the registered "
                                      f"{type(self._modules[name]).__name__} has no loads().")
        try:
            state = torch.load(snap / "trainer.pt", weights_only=True)
            self._check_state(state, {n for n, kind in how.items() if kind == "state_dict"})
        except (ValueError, RuntimeError, OSError, pickle.UnpicklingError) as err:
            raise CheckpointError(
                f"trainer state in {str(path)!r} cannot be loaded: {err}") from err
        loaders = {name: (lambda m=self._modules[name], d=snap / "modules" / name: m.loads(d))
                   for name, kind in how.items() if kind == "dumps"}
        try:
            self._install_state(state, loaders)
        except CheckpointError:
            raise
        except (ValueError, RuntimeError, KeyError, TypeError) as err:  # (a module refused)
            raise CheckpointError(f"trainer checkpoint {str(path)!r} does not fit the trainer "
                                  f"(nothing was changed): {err}") from err

    @staticmethod
    def save_file(state: Mapping[str, Any], path: Path) -> None:
        """``torch.save`` ``state`` (a :meth:`state_dict`) to ``path``, atomically (a temporary
        file then a rename). The temporary files of earlier saves that were killed before
        their rename (each as large as the checkpoint) are removed first."""
        path.parent.mkdir(parents=True, exist_ok=True)
        for stale in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
            stale.unlink(missing_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            save_torch_file(state, tmp, weights_only=False)  # (a .pt file: unpickled)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
