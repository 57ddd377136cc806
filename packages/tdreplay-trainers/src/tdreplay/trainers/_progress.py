"""A trainer's progress (counters saved with it) and its scalar log."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Progress", "ScalarLog"]


@dataclass
class Progress:
    """The counters a trainer saves and restores."""

    #: frames collected so far (counted across resumes)
    collected_frames: int = 0
    #: optimisation steps done so far
    optim_count: int = 0
    #: ``collected_frames`` at the last save
    last_save: int = 0
    #: ``collected_frames`` when each name was last sent to the logger
    last_log: dict[str, int] = field(default_factory=dict)


def _to_log_value(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    return value


class ScalarLog:
    """Logged values: the latest of each name, those shown on the progress bar, and the
    logger's calls (at most once per ``log_interval`` frames per name).

    Examples
    --------
    >>> class Printer:
    ...     def log_scalar(self, name, value, step):
    ...         print(name, value, step)
    >>> progress = Progress(collected_frames=5)
    >>> log = ScalarLog(Printer(), log_interval=10, progress=progress)
    >>> log.log(loss=torch.tensor(0.5), log_pbar=True)
    loss 0.5 5
    >>> log.log(loss=0.25)  # within 10 frames of the last call: kept, not sent
    >>> log.latest, log.pbar_values
    ({'loss': 0.25}, {'loss': 0.5})
    """

    def __init__(self, logger: Any, log_interval: int, progress: Progress) -> None:
        self.logger = logger
        self.log_interval = log_interval
        self._progress = progress
        self._latest: dict[str, Any] = {}
        self._pbar_values: dict[str, Any] = {}

    @property
    def latest(self) -> dict[str, Any]:
        """The last value logged under each name (a copy)."""
        return dict(self._latest)

    @property
    def pbar_values(self) -> dict[str, Any]:
        """The values logged with ``log_pbar=True``, shown on the progress bar (a copy)."""
        return dict(self._pbar_values)

    def log(self, log_pbar: bool = False, **values: Any) -> None:
        """Record ``values``; send each to the logger unless it got that name within
        ``log_interval`` frames."""
        progress = self._progress
        for key, value in values.items():
            value = _to_log_value(value)
            self._latest[key] = value
            if log_pbar:
                self._pbar_values[key] = value
            last = progress.last_log.get(key)
            if self.logger is not None and (last is None or progress.collected_frames - last
                                            >= self.log_interval):
                progress.last_log[key] = progress.collected_frames
                self.logger.log_scalar(key, value, step=progress.collected_frames)
