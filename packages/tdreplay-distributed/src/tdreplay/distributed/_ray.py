"""Ray, imported on first use, and calls to buffer actors that time out and fail clearly."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from .errors import BufferActorDiedError, RemoteBufferError, RemoteCallTimeoutError

__all__ = ["KILL_WAIT", "Deadline", "RayLease", "call_error", "check_timeout", "ensure_ray",
           "import_ray", "wait_all", "wait_dead"]

#: Seconds a killed actor may still answer before :func:`wait_dead` gives up (Ray kills it
#: within milliseconds on a live cluster).
KILL_WAIT = 30.0


class Deadline:
    """The time left of one ``timeout`` (seconds; ``None``: no limit) that several waits share,
    counted from the deadline's creation.

    Examples
    --------
    >>> Deadline(None).remaining() is None
    True
    >>> 0.0 <= Deadline(5.0).remaining() <= 5.0, Deadline(0.0).passed()
    (True, True)
    """

    def __init__(self, timeout: float | None) -> None:
        self._end = None if timeout is None else time.monotonic() + timeout

    def remaining(self) -> float | None:
        """Seconds left (never negative), or ``None`` without a limit."""
        return None if self._end is None else max(self._end - time.monotonic(), 0.0)

    def passed(self) -> bool:
        """Whether no time is left."""
        return self._end is not None and time.monotonic() >= self._end


def import_ray() -> Any:
    """The ``ray`` module (imported here so that importing tdreplay does not start Ray's)."""
    try:
        import ray
    except ImportError as err:  # pragma: no cover - ray is a dependency of this package
        raise ImportError("tdreplay.distributed needs Ray: pip install tdreplay-distributed "
                          "(or pip install ray).") from err
    return ray


def ensure_ray(ray_init_config: dict[str, Any] | None) -> Any:
    """``ray``, initialised with ``ray.init(**ray_init_config)`` unless it already is."""
    if ray_init_config is not None and not isinstance(ray_init_config, dict):
        raise TypeError(f"ray_init_config must be a dict of ray.init arguments or None, got "
                        f"{type(ray_init_config).__name__}.")
    ray = import_ray()
    if not ray.is_initialized():
        ray.init(**(ray_init_config or {}))
    return ray


class RayLease:
    """A buffer's use of this process's Ray runtime, as TorchRL's ``RayReplayBuffer`` holds one.

    :meth:`acquire` initialises Ray if it is not (``ray.init(**ray_init_config)``); when the
    last lease of the process is released (the buffers' ``close()``), Ray is shut down if a
    lease started it. A Ray runtime started by the user (``ray.init`` before the buffers) is
    never shut down by them.

    Examples
    --------
    >>> import ray
    >>> lease = RayLease.acquire(None)  # Ray is already running here: it is not ours
    >>> lease.release(); lease.release()  # releasing twice counts once
    >>> ray.is_initialized()
    True
    """

    _lock = threading.Lock()
    _count = 0
    _owns_runtime = False

    def __init__(self) -> None:
        self._released = False

    @classmethod
    def acquire(cls, ray_init_config: dict[str, Any] | None) -> RayLease:
        """A lease, Ray initialised with ``ray_init_config`` unless it already is."""
        with cls._lock:
            ray = import_ray()
            started = not ray.is_initialized()
            ensure_ray(ray_init_config)
            if started:
                cls._owns_runtime = True
            cls._count += 1
        return cls()

    def release(self) -> None:
        """Give the lease back (once); the last one shuts down a Ray that a lease started."""
        with self._lock:
            if self._released:
                return
            self._released = True
            self._return_one()

    @classmethod
    def _return_one(cls) -> None:
        """One lease fewer (lock held); the last one shuts down a Ray that a lease started."""
        cls._count -= 1
        if cls._count == 0 and cls._owns_runtime:
            cls._owns_runtime = False
            ray = import_ray()
            if ray.is_initialized():
                ray.shutdown()


def check_timeout(value: Any, name: str) -> float | None:
    """``None`` (wait forever) or a positive number of seconds."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds or None, got {value!r}.")
    return float(value)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    for line in text.splitlines():
        if "dead because" in line or "died because" in line:
            return line.strip()
    return text.splitlines()[0] if text else type(err).__name__


def call_error(err: BaseException, what: str, label: str) -> BaseException:
    """What a call of ``what`` on the buffer actor ``label`` that failed with ``err`` (as Ray
    reports it) raises: :class:`RemoteBufferError` for an actor temporarily unavailable,
    :class:`BufferActorDiedError` for a dead one, the buffer's own exception for an error it
    raised in the actor; anything else is ``err`` itself. The error from Ray is the
    ``__cause__`` of the one returned (its message holds the actor-side traceback)."""
    exceptions = import_ray().exceptions
    if isinstance(err, exceptions.ActorUnavailableError):
        translated: BaseException = RemoteBufferError(
            f"{what} failed: buffer actor {label} is unavailable (restarting or unreachable: "
            f"{_first_line(err)}); the call may be retried.", actor=label)
    elif isinstance(err, exceptions.RayActorError):
        translated = BufferActorDiedError(
            f"{what} failed: buffer actor {label} is dead ({_first_line(err)}). What it held "
            "is lost: unless its creator closed it (close() is for good), respawn it from its "
            "last checkpoint (respawn(path), or a new buffer and loads(path)); other clients "
            "then call reconnect().", actor=label)
    elif isinstance(err, exceptions.RayTaskError) \
            and isinstance(cause := getattr(err, "cause", None), BaseException):
        translated = cause
    else:
        return err
    translated.__cause__ = err
    translated.__suppress_context__ = True
    return translated


def wait_all(calls: Sequence[tuple[Any, str]], *, what: str, timeout: float | None) -> list[Any]:
    """Results of ``calls`` (pairs ``(object_ref, actor_label)``), all within ``timeout`` s.

    Raises
    ------
    RemoteCallTimeoutError
        A call got no answer in time (it is cancelled if it has not started).
    BufferActorDiedError
        An actor is dead.
    RemoteBufferError
        An actor is temporarily unavailable (restarting, unreachable).
    Exception
        What the buffer raised inside its actor, as its own type (``ValueError``, ...).
    """
    ray = import_ray()
    exceptions = ray.exceptions
    deadline = Deadline(timeout)
    results = []
    for index, (ref, label) in enumerate(calls):
        try:
            results.append(ray.get(ref, timeout=deadline.remaining()))
        except exceptions.GetTimeoutError:
            for pending, _ in calls[index:]:
                try:
                    ray.cancel(pending)
                except Exception:  # noqa: BLE001 - best effort: it may have finished meanwhile
                    pass
            raise RemoteCallTimeoutError(
                f"{what} on buffer actor {label} got no answer within {timeout} s (call_timeout):"
                " the actor is busy, hung or unreachable; a write may still be applied later.",
                actor=label) from None
        except (exceptions.ActorUnavailableError, exceptions.RayActorError,
                exceptions.RayTaskError) as err:
            raise call_error(err, what, label)  # noqa: B904 - call_error sets its __cause__
    return results


def wait_dead(handle: Any, label: str) -> None:
    """Return once the actor of ``handle``, just killed, is dead. ``ray.kill`` only asks Ray to
    kill it: until Ray has, a call from any client (of another process too) may still be
    served, and a closed or shut-down buffer promises that later calls fail. Raises
    :class:`~tdreplay.distributed.RemoteCallTimeoutError` if it still answers after
    :data:`KILL_WAIT` seconds."""
    ray = import_ray()
    deadline = Deadline(KILL_WAIT)
    while not deadline.passed():
        try:  # a no-op every Ray actor has
            ray.get(handle.__ray_ready__.remote(), timeout=deadline.remaining())
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.GetTimeoutError:
            break
        time.sleep(0.01)
    raise RemoteCallTimeoutError(f"buffer actor {label} still answers {KILL_WAIT} s after it was "
                                 "killed.", actor=label)
