"""Installing a restored state (``loads`` / ``load_state_dict``) as one step.

Everything a restore reads is checked before the buffer changes; what is left is the install:
the storage takes the saved rows, then the sampler, the writer, the generator and the
transforms their saved states, one after the other. Two things could still leave a buffer that
mixes the checkpoint with its old state (the saved rows with the old write cursor, say):

- a Ctrl-C in the middle. :func:`interrupts_held` holds it back until the install is over (in
  the main thread, where Python delivers signals), then delivers it: the restore is complete
  and the ``KeyboardInterrupt`` is raised after it;
- an error raised by a part while installing (memory, a disk error under a memory-mapped
  storage) after another part was installed. :class:`InstallRecord` remembers it, and the
  buffer refuses to be saved (``dumps`` / ``state_dict``) until a restore succeeds or it is
  emptied, so a "save on error" handler never writes such a mixture over a good checkpoint.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Any

__all__ = ["InstallRecord", "interrupts_held"]


@contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold back a SIGINT (Ctrl-C) arriving inside the block and deliver it at its end, to the
    handler that was in place (by default: ``KeyboardInterrupt`` raised there). Outside the
    main thread (no signal is delivered there) the block runs as it is.

    Examples
    --------
    >>> import os, signal
    >>> previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # (Python's own)
    >>> done = []
    >>> try:
    ...     with interrupts_held():
    ...         os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the middle
    ...         done.append("the rest of the block")
    ... except KeyboardInterrupt:
    ...     done.append("interrupted after it")
    >>> _ = signal.signal(signal.SIGINT, previous)
    >>> done
    ['the rest of the block', 'interrupted after it']

    A SIGINT the process ignores (``SIG_IGN``, as in a job started in the background) stays
    ignored.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    received: list[tuple[int, FrameType | None]] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        received.append((signum, frame))

    try:
        signal.signal(signal.SIGINT, hold)
    except ValueError:  # not the main interpreter: signals cannot be handled here
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            _deliver(previous, *received[0])


def _deliver(handler: Any, signum: int, frame: FrameType | None) -> None:
    """Run the SIGINT ``handler`` that was held back (``SIG_DFL``: the default action)."""
    if callable(handler):
        handler(signum, frame)
    elif handler == signal.SIG_DFL:
        signal.raise_signal(signum)


class InstallRecord:
    """Whether the last install of a restored state into a buffer failed half-way.

    Examples
    --------
    >>> record = InstallRecord()
    >>> def fail():
    ...     raise MemoryError("no room")
    >>> record.install([lambda: None, fail])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    MemoryError: no room
    >>> record.check_saveable()  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    RuntimeError: this buffer's last restore failed while installing (MemoryError: no room)...
    >>> record.install([lambda: None])
    >>> record.check_saveable()
    >>> record.install([fail, lambda: None])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    MemoryError: no room
    >>> record.check_saveable()  # (the first step failed: nothing was installed)
    """

    def __init__(self) -> None:
        self.failure: str | None = None

    def install(self, steps: Sequence[Callable[[], Any]]) -> None:
        """Run ``steps`` in order with Ctrl-C held back; an error raised by one after another
        step was installed is recorded (and raised), a run of them all clears the record.

        Each step installs its part whole or not at all (a memory-mapped storage rolls its
        files back), so an error raised by the first step leaves the buffer as it was: it is
        raised, and the record stays as it was (a buffer whose restore changed nothing may
        be saved)."""
        with interrupts_held():
            done = 0
            try:
                for step in steps:
                    step()
                    done += 1
            except BaseException as err:
                if done:
                    self.failure = f"{type(err).__name__}: {err}"
                raise
            self.failure = None

    def clear(self) -> None:
        """Forget a failure (the buffer was emptied: it holds nothing of either state)."""
        self.failure = None

    def check_saveable(self) -> None:
        """``RuntimeError`` when the last install failed half-way: the buffer holds part of
        the restored state and part of its old one, which must not be saved as a checkpoint."""
        if self.failure is not None:
            raise RuntimeError(
                f"this buffer's last restore failed while installing ({self.failure}): it holds "
                "part of the restored state and part of its old one, so it is not saved. "
                "Restore it again (loads / load_state_dict) or empty() it first.")
