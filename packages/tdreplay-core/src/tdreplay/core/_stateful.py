"""Checkpointing of components whose whole state is a ``state_dict`` (samplers, writers)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .checkpoint import CheckpointError, load_torch_file, read_json, save_torch_file, write_json


class StateDictCheckpointMixin:
    """``dumps`` / ``prepare_load`` / ``loads`` for components that expose ``state_dict``.

    The state is written with :func:`torch.save` and read back with ``weights_only=True`` (no
    arbitrary code runs on load). ``prepare_load`` reads and checks the state, then returns a
    function that installs it, so a bad checkpoint changes nothing.
    """

    def state_dict(self) -> dict[str, Any]:  # pragma: no cover - overridden
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # pragma: no cover
        pass

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Raise ``ValueError`` when ``state_dict`` cannot be loaded into this component."""
        expected = set(self.state_dict())
        got = set(state_dict)
        if expected != got:
            raise ValueError(
                f"{type(self).__name__} state_dict keys differ: expected {sorted(expected)}, "
                f"got {sorted(got)}."
            )

    def dumps(self, path: str | os.PathLike[str]) -> None:
        """Write the component's state into directory ``path``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        write_json(path / "component.json", {"class": type(self).__name__})
        save_torch_file(self.state_dict(), path / "state.pt",
                        what=f"{type(self).__name__}.state_dict()")

    def prepare_load(self, path: str | os.PathLike[str]) -> Callable[[], None]:
        """Read and check the state in ``path``; return a function that installs it."""
        path = Path(path)
        meta = read_json(path / "component.json")
        if meta.get("class") != type(self).__name__:
            raise CheckpointError(
                f"checkpoint holds a {meta.get('class')} but this buffer has a "
                f"{type(self).__name__} ({str(path / 'component.json')!r})."
            )
        file = path / "state.pt"
        if not file.is_file():
            raise CheckpointError(f"checkpoint file {str(file)!r} is missing.")
        state = load_torch_file(file)
        if not isinstance(state, dict):
            raise CheckpointError(f"checkpoint file {str(file)!r} does not hold a state dict.")
        try:
            self.check_state_dict(state)
        except (ValueError, TypeError, KeyError) as err:
            raise CheckpointError(f"{err} (in {str(file)!r})") from err
        return lambda: self.load_state_dict(state)

    def loads(self, path: str | os.PathLike[str]) -> None:
        """Restore the state written by :meth:`dumps`."""
        self.prepare_load(path)()
