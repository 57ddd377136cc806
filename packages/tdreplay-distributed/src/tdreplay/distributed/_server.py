"""The object living inside a buffer actor: builds the buffer there and serves its methods.

Components arrive as instances, classes or factories (any callable, ``functools.partial``
included) and are built here, in the actor's process, so that a storage's memory, a memmap
file or a priority tree is created where it is used. Data crosses as :class:`~._wire.Packed`
(tensor bytes out of band, see :mod:`._wire`).
"""

from __future__ import annotations

import math
import os
import warnings
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol, runtime_checkable

import torch
from tensordict import TensorDictBase, is_tensor_collection

from tdreplay.core import (
    ListStorage,
    RandomSampler,
    ReplayBuffer,
    Sampler,
    Storage,
    TensorDictReplayBuffer,
    Writer,
)

from ._channel_host import ChannelHost
from ._ray import import_ray
from ._server_edits import EditsServerMixin
from ._wire import Packed, pack, unpack
from .checkpoints import load_checkpoint, save_checkpoint
from .errors import BufferStateLostError

__all__ = ["COMPONENTS", "BufferServer", "Mass", "PriorityMass", "build_component",
           "check_component_spec", "seeded_generator"]

#: What every answer of a call that may change a buffer's sampling weights carries:
#: ``(sum, min, len, max priority)`` of the buffer after the call (see :func:`_sampling_mass`;
#: ``None`` instead where a prioritized sampler does not tell its mass).
Mass = tuple[float, float, int, float | None]

#: Component arguments built inside the actor, with the type each must be (or build).
COMPONENTS: dict[str, type] = {"storage": Storage, "sampler": Sampler, "writer": Writer,
                               "generator": torch.Generator}


def check_component_spec(value: Any, name: str) -> None:
    """Raise ``TypeError`` unless ``value`` is None, a component of its type, or a factory."""
    kind = COMPONENTS[name]
    if value is None or isinstance(value, kind) or callable(value):
        return
    raise TypeError(f"{name} must be a {kind.__name__}, a {kind.__name__} class or a factory "
                    f"(a callable, e.g. functools.partial) returning one; got "
                    f"{type(value).__name__}.")


def build_component(value: Any, name: str) -> Any:
    """``value`` itself if it is already a component (or None), else ``value()``, checked."""
    check_component_spec(value, name)
    kind = COMPONENTS[name]
    if value is None or isinstance(value, kind):
        return value
    built = value()
    if not isinstance(built, kind):
        raise TypeError(f"the {name} factory {value!r} returned a {type(built).__name__}, "
                        f"expected a {kind.__name__}.")
    return built


