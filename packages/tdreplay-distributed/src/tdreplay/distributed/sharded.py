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
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tensordict import is_tensor_collection

from tdreplay.core import ReplayBuffer

from ._ray import check_timeout, ensure_ray, wait_all
from ._server import seeded_generator
from ._wire import pack, unpack
from .ray_buffer import RayReplayBuffer

__all__ = ["ShardedReplayBuffer"]

WRITE_STRATEGIES = ("round_robin", "least_written")
PRIORITY_WEIGHT_KEY = "priority_weight"
_MANIFEST = "sharded.json"


def _shard_name(name: str, shard: int) -> str:
    return f"{name}/shard-{shard}"


def _concat(parts: Sequence[Any]) -> Any:
    """Join batches along their first dimension (tensors, TensorDicts, lists, tuples, dicts)."""
    first = parts[0]
    if len(parts) == 1:
        return first
    if isinstance(first, torch.Tensor) or is_tensor_collection(first):
        return torch.cat(list(parts), 0)
    if isinstance(first, list):
        return [item for part in parts for item in part]
    if isinstance(first, tuple):
        return tuple(_concat([part[i] for part in parts]) for i in range(len(first)))
    if isinstance(first, dict):
        return {key: _concat([part[key] for part in parts]) for key in first}
    raise TypeError(f"cannot join samples of type {type(first).__name__} drawn from several "
                    "shards (expected tensors, TensorDicts, lists, tuples or dicts of them).")


def _take(data: Any, index: torch.Tensor) -> Any:
    """Items ``index`` (1-d) of a batch, as :func:`_concat` joins it."""
    if isinstance(data, torch.Tensor) or is_tensor_collection(data):
        return data[index]
    if isinstance(data, list):
        return [data[i] for i in index.tolist()]
    if isinstance(data, tuple):
        return tuple(_take(part, index) for part in data)
    if isinstance(data, dict):
        return {key: _take(value, index) for key, value in data.items()}
    raise TypeError(f"cannot reorder a sample of type {type(data).__name__}.")


