"""``OpRegistry``: the ops a trainer runs at each named place, and how each place runs them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tensordict import is_tensor_collection

__all__ = ["HOOK_DESTINATIONS", "OpRegistry"]

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

Op = tuple[Callable[..., Any], dict[str, Any]]


class OpRegistry:
    """Ops by destination (:data:`HOOK_DESTINATIONS`), run in registration order.

    Examples
    --------
    >>> ops = OpRegistry()
    >>> ops.register("post_steps", print, end="!\\n")
    >>> ops.run_plain("post_steps")
    !
    >>> ops.ops("post_steps") == [print], ops.counts()
    (True, {'post_steps': 1})
    """

    def __init__(self) -> None:
        self._ops: dict[str, list[Op]] = {dest: [] for dest in HOOK_DESTINATIONS}

    def register(self, dest: str, op: Callable[..., Any], **kwargs: Any) -> None:
        """Run ``op(..., **kwargs)`` at ``dest``; ``ValueError`` for an unknown place."""
        if dest not in self._ops:
            raise ValueError(f"unknown hook destination {dest!r}; expected one of "
                             f"{', '.join(HOOK_DESTINATIONS)}.")
        if not callable(op):
            raise TypeError(f"op for {dest!r} must be callable, got {type(op).__name__}.")
        self._ops[dest].append((op, kwargs))

    def ops(self, dest: str) -> list[Callable[..., Any]]:
        """The ops registered at ``dest``, in order (a new list)."""
        return [op for op, _ in self._ops[dest]]

    def has(self, dest: str) -> bool:
        """True when some op is registered at ``dest``."""
        return bool(self._ops[dest])

    def counts(self) -> dict[str, int]:
        """Number of ops at each place that has any."""
        return {dest: len(ops) for dest, ops in self._ops.items() if ops}

    def run_data(self, dest: str, data: Any) -> Any:
        """``op(data)`` for each op; a returned TensorDict replaces ``data``. Returns ``data``."""
        for op, kwargs in self._ops[dest]:
            out = op(data, **kwargs)
            if is_tensor_collection(out):
                data = out
        return data

    def run_each(self, dest: str, data: Any) -> None:
        """``op(data)`` for each op (return ignored)."""
        for op, kwargs in self._ops[dest]:
            op(data, **kwargs)

    def run_plain(self, dest: str) -> None:
        """``op()`` for each op (return ignored)."""
        for op, kwargs in self._ops[dest]:
            op(**kwargs)

    def run_log(self, dest: str, data: Any,
                log: Callable[..., None]) -> None:
        """``op(data)`` for each op; a returned dict is passed on as ``log(log_pbar=..., **values)``
        (``TypeError`` for anything but a dict or None)."""
        for op, kwargs in self._ops[dest]:
            result = op(data, **kwargs)
            if result is None:
                continue
            if not isinstance(result, Mapping):
                raise TypeError(f"a {dest!r} op must return a dict of values to log or None; "
                                f"{op!r} returned {type(result).__name__}.")
            result = dict(result)
            log(log_pbar=bool(result.pop("log_pbar", False)), **result)
