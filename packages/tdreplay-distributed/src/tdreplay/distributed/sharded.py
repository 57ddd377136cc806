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
over the whole buffer.

Slots are global: shard ``k`` owns ``[offset_k, offset_k + max_size_k)``, ``offset_k`` the
sum of the sizes of the shards before it; ``extend`` returns and samples carry global slots,
and ``update_priority`` sends each slot to its shard.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase, is_tensor_collection

from tdreplay.core import ReplayBuffer, Sampler, Storage, Writer

from ._ray import check_timeout, ensure_ray, wait_all
from ._server import seeded_generator
from ._sharding import (
    check_manifest,
    check_every_shard,
    merge_samples,
    shard_name,
    split_priority_rows,
    split_priority_update,
    to_global,
    write_manifest,
)
from ._wire import pack, unpack
from .client import ActorClient
from .lifecycle import ClosableBuffer
from .ray_buffer import RayReplayBuffer, priority_entries

__all__ = ["ShardedReplayBuffer"]

WRITE_STRATEGIES = ("round_robin", "least_written")


class ShardedReplayBuffer(ClosableBuffer):
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
    ray_init_config, remote_config, namespace, call_timeout, start_timeout
        As :class:`RayReplayBuffer` (for each shard).
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
        remote_config: dict[str, Any] | None = None,
        name: str | None = None,
        namespace: str | None = None,
        call_timeout: float | None = 60.0,
        start_timeout: float | None = 300.0,
        **kwargs: Any,
    ) -> None:
        if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
            raise ValueError(f"num_shards must be an int >= 1, got {num_shards!r}.")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got "
                            f"{type(generator).__name__}.")
        if "generator" in kwargs:
            raise TypeError("generator is given once for the sharded buffer (it seeds the shards).")
        self._configure(name, write_strategy, call_timeout, generator)
        seeds = (torch.randint(0, 2**62, (num_shards,), generator=generator).tolist()
                 if generator is not None else [None] * num_shards)
        clients = []
        for shard, seed in enumerate(seeds):
            spec = {"storage": storage, "sampler": sampler, "writer": writer,
                    "batch_size": batch_size, **kwargs}
            if seed is not None:
                spec["generator"] = functools.partial(seeded_generator, seed)
            clients.append(ActorClient.for_new_actor(
                spec=spec, replay_buffer_cls=replay_buffer_cls, remote_config=remote_config,
                name=None if name is None else shard_name(name, shard), namespace=namespace,
                call_timeout=call_timeout, start_timeout=start_timeout,
                meta={"shard": shard, "num_shards": num_shards}))
        self._start_with_ray(ray_init_config, lambda: _start(clients))
        self._set_clients(clients)

    def _configure(self, name: str | None, write_strategy: str, call_timeout: float | None,
                   generator: torch.Generator | None) -> None:
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

    def _actor_clients(self) -> list[ActorClient]:
        return list(self._clients)

    def _set_clients(self, clients: list[ActorClient]) -> None:
        self._clients = clients
        self._shards = [RayReplayBuffer.from_client(client) for client in clients]
        sizes = [int(client.info["max_size"]) for client in clients]
        self._offsets = torch.tensor([0] + sizes, dtype=torch.long).cumsum(0)

    @classmethod
    def attach(cls, name: str, *, namespace: str | None = None, write_strategy: str = "round_robin",
               generator: torch.Generator | None = None, call_timeout: float | None = 60.0,
               ray_init_config: dict[str, Any] | None = None) -> ShardedReplayBuffer:
        """A client of the sharded buffer named ``name`` (its shards are found by name).

        ``from_name`` is an alias. The write strategy and generator are this client's.
        """
        client = cls.__new__(cls)
        cls._configure(client, name, write_strategy, call_timeout, generator)
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
    def num_shards(self) -> int:
        """Number of buffer actors."""
        return len(self._clients)

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
        results in that order."""
        refs = [(self._clients[k].submit(method, *args), self._clients[k].label)
                for k, method, args in calls]
        return wait_all(refs, what=what, timeout=self._call_timeout)

    def _all(self, method: str, *args: Any, what: str | None = None) -> list[Any]:
        """``method(*args)`` on every shard at once; their results in shard order."""
        return self._wait([(k, method, args) for k in range(self.num_shards)], what or method)

    # ---- writing -----------------------------------------------------------------------------
    def _next_shard(self) -> int:
        if self.write_strategy == "least_written":
            counts = self._all("write_count", what="choosing a shard")
            return min(range(len(counts)), key=counts.__getitem__)
        shard = self._cursor % self.num_shards
        self._cursor = shard + 1
        return shard

    def _globalise_index_entry(self, data: Any, shard: int) -> None:
        if is_tensor_collection(data) and not data.is_locked and "index" in data.keys():
            data.set("index", to_global(self._offsets, shard, data.get("index")))

    def extend(self, data: Any, **kwargs: Any) -> torch.Tensor:
        """Write a batch to one shard; returns its global slots (and sets ``index`` in a
        TensorDict)."""
        shard = self._next_shard()
        slots = self._shards[shard].extend(data, **kwargs)
        self._globalise_index_entry(data, shard)
        return to_global(self._offsets, shard, slots)

    def add(self, data: Any) -> int | torch.Tensor:
        """Add one item to one shard; returns its global slot."""
        shard = self._next_shard()
        index = self._shards[shard].add(data)
        self._globalise_index_entry(data, shard)
        out = to_global(self._offsets, shard, index)
        return int(out) if isinstance(index, int) else out

    # ---- priorities --------------------------------------------------------------------------
    def update_priority(self, index: Any, priority: Any, *, write_generation: Any = None
                        ) -> None:
        """Set the priorities of global slots ``index``; each shard gets its own slots.

        ``priority``: a scalar, one per index, or one per index followed by trailing dims
        (reduced by the shards' samplers). Every shard checks its part before any shard
        changes (:func:`~._sharding.check_every_shard`); errors name global slots.
        """
        parts = split_priority_update(index, priority, write_generation, self._offsets)
        check_every_shard(parts, self._wait, self._offsets)  # a refusal changes no shard
        calls = [(k, "update_priority", (pack(local), pack(values), pack(kwargs)))
                 for k, local, values, kwargs in parts]
        self._wait(calls, "update_priority")

    def update_tensordict_priority(self, data: TensorDictBase) -> None:
        """Update priorities from ``data[priority_key]`` at the global ``data["index"]``."""
        data = priority_entries(data, self._clients[0].info)  # the shards are built alike
        calls = [(k, "update_tensordict_priority", (pack(part),))
                 for k, part in split_priority_rows(data, self._offsets)]
        self._wait(calls, "update_tensordict_priority")

    # ---- sampling ----------------------------------------------------------------------------
    def sample(self, batch_size: int | None = None, return_info: bool = False) -> Any:
        """Sample ``batch_size`` items over all shards, as one buffer would (module docstring).

        ``info["index"]`` (and a TensorDict sample's ``index``) holds global slots,
        ``priority_weight`` global importance weights.
        """
        if batch_size is None:
            batch_size = self.batch_size
            if batch_size is None:
                raise RuntimeError("sample() needs a batch_size: pass one or build the buffer "
                                   "with batch_size=...")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}.")
        masses = self._all("sampling_mass", what="sample")
        mass = torch.tensor([m[0] for m in masses], dtype=torch.float64)
        if not float(mass.sum()) > 0:
            raise RuntimeError("cannot sample from an empty replay buffer: extend it first.")
        which = torch.multinomial(mass / mass.sum(), batch_size, replacement=True,
                                  generator=self._rng)
        counts = torch.bincount(which, minlength=self.num_shards).tolist()
        drawn = [k for k in range(self.num_shards) if counts[k]]
        results = [unpack(r) for r in self._wait([(k, "sample", (counts[k], True))
                                                  for k in drawn], "sample")]
        data, info = merge_samples(which, drawn, counts, results, masses, self._offsets)
        return (data, info) if return_info else data

    def __len__(self) -> int:
        return sum(self._all("length", what="len"))

    @property
    def write_count(self) -> int:
        """Items written to all shards so far."""
        return sum(self._all("write_count"))

    def empty(self, empty_write_count: bool = True) -> None:
        """Empty every shard."""
        self._all("empty", empty_write_count)

    # ---- checkpoints and faults --------------------------------------------------------------
    def dumps(self, path: str | os.PathLike[str]) -> None:
        """Checkpoint every shard under ``path/shard-<k>`` and write ``path/sharded.json``.

        Each shard's checkpoint is atomic; the shards are saved at once but not as one
        transaction (writes between two shards' saves may be in one and not the other).
        """
        root = Path(os.path.abspath(os.fspath(path)))
        root.mkdir(parents=True, exist_ok=True)
        self._wait([(k, "dumps", (str(root / f"shard-{k}"),)) for k in range(self.num_shards)],
                   "dumps")
        write_manifest(root, self.num_shards)

    def loads(self, path: str | os.PathLike[str]) -> None:
        """Restore every shard from a :meth:`dumps` checkpoint of as many shards."""
        root = Path(os.path.abspath(os.fspath(path)))
        check_manifest(root, self.num_shards)
        self._wait([(k, "loads", (str(root / f"shard-{k}"),)) for k in range(self.num_shards)],
                   "loads")

    save = dumps
    dump = dumps
    load = loads

    def state_dict(self) -> dict[str, Any]:
        """``{"num_shards": K, "shards": [state_dict of each shard]}``."""
        return {"num_shards": self.num_shards,
                "shards": [unpack(s) for s in self._all("state_dict")]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` of as many shards."""
        if not isinstance(state_dict, dict) or state_dict.get("num_shards") != self.num_shards \
                or len(state_dict.get("shards", ())) != self.num_shards:
            raise ValueError(f"state_dict must come from a ShardedReplayBuffer of "
                             f"{self.num_shards} shards.")
        self._wait([(k, "load_state_dict", (pack(sd),))
                    for k, sd in enumerate(state_dict["shards"])], "load_state_dict")

    def respawn(self, path: str | os.PathLike[str] | None = None) -> None:
        """Replace every shard's actor by a new one, restored from ``path`` if given."""
        if path is not None:
            check_manifest(Path(os.path.abspath(os.fspath(path))), self.num_shards)
        self._check_not_closed()
        if not all(client.can_respawn for client in self._clients):
            raise RuntimeError("respawn() needs the creation arguments, which only the "
                               "client that created the buffer has.")
        for client in self._clients:
            client.shutdown()
        for client in self._clients:
            client.wait_name_released()
        _start(self._clients)
        if path is not None:
            self.loads(path)

    def reconnect(self) -> None:
        """Look every shard up by name again (after another process respawned them)."""
        for client in self._clients:
            client.reconnect()

    def shutdown(self) -> None:
        """Kill every shard's actor (:meth:`respawn` can replace them)."""
        for client in self._clients:
            client.shutdown()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(name={self._name!r}, num_shards={self.num_shards}, "
                f"write_strategy={self.write_strategy!r}, batch_size={self.batch_size})")


def _start(clients: list[ActorClient]) -> None:
    """Start every shard's actor at once, then wait for them all (killing all on failure)."""
    try:
        refs = [client.start_spawn() for client in clients]
        for client, ref in zip(clients, refs):
            client.finish_spawn(ref)
    except BaseException:
        for client in clients:
            client.shutdown()
        raise