class ShardedReplayBuffer:
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
    >>> rb.shutdown()
    """

    def __init__(
        self,
        *,
        num_shards: int,
        storage: Any = None,
        sampler: Any = None,
        writer: Any = None,
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
        self._configure(write_strategy, call_timeout, generator)
        seeds = (torch.randint(0, 2**62, (num_shards,), generator=generator).tolist()
                 if generator is not None else [None] * num_shards)
        ensure_ray(ray_init_config)
        shards = []
        for shard, seed in enumerate(seeds):
            client = RayReplayBuffer.__new__(RayReplayBuffer)
            spec = {"storage": storage, "sampler": sampler, "writer": writer,
                    "batch_size": batch_size, **kwargs}
            if seed is not None:
                spec["generator"] = functools.partial(seeded_generator, seed)
            client._setup(spec=spec, replay_buffer_cls=replay_buffer_cls, ray_init_config=None,
                          remote_config=remote_config,
                          name=None if name is None else _shard_name(name, shard),
                          namespace=namespace, call_timeout=call_timeout,
                          start_timeout=start_timeout,
                          meta={"shard": shard, "num_shards": num_shards})
            shards.append(client)
        self._start(shards)
        self._name = name

    def _configure(self, write_strategy: str, call_timeout: float | None,
                   generator: torch.Generator | None) -> None:
        if write_strategy not in WRITE_STRATEGIES:
            raise ValueError(f"write_strategy must be one of {WRITE_STRATEGIES}, got "
                             f"{write_strategy!r}.")
        self.write_strategy = write_strategy
        self._call_timeout = check_timeout(call_timeout, "call_timeout")
        self._rng = generator
        self._cursor = 0
        self._shards: list[RayReplayBuffer] = []

    def _start(self, shards: list[RayReplayBuffer]) -> None:
        """Start every shard's actor at once, then wait for them all (killing all on failure)."""
        try:
            refs = []
            for shard in shards:
                refs.append(shard._start_spawn())
            for shard, ref in zip(shards, refs):
                shard._finish_spawn(ref)
        except BaseException:
            for shard in shards:
                shard.shutdown()
            raise
        self._set_shards(shards)

    def _set_shards(self, shards: list[RayReplayBuffer]) -> None:
        self._shards = shards
        sizes = [shard.max_size for shard in shards]
        self._offsets = torch.tensor([0] + sizes, dtype=torch.long).cumsum(0)

    @classmethod
    def attach(cls, name: str, *, namespace: str | None = None, write_strategy: str = "round_robin",
               generator: torch.Generator | None = None, call_timeout: float | None = 60.0,
               ray_init_config: dict[str, Any] | None = None) -> ShardedReplayBuffer:
        """A client of the sharded buffer named ``name`` (its shards are found by name).

        ``from_name`` is an alias. The write strategy and generator are this client's.
        """
        client = cls.__new__(cls)
        client._configure(write_strategy, call_timeout, generator)
        first = RayReplayBuffer.attach(_shard_name(name, 0), namespace=namespace,
                                       call_timeout=call_timeout, ray_init_config=ray_init_config)
        num_shards = first._info["meta"].get("num_shards")
        if not isinstance(num_shards, int):
            raise ValueError(f"the actor {_shard_name(name, 0)!r} is not a shard of a "
                             "ShardedReplayBuffer.")
        shards = [first] + [RayReplayBuffer.attach(_shard_name(name, k), namespace=namespace,
                                                   call_timeout=call_timeout)
                            for k in range(1, num_shards)]
        client._set_shards(shards)
        client._name = name
        return client

    from_name = attach

    # ---- properties --------------------------------------------------------------------------
    @property
    def shards(self) -> tuple[RayReplayBuffer, ...]:
        """The shard clients, in shard order."""
        return tuple(self._shards)

    @property
    def num_shards(self) -> int:
        return len(self._shards)

    @property
    def name(self) -> str | None:
        return self._name

    @property
    def batch_size(self) -> int | None:
        """Default batch size of :meth:`sample`."""
        return self._shards[0].batch_size

    @property
    def max_size(self) -> int:
        """Slots of all shards together (global slots are ``[0, max_size)``)."""
        return int(self._offsets[-1])

    @property
    def priority_key(self) -> str | None:
        return self._shards[0].priority_key

    @property
    def call_timeout(self) -> float | None:
        """Seconds a call (over all shards) waits for its answers."""
        return self._call_timeout

    @call_timeout.setter
    def call_timeout(self, value: float | None) -> None:
        self._call_timeout = check_timeout(value, "call_timeout")
        for shard in self._shards:
            shard.call_timeout = value

    def _all(self, method: str, *args: Any, what: str | None = None) -> list[Any]:
        """``method(*args)`` on every shard at once; their results in shard order."""
        calls = [(shard._submit(method, *args), shard._label) for shard in self._shards]
        return wait_all(calls, what=what or method, timeout=self._call_timeout)

    # ---- writing -----------------------------------------------------------------------------
    def _next_shard(self) -> int:
        if self.write_strategy == "least_written":
            counts = self._all("write_count", what="choosing a shard")
            return min(range(len(counts)), key=counts.__getitem__)
        shard = self._cursor % len(self._shards)
        self._cursor = shard + 1
        return shard

    def _to_global(self, shard: int, slots: Any) -> Any:
        slots = torch.as_tensor(slots)
        offset = self._offsets[shard]
        return torch.where(slots >= 0, slots + offset, slots)

    def _globalise_index_entry(self, data: Any, shard: int) -> None:
        if is_tensor_collection(data) and not data.is_locked and "index" in data.keys():
            data.set("index", self._to_global(shard, data.get("index")))

    def extend(self, data: Any, **kwargs: Any) -> torch.Tensor:
        """Write a batch to one shard; returns its global slots (and sets ``index`` in a
        TensorDict)."""
        shard = self._next_shard()
        slots = self._shards[shard].extend(data, **kwargs)
        self._globalise_index_entry(data, shard)
        return self._to_global(shard, slots)

    def add(self, data: Any) -> int | torch.Tensor:
        """Add one item to one shard; returns its global slot."""
        shard = self._next_shard()
        index = self._shards[shard].add(data)
        self._globalise_index_entry(data, shard)
        out = self._to_global(shard, index)
        return int(out) if isinstance(index, int) else out

    # ---- global slots ------------------------------------------------------------------------
    def _split(self, index: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat ``index`` and the shard of each entry (``-1`` entries: shard ``-1``).

        Raises ``IndexError`` for slots outside ``[0, max_size)`` (other than ``-1``).
        """
        try:
            flat = torch.as_tensor(index).reshape(-1)
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(f"index must be integers, got {type(index).__name__}.") from err
        if flat.dtype.is_floating_point or flat.dtype.is_complex or flat.dtype is torch.bool:
            raise TypeError(f"index must hold integers, got dtype {flat.dtype}.")
        flat = flat.to(torch.long)
        bad = (flat < -1) | (flat >= self.max_size)
        if bool(bad.any()):
            raise IndexError(f"index must lie in [0, {self.max_size}) (the global slots of the "
                             f"{self.num_shards} shards), got {flat[bad][:5].tolist()}. Nothing "
                             "was updated.")
        shard = torch.bucketize(flat, self._offsets[1:], right=True)
        return flat, torch.where(flat >= 0, shard, -1)

    def update_priority(self, index: Any, priority: Any, *, write_generation: Any = None
                        ) -> None:
        """Set the priorities of global slots ``index``; each shard gets its own slots.

        ``priority``: a scalar, one per index, or one per index followed by trailing dims
        (reduced by the shards' samplers). Indices and priority values are checked before any
        shard changes.
        """
        flat, shard_of = self._split(index)
        shape = torch.as_tensor(index).shape
        n = flat.numel()
        priority = torch.as_tensor(priority)
        if priority.ndim == 0:
            priority = priority.expand(n)
        elif priority.shape[: len(shape)] == shape:
            priority = priority.reshape(n, *priority.shape[len(shape):])
        elif priority.numel() == n:
            priority = priority.reshape(n)
        else:
            raise ValueError(f"priority of shape {tuple(priority.shape)} does not match index of "
                             f"shape {tuple(shape)}.")
        if priority.dtype is torch.bool or priority.is_complex():
            raise TypeError(f"priority must hold real numbers, got dtype {priority.dtype}.")
        values = priority.double()
        if n and not bool(((values >= 0) & (values < math.inf)).all()):
            raise ValueError("priority must be finite and >= 0. Nothing was updated.")
        generation = None
        if write_generation is not None:
            generation = torch.as_tensor(write_generation).reshape(-1)
            if generation.numel() != n:
                raise ValueError(f"write_generation has {generation.numel()} entries for {n} "
                                 "indices.")
        calls = []
        for k in range(self.num_shards):
            mask = shard_of == k
            if not bool(mask.any()):
                continue
            kwargs = {} if generation is None else {"write_generation": generation[mask]}
            local = flat[mask] - self._offsets[k]
            shard = self._shards[k]
            calls.append((shard._submit("update_priority", pack(local), pack(priority[mask]),
                                        pack(kwargs)), shard._label))
        wait_all(calls, what="update_priority", timeout=self._call_timeout)

    def update_tensordict_priority(self, data: Any) -> None:
        """Update priorities from ``data[priority_key]`` at the global ``data["index"]``."""
        data = self._shards[0]._priority_entries(data)  # the shards are built alike
        if "index" not in data.keys():
            raise KeyError("update_tensordict_priority needs an 'index' entry in data (samples "
                           "and extended TensorDicts carry one).")
        index = data.get("index")
        if index.ndim == 0 or data.batch_dims == 0:
            data, index = data.unsqueeze(0), index.reshape(1)
        _, slot_shard = self._split(index)  # every slot in range
        shard_of = slot_shard.reshape(index.shape[0], -1)[:, 0]  # a row's slots share a shard
        calls = []
        for k in range(self.num_shards):
            rows = (shard_of == k).nonzero().squeeze(-1)
            if not rows.numel():
                continue
            part = data[rows]
            part.set("index", torch.where(part.get("index") >= 0,
                                          part.get("index") - self._offsets[k],
                                          part.get("index")))
            shard = self._shards[k]
            calls.append((shard._submit("update_tensordict_priority", pack(part)), shard._label))
        wait_all(calls, what="update_tensordict_priority", timeout=self._call_timeout)

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
        results = self._sample_shards(drawn, counts)
        # the smallest p over all shards: fresh from the shards drawn, as read before otherwise
        minimum = [m[1] for m in masses]
        for k, (_, _, (_, shard_min), _) in zip(drawn, results):
            minimum[k] = shard_min
        global_min = min(minimum)
        datas, infos = [], []
        for k, (data, info, (_, shard_min), beta) in zip(drawn, results):
            info = dict(info)
            info["index"] = self._to_global(k, info["index"])
            weight = info.get(PRIORITY_WEIGHT_KEY)
            if isinstance(weight, torch.Tensor) and beta is not None and shard_min > global_min:
                scale = math.exp(-beta * (math.log(shard_min) - math.log(global_min)))
                info[PRIORITY_WEIGHT_KEY] = (weight.double() * scale).to(weight.dtype)
            if is_tensor_collection(data):
                for key in ("index", PRIORITY_WEIGHT_KEY):
                    if key in data.keys() and key in info:
                        data.set(key, info[key].to(data.get(key).dtype).reshape(
                            data.get(key).shape))
            datas.append(data)
            infos.append(info)
        # rows come grouped by shard; put each at the position that drew its shard
        order = torch.argsort(which, stable=True)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(batch_size)
        data = _take(_concat(datas), inverse)
        info = {}
        for key in infos[0]:
            values = [part[key] for part in infos]
            if all(isinstance(v, torch.Tensor) and v.ndim and v.shape[0] == counts[k]
                   for v, k in zip(values, drawn)):
                info[key] = torch.cat(values, 0)[inverse]
            else:
                info[key] = values
        return (data, info) if return_info else data

    def _sample_shards(self, drawn: list[int], counts: list[int]) -> list[tuple[Any, ...]]:
        calls = [(self._shards[k]._submit("sample", counts[k], True), self._shards[k]._label)
                 for k in drawn]
        return [unpack(r) for r in wait_all(calls, what="sample", timeout=self._call_timeout)]

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
    def dumps(self, path: str | os.PathLike) -> None:
        """Checkpoint every shard under ``path/shard-<k>`` and write ``path/sharded.json``.

        Each shard's checkpoint is atomic; the shards are saved at once but not as one
        transaction (writes between two shards' saves may be in one and not the other).
        """
        root = Path(os.path.abspath(os.fspath(path)))
        root.mkdir(parents=True, exist_ok=True)
        wait_all([(shard._submit("dumps", str(root / f"shard-{k}")), shard._label)
                  for k, shard in enumerate(self._shards)], what="dumps",
                 timeout=self._call_timeout)
        tmp = root / f".{_MANIFEST}.tmp"
        tmp.write_text(json.dumps({"num_shards": self.num_shards}))
        os.replace(tmp, root / _MANIFEST)

    def loads(self, path: str | os.PathLike) -> None:
        """Restore every shard from a :meth:`dumps` checkpoint of as many shards."""
        root = Path(os.path.abspath(os.fspath(path)))
        self._check_manifest(root)
        wait_all([(shard._submit("loads", str(root / f"shard-{k}")), shard._label)
                  for k, shard in enumerate(self._shards)], what="loads",
                 timeout=self._call_timeout)

    save = dumps
    dump = dumps
    load = loads

    def _check_manifest(self, root: Path) -> None:
        from tdreplay.core import CheckpointError

        try:
            manifest = json.loads((root / _MANIFEST).read_text())
        except (OSError, ValueError) as err:
            raise CheckpointError(f"{root} holds no readable sharded checkpoint ({_MANIFEST}): "
                                  f"{err}") from err
        if manifest.get("num_shards") != self.num_shards:
            raise CheckpointError(f"the checkpoint at {root} has {manifest.get('num_shards')} "
                                  f"shards, this buffer {self.num_shards}.")

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
        wait_all([(shard._submit("load_state_dict", pack(sd)), shard._label)
                  for shard, sd in zip(self._shards, state_dict["shards"])],
                 what="load_state_dict", timeout=self._call_timeout)

    def respawn(self, path: str | os.PathLike | None = None) -> None:
        """Replace every shard's actor by a new one, restored from ``path`` if given."""
        if path is not None:
            self._check_manifest(Path(os.path.abspath(os.fspath(path))))
        for shard in self._shards:
            if shard._spawn_args is None:
                raise RuntimeError("respawn() needs the creation arguments, which only the "
                                   "client that created the buffer has.")
        for shard in self._shards:
            shard.shutdown()
        for shard in self._shards:
            shard._wait_name_released()
        self._start(self._shards)
        if path is not None:
            self.loads(path)

    def reconnect(self) -> None:
        """Look every shard up by name again (after another process respawned them)."""
        for shard in self._shards:
            shard.reconnect()

    def shutdown(self) -> None:
        """Kill every shard's actor."""
        for shard in self._shards:
            shard.shutdown()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(name={self._name!r}, num_shards={self.num_shards}, "
                f"write_strategy={self.write_strategy!r}, batch_size={self.batch_size})")
