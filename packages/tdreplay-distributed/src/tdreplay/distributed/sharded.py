"""``ShardedReplayBuffer``: K buffer actors written in turn and sampled as one buffer.

Sampling keeps the distribution of one buffer holding every shard's items. Shard ``k`` holds
sampling mass ``M_k`` (for a prioritized sampler the sum of ``p_i = (priority_i + eps) **
alpha`` over its items, i.e. its sum tree's total; for any other sampler its number of
written slots). Every position of a batch picks shard ``k`` with probability
``M_k / sum_j M_j`` (so shard counts are multinomial), and the shard draws its items in
proportion to ``p_i / M_k``: item ``i`` is drawn with probability ``p_i / sum_all p``, as in
one buffer. Importance weights are made global the same way: a shard returns
``(p_i / min_k) ** -beta`` with ``min_k`` its smallest ``p``; multiplying by
``(min_k / min) ** -beta``, ``min`` the smallest ``p`` of all shards, gives
``(p_i / min) ** -beta = (N P(i)) ** -beta / max_j (N P(j)) ** -beta`` with ``P`` and ``N``
over the whole buffer. The masses come with the shards' answers, the draws' own included,
so a sample is one round of calls and stale masses never bias it (:mod:`._shard_calls`).

Slots are global: shard ``k`` owns ``[offset_k, offset_k + max_size_k)``, ``offset_k`` the
sum of the sizes of the shards before it; ``extend`` returns and samples carry global slots,
and ``update_priority`` sends each slot to its shard.

Layouts: a lazy storage lays itself out (keys, row shapes, dtypes) at its first write, and
each shard has its own, so a shard not laid out yet is first laid out like a shard that is
(a write of no rows of that shard's layout), and its storage then checks the batch itself:
one of another schema is refused as the other shards' storages refuse it (``KeyError``,
``ValueError``, ``TypeError``), no row written anywhere (the first write of all goes to the
lowest live shard, so racing writers cannot lay out two shards unlike each other). Once every
shard a client writes to is laid out, this costs nothing. A batch that brings an entry the
shards do not hold is refused too (``KeyError``, nothing written), though a local
``LazyTensorStorage`` would add it: a shard holding an entry the others lack would make every
sample that joins their rows fail.

>>> from functools import partial
>>> from tensordict import TensorDict
>>> from tdreplay.core import TensorDictReplayBuffer
>>> from tdreplay.storages import LazyTensorStorage
>>> rb = ShardedReplayBuffer(num_shards=2, storage=partial(LazyTensorStorage, 10),
...                          replay_buffer_cls=TensorDictReplayBuffer)
>>> rb.extend(TensorDict({"obs": torch.zeros(2, 3)}, [2])).tolist()          # shard 0
[0, 1]
>>> rb.extend(TensorDict({"obs": torch.zeros(2, 4)}, [2]))  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
tdreplay.core.utils.ShapeMismatchError: entry 'obs' has shape (2, 4), expected (2, 3) for ...
>>> len(rb.shards[1])                                        # nothing was written there
0
>>> good = TensorDict({"obs": torch.ones(2, 3)}, [2])
>>> rb.extend(good).tolist(), rb.extend(good).tolist()       # shards 0 and 1 in turn
([2, 3], [10, 11])
>>> rb.close()

Faults: a dead shard is set aside (:mod:`._shard_calls`): writes go to the live shards,
samples come from them with a :class:`~tdreplay.distributed.errors.ShardsUnavailableWarning`
(the distribution is then that of one buffer holding the live shards' items), and
``respawn(path)`` rebuilds only the dead shards (all of them when every shard is dead),
restored from their checkpoints. A shard Ray is restarting (``max_restarts``) is left out
only until it answers again.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase

from tdreplay.core import ReplayBuffer, Sampler, Storage, Writer
from tdreplay.core.utils import check_count, check_flag, check_required_count

from ._draw_ahead import DrawAhead
from ._ray import check_timeout, ensure_ray
from ._server import seeded_generator
from ._shard_calls import ShardCalls
from ._sharding import (
    check_every_shard,
    shard_name,
    split_priority_rows,
    split_priority_update,
    to_global,
)
from ._wire import pack, sendable_batch, unpack
from .checkpoints import join_location, resolve_location
from .client import ActorClient
from .conditional_updates import ShardedConditionalUpdateMixin
from .errors import RemoteBufferError
from .handle import ClientHandleMixin
from .iteration import ShardedIterationMixin
from .lifecycle import ClosableBuffer
from .ray_buffer import RayReplayBuffer, check_prefetch, priority_entries
from .sharded_recovery import ShardedRecoveryMixin, spread_over_nodes, start_shards

__all__ = ["ShardedReplayBuffer"]

WRITE_STRATEGIES = ("round_robin", "least_written")


class ShardedReplayBuffer(ShardedRecoveryMixin, ShardedConditionalUpdateMixin,
                          ShardedIterationMixin, ClientHandleMixin, ClosableBuffer):
    """A replay buffer split over ``num_shards`` Ray buffer actors, sampled as one buffer.

    Each ``extend`` goes whole to one shard (so a batch's rows stay together in one storage):
    the next one in turn (``write_strategy="round_robin"``) or the one with the fewest writes
    (``"least_written"``). ``sample`` draws from every shard with the distribution of a single
    buffer holding all the items, prioritized samplers included (see the module docstring), and
    returns global slots and global importance weights.

    Parameters
    ----------
    num_shards : int
        Number of buffer actors.
    storage, sampler, writer, batch_size, replay_buffer_cls, **kwargs
        As :class:`RayReplayBuffer`, for every shard; components should be classes or
        factories so that each shard builds its own (an instance is copied to each shard).
        Samplers must draw items (random, without replacement, prioritized); slice samplers
        are not supported (a shard's count of a batch need not be a whole number of slices).
    write_strategy : {"round_robin", "least_written"}
        Which shard an ``extend`` or ``add`` goes to.
    generator : torch.Generator, optional
        Seeds the choice of shards and, through seeds drawn from it, each shard's sampler.
    ray_init_config, namespace, call_timeout, start_timeout
        As :class:`RayReplayBuffer` (for each shard).
    remote_config : dict or list of dicts, optional
        Actor options of every shard, or one dict per shard (e.g. each its own
        ``scheduling_strategy``: node affinity, a placement group bundle).
    placement : {"spread", None}
        ``"spread"`` (default): shards without a ``scheduling_strategy`` of their own are
        pinned to the cluster's live nodes in turn (node affinity; a respawned shard whose
        node is gone goes to a live one); ``None``: where Ray puts them.
    prefetch : int, optional
        Keep this many ``sample()`` calls (of the default batch size) in flight on worker
        threads, their round trips overlapping each other and the caller's work.
    checkpoint_path : str, optional
        As :class:`RayReplayBuffer`; shard ``k`` uses ``checkpoint_path/shard-k``.
    name : str, optional
        Shard ``k`` is the actor ``f"{name}/shard-{k}"``; :meth:`attach` finds them all.

    Examples
    --------
    >>> from functools import partial
    >>> import torch
    >>> from tdreplay.core import ListStorage
    >>> rb = ShardedReplayBuffer(num_shards=2, storage=partial(ListStorage, 10), batch_size=6)
    >>> rb.extend([torch.tensor(1.0), torch.tensor(2.0)]).tolist()  # shard 0: slots 0..9
    [0, 1]
    >>> rb.extend([torch.tensor(3.0)]).tolist()  # shard 1: slots 10..19
    [10]
    >>> len(rb), rb.write_count
    (3, 3)
    >>> data, info = rb.sample(return_info=True)
    >>> data.shape, set(info["index"].tolist()) <= {0, 1, 10}
    (torch.Size([6]), True)
    >>> rb.close()

    It pickles, for Ray tasks and actors: a copy is a client of the same shards, as
    :meth:`attach` gives (a copy of the cursor and generator), without :meth:`respawn`.
    """

    def __init__(
        self,
        *,
        num_shards: int,
        storage: Storage | Callable[[], Storage] | None = None,
        sampler: Sampler | Callable[[], Sampler] | None = None,
        writer: Writer | Callable[[], Writer] | None = None,
        batch_size: int | None = None,
        replay_buffer_cls: type[ReplayBuffer] = ReplayBuffer,
        write_strategy: str = "round_robin",
        generator: torch.Generator | None = None,
        ray_init_config: dict[str, Any] | None = None,
        remote_config: dict[str, Any] | list[dict[str, Any]] | None = None,
        name: str | None = None,
        namespace: str | None = None,
        call_timeout: float | None = 60.0,
        start_timeout: float | None = 300.0,
        placement: str | None = "spread",
        prefetch: int | None = None,
        checkpoint_path: str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> None:
        num_shards = check_required_count(num_shards, "num_shards", 1)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got "
                            f"{type(generator).__name__}.")
        if "rate_limiter" in kwargs:  # (generator is a parameter: it never reaches kwargs)
            raise TypeError("rate_limiter is not supported on sharded buffers (one per shard "
                            "would limit each shard apart): use a RayReplayBuffer.")
        configs = _shard_configs(remote_config, num_shards)
        self._configure(name, write_strategy, call_timeout, generator, prefetch)
        seeds = (torch.randint(0, 2**62, (num_shards,), generator=generator).tolist()
                 if generator is not None else [None] * num_shards)
        root = None if checkpoint_path is None else resolve_location(checkpoint_path)
        self._checkpoint_path = root

        def start() -> None:
            placed = spread_over_nodes(configs, placement)
            for shard, seed in enumerate(seeds):
                spec = {"storage": storage, "sampler": sampler, "writer": writer,
                        "batch_size": batch_size, **kwargs}
                if seed is not None:
                    spec["generator"] = functools.partial(seeded_generator, seed)
                clients.append(ActorClient.for_new_actor(
                    spec=spec, replay_buffer_cls=replay_buffer_cls, remote_config=placed[shard],
                    name=None if name is None else shard_name(name, shard), namespace=namespace,
                    call_timeout=call_timeout, start_timeout=start_timeout,
                    meta={"shard": shard, "num_shards": num_shards,
                          "spread": placement == "spread" and "scheduling_strategy"
                          not in configs[shard], "checkpoint_path":
                          None if root is None else join_location(root, f"shard-{shard}")}))
            start_shards(clients)

        clients: list[ActorClient] = []
        self._start_with_ray(ray_init_config, start)
        self._set_clients(clients)

    def _configure(self, name: str | None, write_strategy: str, call_timeout: float | None,
                   generator: torch.Generator | None, prefetch: int | None = None) -> None:
        if write_strategy not in WRITE_STRATEGIES:
            raise ValueError(f"write_strategy must be one of {WRITE_STRATEGIES}, got "
                             f"{write_strategy!r}.")
        self._name = name
        self.write_strategy = write_strategy
        self._call_timeout = check_timeout(call_timeout, "call_timeout")
        self._rng = generator
        self._cursor = 0
        self._clients: list[ActorClient] = []
        self._shards: list[RayReplayBuffer] = []
        self._ahead = DrawAhead(check_prefetch(prefetch))

    def _actor_clients(self) -> list[ActorClient]:
        return list(self._clients)

    def _set_clients(self, clients: list[ActorClient]) -> None:
        self._clients = clients
        self._calls = ShardCalls(clients)
        self._shards = [RayReplayBuffer.from_client(client) for client in clients]
        sizes = [int(client.info["max_size"]) for client in clients]
        self._offsets = torch.tensor([0] + sizes, dtype=torch.long).cumsum(0)

    @classmethod
    def attach(cls, name: str, *, namespace: str | None = None, write_strategy: str = "round_robin",
               generator: torch.Generator | None = None, call_timeout: float | None = 60.0,
               ray_init_config: dict[str, Any] | None = None,
               prefetch: int | None = None) -> ShardedReplayBuffer:
        """A client of the sharded buffer named ``name`` (its shards are found by name).

        ``from_name`` is an alias. The write strategy, generator and prefetch are this
        client's.
        """
        client = cls.__new__(cls)
        cls._configure(client, name, write_strategy, call_timeout, generator, prefetch)
        ensure_ray(ray_init_config)
        first = ActorClient.for_named_actor(shard_name(name, 0), namespace=namespace,
                                            call_timeout=call_timeout)
        num_shards = first.info["meta"].get("num_shards")
        if not isinstance(num_shards, int):
            raise ValueError(f"the actor {shard_name(name, 0)!r} is not a shard of a "
                             "ShardedReplayBuffer.")
        clients = [first] + [ActorClient.for_named_actor(shard_name(name, k),
                                                         namespace=namespace,
                                                         call_timeout=call_timeout)
                             for k in range(1, num_shards)]
        cls._set_clients(client, clients)
        return client

    from_name = attach

    # ---- properties --------------------------------------------------------------------------
    @property
    def shards(self) -> tuple[RayReplayBuffer, ...]:
        """The shard clients, in shard order."""
        return tuple(self._shards)

    @property
    def dead_shards(self) -> tuple[int, ...]:
        """Shards found dead (set aside until :meth:`respawn`)."""
        return tuple(sorted(self._calls.dead))

    @property
    def name(self) -> str | None:
        """The name given at creation (shard ``k`` is the actor ``f"{name}/shard-{k}"``)."""
        return self._name

    @property
    def batch_size(self) -> int | None:
        """Default batch size of :meth:`sample`."""
        return self._clients[0].info.get("batch_size")

    @property
    def max_size(self) -> int:
        """Slots of all shards together (global slots are ``[0, max_size)``)."""
        return int(self._offsets[-1])

    @property
    def priority_key(self) -> str | None:
        """The shards' ``priority_key`` (TensorDict buffers), else ``None``."""
        return self._clients[0].info.get("priority_key")

    @property
    def call_timeout(self) -> float | None:
        """Seconds a call (over all shards) waits for its answers."""
        return self._call_timeout

    @call_timeout.setter
    def call_timeout(self, value: float | None) -> None:
        self._call_timeout = check_timeout(value, "call_timeout")
        for client in self._clients:
            client.call_timeout = value

    def _wait(self, calls: list[tuple[int, str, tuple[Any, ...]]], what: str) -> list[Any]:
        """Send ``method(*args)`` to shard ``k`` for each ``(k, method, args)`` at once; the
        results in that order (every shard must answer)."""
        return self._calls.strict(calls, what, self._call_timeout)

    def _all(self, method: str, *args: Any, what: str | None = None) -> list[Any]:
        """``method(*args)`` on every shard at once; their results in shard order."""
        return self._wait([(k, method, args) for k in range(self.num_shards)], what or method)

    def _ask_live(self, calls: list[tuple[int, str, tuple[Any, ...]]], what: str
                  ) -> list[tuple[int, Any]]:
        """``(shard, result)`` of the calls whose shard answered; a shard found dead is set
        aside with a :class:`~tdreplay.distributed.ShardsUnavailableWarning`."""
        return self._calls.tolerant(calls, what, self._call_timeout)

    def _check_every_shard_alive(self, what: str) -> None:
        """:class:`~tdreplay.distributed.BufferActorDiedError` (naming ``what``) unless every
        shard answers: asked before a call that changes every shard (``loads``, ``empty``,
        ``dumps``), which must change none of them when one cannot take part."""
        self._all("length", what=f"{what} (checking that every shard is alive first)")

    def _live(self, method: str, *args: Any, what: str | None = None) -> list[tuple[int, Any]]:
        """``(shard, result)`` of ``method(*args)`` on every live shard (dead ones set aside)."""
        self._calls.check_open(what or method)
        return self._calls.tolerant([(k, method, args) for k in self._calls.live()],
                                    what or method, self._call_timeout)

    # ---- writing -----------------------------------------------------------------------------
    def _next_shard(self) -> int:
        if self.write_strategy == "least_written":
            counts = self._live("write_count", what="choosing a shard")
            return min(counts, key=lambda kc: kc[1])[0]
        live = self._calls.live()
        shard = min((k for k in live if k >= self._cursor % self.num_shards), default=live[0])
        self._cursor = shard + 1
        return shard

    def _write(self, method: str, data: Any, *args: Any) -> tuple[int, Any]:
        """``(shard, answer)`` of a write to the next live shard; a shard found dead (or
        temporarily unavailable) is set aside and the write goes to the next (a dead actor
        applied nothing). A shard not known to be laid out checks the batch against a shard
        that is (:meth:`~._shard_calls.ShardCalls.layout_for`), and every shard refuses a
        batch whose entries differ from those it holds (``same_entries``, module docstring)."""
        self._calls.check_open(method)
        failed: set[int] = set()
        while True:
            shard, template = self._calls.layout_for(self._next_shard(), self._call_timeout)
            client = self._clients[shard]
            try:
                answer = unpack(client.call(method, pack(data), *args, client.limit_timeout,
                                            self._calls.max_priority, template, True))
            except RemoteBufferError as err:
                if isinstance(err, TimeoutError) or shard in failed:
                    raise  # (every other shard is skipped too: nowhere else to write)
                failed.add(shard)
                self._calls.set_aside(shard, err)
                continue
            self._calls.note_answer(shard)
            self._calls.note_mass(shard, answer[-1])
            return shard, answer[0]

    def extend(self, data: Any, **kwargs: Any) -> torch.Tensor:
        """Write a batch to one shard; returns its global slots (``-1`` for a row the shard's
        writer did not keep); ``data`` is left as it is. A shard whose storage is not laid
        out yet refuses what the laid-out shards would (module docstring)."""
        shard, slots = self._write("extend", sendable_batch(data), kwargs)
        return to_global(self._offsets, shard, slots)

    def add(self, data: Any) -> int | torch.Tensor | None:
        """Add one item to one shard; returns its global slot (``None``: the shard's writer
        did not keep it)."""
        shard, index = self._write("add", data)
        if index is None:
            return None
        out = to_global(self._offsets, shard, index)
        return int(out) if isinstance(index, int) else out

    # ---- priorities --------------------------------------------------------------------------
    def update_priority(self, index: Any, priority: Any, *, write_generation: Any = None
                        ) -> None:
        """Set the priorities of global slots ``index``; each shard gets its own slots.

        ``priority``: a scalar, one per index, or one per index followed by trailing dims
        (reduced by the shards' samplers). Every shard checks its part before any shard
        changes (:func:`~._sharding.check_every_shard`); errors name global slots.

        The part of a shard found dead (or temporarily unavailable) is dropped, with a
        :class:`~tdreplay.distributed.ShardsUnavailableWarning`, while other shards live: its
        items are not sampled until it is back. With no shard left (every one dead, or the
        buffer closed) it raises :class:`~tdreplay.distributed.BufferActorDiedError`, as
        ``len``, ``sample`` and ``extend`` do.
        """
        self._calls.check_open("update_priority")
        self._calls.live()  # raises when no shard is left (dead, or the buffer was closed)
        skipped = self._calls.skipped()
        split = split_priority_update(index, priority, write_generation, self._offsets)
        parts = [part for part in split if part[0] not in skipped]
        parts = check_every_shard(parts, self._ask_live, self._offsets)  # a refusal: no change
        calls = [(k, "update_priority", (pack(local), pack(values), pack(kwargs)))
                 for k, local, values, kwargs in parts]
        answers = self._calls.tolerant(calls, "update_priority", self._call_timeout)
        for k, mass in answers:
            self._calls.note_mass(k, mass)
        if split and not answers:  # every shard concerned is gone: raise if no other is left
            self._calls.confirm_live("update_priority", self._call_timeout)

    def update_tensordict_priority(self, data: TensorDictBase) -> None:
        """Update priorities from ``data[priority_key]`` at the global ``data["index"]``.

        Dead shards are handled as by :meth:`update_priority`: their rows are dropped while
        other shards live, and with none left it raises
        :class:`~tdreplay.distributed.BufferActorDiedError`."""
        self._calls.check_open("update_tensordict_priority")
        self._calls.live()  # raises when no shard is left (dead, or the buffer was closed)
        info = self._clients[0].info  # the shards are built alike
        data = priority_entries(data, info)
        skipped = self._calls.skipped()
        split = split_priority_rows(data, self._offsets)
        parts = [(k, part) for k, part in split if k not in skipped]
        key = info.get("priority_key")
        if key is not None and key in data.keys():  # (else every shard refuses alike)
            # every shard checks its part first: a refusal (a NaN, a negative) changes no shard
            checked = check_every_shard(
                [(k, part.get("index"), part.get(key), None) for k, part in parts],
                self._ask_live, self._offsets)
            answered = {k for k, *_ in checked}
            parts = [(k, part) for k, part in parts if k in answered]
        calls = [(k, "update_tensordict_priority", (pack(part),)) for k, part in parts]
        answers = self._calls.tolerant(calls, "update_tensordict_priority", self._call_timeout)
        for k, mass in answers:
            self._calls.note_mass(k, mass)
        if split and not answers:  # every shard concerned is gone: raise if no other is left
            self._calls.confirm_live("update_tensordict_priority", self._call_timeout)

    # ---- sampling ----------------------------------------------------------------------------
    def sample(self, batch_size: int | None = None, return_info: bool = False) -> Any:
        """Sample ``batch_size`` items over all shards, as one buffer would (module docstring).

        ``info["index"]`` (and a TensorDict sample's ``index``) holds global slots,
        ``priority_weight`` global importance weights.
        """
        self._calls.check_open("sample")
        if return_info is not False and return_info is not True:  # (one check when a bool)
            check_flag(return_info, "return_info")
        batch_size = _check_batch_size(self.batch_size if batch_size is None else batch_size)
        def draw() -> tuple[Any, dict[str, Any]]:
            return self._calls.sample(batch_size, self._rng, self._offsets, self._call_timeout)

        use_ahead = self._ahead.depth and batch_size == self.batch_size
        data, info = self._ahead.next(batch_size, draw) if use_ahead else draw()
        return (data, info) if return_info else data

    def __len__(self) -> int:
        """Items held by the live shards."""
        return sum(n for _, n in self._live("length", what="len"))

    @property
    def write_count(self) -> int:
        """Items written to the live shards so far."""
        return sum(n for _, n in self._live("write_count"))

    def empty(self, empty_write_count: bool = True) -> None:
        """Empty every shard (none when a shard is dead: ``BufferActorDiedError``)."""
        empty_write_count = check_flag(empty_write_count, "empty_write_count")
        self._check_every_shard_alive("empty")
        self._ahead.clear()
        for k, mass in enumerate(self._all("empty", empty_write_count)):
            self._calls.note_mass(k, mass)

    def clear_prefetch(self) -> None:
        """Drop the batches this handle drew ahead (``prefetch``), as a
        :class:`~tdreplay.distributed.RayReplayBuffer`'s ``clear_prefetch``: call it after
        another client emptied or restored the shards.

        Examples
        --------
        >>> from functools import partial
        >>> from tdreplay.core import ListStorage
        >>> from tdreplay.distributed import ShardedReplayBuffer
        >>> rb = ShardedReplayBuffer(storage=partial(ListStorage, 10), num_shards=2,
        ...                          batch_size=2, prefetch=1)
        >>> _ = rb.extend([1, 1, 1])
        >>> rb.clear_prefetch()
        >>> len(rb.sample())
        2
        >>> rb.close()
        """
        self._ahead.clear()

    def _stop_drawing_ahead(self) -> None:
        self._ahead.close()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(name={self._name!r}, num_shards={self.num_shards}, "
                f"write_strategy={self.write_strategy!r}, batch_size={self.batch_size})")


def _check_batch_size(value: Any) -> int:
    """``value`` checked as a local buffer's ``sample`` checks it (core's ``check_count``:
    ``TypeError`` for what is not an integer, ``ValueError`` below 1); ``RuntimeError`` for
    ``None`` (no batch size given, none set on the buffer)."""
    checked = check_count(value, "batch_size", minimum=1)
    if checked is None:
        raise RuntimeError("batch_size not specified: pass one to sample() or build the "
                           "buffer with batch_size=...")
    return checked


def _shard_configs(remote_config: Any, num_shards: int) -> list[dict[str, Any]]:
    """One dict of actor options per shard: ``remote_config`` repeated, or its items."""
    if isinstance(remote_config, list):
        if len(remote_config) != num_shards or not all(isinstance(c, dict)
                                                       for c in remote_config):
            raise ValueError(f"remote_config as a list needs one dict per shard "
                             f"({num_shards}), got {remote_config!r}.")
        return [dict(c) for c in remote_config]
    if remote_config is not None and not isinstance(remote_config, dict):
        raise TypeError(f"remote_config must be a dict, a list of dicts (one per shard) or "
                        f"None, got {type(remote_config).__name__}.")
    return [dict(remote_config or {}) for _ in range(num_shards)]
