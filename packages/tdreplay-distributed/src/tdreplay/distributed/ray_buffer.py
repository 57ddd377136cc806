"""``RayReplayBuffer``: a replay buffer that lives in a Ray actor, shared by many processes."""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import Any

import torch
from tensordict import is_tensor_collection

from tdreplay.core import ReplayBuffer

from ._ray import check_timeout, ensure_ray, import_ray, wait_all
from ._server import COMPONENTS, BufferServer, check_component_spec
from ._wire import pack, unpack
from .errors import RemoteCallTimeoutError

__all__ = ["RayReplayBuffer"]

_ACTOR_CLASS: Any = None


def _actor_class() -> Any:
    """``ray.remote(BufferServer)``, made once per process."""
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        _ACTOR_CLASS = import_ray().remote(BufferServer)
    return _ACTOR_CLASS


def _check_name(value: Any, name: str) -> str | None:
    if value is None or (isinstance(value, str) and value):
        return value
    raise TypeError(f"{name} must be a non-empty str or None, got {value!r}.")


class RayReplayBuffer:
    """A replay buffer served by a Ray actor: collectors and learners anywhere share it.

    The buffer (``replay_buffer_cls(storage=..., sampler=..., writer=..., batch_size=...,
    **kwargs)``) is built inside the actor; this object forwards ``extend``, ``add``,
    ``sample``, ``update_priority``, ``update_tensordict_priority``, ``len``, ``write_count``,
    ``dumps`` / ``loads`` and ``state_dict`` / ``load_state_dict`` to it. The actor runs one
    call at a time, so each ``extend`` is applied whole or not at all.

    Parameters
    ----------
    storage, sampler, writer : component, class or factory, optional
        A component instance (pickled to the actor), or a class or any factory (e.g.
        ``functools.partial(LazyTensorStorage, 100_000)``) called inside the actor, so memory
        and files are created where the buffer lives. Defaults as :class:`ReplayBuffer`.
    batch_size : int, optional
        Default batch size of :meth:`sample`.
    replay_buffer_cls : type
        The buffer class built in the actor (:class:`~tdreplay.core.ReplayBuffer`,
        :class:`~tdreplay.core.TensorDictReplayBuffer`, a prioritized buffer class, ...).
    ray_init_config : dict, optional
        ``ray.init`` arguments, used only when Ray is not initialised yet.
    remote_config : dict, optional
        Actor options (``ray.remote`` / ``.options``): ``num_cpus`` (default ``0``: a buffer
        waits on calls more than it computes, so it reserves no CPU), ``max_concurrency``,
        ``lifetime="detached"`` (outlive the creating process), ``scheduling_strategy``, ...
    name : str, optional
        Ray actor name: other processes find the buffer with :meth:`attach`.
    namespace : str, optional
        Ray namespace of the name (default: the current job's namespace).
    call_timeout : float or None
        Seconds every call waits for its answer before raising
        :class:`~tdreplay.distributed.RemoteCallTimeoutError` (``None``: wait forever).
        Settable attribute.
    start_timeout : float or None
        Seconds to wait for the actor to start and build the buffer.
    prefetch : int, optional
        Keep this many ``sample()`` calls (of the default batch size) in flight, so the next
        batches are drawn and shipped while the caller works on the current one. Client-side:
        each client has its own (see :meth:`attach`). Prefetched batches were drawn before the
        priority updates made meanwhile, as with a local buffer's ``prefetch``.
    **kwargs
        Other arguments of ``replay_buffer_cls`` (``transform``, ``collate_fn``,
        ``priority_key``, ``alpha``, ...); ``generator`` may be a ``torch.Generator`` or a
        factory of one.

    Transport: the bytes of CPU tensors travel as out-of-band buffers that Ray writes once into
    its object store; the actor reads them in place (zero copy) and the storage's write of the
    rows is the only other copy. Sampled tensors likewise view the object that carried them.

    Faults: a dead actor makes every call raise
    :class:`~tdreplay.distributed.BufferActorDiedError` naming it (what it held is lost;
    :meth:`respawn` rebuilds it from the last :meth:`dumps`); a call that gets no answer within
    ``call_timeout`` raises :class:`~tdreplay.distributed.RemoteCallTimeoutError`. Errors the
    buffer raises (bad data, bad batch size, ...) reach the caller as their own type, and leave
    the buffer as it was, as for a local buffer.

    Examples
    --------
    >>> from functools import partial
    >>> import torch
    >>> from tdreplay.core import ListStorage
    >>> rb = RayReplayBuffer(storage=partial(ListStorage, 100), batch_size=4, name="doc-rb",
    ...                      ray_init_config={"num_cpus": 1})
    >>> rb.extend([torch.tensor(float(i)) for i in range(10)]).tolist()
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    >>> collector = RayReplayBuffer.attach("doc-rb")  # e.g. in a collector process
    >>> collector.add(torch.tensor(10.0))
    10
    >>> len(rb), rb.write_count, rb.sample().shape
    (11, 11, torch.Size([4]))
    >>> rb.shutdown()
    """

    def __init__(
        self,
        *,
        storage: Any = None,
        sampler: Any = None,
        writer: Any = None,
        batch_size: int | None = None,
        replay_buffer_cls: type[ReplayBuffer] = ReplayBuffer,
        ray_init_config: dict[str, Any] | None = None,
        remote_config: dict[str, Any] | None = None,
        name: str | None = None,
        namespace: str | None = None,
        call_timeout: float | None = 60.0,
        start_timeout: float | None = 300.0,
        prefetch: int | None = None,
        **kwargs: Any,
    ) -> None:
        self._setup(
            spec={"storage": storage, "sampler": sampler, "writer": writer,
                  "batch_size": batch_size, **kwargs},
            replay_buffer_cls=replay_buffer_cls, ray_init_config=ray_init_config,
            remote_config=remote_config, name=name, namespace=namespace,
            call_timeout=call_timeout, start_timeout=start_timeout, meta={})
        self._set_prefetch(prefetch)
        self._spawn()

    def _setup(self, *, spec: dict[str, Any], replay_buffer_cls: Any,
               ray_init_config: dict[str, Any] | None, remote_config: dict[str, Any] | None,
               name: str | None, namespace: str | None, call_timeout: float | None,
               start_timeout: float | None, meta: dict[str, Any]) -> None:
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
        self._init_client(name=_check_name(name, "name"),
                          namespace=_check_name(namespace, "namespace"),
                          call_timeout=call_timeout)
        self._start_timeout = check_timeout(start_timeout, "start_timeout")
        self._spawn_args = (replay_buffer_cls, {k: v for k, v in spec.items() if v is not None},
                            dict(remote_config or {}), dict(meta))
        ensure_ray(ray_init_config)

    def _init_client(self, *, name: str | None, namespace: str | None,
                     call_timeout: float | None) -> None:
        self.call_timeout = call_timeout
        self._name = name
        self._namespace = namespace
        self._handle: Any = None
        self._label = f"{name!r}" if name else "<unnamed>"
        self._info: dict[str, Any] = {}
        self._spawn_args: tuple[Any, ...] | None = None
        self._start_timeout: float | None = None
        self._prefetch = 0
        self._prefetched: collections.deque[Any] = collections.deque()
        self._prefetch_lock = threading.Lock()

    def _set_prefetch(self, prefetch: int | None) -> None:
        if prefetch is not None and (isinstance(prefetch, bool) or not isinstance(prefetch, int)
                                     or prefetch < 0):
            raise ValueError(f"prefetch must be an int >= 0 or None, got {prefetch!r}.")
        self._prefetch = prefetch or 0

    def _spawn(self) -> None:
        """Start a new actor from the creation arguments and wait until its buffer is built."""
        self._finish_spawn(self._start_spawn())

    def _start_spawn(self) -> Any:
        """Start the actor; returns the ref of its first ``describe`` (see _finish_spawn)."""
        buffer_cls, spec, remote_config, meta = self._spawn_args
        options = {"num_cpus": 0, **remote_config}
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
        self._connect(handle)
        return self._submit("describe")

    def _finish_spawn(self, describe_ref: Any) -> None:
        """Wait until the buffer is built; on failure kill the actor and raise its error."""
        try:
            self._info = wait_all([(describe_ref, self._label)], what="starting the buffer",
                                  timeout=self._start_timeout)[0]
        except BaseException:
            self.shutdown()
            self._handle = None
            raise

    def _connect(self, handle: Any) -> None:
        self._drop_prefetched()
        self._handle = handle
        actor_id = handle._actor_id.hex()[:12]
        self._label = f"{self._name!r} (actor {actor_id})" if self._name else f"<unnamed actor " \
                                                                               f"{actor_id}>"

    # ---- finding and replacing the actor -------------------------------------------------------
    @classmethod
    def attach(cls, name: str, *, namespace: str | None = None,
               call_timeout: float | None = 60.0, prefetch: int | None = None,
               ray_init_config: dict[str, Any] | None = None) -> RayReplayBuffer:
        """A client of the buffer actor named ``name``, e.g. in a collector process.

        The process must be connected to the same Ray cluster (``ray_init_config``, e.g.
        ``{"address": "auto"}``, is used if Ray is not initialised). ``from_name`` is an alias.
        See the class example.

        Raises
        ------
        ValueError
            No actor has that name in that namespace.
        """
        ray = ensure_ray(ray_init_config)
        client = cls.__new__(cls)
        client._init_client(name=_check_name(name, "name"),
                            namespace=_check_name(namespace, "namespace"),
                            call_timeout=call_timeout)
        client._set_prefetch(prefetch)
        client._connect(client._lookup(ray))
        client._info = client._call("describe")
        return client

    from_name = attach

    def _lookup(self, ray: Any) -> Any:
        if self._name is None:
            raise RuntimeError("this buffer actor has no name: it cannot be looked up.")
        try:
            return ray.get_actor(self._name, namespace=self._namespace)
        except ValueError as err:
            where = f" in namespace {self._namespace!r}" if self._namespace else ""
            raise ValueError(f"no buffer actor named {self._name!r}{where}: is it started, and is "
                             "this process connected to the same Ray cluster and namespace?"
                             ) from err

    def reconnect(self) -> None:
        """Look the actor up by name again (after another process respawned it)."""
        self._connect(self._lookup(import_ray()))
        self._info = self._call("describe")

    def respawn(self, path: str | os.PathLike | None = None) -> None:
        """Replace the actor by a new one built like it, restored from ``path`` if given.

        The old actor is killed if it is still alive (what it held and did not save is lost).
        Only the client that created the buffer knows how to build it again; other clients
        then call :meth:`reconnect`.

        Raises
        ------
        RuntimeError
            This client was attached, not the creator.
        """
        if self._spawn_args is None:
            raise RuntimeError("respawn() needs the creation arguments, which only the client "
                               "that created the buffer has (this one was attached).")
        path = None if path is None else os.path.abspath(os.fspath(path))
        self.shutdown()
        self._wait_name_released()
        self._spawn()
        if path is not None:
            self.loads(path)

    def _wait_name_released(self) -> None:
        """Wait (up to ``start_timeout``) until the killed actor no longer holds its name."""
        if self._name is None or self._handle is None:
            return
        ray = import_ray()
        deadline = None if self._start_timeout is None else time.monotonic() + self._start_timeout
        while deadline is None or time.monotonic() < deadline:
            try:
                current = ray.get_actor(self._name, namespace=self._namespace)
            except ValueError:
                return
            if current._actor_id != self._handle._actor_id:
                return
            time.sleep(0.05)
        raise RemoteCallTimeoutError(f"buffer actor {self._label} still holds its name "
                                     f"{self._start_timeout} s after it was killed.",
                                     actor=self._label)

    def shutdown(self) -> None:
        """Kill the actor (no restart); every client's later calls raise
        :class:`~tdreplay.distributed.BufferActorDiedError`."""
        if self._handle is not None:
            import_ray().kill(self._handle, no_restart=True)

    # ---- calls ---------------------------------------------------------------------------------
    _DEFAULT = object()

    def _submit(self, method: str, *args: Any) -> Any:
        """The object ref of ``method(*args)`` on the actor (see :meth:`_call`)."""
        return getattr(self._handle, method).remote(*args)

    def _call(self, method: str, *args: Any, timeout: Any = _DEFAULT) -> Any:
        ref = self._submit(method, *args)
        timeout = self.call_timeout if timeout is self._DEFAULT else timeout
        return wait_all([(ref, self._label)], what=method, timeout=timeout)[0]

    @property
    def call_timeout(self) -> float | None:
        """Seconds a call waits for its answer (``None``: forever)."""
        return self._call_timeout

    @call_timeout.setter
    def call_timeout(self, value: float | None) -> None:
        self._call_timeout = check_timeout(value, "call_timeout")

    @property
    def name(self) -> str | None:
        """Ray actor name of the buffer (``None`` if unnamed)."""
        return self._name

    @property
    def namespace(self) -> str | None:
        """Ray namespace given for the name (``None``: the job's)."""
        return self._namespace

    @property
    def actor(self) -> Any:
        """The Ray actor handle (calls on it bypass the timeouts and error translation)."""
        return self._handle

    @property
    def batch_size(self) -> int | None:
        """Default batch size of :meth:`sample` (the remote buffer's)."""
        return self._info.get("batch_size")

    @property
    def priority_key(self) -> str | None:
        """The remote buffer's ``priority_key`` (TensorDict buffers), else ``None``."""
        return self._info.get("priority_key")

    @property
    def max_size(self) -> int:
        """Slots of the remote buffer's storage."""
        return self._info["max_size"]

    # ---- writing -------------------------------------------------------------------------------
    def extend(self, data: Any, **kwargs: Any) -> torch.Tensor:
        """Write a batch; returns the slots written.

        As the remote buffer's ``extend`` (``kwargs`` too, e.g. ``update_priority``). A
        TensorDict gets the ``index`` (and ``write_generation``) entries the buffer sets.
        """
        slots, bookkeeping = unpack(self._call("extend", pack(data), kwargs))
        self._copy_bookkeeping(data, bookkeeping)
        return slots

    def add(self, data: Any) -> int | torch.Tensor:
        """Add one item; returns where it lives (as the remote buffer's ``add``)."""
        index, bookkeeping = unpack(self._call("add", pack(data)))
        self._copy_bookkeeping(data, bookkeeping)
        return index

    @staticmethod
    def _copy_bookkeeping(data: Any, bookkeeping: Any) -> None:
        if bookkeeping is not None and is_tensor_collection(data) and not data.is_locked:
            data.update(bookkeeping)

    def __setitem__(self, index: Any, value: Any) -> None:
        self._call("set_item", pack(index), pack(value))

    def update_priority(self, index: Any, priority: Any, **kwargs: Any) -> None:
        """Set the priorities of slots ``index`` (``kwargs``: e.g. ``write_generation``)."""
        self._call("update_priority", pack(index), pack(priority), pack(kwargs))

    def update_tensordict_priority(self, data: Any) -> None:
        """Update priorities from ``data[priority_key]`` at ``data["index"]``.

        Only ``index``, the priority entry and the entries the sampler asks back
        (``update_keys``, e.g. ``write_generation``) are sent.
        """
        self._call("update_tensordict_priority", pack(self._priority_entries(data)))

    def _priority_entries(self, data: Any) -> Any:
        """``data`` reduced to what a priority update reads: ``index``, the priority entry and
        the entries the remote sampler asks back (``update_keys``)."""
        if not is_tensor_collection(data):
            raise TypeError(f"data must be a TensorDict, got {type(data).__name__}.")
        present = data.keys()
        keys = [k for k in ("index", self.priority_key, *self._info.get("update_keys", ()))
                if k is not None and k in present]
        return data.select(*keys)

    def empty(self, empty_write_count: bool = True) -> None:
        """Remove every item (and reset the write count by default)."""
        self._drop_prefetched()
        self._call("empty", empty_write_count)

    # ---- reading -------------------------------------------------------------------------------
    def sample(self, batch_size: int | None = None, return_info: bool = False) -> Any:
        """Sample a batch (of ``batch_size``, default the buffer's); with ``return_info``
        returns ``(batch, info)``."""
        if self._prefetch and batch_size in (None, self.batch_size) \
                and self.batch_size is not None:
            data, info = unpack(self._next_prefetched())
        else:
            data, info = unpack(self._call("sample", batch_size, False))
        return (data, info) if return_info else data

    def _next_prefetched(self) -> Any:
        """The oldest in-flight sample, after topping the queue up to ``prefetch + 1``."""
        with self._prefetch_lock:
            while len(self._prefetched) < self._prefetch + 1:
                self._prefetched.append(self._submit("sample", None, False))
            ref = self._prefetched.popleft()
        try:
            return wait_all([(ref, self._label)], what="sample", timeout=self.call_timeout)[0]
        except BaseException:
            # those queued behind a failed sample (e.g. from an empty buffer) would fail too
            self._drop_prefetched()
            raise

    def _drop_prefetched(self) -> None:
        """Forget the samples in flight (after the buffer was emptied, restored or replaced)."""
        with self._prefetch_lock:
            self._prefetched.clear()

    def __getitem__(self, index: Any) -> Any:
        return unpack(self._call("get_item", pack(index)))

    def __len__(self) -> int:
        return self._call("length")

    @property
    def write_count(self) -> int:
        """Items written through ``add`` and ``extend`` so far."""
        return self._call("write_count")

    # ---- checkpoints ---------------------------------------------------------------------------
    def dumps(self, path: str | os.PathLike) -> None:
        """Checkpoint the buffer under directory ``path``, atomically.

        The actor writes it: ``path`` is on the actor's machine (made absolute here).
        """
        self._call("dumps", os.path.abspath(os.fspath(path)))

    def loads(self, path: str | os.PathLike) -> None:
        """Restore a checkpoint written by :meth:`dumps` (checked before anything changes)."""
        self._drop_prefetched()
        self._call("loads", os.path.abspath(os.fspath(path)))

    save = dumps
    dump = dumps
    load = loads

    def state_dict(self) -> dict[str, Any]:
        """The remote buffer's ``state_dict()``."""
        return unpack(self._call("state_dict"))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` into the remote buffer."""
        self._drop_prefetched()
        self._call("load_state_dict", pack(state_dict))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(actor={self._label}, "
                f"buffer_cls={self._info.get('buffer_cls')}, batch_size={self.batch_size}, "
                f"call_timeout={self.call_timeout})")
