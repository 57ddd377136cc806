"""``RayReplayBuffer``: a replay buffer that lives in a Ray actor, shared by many processes.

Transport: the bytes of CPU tensors travel as out-of-band buffers that Ray writes once into
its object store; the actor reads them in place (zero copy) and the storage's write of the
rows is the only other copy. Sampled tensors likewise view the object that carried them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import torch
from tensordict import TensorDictBase

from tdreplay.core import ReplayBuffer, Sampler, Storage, Writer
from tdreplay.core.buffer_iteration import NextBatchMixin
from tdreplay.core.utils import check_count, check_flag, ensure_update_tensordict

from ._ray import ensure_ray
from ._wire import pack, sendable_batch, unpack
from .checkpoints import checkpoint_if_any, resolve_location
from .client import ActorClient, check_name
from .conditional_updates import RemoteConditionalUpdateMixin
from .handle import ClientHandleMixin
from .iteration import RemoteIterationMixin
from .lifecycle import ClosableBuffer
from .remote_checkpoints import ActorCheckpointsMixin
from .remote_configuration import RemoteConfigurationMixin
from .remote_edits import RemoteEditsMixin
from .remote_sharing import RemoteSharingMixin
from .transport import TransportMixin, check_transport

__all__ = ["RayReplayBuffer", "check_prefetch", "priority_entries"]


def check_prefetch(prefetch: Any) -> int:
    """How many batches a remote buffer's handle draws ahead: ``prefetch`` (an int >= 0, or
    ``None`` for 0), checked as a local buffer checks its own.

    Examples
    --------
    >>> check_prefetch(None), check_prefetch(2)
    (0, 2)
    >>> check_prefetch(-1)
    Traceback (most recent call last):
    ...
    ValueError: prefetch must be >= 0, got -1: a non-negative int.
    """
    return check_count(prefetch, "prefetch", 0) or 0


def priority_entries(data: Any, info: Mapping[str, Any]) -> TensorDictBase:
    """``data`` reduced to what a priority update reads: ``index``, the priority entry and the
    entries the remote sampler asks back (``update_keys``), as ``info`` (a buffer actor's
    description) names them."""
    data = ensure_update_tensordict(data)
    present = data.keys()
    keys = [k for k in ("index", info.get("priority_key"), *info.get("update_keys", ()))
            if k is not None and k in present]
    return data.select(*keys)


class RayReplayBuffer(ActorCheckpointsMixin, RemoteConditionalUpdateMixin, RemoteEditsMixin,
                      RemoteIterationMixin, NextBatchMixin, RemoteConfigurationMixin,
                      RemoteSharingMixin, TransportMixin, ClientHandleMixin, ClosableBuffer):
    """A replay buffer served by a Ray actor: collectors and learners anywhere share it.

    The buffer (``replay_buffer_cls(storage=..., sampler=..., writer=..., batch_size=...,
    **kwargs)``) is built inside the actor; this object forwards ``extend``, ``add``,
    ``sample``, ``update_priority``, ``update_tensordict_priority``, ``len``, ``write_count``,
    ``dumps`` / ``loads`` and ``state_dict`` / ``load_state_dict`` to it, and
    ``read_all_in_order``, ``write_all``, ``set_``, ``set_at_``, ``update_``, ``query``
    (:mod:`.remote_edits`), ``update_if_present`` / ``submit_update_if_present``
    (:mod:`.conditional_updates`), configuration calls (:mod:`.remote_configuration`). The
    actor runs one call at a time, so each ``extend`` is applied whole or not at all.
    ``share()`` returns the buffer, already shared (:mod:`.remote_sharing`).

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
        priority updates made meanwhile, as with a local buffer's ``prefetch`` (and, as
        there, never with a finite sampler: its epoch would be drawn ahead).
    transport : str
        How :meth:`client` handles move data: ``"ray"`` (or ``"auto"``, the default: Ray's
        object store) or ``"distributed"`` (TorchRL's: each client opens a gloo channel of its
        own to the actor, see :mod:`~tdreplay.distributed.transport`). This object's own calls
        go through Ray either way.
    transport_options : dict, optional
        Of the ``"distributed"`` transport: ``backend`` (``"gloo"``) and ``timeout`` (seconds
        a client's call may take, 300 by default).
    checkpoint_path : str, optional
        Where :meth:`dumps` writes by default, and what an actor restarted by Ray
        (``remote_config={"max_restarts": ...}``) restores; without it a restarted actor
        refuses every call (:class:`~tdreplay.distributed.errors.BufferStateLostError`). A
        path every node mounts, or an fsspec URL (:mod:`~tdreplay.distributed.checkpoints`).
    **kwargs
        Other arguments of ``replay_buffer_cls`` (``rate_limiter``: its calls wait in the
        actor, at most a little less than ``call_timeout``;  ``transform``, ``collate_fn``,
        ``priority_key``, ``alpha``, ...); ``generator`` may be a factory.

    Faults: a dead actor makes every call raise
    :class:`~tdreplay.distributed.BufferActorDiedError` naming it (what it held is lost;
    :meth:`respawn` rebuilds it from the last :meth:`dumps`); a call that gets no answer within
    ``call_timeout`` raises :class:`~tdreplay.distributed.RemoteCallTimeoutError`. Errors the
    buffer raises (bad data, bad batch size, ...) reach the caller as their own type, and leave
    the buffer as it was, as for a local buffer.

    Sharing: the buffer pickles, so Ray tasks and actors (collectors, learners) can be handed
    it. A copy is a client of the same actor, as :meth:`attach` gives (unnamed actors too),
    with an empty ``prefetch`` queue and without the creator's :meth:`respawn`;
    :meth:`client` gives one without ``close`` / ``shutdown`` either (TorchRL's handle).
    :meth:`stats` and ``for batch in rb`` are the remote buffer's (:mod:`.iteration`).

    Examples
    --------
    >>> from functools import partial
    >>> import pickle
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
    >>> copy = pickle.loads(pickle.dumps(rb))  # what a Ray task or actor receives
    >>> copy.add(torch.tensor(11.0)), len(rb)
    (11, 12)
    >>> rb.close()
    """

    def __init__(
        self,
        *,
        storage: Storage | Callable[[], Storage] | None = None,
        sampler: Sampler | Callable[[], Sampler] | None = None,
        writer: Writer | Callable[[], Writer] | None = None,
        batch_size: int | None = None,
        replay_buffer_cls: type[ReplayBuffer] = ReplayBuffer,
        ray_init_config: dict[str, Any] | None = None,
        remote_config: dict[str, Any] | None = None,
        name: str | None = None,
        namespace: str | None = None,
        call_timeout: float | None = 60.0,
        start_timeout: float | None = 300.0,
        prefetch: int | None = None,
        transport: str = "auto",
        transport_options: dict[str, Any] | None = None,
        checkpoint_path: str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> None:
        self._transport, self._transport_options = check_transport(transport,
                                                                   transport_options)
        self._checkpoint_path = None if checkpoint_path is None \
            else resolve_location(checkpoint_path)
        client = ActorClient.for_new_actor(
            spec={"storage": storage, "sampler": sampler, "writer": writer,
                  "batch_size": batch_size, **kwargs},
            replay_buffer_cls=replay_buffer_cls, remote_config=remote_config, name=name,
            namespace=namespace, call_timeout=call_timeout, start_timeout=start_timeout,
            meta={"checkpoint_path": self._checkpoint_path})
        self._bind(client, prefetch)
        self._start_with_ray(ray_init_config, client.spawn)

    def _bind(self, client: ActorClient, prefetch: int | None) -> None:
        self._prefetch = check_prefetch(prefetch)
        self._client = client

    def _actor_clients(self) -> list[ActorClient]:
        return [self._client]

    @classmethod
    def from_client(cls, client: ActorClient, *, prefetch: int | None = None) -> RayReplayBuffer:
        """A buffer over ``client``, a connection to a buffer actor made elsewhere (e.g. by
        :class:`~tdreplay.distributed.ShardedReplayBuffer`, one per shard).

        The client is shared, not copied: what one side does (reconnect, respawn, a new
        ``call_timeout``) the other sees.

        Examples
        --------
        >>> from functools import partial
        >>> from tdreplay.core import ListStorage
        >>> from tdreplay.distributed.client import ActorClient
        >>> client = ActorClient.for_new_actor(spec={"storage": partial(ListStorage, 8)},
        ...                                    replay_buffer_cls=ReplayBuffer)
        >>> client.spawn()
        >>> rb = RayReplayBuffer.from_client(client)
        >>> rb.max_size, len(rb)
        (8, 0)
        >>> rb.shutdown()
        """
        buffer = cls.__new__(cls)
        cls._bind(buffer, client, prefetch)
        return buffer

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
        ensure_ray(ray_init_config)
        client = ActorClient(name=check_name(name, "name"),
                             namespace=check_name(namespace, "namespace"),
                             call_timeout=call_timeout)
        prefetch = check_prefetch(prefetch)
        client.reconnect()
        return cls.from_client(client, prefetch=prefetch)

    from_name = attach

    def reconnect(self) -> None:
        """Look the actor up by name again (after another process respawned it)."""
        self._client.reconnect()

    def respawn(self, path: str | os.PathLike[str] | None = None) -> None:
        """Replace the actor by a new one built like it, restored from ``path``; without one,
        from ``checkpoint_path`` once something was saved there (else it starts empty).

        The checkpoint at ``path`` is checked first (every file against its size and
        CRC-32): a missing or damaged one is refused and the actor keeps serving. Then the old
        actor is killed if it is still alive (what it held and did not save is lost). The new
        one restores ``path`` before it answers any call: a client that reconnects meanwhile
        waits, and never sees it empty. Only the client that created the buffer knows how to
        build it again; other clients then call :meth:`reconnect`.

        Raises
        ------
        RuntimeError
            This client was attached, not the creator.
        CheckpointError
            No committed checkpoint at ``path`` (``CheckpointNotFoundError``, a
            ``FileNotFoundError``), or a damaged one: nothing was changed.
        """
        client = self._client
        self._check_not_closed()
        if not client.can_respawn:
            raise RuntimeError("respawn() needs the creation arguments, which only the client "
                               "that created the buffer has (this one was attached).")
        if path is not None:
            client.respawn(resolve_location(path))
        else:  # (checked here: a damaged checkpoint_path is refused, nothing changed)
            client.respawn(checkpoint_if_any(self._checkpoint_path), checked=True)

    def shutdown(self, timeout: float | None = None) -> None:
        """Kill the actor (no restart); every client's later calls raise
        :class:`~tdreplay.distributed.BufferActorDiedError`. :meth:`respawn` can replace it.
        ``timeout``: accepted as TorchRL's, which ignores it too (the kill does not wait)."""
        self._client.shutdown()

    # ---- what this client knows ----------------------------------------------------------------
    @property
    def call_timeout(self) -> float | None:
        """Seconds a call waits for its answer (``None``: forever)."""
        return self._client.call_timeout

    @call_timeout.setter
    def call_timeout(self, value: float | None) -> None:
        self._client.call_timeout = value

    @property
    def name(self) -> str | None:
        """Ray actor name of the buffer (``None`` if unnamed)."""
        return self._client.name

    @property
    def namespace(self) -> str | None:
        """Ray namespace given for the name (``None``: the job's)."""
        return self._client.namespace

    @property
    def actor(self) -> Any:
        """The Ray actor handle (calls on it bypass the timeouts and error translation)."""
        return self._client.handle

    @property
    def actor_id(self) -> str | None:
        """Ray's id of the actor (hex; it changes when the actor is respawned)."""
        return self._client.actor_id

    @property
    def actor_info(self) -> dict[str, Any]:
        """What the actor reported when this client connected: ``buffer_cls``,
        ``batch_size``, ``priority_key``, ``is_prioritized``, ``update_keys``, ``max_size``,
        ``meta``, ``pid``, ``actor_id``, ``node_id`` (a copy)."""
        return dict(self._client.info)

    @property
    def batch_size(self) -> int | None:
        """Default batch size of :meth:`sample` (the remote buffer's)."""
        return self._client.info.get("batch_size")

    @property
    def priority_key(self) -> str | None:
        """The remote buffer's ``priority_key`` (TensorDict buffers), else ``None``."""
        return self._client.info.get("priority_key")

    @property
    def dim_extend(self) -> int:
        """The remote buffer's ``dim_extend`` (the batch dim ``extend`` writes along); setting
        it accepts the value it has and refuses another, as a local buffer's (TorchRL's).

        Examples
        --------
        >>> from functools import partial
        >>> from tdreplay.storages import LazyTensorStorage
        >>> from tdreplay.distributed import RayReplayBuffer
        >>> rb = RayReplayBuffer(storage=partial(LazyTensorStorage, 8, ndim=2))
        >>> rb.dim_extend, rb.is_alive, rb.has_gpu  # (2 dims: the last batch dim)
        (1, True, False)
        >>> rb.dim_extend = 0  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        RuntimeError: dim_extend cannot be reset (it is 1, got 0). Please create a new ...
        >>> rb.close(); rb.is_alive
        False
        """
        return int(self._client.call("get_dim_extend"))

    @dim_extend.setter
    def dim_extend(self, value: int) -> None:
        self._client.drop_prefetched()  # (drawn before the change)
        self._client.call("set_dim_extend", value)

    @property
    def is_alive(self) -> bool:
        """Whether this buffer is open (:meth:`close` not called), as TorchRL's
        ``is_alive``."""
        return not self.closed

    @property
    def has_gpu(self) -> bool:
        """Whether the actor was given GPUs (``remote_config={"num_gpus": ...}``), as
        TorchRL's; ``False`` on an attached client, which does not know."""
        return bool(self._client.options.get("num_gpus", 0))

    @property
    def max_size(self) -> int:
        """Slots of the remote buffer's storage."""
        return int(self._client.info["max_size"])

    #: where the buffer is served (``ReplayBuffer(..., service_backend="ray")`` builds one)
    service_backend = "ray"

    # ---- writing -------------------------------------------------------------------------------
    def extend(self, data: Any, **kwargs: Any) -> torch.Tensor:
        """Write a batch; returns the slots written.

        As the remote buffer's ``extend`` (``kwargs`` too, e.g. ``update_priority``); ``data``
        is left as it is.
        """
        slots, _ = unpack(self._client.call("extend", pack(sendable_batch(data)), kwargs,
                                            self._client.limit_timeout))
        return slots

    def add(self, data: Any) -> int | torch.Tensor | None:
        """Add one item; returns where it lives (as the remote buffer's ``add``)."""
        index, _ = unpack(self._client.call("add", pack(data), self._client.limit_timeout))
        return index

    def __setitem__(self, index: Any, value: Any) -> None:
        self._client.call("set_item", pack(index), pack(value))

    def mark_update(self, index: Any) -> None:
        """Tell the served buffer's sampler that the items at slots ``index`` changed (its
        ``mark_update``, which TorchRL's ``RayReplayBuffer`` forwards too); batches this
        client drew ahead are dropped."""
        self._client.drop_prefetched()
        self._client.call("mark_update", pack(index))

    def update_priority(self, index: Any, priority: Any, **kwargs: Any) -> None:
        """Set the priorities of slots ``index`` (``kwargs``: e.g. ``write_generation``)."""
        self._client.call("update_priority", pack(index), pack(priority), pack(kwargs))

    def update_tensordict_priority(self, data: TensorDictBase) -> None:
        """Update priorities from ``data[priority_key]`` at ``data["index"]``.

        Only ``index``, the priority entry and the entries the sampler asks back
        (``update_keys``, e.g. ``write_generation``) are sent.
        """
        self._client.call("update_tensordict_priority",
                          pack(priority_entries(data, self._client.info)))

    def empty(self, empty_write_count: bool = True) -> None:
        """Remove every item (and reset the write count by default)."""
        empty_write_count = check_flag(empty_write_count, "empty_write_count")
        self._client.drop_prefetched()
        self._client.call("empty", empty_write_count)

    def clear_prefetch(self) -> None:
        """Drop the ``sample()`` calls this client keeps in flight (``prefetch``), as a local
        buffer's ``clear_prefetch``: the next ``sample()`` draws from the buffer as it is now.
        This client's own ``empty`` / ``loads`` / edits do it; call it after *another* client
        emptied or restored the buffer, whose batches drawn ahead hold rows gone since.

        Examples
        --------
        >>> from functools import partial
        >>> from tdreplay.core import ListStorage
        >>> from tdreplay.distributed import RayReplayBuffer
        >>> rb = RayReplayBuffer(storage=partial(ListStorage, 10), batch_size=2,
        ...                      name="doc-clear-prefetch")
        >>> _ = rb.extend([1, 1, 1])
        >>> learner = RayReplayBuffer.attach("doc-clear-prefetch", prefetch=2)
        >>> learner.sample()
        [1, 1]
        >>> rb.empty(); _ = rb.extend([7, 7])    # another client empties and refills
        >>> learner.clear_prefetch()             # (else up to 2 batches of 1s still come)
        >>> learner.sample()
        [7, 7]
        >>> rb.close()
        """
        self._client.drop_prefetched()

    # ---- reading -------------------------------------------------------------------------------
    def sample(self, batch_size: int | None = None, return_info: bool = False) -> Any:
        """Sample a batch (of ``batch_size``, default the buffer's); with ``return_info``
        returns ``(batch, info)``."""
        if return_info is not False and return_info is not True:  # (one check when a bool)
            check_flag(return_info, "return_info")
        if self._prefetch and batch_size in (None, self.batch_size) \
                and self.batch_size is not None and not self._client.info.get("finite_epochs"):
            data, info = unpack(self._client.next_prefetched(self._prefetch, "sample", None, False,
                                                             self._client.limit_timeout))
        else:
            data, info = unpack(self._client.call("sample", batch_size, False,
                                                  self._client.limit_timeout))
        return (data, info) if return_info else data

    def can_sample(self, batch_size: int | None = None) -> bool:
        """The served buffer's ``can_sample`` (of its ``batch_size`` by default)."""
        return self._client.call("can_sample", batch_size)

    def __getitem__(self, index: Any) -> Any:
        return unpack(self._client.call("get_item", pack(index)))

    def __len__(self) -> int:
        return self._client.call("length")

    @property
    def write_count(self) -> int:
        """Items written through ``add`` and ``extend`` so far."""
        return self._client.call("write_count")

    def __repr__(self) -> str:
        if getattr(self, "_client", None) is None:  # (Ray's actor class of this class reads it)
            return f"{type(self).__name__}(no actor)"
        return (f"{type(self).__name__}(actor={self._client.label}, "
                f"buffer_cls={self._client.info.get('buffer_cls')}, batch_size={self.batch_size}, "
                f"call_timeout={self.call_timeout})")
