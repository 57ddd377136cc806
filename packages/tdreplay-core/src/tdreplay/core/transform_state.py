"""The state of a buffer's transforms in its checkpoints (``state_dict`` / ``dumps``).

A transform declares state with :attr:`~tdreplay.core.Transform.has_state` (e.g.
``ObservationNorm``'s ``loc`` / ``scale``, ``VecNorm``'s running statistics); the buffer's
:class:`~tdreplay.core.Compose` gathers them by position and class. A buffer whose transforms
have state saves it under ``"_transform"`` (``transform.pt`` in a checkpoint directory) and
refuses a state or checkpoint without it, or with the state of other transforms, before
anything changes; so does a buffer whose transforms have no state, given a saved one (the
buffer it restores would read other values than the saved one did, as TorchRL refuses it).

Examples
--------
>>> from tdreplay.core import Compose, Transform
>>> class Count(Transform):
...     has_state = True
...     def __init__(self): super().__init__(); self.n = 0
...     def state_dict(self): return {"n": self.n}
...     def check_state_dict(self, state):
...         if not isinstance(state.get("n"), int): raise ValueError("n must be an int")
...     def load_state_dict(self, state): self.n = state["n"]
>>> t = Compose(Count())
>>> state = transform_state(t)
>>> t.transforms[0].n = 3
>>> check_transform_state(t, state)()
>>> t.transforms[0].n
0
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from .checkpoint import CheckpointError, load_torch_file, save_torch_file
from .transform import Compose

__all__ = ["TRANSFORM_FILE", "check_transform_state", "dump_transform_state",
           "prepare_transform_load", "transform_mark", "transform_state", "undo_transforms",
           "write_side_undone_on_failure"]

WriteT = TypeVar("WriteT", bound=Callable[..., Any])

#: the file of a checkpoint directory holding the transforms' state
TRANSFORM_FILE = "transform.pt"


def transform_state(transform: Compose) -> dict[str, Any] | None:
    """The state of the transforms with state, or ``None`` when none has state."""
    return transform.state_dict() if transform.has_state else None


def transform_mark(transform: Compose) -> dict[str, Any] | None:
    """A copy of the state of the transforms with state, taken before they run on a read
    (``sample``, ``rb[...]``, ``query``), for :func:`undo_transforms` to put back if the read
    fails; ``None`` (nothing copied, nothing to put back) when none has state.

    Examples
    --------
    >>> from tdreplay.core import Compose, Transform
    >>> class Count(Transform):
    ...     has_state = True
    ...     def __init__(self): super().__init__(); self.n = 0
    ...     def forward(self, x): self.n += 1; return x
    ...     def state_dict(self): return {"n": self.n}
    ...     def check_state_dict(self, state): int(state["n"])
    ...     def load_state_dict(self, state): self.n = state["n"]
    >>> t = Compose(Count())
    >>> mark = transform_mark(t)
    >>> _ = t(1), t(2)
    >>> undo_transforms(t, mark)
    >>> t.transforms[0].n, transform_mark(Compose(lambda x: x)) is None
    (0, True)
    """
    if not transform.transforms or not transform.has_state:
        return None
    return copy.deepcopy(transform.state_dict())  # (a transform may hand out its own tensors)


def undo_transforms(transform: Compose, mark: dict[str, Any] | None) -> None:
    """Put back the state :func:`transform_mark` copied (nothing when it copied none)."""
    if mark is not None:
        transform.load_state_dict(mark)


def write_side_undone_on_failure(write: WriteT) -> WriteT:
    """``write`` (a buffer's ``add`` / ``extend`` / ``rb[i] = x``) that puts back the state of
    the buffer's transforms when it raises: its write-side transforms ran first and may have
    changed their state (``VecNorm``'s statistics took the batch in, ``MultiStepTransform``
    swapped the steps it holds back for the batch's) for a batch the storage, the writer or a
    later transform then refused (not when the write was counted: a write an interrupt cut
    short is completed before the interrupt propagates). A buffer without transforms with
    state pays one check; one with them runs such writes one at a time, under its lock (a rate
    limiter's gate too: where it would wait, the write is undone and waits without the lock,
    then runs again).

    Examples
    --------
    >>> import torch
    >>> from tdreplay.core import Compose, ReplayBuffer, Transform
    >>> class Count(Transform):
    ...     has_state = True
    ...     def __init__(self): super().__init__(); self.n = 0
    ...     def inv(self, x): self.n += 1; return x
    ...     def state_dict(self): return {"n": self.n}
    ...     def check_state_dict(self, state): int(state["n"])
    ...     def load_state_dict(self, state): self.n = state["n"]
    >>> def at_most_two(batch):
    ...     if len(batch) > 2:
    ...         raise ValueError("at most two rows")
    ...     return batch
    >>> rb, count = ReplayBuffer(), Count()
    >>> _ = rb.append_transform(at_most_two, invert=True)
    >>> _ = rb.append_transform(count)  # (its inverse runs first on writes)
    >>> _ = rb.extend(torch.zeros(2, 3))
    >>> try:
    ...     rb.extend(torch.zeros(5, 3))  # refused by the transform after it
    ... except ValueError:
    ...     pass
    >>> count.n, len(rb)  # the refused batch is not counted
    (1, 2)
    """
    @functools.wraps(write)
    def undone_on_failure(self: Any, *args: Any, **kwargs: Any) -> Any:
        transform = self._transform
        if not transform.transforms or not transform.has_state:
            return write(self, *args, **kwargs)

        def write_once() -> Any:
            # one write at a time through the transforms and into the storage: the state put
            # back is the one this write began from, with no other thread's write in between
            with self._lock:
                self._follow_untold_resets()  # (a storage of storages: buffer_readers)
                return _undone_on_failure(transform, write, self, args, kwargs)
        # a rate limiter's gate, passed under the lock, waits without it (buffer_rate_limit)
        return self._write_whole_under_lock(write_once)
    return undone_on_failure  # type: ignore[return-value]


def _undone_on_failure(transform: Compose, write: Callable[..., Any], buffer: Any,
                       args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    mark = transform_mark(transform)
    written = buffer.write_count
    try:
        return write(buffer, *args, **kwargs)
    except BaseException:
        # (a write an interrupt cut short is completed before the interrupt propagates: the
        # rows are stored and counted, so the state that took them in stays)
        if buffer.write_count == written:
            undo_transforms(transform, mark)
        raise


def check_transform_state(transform: Compose, state: Any) -> Callable[[], None]:
    """Check ``state`` (``None``: none saved) against ``transform``; return a function that
    restores it. ``ValueError`` naming ``state_dict['_transform']`` otherwise, nothing
    changed."""
    if not transform.has_state:
        if state is not None:
            raise ValueError(
                "state_dict['_transform'] holds the state of transforms with state "
                f"({sorted(state) if isinstance(state, dict) else type(state).__name__}), "
                "which this buffer does not have: append the same transforms before loading.")
        return lambda: None
    if state is None:
        raise ValueError("state_dict['_transform']: no saved state for the buffer's transforms "
                         f"with state ({sorted(transform.state_dict())}).")
    try:
        transform.check_state_dict(state)
    except (ValueError, TypeError, KeyError) as err:
        raise ValueError(f"state_dict['_transform']: {err}") from err
    return lambda: transform.load_state_dict(state)


def dump_transform_state(transform: Compose, snap: Path) -> None:
    """Write the transforms' state into checkpoint directory ``snap`` (when they have any)."""
    state = transform_state(transform)
    if state is not None:
        save_torch_file(state, snap / TRANSFORM_FILE, what="the transforms' state_dict()")


def prepare_transform_load(transform: Compose, snap: Path) -> Callable[[], None]:
    """Read and check the transforms' state of checkpoint ``snap``; return a function that
    restores it (``CheckpointError`` otherwise, nothing changed)."""
    file = snap / TRANSFORM_FILE
    if not transform.has_state:
        if file.is_file():
            raise CheckpointError(
                f"the checkpoint holds the state of transforms with state ({str(file)!r}), "
                "which this buffer does not have: append the same transforms before loading.")
        return lambda: None
    if not file.is_file():
        raise CheckpointError(f"the checkpoint holds no state for the buffer's transforms with "
                              f"state ({str(file)!r} is missing).")
    state = load_torch_file(file)
    try:
        return check_transform_state(transform, state)
    except ValueError as err:
        raise CheckpointError(f"{err} (in {str(file)!r})") from err