def seeded_generator(seed: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with ``seed`` (a picklable generator factory)."""
    return torch.Generator().manual_seed(seed)


@runtime_checkable
class PriorityMass(Protocol):
    """What a prioritized sampler tells about its stored priorities ``p_i = (priority_i + eps)
    ** alpha`` (``tdreplay.samplers.PrioritizedSampler`` has both): a sharded buffer weighs
    its shards by them."""

    @property
    def total_priority(self) -> float:
        """Sum of ``p_i`` over the written slots."""
        ...

    @property
    def min_priority(self) -> float:
        """Least ``p_i`` over the written slots (``inf`` if none)."""
        ...


@runtime_checkable
class MaxPriority(Protocol):
    """A prioritized sampler that tells the priority new items get (``max_priority``, as
    ``tdreplay.samplers.PrioritizedSampler``): a sharded buffer keeps the max over shards."""

    @property
    def max_priority(self) -> float:
        """Priority new items get (before ``eps`` and ``alpha``)."""
        ...


def _sampling_mass(buffer: ReplayBuffer) -> tuple[float, float]:
    """``(sum, min)`` of the sampling weights of the written slots.

    A prioritized sampler draws slot ``i`` with probability ``p_i / sum_j p_j`` where
    ``p_i = (priority_i + eps) ** alpha`` is what its sum tree holds, so its mass is its
    ``total_priority`` and ``min`` its ``min_priority`` (used for the importance weights). Any
    other sampler draws the written slots uniformly: mass ``len(storage)``, weight 1 each.
    """
    sampler, storage = buffer.sampler, buffer.storage
    written = len(storage)
    if not sampler.is_prioritized:
        return float(written), 1.0
    if written == 0:
        return 0.0, math.inf
    if not isinstance(sampler, PriorityMass):
        raise TypeError(f"{type(sampler).__name__} does not expose its priority mass "
                        "(total_priority and min_priority): a sharded buffer cannot weigh its "
                        "shards.")
    return float(sampler.total_priority), float(sampler.min_priority)


def _independent_draws(sampler: Sampler) -> bool:
    """Whether the sampler draws every item of a batch independently, with replacement and no
    state changed by a draw (uniform or prioritized): items drawn and dropped change nothing,
    so a sharded client may draw a few more than it keeps (see :mod:`._shard_calls`)."""
    return not sampler.finite_epochs and (
        sampler.is_prioritized and isinstance(sampler, PriorityMass)
        or type(sampler) is RandomSampler)


def _restarted_by_ray() -> bool:
    """Whether this actor is a restart (``max_restarts``) of one that died."""
    if _own_actor_id() is None:  # built outside an actor (tests, tools)
        return False
    with warnings.catch_warnings():  # (Ray's property reads its own deprecated actor_id)
        warnings.simplefilter("ignore", DeprecationWarning)
        return bool(import_ray().get_runtime_context().was_current_actor_reconstructed)


def _own_node_id() -> str | None:
    """Ray's id (hex) of the node this runs on; ``None`` outside Ray."""
    ray = import_ray()
    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def _own_actor_id() -> str | None:
    """Ray's id (hex) of the actor this runs in; ``None`` outside an actor."""
    ray = import_ray()
    if not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_actor_id()


#: the buffer methods a client may call through :meth:`BufferServer.configure`
CONFIGURATION_CALLS = frozenset({"append_transform", "insert_transform", "register_save_hook",
                                 "register_load_hook", "set_rng", "set_storage", "set_sampler",
                                 "set_writer", "synchronize"})


class BufferServer(EditsServerMixin):
    """A replay buffer built and served inside a Ray actor (see :class:`RayReplayBuffer`).

    In-place edits, whole-buffer reads, queries and submitted conditional updates are
    :class:`~._server_edits.EditsServerMixin`'s. A construction error is kept and raised by
    the first :meth:`describe`, so the client gets the buffer's own exception
    (``TypeError``, ``ValueError``) rather than a dead actor.

    ``meta["restore_from"]``: a checkpoint loaded here, before the actor answers any call (a
    respawned actor is never seen empty). When Ray restarts the actor (``max_restarts``), it
    restores ``meta["checkpoint_path"]`` instead, or, without one that loads, refuses every
    call with :class:`~tdreplay.distributed.errors.BufferStateLostError`.
    """

    def __init__(self, buffer_cls: type[ReplayBuffer], spec: dict[str, Any],
                 meta: dict[str, Any]) -> None:
        self._meta = dict(meta)
        self._error: BaseException | None = None
        self._channels: ChannelHost | None = None
        self._buffer: ReplayBuffer | None = None
        #: states checked by :meth:`stage_state_dict`, by token, until loaded or dropped
        self._staged: dict[str, dict[str, Any]] = {}
        try:
            kwargs = dict(spec)
            for name in COMPONENTS:
                if kwargs.get(name) is not None:
                    kwargs[name] = build_component(kwargs[name], name)
            self._buffer = buffer_cls(**kwargs)
        except Exception as err:  # noqa: BLE001 - re-raised by describe()
            self._error = err
            return
        self._lost: str | None = None
        if _restarted_by_ray():
            self._restore_after_restart(meta.get("checkpoint_path"))
        elif meta.get("restore_from") is not None:
            try:
                load_checkpoint(self._buffer, meta["restore_from"])
            except Exception as err:  # noqa: BLE001 - re-raised by describe()
                self._error = err

    def _restore_after_restart(self, path: str | None) -> None:
        if path is None:
            self._lost = ("it was restarted by Ray (max_restarts) and has no checkpoint_path to "
                          "restore from: what it held is lost")
            return
        try:
            load_checkpoint(self.buffer, path)
        except Exception as err:  # noqa: BLE001 - refused below, with the reason
            self._lost = (f"it was restarted by Ray (max_restarts) and could not restore its "
                          f"checkpoint_path {path!r} ({type(err).__name__}: {err})")

    @property
    def buffer(self) -> ReplayBuffer:
        if self._buffer is None or self._error is not None:
            raise RuntimeError("the buffer could not be built") from self._error
        if getattr(self, "_lost", None):
            label = f"buffer actor {self._meta.get('label', '')}".rstrip()
            raise BufferStateLostError(
                f"{label} refuses calls: {self._lost}. Respawn it from a checkpoint "
                "(respawn(path)); other clients then call reconnect().", actor=label)
        return self._buffer

    def _limited(self, timeout: float | None) -> AbstractContextManager[Any]:
        """This call's rate limiter waits at most ``timeout`` s (the caller's deadline)."""
        limiter = self.buffer.rate_limiter
        return nullcontext() if limiter is None else limiter.call_timeout(timeout)

    def _max_priority(self) -> float | None:
        sampler = self.buffer.sampler
        return float(sampler.max_priority) if isinstance(sampler, MaxPriority) else None

    def _lift_to(self, slots: Any, data: Any, global_max: float | None) -> None:
        """Give the new ``slots`` the sharded buffer's max priority ``global_max`` when it is
        above this shard's (unless ``data`` brought its own priorities). ``-1`` slots (rows a
        max-value writer did not keep) and ``None`` (an item it did not keep) are skipped."""
        if slots is None:
            return
        slots = torch.as_tensor(slots)
        slots = slots[slots >= 0]
        own = self._max_priority()
        if global_max is None or own is None or not global_max > own:
            return
        key = self.buffer.priority_key
        if key is not None and is_tensor_collection(data) and key in data.keys():
            return
        self.buffer.update_priority(slots, global_max)

    # ---- description -------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """What the client caches: class, batch size, priority key, slots, meta, pid."""
        if self._error is not None:
            raise self._error
        buffer = self.buffer
        return {
            "buffer_cls": type(buffer).__name__,
            "batch_size": buffer.batch_size,
            "priority_key": buffer.priority_key,
            "is_prioritized": bool(buffer.sampler.is_prioritized),
            "update_keys": tuple(buffer.sampler.update_keys),
            "independent_draws": _independent_draws(buffer.sampler),
            "finite_epochs": bool(buffer.sampler.finite_epochs),
            "max_size": buffer.storage.max_size,
            "meta": dict(self._meta),
            "pid": os.getpid(),
            "actor_id": _own_actor_id(),
            "node_id": _own_node_id(),
        }

    # ---- writes ------------------------------------------------------------------------------
    def _received(self, payload: Any) -> Any:
        # a ListStorage keeps the items it is given: they must not view the message's memory
        return unpack(payload, copy=isinstance(self.buffer.storage, ListStorage))

    def layout_template(self) -> tuple[bool, Packed | None]:
        """Whether this buffer's storage is laid out (a lazy storage is not before its first
        write), and no rows of it: a TensorDict of its keys, row shapes and dtypes (``None``
        when it is not laid out or does not hold TensorDicts), what :meth:`_lay_out_like`
        lays another shard's storage out from."""
        laid_out, template = self._no_rows()
        return laid_out, None if template is None else pack(template)

    def _no_rows(self) -> tuple[bool, TensorDictBase | None]:
        """Whether the storage is laid out, and its rows ``[0:0]`` when they are a TensorDict
        (``None`` otherwise): :meth:`layout_template` unpacked."""
        storage = self.buffer.storage
        if not storage.initialized:
            return False, None
        try:
            template = storage[0:0]
        except Exception:  # noqa: BLE001 - a storage that cannot read no rows: nothing to copy
            return True, None
        return True, template if is_tensor_collection(template) else None

    def _lay_out_like(self, template: Any) -> None:
        """While this buffer's storage is not laid out (a lazy storage before its first
        write), lay it out from ``template`` (another shard's :meth:`layout_template`) by a
        write of no rows: the write that follows is then checked and cast by the storage
        itself, as on every other shard, and a batch of another schema is refused with the
        storage's own error instead of laying this shard out unlike the others. A storage of
        several dims is left to its first write."""
        storage = self.buffer.storage
        if template is None or storage.initialized or storage.ndim != 1:
            return
        with self.buffer.locked():
            if not storage.initialized:
                storage.set(torch.arange(0), unpack(template))

    def _check_same_entries(self, data: Any) -> None:
        """``KeyError`` naming the entries when ``data`` (a TensorDict batch) brings entries
        this buffer's laid-out storage does not hold (nested keys included), before anything
        is written. A sharded buffer asks it of every write: a lazy storage adds an entry a
        batch brings, and a shard laid out with an entry the others lack would make every
        later sample that joins their rows fail. Missing entries are left to the storage's
        own check (it refuses them as a local buffer's does), and so are storages not laid
        out or not holding TensorDicts, and buffers with transforms (whose written entries
        are not the batch's)."""
        if not is_tensor_collection(data) or self.buffer.transform.transforms:
            return
        _, template = self._no_rows()  # (not packed and unpacked at every write)
        if template is None:
            return
        held = set(template.keys(include_nested=True, leaves_only=True))
        given = set(data.keys(include_nested=True, leaves_only=True))
        # (a sample written back: its index and per-item info are left out by the write)
        bookkeeping = set(getattr(self.buffer, "bookkeeping_keys", ()))
        extra = sorted(map(str, given - held - bookkeeping))
        if extra:
            missing = sorted(map(str, held - given))
            raise KeyError(
                f"data keys do not match the shards' storage: missing {missing}, unexpected "
                f"{extra}. Every shard of a sharded buffer holds the same entries (a shard "
                "that added one would hold a layout unlike the others', and samples joining "
                "their rows would fail): write batches of the entries the buffer holds. "
                "Nothing was written.")

    def extend(self, payload: Any, kwargs: dict[str, Any], timeout: float | None = None,
               global_max: float | None = None, template: Any = None,
               same_entries: bool = False) -> Packed:
        """``extend``; returns the slots and the buffer's :data:`Mass` after the write.
        ``timeout``: the most the rate limiter may wait; ``global_max``: see
        :meth:`_lift_to`; ``template``: see :meth:`_lay_out_like`; ``same_entries``: see
        :meth:`_check_same_entries`."""
        self._lay_out_like(template)
        data = self._received(payload)
        if same_entries:
            self._check_same_entries(data)
        with self._limited(timeout):
            slots = self.buffer.extend(data, **kwargs)
        self._lift_to(slots, data, global_max)
        return pack((slots, self._mass_if_known()))

    def add(self, payload: Any, timeout: float | None = None,
            global_max: float | None = None, template: Any = None,
            same_entries: bool = False) -> Packed:
        """``add``; returns the index and the :data:`Mass` (``template``: see
        :meth:`_lay_out_like`; ``same_entries``: see :meth:`_check_same_entries`)."""
        self._lay_out_like(template)
        data = self._received(payload)
        if same_entries:
            self._check_same_entries(data)
        with self._limited(timeout):
            index = self.buffer.add(data)
        self._lift_to(index, data, global_max)
        return pack((index, self._mass_if_known()))

    def update_priority(self, index: Any, priority: Any, kwargs: dict[str, Any]) -> Mass | None:
        """``update_priority``; returns the buffer's :data:`Mass` after it."""
        self.buffer.update_priority(unpack(index), unpack(priority), **unpack(kwargs))
        return self._mass_if_known()

    def check_priority_update(self, index: Any, priority: Any) -> list[int]:
        """The local slots of ``index`` that ``update_priority`` would refuse as unwritten;
        raises as it would on bad priority values (e.g. one that overflows once raised to this
        shard's ``alpha``). Changes nothing: a sharded buffer checks every shard's part before
        it updates any."""
        buffer = self.buffer
        buffer.sampler.check_priority(unpack(priority))
        slots = torch.as_tensor(unpack(index)).reshape(-1)
        return slots[slots >= len(buffer)].tolist()

    def update_tensordict_priority(self, payload: Any) -> Mass | None:
        """``update_tensordict_priority``; returns the buffer's :data:`Mass` after it."""
        buffer = self.buffer
        if not isinstance(buffer, TensorDictReplayBuffer):
            raise TypeError(f"{type(buffer).__name__} has no update_tensordict_priority (use a "
                            "TensorDict buffer class, e.g. replay_buffer_cls="
                            "TensorDictReplayBuffer).")
        buffer.update_tensordict_priority(unpack(payload))
        return self._mass_if_known()

    def update_if_present(self, payload: Any) -> Packed:
        """``update_if_present(**kwargs)`` (``kwargs`` packed); returns its
        ``ConditionalUpdateResult``."""
        return pack(self.buffer.update_if_present(**unpack(payload, copy=True)))

    def set_item(self, index: Any, payload: Any) -> None:
        self.buffer[unpack(index)] = self._received(payload)

    def mark_update(self, index: Any) -> None:
        """The buffer's ``mark_update``: its sampler hears that the slots ``index`` changed."""
        self.buffer.mark_update(unpack(index))

    def empty(self, empty_write_count: bool) -> Mass | None:
        """``empty``; returns the buffer's :data:`Mass` after it."""
        self.buffer.empty(empty_write_count)
        return self._mass_if_known()

    # ---- reads -------------------------------------------------------------------------------
    def sample(self, batch_size: int | None, with_mass: bool,
               timeout: float | None = None) -> Packed:
        """``(data, info)``, and with ``with_mass`` the ``(sum, min)`` mass, ``beta`` and the
        max priority too. ``timeout``: the most the rate limiter may wait.

        The mass is read in the same actor call as the draw, so it describes the slots drawn.
        """
        with self._limited(timeout):
            data, info = self.buffer.sample(batch_size, return_info=True)
        if not with_mass:
            return pack((data, info))
        sampler = self.buffer.sampler
        return pack((data, info, _sampling_mass(self.buffer), getattr(sampler, "beta", None),
                     self._max_priority()))

    def sample_part(self, count: int) -> Packed:
        """A sharded buffer's draw from this shard: ``(data, info, mass, beta)``, the
        :data:`Mass` read in the same call as the draw (so it describes the slots drawn) and
        the sampler's ``beta`` (``None`` without importance weights). With ``count == 0``, or
        an empty buffer, nothing is drawn: ``data`` and ``info`` are ``None`` (the mass alone
        tells the client how much this shard now weighs)."""
        mass = self.sampling_mass()
        beta = getattr(self.buffer.sampler, "beta", None)
        if count == 0 or mass[2] == 0:
            return pack((None, None, mass, beta))
        data, info = self.buffer.sample(count, return_info=True)
        return pack((data, info, mass, beta))

    def _mass_if_known(self) -> Mass | None:
        """The :data:`Mass` a write's or update's answer carries; ``None`` for a prioritized
        sampler that does not tell its mass (fine for one buffer; a sharded one refuses it
        when it samples, see :func:`_sampling_mass`)."""
        sampler = self.buffer.sampler
        if sampler.is_prioritized and not isinstance(sampler, PriorityMass):
            return None
        return self.sampling_mass()

    def sampling_mass(self) -> Mass:
        """``(sum, min, len, max priority)``: see :func:`_sampling_mass`."""
        total, minimum = _sampling_mass(self.buffer)
        return total, minimum, len(self.buffer), self._max_priority()

    def next_batch(self, timeout: float | None = None) -> Packed:
        """The next batch of an iteration (the buffer's batch size) and whether the sampler
        ran out with it (the epoch ends with it), in one call. ``timeout``: as :meth:`sample`."""
        buffer = self.buffer
        with self._limited(timeout):
            data = buffer.sample()
        return pack((data, bool(buffer.sampler.ran_out)))

    def can_sample(self, batch_size: int | None) -> bool:
        return self.buffer.can_sample(batch_size)

    def stats(self) -> dict[str, int | float | bool]:
        """The buffer's ``stats()`` (counters only, no data)."""
        return self.buffer.stats()

    def get_item(self, index: Any) -> Packed:
        return pack(self.buffer[unpack(index)])

    def length(self) -> int:
        return len(self.buffer)

    def write_count(self) -> int:
        return self.buffer.write_count

    # ---- configuration -----------------------------------------------------------------------
    def get_dim_extend(self) -> int:
        return int(self.buffer.dim_extend)

    def set_dim_extend(self, value: Any) -> None:
        self.buffer.dim_extend = value  # (checked by the buffer: ValueError naming it)

    def configure(self, method: str, payload: Any) -> None:
        """``buffer.<method>(*args, **kwargs)`` of a configuration call (``payload`` packs
        ``(args, kwargs)``); ``ValueError`` for any other method name."""
        if method not in CONFIGURATION_CALLS:
            raise ValueError(f"{method!r} is not a configuration call of the buffer (one of "
                             f"{sorted(CONFIGURATION_CALLS)}).")
        args, kwargs = unpack(payload, copy=True)
        getattr(self.buffer, method)(*args, **kwargs)

    # ---- checkpoints -------------------------------------------------------------------------
    def dumps(self, path: str) -> None:
        save_checkpoint(self.buffer, path)

    def loads(self, path: str) -> None:
        load_checkpoint(self.buffer, path)

    def state_dict(self) -> Packed:
        return pack(self.buffer.state_dict())

    def load_state_dict(self, payload: Any) -> None:
        self.buffer.load_state_dict(unpack(payload, copy=True))

    def stage_state_dict(self, token: str, payload: Any) -> None:
        """Check a state as ``load_state_dict`` checks it before changing anything (the
        buffer's ``check_state_dict``), and keep it under ``token`` for
        :meth:`load_staged_state_dict`; changes nothing. A sharded buffer's
        ``load_state_dict`` stages every shard's part before any shard loads."""
        state = unpack(payload, copy=True)
        self.buffer.check_state_dict(state)
        self._staged[token] = state

    def load_staged_state_dict(self, token: str) -> None:
        """``load_state_dict`` of the state :meth:`stage_state_dict` kept under ``token``."""
        state = self._staged.pop(token, None)
        if state is None:
            raise RuntimeError(f"no state_dict staged under {token!r} (this actor was "
                               "replaced since): nothing was loaded here.")
        self.buffer.load_state_dict(state)

    def drop_staged_state_dict(self, token: str) -> None:
        """Forget the state staged under ``token`` (another shard refused its part)."""
        self._staged.pop(token, None)

    def repr(self) -> str:
        return repr(self.buffer)

    # ---- the "distributed" transport ---------------------------------------------------------
    def open_channel(self, timeout: float) -> dict[str, Any]:
        """Where a client of the ``"distributed"`` transport joins a channel of its own to
        this buffer (see :mod:`._channel_host`)."""
        self.buffer  # noqa: B018 - refuses a buffer that could not be built or was lost
        if self._channels is None:
            self._channels = ChannelHost(lambda: self.buffer,
                                         import_ray().util.get_node_ip_address())
        return self._channels.open(timeout)
