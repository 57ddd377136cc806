"""Save and load hooks of storage checkpointers: how they are registered and called.

A hook is ``hook(data) -> data``: a save hook gets the contents a checkpointer is about to
write and returns what it writes; a load hook gets what a checkpointer read and returns what
it installs. TorchRL's checkpointers call save hooks as ``hook(data, path=path)`` (the
directory being written) and load hooks as ``hook(data, out=dest)``; :func:`call_hook` passes
those keywords to a hook that declares them (or ``**kwargs``), so hooks written for TorchRL
(``TED2Flat``, ``Flat2TED``, ...) and one-argument hooks both work.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["HookList", "call_hook", "check_hook"]


def check_hook(hook: Any, name: str = "hook") -> Callable[..., Any]:
    """``hook`` when it is callable, else ``TypeError`` naming ``name``.

    Examples
    --------
    >>> check_hook(len)
    <built-in function len>
    >>> check_hook(3)
    Traceback (most recent call last):
    ...
    TypeError: hook must be callable (hook(data) -> data), got int.
    """
    if not callable(hook):
        raise TypeError(f"{name} must be callable (hook(data) -> data), got "
                        f"{type(hook).__name__}.")
    checked: Callable[..., Any] = hook
    return checked


def _accepted(hook: Callable[..., Any], keywords: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``keywords`` that ``hook`` declares (all when it takes ``**kwargs``;
    none when its signature cannot be read)."""
    try:
        params = inspect.signature(hook).parameters
    except (TypeError, ValueError):
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return keywords
    named = {name for name, p in params.items() if p.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    return {k: v for k, v in keywords.items() if k in named}


def call_hook(hook: Callable[..., Any], data: Any, **keywords: Any) -> Any:
    """``hook(data, **keywords)`` with only the keywords ``hook`` declares.

    Examples
    --------
    >>> call_hook(lambda d: d + 1, 1, path="/tmp")
    2
    >>> call_hook(lambda d, path=None: (d, path), 1, path="/tmp")
    (1, '/tmp')
    """
    return hook(data, **_accepted(hook, keywords)) if keywords else hook(data)


class HookList:
    """The save or load hooks of a checkpointer, run in registration order.

    Examples
    --------
    >>> hooks = HookList()
    >>> hooks.append(lambda d: d * 2)
    >>> hooks.append(lambda d, path=None: d + len(path))
    >>> hooks.run(1, path="ab"), len(hooks)
    (4, 2)
    """

    def __init__(self) -> None:
        self._hooks: list[Callable[..., Any]] = []

    def append(self, hook: Callable[..., Any]) -> None:
        """Add ``hook`` (``TypeError`` naming ``hook`` when it is not callable; nothing added)."""
        self._hooks.append(check_hook(hook))

    def run(self, data: Any, **keywords: Any) -> Any:
        """``data`` passed through every hook (see :func:`call_hook`)."""
        for hook in self._hooks:
            data = call_hook(hook, data, **keywords)
        return data

    def as_tuple(self) -> tuple[Callable[..., Any], ...]:
        return tuple(self._hooks)

    def __len__(self) -> int:
        return len(self._hooks)
