"""Extra stateful parts a buffer saves and restores with its own state.

A part is any object with ``state_dict()``, ``check_state_dict(state)`` (raises
``ValueError`` on a state it cannot load, changing nothing) and ``load_state_dict(state)``,
e.g. a parameter scheduler (``tdreplay.samplers.LinearScheduler``) that anneals the
sampler's ``beta``: its step count belongs to the checkpoint as much as the sampler's
priorities. The buffer registers it with
:meth:`~tdreplay.core.ReplayBuffer.register_stateful`; then ``state_dict`` / ``dumps`` save its
state and ``load_state_dict`` / ``loads`` check it with everything else before restoring it.

A registered part whose state a checkpoint lacks is refused (``ValueError`` /
``CheckpointError`` naming it, nothing changes), unless the part says it may be missing
(``missing_ok = True``: checkpoints written before the part was saved; it is then left as it
is); states of parts a checkpoint holds but the buffer has not registered are ignored (e.g. a
buffer built only to read the data).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .checkpoint import CheckpointError, load_torch_file, save_torch_file

__all__ = ["StatefulPart", "StatefulParts"]

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


@runtime_checkable
class StatefulPart(Protocol):
    """What a buffer can save and restore besides its storage, sampler and writer."""

    def state_dict(self) -> dict[str, Any]: ...

    def check_state_dict(self, state_dict: dict[str, Any]) -> None: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


class StatefulParts:
    """The extra parts of one buffer, by name (see the module docstring).

    Examples
    --------
    >>> class Counter:
    ...     def __init__(self): self.n = 0
    ...     def state_dict(self): return {"n": self.n}
    ...     def check_state_dict(self, state): pass
    ...     def load_state_dict(self, state): self.n = state["n"]
    >>> parts, counter = StatefulParts(), Counter()
    >>> parts.register("counter", counter)
    >>> counter.n = 3
    >>> saved = parts.state_dict()
    >>> counter.n = 7
    >>> parts.load_state_dict(saved)
    >>> counter.n
    3
    """

    def __init__(self) -> None:
        self._parts: dict[str, StatefulPart] = {}

    def _required(self, name: str) -> bool:
        """Whether a checkpoint must hold the state of part ``name`` (see ``missing_ok``)."""
        return not getattr(self._parts[name], "missing_ok", False)

    def register(self, name: str, part: StatefulPart | None) -> None:
        """Save and restore ``part`` under ``name`` (replacing what had that name); ``None``
        unregisters ``name``."""
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"name must be a non-empty string of letters, digits, '_', '.' "
                             f"and '-' (not starting with '.' or '-'), got {name!r}.")
        if part is None:
            self._parts.pop(name, None)
            return
        if not isinstance(part, StatefulPart):
            raise TypeError(f"part must have state_dict(), check_state_dict(state) and "
                            f"load_state_dict(state), got "
                            f"{type(part).__name__}.")
        self._parts[name] = part

    @property
    def names(self) -> tuple[str, ...]:
        """Names of the registered parts, sorted."""
        return tuple(sorted(self._parts))

    def __len__(self) -> int:
        return len(self._parts)

    def state_dict(self) -> dict[str, dict[str, Any]]:
        """``{name: part.state_dict()}`` of every registered part."""
        return {name: self._parts[name].state_dict() for name in self.names}

    def check_state_dict(self, state_dict: Any) -> None:
        """Raise ``ValueError`` naming the part unless every registered part can load its
        state from ``state_dict`` (changes nothing)."""
        if not isinstance(state_dict, dict):
            raise ValueError(f"the states of the buffer's extra parts must be a dict, got "
                             f"{type(state_dict).__name__}.")
        for name in self.names:
            if name not in state_dict:
                if not self._required(name):
                    continue
                raise ValueError(f"no saved state for the buffer's part {name!r} (registered "
                                 "with register_stateful); register it after loading instead.")
            part = self._parts[name]
            state = state_dict[name]
            if not isinstance(state, dict):
                raise ValueError(f"the saved state of part {name!r} must be a dict, got "
                                 f"{type(state).__name__}.")
            try:
                part.check_state_dict(state)
            except (ValueError, TypeError, KeyError) as err:
                raise ValueError(f"part {name!r}: {err}") from err

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Check, then restore every registered part."""
        self.check_state_dict(state_dict)
        for name in self.names:
            if name in state_dict:
                self._parts[name].load_state_dict(state_dict[name])

    def dumps(self, path: Path) -> list[str]:
        """Write every part's state under directory ``path`` (``<name>.pt``); returns the
        names written."""
        if not self._parts:
            return []
        path.mkdir(parents=True, exist_ok=True)
        for name, state in self.state_dict().items():
            save_torch_file(state, path / f"{name}.pt", what=f"the state of {name!r}")
        return list(self.names)

    def prepare_load(self, path: Path, saved: list[str]) -> Callable[[], None]:
        """Read and check the states under ``path`` (``saved``: the names the checkpoint
        recorded); return a function that restores them. ``CheckpointError`` otherwise."""
        states: dict[str, Any] = {}
        for name in self.names:
            file = path / f"{name}.pt"
            if name not in saved and not self._required(name):
                continue  # (a checkpoint written before the part was saved)
            if name not in saved or not file.is_file():
                raise CheckpointError(f"the checkpoint holds no state for the buffer's part "
                                      f"{name!r} (registered with register_stateful) in "
                                      f"{str(path)!r}; register it after loading instead.")
            states[name] = load_torch_file(file)
        try:
            self.check_state_dict(states)
        except ValueError as err:
            raise CheckpointError(f"{err} (in {str(path)!r})") from err
        return lambda: self.load_state_dict(states)
