"""``CheckpointMethods``: how a :class:`~tdreplay.trainers.Trainer` saves and restores itself
(state dicts, ``.pt`` files, checkpoint directories), over its :class:`~._state.TrainerState`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch

from tdreplay.core.utils import check_flag

from ._progress import Progress
from ._state import TrainerState

__all__ = ["CheckpointMethods"]

_FILE_SUFFIXES = (".pt", ".pth")
_T = TypeVar("_T", bound="CheckpointMethods")


class CheckpointMethods:
    """The saving half of :class:`~tdreplay.trainers.Trainer` (a base class of it): every
    method works on the trainer's ``_state`` and ``_progress``."""

    _state: TrainerState
    _progress: Progress
    save_trainer_file: Path | None
    save_trainer_interval: int

    def state_dict(self) -> dict[str, Any]:
        """Counters, loss module, collector (when it has a state) and every registered module.

        Raises ``TypeError`` when a registered module can only save itself to a directory
        (``dumps`` without ``state_dict``): use :meth:`dumps` then.
        """
        return self._state.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`; the same modules must be registered under the same names.

        The structure is checked before anything changes, and a module that refuses its state
        (a loss head of another shape, a buffer of another capacity) raises with every module
        and counter as it was: the modules that load first are put back. (Of two modules that
        save themselves, e.g. two replay buffers, the first stays loaded if the second
        refuses.)
        """
        self._state.load_state_dict(state_dict)

    def dumps(self, path: str | os.PathLike[str]) -> None:
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
        >>> from tdreplay.trainers import Trainer
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
        self._state.dumps(path, type(self).__name__)

    def loads(self, path: str | os.PathLike[str]) -> None:
        """Restore a checkpoint directory written by :meth:`dumps`.

        Every file is checked (sizes and CRCs) and the saved modules must match the registered
        ones before anything changes; the state of the loss module, the collector and the
        modules saved as state dicts is installed, then the modules saved with ``dumps`` load
        themselves (a replay buffer validates its files before it changes). A bad checkpoint,
        or one a module refuses, raises :class:`~tdreplay.core.CheckpointError` with the
        trainer as it was (as :meth:`load_state_dict`).
        """
        self._state.loads(path)

    def save_trainer(self, force_save: bool = False) -> None:
        """Save to ``save_trainer_file`` when ``save_trainer_interval`` frames have passed since
        the last save, or now with ``force_save``. Does nothing without ``save_trainer_file``."""
        check_flag(force_save, "force_save")
        if self.save_trainer_file is None:
            return
        progress = self._progress
        if not force_save and \
                progress.collected_frames - progress.last_save < self.save_trainer_interval:
            return
        progress.last_save = progress.collected_frames
        path = self.save_trainer_file
        if path.suffix in _FILE_SUFFIXES:
            TrainerState.save_file(self.state_dict(), path)
        else:
            self.dumps(path)

    def load_from_file(self: _T, file: str | os.PathLike[str]) -> _T:
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

