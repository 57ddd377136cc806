"""``ActorClient``: one process's connection to one buffer actor.

It knows how to start the actor (the creation arguments, kept by the client that created it),
find it by name, replace it, and call its methods with a timeout and clear errors.
:class:`~tdreplay.distributed.RayReplayBuffer` is the user-facing buffer over one client;
:class:`~tdreplay.distributed.ShardedReplayBuffer` drives one client per shard (starting them
all at once, sending calls to several shards before waiting for any).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

from tdreplay.core import ReplayBuffer
from tdreplay.core.utils import restore_attributes

from ._ray import Deadline, check_timeout, import_ray, wait_all, wait_dead
from ._server import COMPONENTS, BufferServer, check_component_spec
from .checkpoints import check_checkpoint
from .errors import (
    BufferActorDiedError,
    BufferNotFoundError,
    BufferStartError,
    RemoteCallTimeoutError,
)

__all__ = ["ActorClient", "SpawnArgs", "check_name"]

_ACTOR_CLASS: Any = None
_DEFAULT: Any = object()


def _actor_class() -> Any:
    """``ray.remote(BufferServer)``, made once per process."""
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        _ACTOR_CLASS = import_ray().remote(BufferServer)
    return _ACTOR_CLASS


def check_name(value: Any, name: str) -> str | None:
    """``value`` if it is ``None`` or a non-empty str, else ``TypeError`` naming ``name``."""
    if value is None or (isinstance(value, str) and value):
        return value
    raise TypeError(f"{name} must be a non-empty str or None, got {value!r}.")


class SpawnArgs(NamedTuple):
    """How to build a buffer actor: what :meth:`ActorClient.for_new_actor` checked."""

    #: the buffer class built in the actor
    buffer_cls: type[ReplayBuffer]
    #: its arguments (components as instances, classes or factories; no ``None`` values)
    spec: dict[str, Any]
    #: actor options (``ray.remote`` / ``.options``)
    remote_config: dict[str, Any]
    #: travels to the actor and back in :attr:`ActorClient.info` (e.g. the shard number)
    meta: dict[str, Any]


class ActorClient:
    """The connection to one buffer actor (a :class:`~._server.BufferServer` in Ray).

    ``name`` / ``namespace``: the actor's Ray name; ``call_timeout`` / ``start_timeout``:
    seconds a call / the start of the actor waits (``None``: forever); ``spawn``: how to build
    the actor (``None``: this client only connects to a running one). Build one with
    :meth:`for_new_actor` (then :meth:`spawn`, or :meth:`start_spawn` and
    :meth:`finish_spawn` to start several actors at once) or :meth:`for_named_actor`.

    Examples
    --------
    >>> from functools import partial
    >>> import torch
    >>> from tdreplay.core import ListStorage
    >>> client = ActorClient.for_new_actor(spec={"storage": partial(ListStorage, 4)},
    ...                                    replay_buffer_cls=ReplayBuffer)
    >>> client.spawn()
    >>> client.call("length"), client.info["max_size"], client.can_respawn
    (0, 4, True)

    A client pickles (to a Ray task or actor, a process pool): the copy calls the same actor,
    as a client from :meth:`for_named_actor` would, without the creation arguments (only the
    creator respawns the actor) and without the calls this one has in flight.

    >>> import pickle
    >>> copy = pickle.loads(pickle.dumps(client))
    >>> copy.call("length"), copy.actor_id == client.actor_id, copy.can_respawn
    (0, True, False)
    >>> client.close()
    >>> client.closed, copy.closed  # the copy learns it from its next call
    (True, False)
    """

    def __init__(self, *, name: str | None = None, namespace: str | None = None,
                 call_timeout: float | None = 60.0, start_timeout: float | None = 300.0,
                 spawn: SpawnArgs | None = None) -> None:
        self.call_timeout = call_timeout
        self._start_timeout = check_timeout(start_timeout, "start_timeout")
        self._spawn_args = spawn
        self._name = check_name(name, "name")
        self._namespace = check_name(namespace, "namespace")
        self._handle: Any = None
        self._info: dict[str, Any] = {}
        self._label = self._make_label(None)
        self._prefetched: collections.deque[Any] = collections.deque()
        self._prefetch_lock = threading.Lock()
        self._closed = False
        self._options: dict[str, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        """What a copy in another process keeps: the connection, not the creation arguments,
        the calls in flight or the lock (see the class docstring)."""
        state = self.__dict__.copy()
        del state["_prefetch_lock"], state["_prefetched"]
        state["_spawn_args"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        restore_attributes(self, state)
        self._prefetched = collections.deque()
        self._prefetch_lock = threading.Lock()

    @classmethod
    def for_new_actor(cls, *, spec: dict[str, Any], replay_buffer_cls: type[ReplayBuffer],
                      remote_config: dict[str, Any] | None = None, name: str | None = None,
                      namespace: str | None = None, call_timeout: float | None = 60.0,
                      start_timeout: float | None = 300.0,
                      meta: dict[str, Any] | None = None) -> ActorClient:
        """A client that will start the actor (not started yet: see :meth:`spawn`).

        ``spec`` holds the buffer's arguments (components as instances, classes or
        factories); they are checked here. ``meta`` travels to the actor and back in
        :attr:`info` (e.g. the shard number).
        """
        if not (isinstance(replay_buffer_cls, type)
                and issubclass(replay_buffer_cls, ReplayBuffer)):
            raise TypeError(f"replay_buffer_cls must be a ReplayBuffer subclass, got "
                            f"{replay_buffer_cls!r}.")
        for component in COMPONENTS:
            if component in spec:
                check_component_spec(spec[component], component)
        if remote_config is not None and not isinstance(remote_config, dict):
            raise TypeError(f"remote_config must be a dict of actor options or None, got "
                            f"{type(remote_config).__name__}.")
        spawn = SpawnArgs(replay_buffer_cls, {k: v for k, v in spec.items() if v is not None},
                          dict(remote_config or {}), dict(meta or {}))
        return cls(name=name, namespace=namespace, call_timeout=call_timeout,
                   start_timeout=start_timeout, spawn=spawn)

    @classmethod
    def for_named_actor(cls, name: str, *, namespace: str | None = None,
                        call_timeout: float | None = 60.0) -> ActorClient:
        """A client of the running actor named ``name`` (Ray must be initialised).

        Raises ``ValueError`` when no actor has that name in that namespace.
        """
        client = cls(name=check_name(name, "name"), namespace=namespace,
                     call_timeout=call_timeout)
        client.reconnect()
        return client

    # ---- what this client knows ----------------------------------------------------------------
    @property
    def name(self) -> str | None:
        """Ray actor name (``None`` if unnamed)."""
        return self._name

    @property
    def namespace(self) -> str | None:
        """Ray namespace given for the name (``None``: the job's)."""
        return self._namespace

    @property
    def handle(self) -> Any:
        """The Ray actor handle (``None`` before the actor is started or found)."""
        return self._handle

    @property
    def label(self) -> str:
        """How errors name the actor: its name and actor id."""
        return self._label

    @property
    def info(self) -> Mapping[str, Any]:
        """What the actor described when last connected (``describe``): buffer class, batch
        size, priority key, slots, meta, pid, actor id. Read-only."""
        return self._info

    @property
    def actor_id(self) -> str | None:
        """Ray's id of the actor (hex), ``None`` before it described itself."""
        return self._info.get("actor_id")

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called on this client."""
        return self._closed

    @property
    def limit_timeout(self) -> float | None:
        """Seconds a buffer's rate limiter may keep a call waiting: a little less than
        :attr:`call_timeout`, so that the limiter's :class:`~tdreplay.core.RateLimitTimeout`
        (nothing done) comes before the client's timeout (outcome unknown)."""
        timeout = self._call_timeout
        return None if timeout is None else timeout - min(2.0, 0.1 * timeout)

    @property
    def can_respawn(self) -> bool:
        """True for the client that created the actor (it has the creation arguments)."""
        return self._spawn_args is not None

    def set_scheduling_strategy(self, strategy: Any) -> None:
        """Where the next :meth:`spawn` places the actor (a Ray scheduling strategy)."""
        if (args := self._spawn_args) is None:
            raise RuntimeError("only the client that created the actor places it.")
        config = {**args.remote_config, "scheduling_strategy": strategy}
        self._spawn_args = SpawnArgs(args.buffer_cls, args.spec, config, args.meta)

    @property
    def call_timeout(self) -> float | None:
        """Seconds a call waits for its answer (``None``: forever)."""
        return self._call_timeout

    @call_timeout.setter
    def call_timeout(self, value: float | None) -> None:
        self._call_timeout = check_timeout(value, "call_timeout")

    def _make_label(self, actor_id: str | None) -> str:
        if actor_id:
            short = actor_id[:12]
            return f"{self._name!r} (actor {short})" if self._name else f"<unnamed actor {short}>"
        return f"{self._name!r}" if self._name else "<unnamed>"

    def _set_info(self, info: dict[str, Any]) -> None:
        self._info = info
        self._label = self._make_label(info.get("actor_id"))

    def refresh_info(self) -> None:
        """Read the actor's description (:attr:`info`) again, e.g. after its buffer's
        storage or sampler was replaced."""
        self._set_info(self.call("describe"))

    # ---- calls ---------------------------------------------------------------------------------
    def submit(self, method: str, *args: Any) -> Any:
        """The object ref of ``method(*args)`` on the actor (wait for it with :meth:`wait`).

        Raises :class:`~tdreplay.distributed.BufferActorDiedError` after :meth:`close`.
        """
        if self._closed:
            raise BufferActorDiedError(f"{method} failed: buffer actor {self._label} was closed "
                                       "(close() kills the actor for good).", actor=self._label)
        if self._handle is None:  # (a start or respawn that failed killed it)
            raise BufferActorDiedError(
                f"{method} failed: buffer actor {self._label} is gone (its last start or respawn "
                "failed): respawn it from its last checkpoint (respawn(path)); other clients "
                "then call reconnect().", actor=self._label)
        return getattr(self._handle, method).remote(*args)

    def wait(self, ref: Any, what: str, timeout: Any = _DEFAULT) -> Any:
        """The result of ``ref`` within ``timeout`` s (default :attr:`call_timeout`)."""
        timeout = self._call_timeout if timeout is _DEFAULT else timeout
        return wait_all([(ref, self._label)], what=what, timeout=timeout)[0]

    @property
    def options(self) -> dict[str, Any]:
        """The Ray options the actor was started with (``{}`` on an attached client)."""
        return dict(self._options)

    def call(self, method: str, *args: Any) -> Any:
        """``method(*args)`` on the actor, within :attr:`call_timeout`; errors as in
        :func:`~._ray.wait_all`."""
        return wait_all([(self.submit(method, *args), self._label)], what=method,
                        timeout=self._call_timeout)[0]

    def next_prefetched(self, depth: int, method: str, *args: Any) -> Any:
        """The result of the oldest of ``depth + 1`` calls of ``method(*args)`` kept in flight.

        On an error the calls queued behind it are dropped (they would fail too).
        """
        with self._prefetch_lock:
            while len(self._prefetched) < depth + 1:
                self._prefetched.append(self.submit(method, *args))
            ref = self._prefetched.popleft()
        try:
            return self.wait(ref, method)
        except BaseException:
            self.drop_prefetched()
            raise

    def drop_prefetched(self) -> None:
        """Forget the calls in flight (after the buffer was emptied, restored or replaced).
        Their answers are collected on a daemon thread, errors included: an error never
        fetched is logged by Ray as an "Unhandled error" when its reference goes, after the
        caller already had the error that mattered."""
        with self._prefetch_lock:
            dropped = list(self._prefetched)
            self._prefetched.clear()
        if dropped:
            threading.Thread(target=_settle, args=(dropped,), daemon=True,
                             name="tdreplay-dropped-calls").start()

    # ---- finding, starting and replacing the actor ---------------------------------------------
    def connect(self, handle: Any) -> None:
        """Send later calls to ``handle`` (what was prefetched from the old one is dropped)."""
        self.drop_prefetched()
        self._handle = handle
        self._label = self._make_label(None)  # the new actor's id comes with its describe

    def lookup(self) -> Any:
        """The handle of the actor named :attr:`name`; :class:`BufferNotFoundError` (a
        ``ValueError``) if there is none."""
        if self._name is None:
            raise RuntimeError("this buffer actor has no name: it cannot be looked up.")
        try:
            return import_ray().get_actor(self._name, namespace=self._namespace)
        except ValueError as err:
            where = f" in namespace {self._namespace!r}" if self._namespace else ""
            raise BufferNotFoundError(
                f"no buffer actor named {self._name!r}{where}. If it died, the client that "
                "created the buffer must respawn(path) it first, then reconnect() here; else "
                "check that it was started and that this process is connected to the same Ray "
                "cluster and namespace.", actor=repr(self._name)) from err

    def reconnect(self) -> None:
        """Look the actor up by name again and read its description (a handle to the same
        actor is kept: the creator's owns it, Ray would kill it once dropped)."""
        handle = self.lookup()
        if self._handle is None or handle != self._handle:
            self.connect(handle)
        else:
            self.drop_prefetched()
        self.refresh_info()

    def spawn(self, restore_from: str | None = None) -> None:
        """Start a new actor from the creation arguments and wait until its buffer is built
        (and restored from ``restore_from``: the actor answers no call before)."""
        self.finish_spawn(self.start_spawn(restore_from))

    def respawn(self, restore_from: str | None = None, checked: bool = False) -> None:
        """Kill the actor if alive, wait until its name is free, start a new one restored from
        ``restore_from`` before it answers any call (a client that reconnects meanwhile waits).
        The checkpoint is checked first (:func:`~.checkpoints.check_checkpoint`; ``checked``:
        the caller did): a missing or damaged one is refused before the actor is killed."""
        if restore_from is not None and not checked:
            check_checkpoint(restore_from)
        self.shutdown()
        self.wait_name_released()
        self.spawn(restore_from)

    def start_spawn(self, restore_from: str | None = None) -> Any:
        """Start the actor; returns the ref of its first ``describe`` (see :meth:`finish_spawn`)."""
        if self._spawn_args is None:
            raise RuntimeError("respawn() needs the creation arguments, which only the client "
                               "that created the buffer has (this one was attached).")
        buffer_cls, spec, remote_config, meta = self._spawn_args
        meta = {**meta, "restore_from": restore_from, "label": repr(self._name or "<unnamed>")}
        # a rate limiter blocks calls inside the actor: other calls must go on meanwhile
        threads = {"max_concurrency": 16} if spec.get("rate_limiter") is not None else {}
        options = {"num_cpus": 0, **threads, **remote_config}
        self._options = options
        if self._name is not None:
            options["name"] = self._name
            if self._namespace is not None:
                options["namespace"] = self._namespace
        try:
            handle = _actor_class().options(**options).remote(buffer_cls, spec, meta)
        except ValueError as err:
            if self._name is not None and "already taken" in str(err):
                raise ValueError(
                    f"a buffer actor named {self._name!r} already exists: attach to it with "
                    f"RayReplayBuffer.attach({self._name!r}), or pick another name.") from err
            raise
        self.connect(handle)
        return self.submit("describe")

    def finish_spawn(self, describe_ref: Any) -> None:
        """Wait until the buffer is built; on failure kill the actor and raise its error."""
        try:
            self._set_info(self.wait(describe_ref, "starting the buffer",
                                     timeout=self._start_timeout))
        except RemoteCallTimeoutError as err:
            self.shutdown()
            self._handle = None
            raise BufferStartError(
                f"buffer actor {self._label} did not start within {self._start_timeout} s "
                "(start_timeout): Ray could not schedule it (no live node has the resources "
                f"its options ask for: {self._options}) or building and "
                "restoring its buffer took longer. The actor was killed; nothing was written "
                "to it.", actor=self._label) from err
        except BaseException:
            self.shutdown()
            self._handle = None
            raise

    def wait_name_released(self) -> None:
        """Wait (up to the start timeout) until the killed actor no longer holds its name."""
        if self._name is None or self._handle is None:
            return
        ray = import_ray()
        deadline = Deadline(self._start_timeout)
        while not deadline.passed():
            try:
                current = ray.get_actor(self._name, namespace=self._namespace)
            except ValueError:
                return
            if current != self._handle:
                return
            time.sleep(0.05)
        raise RemoteCallTimeoutError(f"buffer actor {self._label} still holds its name "
                                     f"{self._start_timeout} s after it was killed.",
                                     actor=self._label)

    def shutdown(self) -> None:
        """Kill the actor (no restart) and return once it is dead (:func:`._ray.wait_dead`)."""
        if self._handle is not None:
            import_ray().kill(self._handle, no_restart=True)
            wait_dead(self._handle, self._label)

    def close(self) -> None:
        """Kill the actor for good, quietly if it is already dead or Ray is shut down, and
        return once it is dead: later calls of this client raise
        :class:`~tdreplay.distributed.BufferActorDiedError`, other clients' calls find the
        actor dead. Closing twice does nothing."""
        if self._closed:
            return
        self._closed = True
        self.drop_prefetched()
        ray = import_ray()
        if self._handle is not None and ray.is_initialized():
            try:
                ray.kill(self._handle, no_restart=True)
            except (ValueError, RuntimeError):  # already gone (TorchRL ignores these too)
                return
            wait_dead(self._handle, self._label)


def _settle(refs: list[Any]) -> None:
    """Fetch the answers of dropped calls and discard them (their errors too)."""
    ray = import_ray()
    for ref in refs:
        try:
            ray.get(ref)
        except Exception:  # noqa: BLE001, S110 - dropped: only fetched so Ray logs nothing
            pass
