"""``ShardedRecoveryMixin``: a sharded buffer's checkpoints (every shard under one directory,
with a manifest) and its recovery (respawning the dead shards only, each restored before it
answers any call)."""

from __future__ import annotations

import os
import uuid
from typing import TYPE_CHECKING, Any

import torch

from tdreplay.core.checkpoint import CheckpointNotFoundError

from ._client_state import check_client_state, client_state, restore_client_state
from ._draw_ahead import DrawAhead
from ._ray import Deadline, import_ray
from ._shard_calls import ShardCalls
from ._sharding import check_manifest, write_manifest
from ._wire import pack, unpack
from .checkpoints import check_checkpoint, is_url, join_location, resolve_location
from .client import ActorClient
from .errors import RemoteBufferError

__all__ = ["ShardedRecoveryMixin", "start_shards"]


class ShardedRecoveryMixin:
    """Checkpoints and recovery of :class:`~tdreplay.distributed.ShardedReplayBuffer`."""

    _clients: list[ActorClient]
    _calls: ShardCalls
    _ahead: DrawAhead
    _call_timeout: float | None
    _cursor: int  # (the round-robin write cursor: the next write's first shard to try)
    _rng: torch.Generator | None  # (draws the shard of each position of a batch)
    #: where ``dumps()`` / ``loads()`` go by default (the creator's ``checkpoint_path``)
    _checkpoint_path: str | None = None

    @property
    def checkpoint_path(self) -> str | None:
        """The buffer's ``checkpoint_path`` (shard ``k`` restores ``checkpoint_path/shard-k``
        after a Ray restart; ``None``: not given, or an attached client)."""
        return self._checkpoint_path

    def _location(self, path: str | os.PathLike[str] | None) -> str:
        """``path`` made absolute (a URL as is), or ``checkpoint_path`` when ``path`` is
        ``None``; ``ValueError`` naming ``path`` when there is neither."""
        if path is not None:
            return resolve_location(path)
        if self._checkpoint_path is None:
            raise ValueError("no checkpoint path: pass path, or build the buffer with "
                             "checkpoint_path=...")
        return self._checkpoint_path

    @property
    def num_shards(self) -> int:
        """Number of buffer actors."""
        return len(self._clients)

    if TYPE_CHECKING:  # what the buffer this is mixed into provides
        def _wait(self, calls: list[tuple[int, str, tuple[Any, ...]]], what: str
                  ) -> list[Any]: ...

        def _all(self, method: str, *args: Any, what: str | None = None) -> list[Any]: ...

        def _live(self, method: str, *args: Any, what: str | None = None
                  ) -> list[tuple[int, Any]]: ...

        def _check_not_closed(self) -> None: ...

        def _check_every_shard_alive(self, what: str) -> None: ...

    def dumps(self, path: str | os.PathLike[str] | None = None) -> None:
        """Checkpoint every shard under ``path/shard-<k>`` and write ``path/sharded.json``
        (``path`` defaults to ``checkpoint_path``, as :meth:`RayReplayBuffer.dumps
        <tdreplay.distributed.RayReplayBuffer.dumps>`: what shards restarted by Ray restore).

        ``path``: a path (made absolute here; the shards' actors write there, on their
        nodes: give a path every node mounts) or an fsspec URL, see
        :mod:`~tdreplay.distributed.checkpoints`; :meth:`loads` and :meth:`respawn` take the
        same.

        The manifest holds this client's write cursor and generator state too, so that a
        buffer restored with :meth:`loads` writes to the shard and draws the batches the saved
        one would have (without ``prefetch``: batches drawn ahead are not saved).

        Each shard's checkpoint is atomic; the shards are saved at once but not as one
        transaction (writes between two shards' saves may be in one and not the other). With
        a shard dead nothing is saved (``BufferActorDiedError``): the checkpoint at ``path``
        stays the last one committed whole.
        """
        root = self._location(path)
        self._check_every_shard_alive("dumps")
        if not is_url(root):
            os.makedirs(root, exist_ok=True)
        self._wait([(k, "dumps", (join_location(root, f"shard-{k}"),))
                    for k in range(self.num_shards)], "dumps")
        write_manifest(root, self.num_shards, client_state(self._cursor, self._rng))

    def loads(self, path: str | os.PathLike[str] | None = None) -> None:
        """Restore every shard from a :meth:`dumps` checkpoint of as many shards (none when a
        shard is dead: ``BufferActorDiedError``; :meth:`respawn` restores the dead ones).
        ``path`` defaults to ``checkpoint_path``.

        Every shard's checkpoint is checked (files, sizes, CRCs) before any shard loads, as
        :meth:`respawn` checks them: a damaged one raises ``CheckpointError`` with every shard
        as it was (shard 0 was restored before shard 1's damaged file was found, and the buffer
        left half old, half restored)."""
        root = self._location(path)
        client = check_manifest(root, self.num_shards)
        self._check_every_shard_alive("loads")
        for k in range(self.num_shards):
            check_checkpoint(join_location(root, f"shard-{k}"))
        self._ahead.clear()
        self._calls.forget_masses()
        self._wait([(k, "loads", (join_location(root, f"shard-{k}"),))
                    for k in range(self.num_shards)], "loads")
        self._follow_restored(client)

    def _follow_restored(self, client: dict[str, Any] | None) -> None:
        """After every shard was restored: this client's write cursor and generator as saved
        (``client``; ``None``: a checkpoint of an earlier version, which saved none), and the
        shards' masses learnt again, as the saved client knew them from the shards' answers
        (how many items a batch asks each shard for depends on them, and with it what the
        shards draw)."""
        if client is not None:
            self._cursor = restore_client_state(client, self._rng)
        self._calls.ask_masses(range(self.num_shards), "loads", self._call_timeout)

    save = dumps
    dump = dumps
    load = loads

    def state_dict(self) -> dict[str, Any]:
        """``{"num_shards": K, "shards": [state_dict of each shard], "client": {"cursor",
        "generator"}}`` (this client's write cursor and generator state, as :meth:`dumps`
        saves them)."""
        return {"num_shards": self.num_shards,
                "shards": [unpack(s) for s in self._all("state_dict")],
                "client": client_state(self._cursor, self._rng)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` of as many shards, all of them or none.

        Every shard first checks its part (its buffer's ``check_state_dict``: every check
        its ``load_state_dict`` makes before it changes anything), and keeps it; only when
        every shard accepted its part do they all load. A part refused
        (e.g. of another capacity) raises its shard's error, naming the shard, and leaves
        every shard as it was; a dead shard raises ``BufferActorDiedError`` before any part
        is sent. (A shard that dies between the two steps raises ``BufferActorDiedError``
        while the others load: :meth:`respawn` it, or load again.)
        """
        if not isinstance(state_dict, dict) or state_dict.get("num_shards") != self.num_shards \
                or not isinstance(state_dict.get("shards"), (list, tuple)) \
                or len(state_dict["shards"]) != self.num_shards:
            raise ValueError(f"state_dict must come from a ShardedReplayBuffer of "
                             f"{self.num_shards} shards.")
        unknown = sorted(map(str, set(state_dict) - {"num_shards", "shards", "client"}))
        if unknown:
            raise ValueError(f"state_dict has entries {unknown} that a ShardedReplayBuffer "
                             "never saves: it is the state of something else.")
        client = state_dict.get("client")  # (absent from the states of earlier versions)
        if client is not None:
            check_client_state(client, self.num_shards)
        self._check_every_shard_alive("load_state_dict")
        token = uuid.uuid4().hex
        try:
            self._each_shard([(k, "stage_state_dict", (token, pack(sd)))
                              for k, sd in enumerate(state_dict["shards"])],
                             "load_state_dict (every shard checking its part first)")
        except BaseException:
            self._drop_staged(token)
            raise
        self._ahead.clear()
        self._calls.forget_masses()
        self._each_shard([(k, "load_staged_state_dict", (token,))
                          for k in range(self.num_shards)], "load_state_dict")
        self._follow_restored(client)

    def _each_shard(self, calls: list[tuple[int, str, tuple[Any, ...]]], what: str) -> None:
        """Send ``calls`` at once and wait for every answer; the first error in shard order
        is raised, its message prefixed with the shard that raised it."""
        refs = [(k, self._clients[k].submit(method, *args)) for k, method, args in calls]
        deadline = Deadline(self._call_timeout)
        errors = []
        for k, ref in refs:
            try:
                self._clients[k].wait(ref, what, timeout=deadline.remaining())
            except Exception as err:  # noqa: BLE001 - raised below, after every answer
                errors.append((k, err))
        if errors:
            shard, first = errors[0]
            if not isinstance(first, RemoteBufferError) and first.args \
                    and isinstance(first.args[0], str):
                first.args = (f"shard {shard}: {first.args[0]}", *first.args[1:])
            raise first

    def _drop_staged(self, token: str) -> None:
        """Best effort: the shards forget a state staged under ``token`` (a shard that is
        gone kept nothing)."""
        for client in self._clients:
            try:
                client.submit("drop_staged_state_dict", token)
            except RemoteBufferError:
                pass

    def respawn(self, path: str | os.PathLike[str] | None = None,
                shards: list[int] | None = None) -> None:
        """Replace the dead shards' actors (``shards``: these ones; none dead: every shard),
        each restored from ``path/shard-k`` before it answers any call (without ``path``, from
        ``checkpoint_path/shard-k`` once something was saved there; else they start empty).
        The live shards keep serving, with their newer writes. With every shard dead, every
        shard is rebuilt.
        """
        root = resolve_location(path) if path is not None else self._checkpoint_path
        if root is not None:
            try:
                check_manifest(root, self.num_shards)
            except CheckpointNotFoundError:
                if path is not None:
                    raise
                root = None  # (nothing saved at checkpoint_path yet)
        self._check_not_closed()
        if not all(client.can_respawn for client in self._clients):
            raise RuntimeError("respawn() needs the creation arguments, which only the "
                               "client that created the buffer has.")
        if shards is None:  # (every shard dead: they are all rebuilt, nothing is refused)
            self._calls.tolerant([(k, "length", ()) for k in range(self.num_shards)
                                  if k not in self._calls.dead],
                                 "respawn (finding the dead shards)", self._call_timeout,
                                 need_one=False)
            shards = sorted(self._calls.dead) or list(range(self.num_shards))
        restore = [None if root is None else join_location(root, f"shard-{k}") for k in shards]
        for location in restore:  # (every one, before any shard's actor is killed)
            if location is not None:
                check_checkpoint(location)
        for k in shards:
            self._clients[k].shutdown()
        for k in shards:
            self._clients[k].wait_name_released()
        replace_lost_nodes([self._clients[k] for k in shards])
        start_shards([self._clients[k] for k in shards], restore)
        self._calls.dead.difference_update(shards)
        for k in shards:
            self._calls.note_answer(k)
        self._calls.forget_masses()
        self._ahead.clear()

    def reconnect(self) -> None:
        """Look every shard up by name again (after another process respawned them)."""
        for client in self._clients:
            client.reconnect()
        self._calls.dead.clear()
        self._calls.unavailable.clear()
        self._calls.forget_masses()

    def shutdown(self) -> None:
        """Kill every shard's actor (:meth:`respawn` can replace them)."""
        for client in self._clients:
            client.shutdown()


def start_shards(clients: list[ActorClient], restore: list[str | None] | None = None) -> None:
    """Start the shards' actors at once (each restored from ``restore[i]``), then wait for
    them all (killing all on failure)."""
    try:
        restore = restore or [None] * len(clients)
        refs = [client.start_spawn(path) for client, path in zip(clients, restore)]
        for client, ref in zip(clients, refs):
            client.finish_spawn(ref)
    except BaseException:
        for client in clients:
            client.shutdown()
        raise


def _live_nodes() -> list[str]:
    ray = import_ray()
    return sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))


def _on_node(node: str) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node, soft=False)


def spread_over_nodes(configs: list[dict[str, Any]], placement: str | None
                      ) -> list[dict[str, Any]]:
    """``configs``, shards without a scheduling strategy pinned to the live nodes in turn when
    ``placement == "spread"`` (one node: left to Ray)."""
    if placement not in ("spread", None):
        raise ValueError(f"placement must be 'spread' or None, got {placement!r}.")
    nodes = _live_nodes() if placement == "spread" else []
    if len(nodes) < 2:
        return configs
    return [c if "scheduling_strategy" in c else
            {**c, "scheduling_strategy": _on_node(nodes[k % len(nodes)])}
            for k, c in enumerate(configs)]


def replace_lost_nodes(clients: list[ActorClient]) -> None:
    """Shards spread by :func:`spread_over_nodes` whose node is gone go to live nodes in turn."""
    nodes = _live_nodes()
    lost = [c for c in clients if c.info.get("meta", {}).get("spread")
            and c.info.get("node_id") not in nodes]
    for k, client in enumerate(lost):
        client.set_scheduling_strategy(_on_node(nodes[k % len(nodes)]) if nodes else None)
