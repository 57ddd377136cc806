"""``StoreStorage``: a storage whose rows live on a Redis-compatible key-value server.

The rows are kept by tensordict's :class:`~tensordict.store.TensorDictStore` (Redis, Dragonfly,
KeyDB or any server speaking the Redis protocol), created at the first write from the structure
of the data written. The storage keeps in the process only the number of written rows and the
structure of a row (:class:`StoreSchema`), which every later write is checked against before
anything is sent to the server.

``redis`` is needed only here: it is the ``store`` extra of this package
(``pip install "tdreplay-storages[store]"``) and is imported when a store is opened, so that
``import tdreplay.storages`` works without it.
"""

from __future__ import annotations

import importlib.util
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from tensordict import (
    TensorDictBase,
)

from tdreplay.core import Storage, StorageCheckpointerBase
from tdreplay.core.checkpoint import CheckpointError, read_json, write_json
from tdreplay.core.utils import as_long_tensor, check_flag, check_instance, is_int

from ._casts import check_cast
from ._formats import (
    KIND_TC,
    KIND_TENSOR,
    TENSOR_KEY,
)
from ._keys import as_key
from ._store_index import read_index, write_index
from ._store_schema import (
    StoreSchema,
    as_store_rows,
    cast_to_schema,
    schema_of_store,
)
from ._tensorclasses import (
    inner_first,
    nested_tensorclasses,
    with_classes,
)
from .checkpointers import hooked_rows, read_rows, write_rows

__all__ = ["StoreSchema", "StoreStorage", "StoreStorageCheckpointer"]

#: how to install what :class:`StoreStorage` needs
INSTALL_HINT = 'pip install "tdreplay-storages[store]"'

#: keywords of ``TensorDictStore`` that the storage sets itself
_RESERVED = ("batch_size",)

def _require_store() -> None:
    """``ModuleNotFoundError`` naming the extra to install unless ``redis`` and
    ``tensordict.store`` can be imported."""
    if importlib.util.find_spec("redis") is None:
        raise ModuleNotFoundError(
            "StoreStorage needs the redis client, which is not installed: "
            f"{INSTALL_HINT}", name="redis")
    if importlib.util.find_spec("tensordict.store") is None:  # pragma: no cover - old tensordict
        raise ModuleNotFoundError(
            "StoreStorage needs a tensordict with the tensordict.store module (0.15 or later): "
            f"pip install -U tensordict, then {INSTALL_HINT}", name="tensordict.store")


class StoreStorageCheckpointer(StorageCheckpointerBase):
    """Checkpointer of :class:`StoreStorage`: the written rows themselves, read from the server.

    The rows are saved as :class:`~tdreplay.storages.TensorStorageCheckpointer` saves its rows:
    memory-mapped files in ``data/`` (``TensorDict.load_memmap`` reads them), non-tensor
    entries as JSON in ``non_tensor.json``, and ``storage.json`` with the structure of a row.
    Loading checks everything before the storage changes, then writes the rows into the
    loading storage's own store (created on its server if it has none yet), so that a
    checkpoint restores the data whatever became of the server it was saved from.

    Save hooks get the written rows as a TensorDict (a tensor storage's under the key
    ``"_tensor"``) and must return one; load hooks get what was read.

    Examples
    --------
    >>> import tempfile
    >>> from fakeredis import FakeServer
    >>> from fakeredis.aioredis import FakeRedis
    >>> server = FakeServer()
    >>> s = StoreStorage(10, client=FakeRedis(server=server))
    >>> s.set(slice(0, 3), torch.arange(3.0))
    >>> with tempfile.TemporaryDirectory() as d:
    ...     s.dumps(d)
    ...     t = StoreStorage(10, client=FakeRedis(server=FakeServer()))  # another server
    ...     t.loads(d)
    >>> len(t), t[:].tolist()
    (3, [0.0, 1.0, 2.0])
    """

    def dumps(self, storage: Storage, path: Path) -> None:
        source = _store_storage(storage, self)
        path = Path(path)
        meta = source.layout_meta()
        meta["checkpointer"] = type(self).__name__
        if len(source):
            write_rows(hooked_rows(self, source.written_rows(), path), path, meta)
        write_json(path / "storage.json", meta)

    def prepare_load(self, storage: Storage, path: Path) -> Callable[[], None]:
        target = _store_storage(storage, self)
        path = Path(path)
        meta = read_json(path / "storage.json")
        for name, expected in (("class", type(target).__name__),
                               ("checkpointer", type(self).__name__)):
            if meta.get(name) != expected:
                raise CheckpointError(f"checkpoint storage.json names {name} "
                                      f"{meta.get(name)!r}, expected {expected!r} "
                                      f"({str(path / 'storage.json')!r}).")
        if meta.get("max_size") != target.max_size:
            raise CheckpointError(f"checkpoint storage has max_size={meta.get('max_size')} but "
                                  f"this storage has max_size={target.max_size}.")
        n = meta.get("len")
        if not is_int(n) or not 0 <= n <= target.max_size:
            raise CheckpointError(f"checkpoint storage.json has len={n!r}, expected an int in "
                                  f"[0, {target.max_size}].")
        if not n:
            return target.empty
        try:
            schema = StoreSchema.from_record(meta.get("schema"), "checkpoint storage.json")
        except ValueError as err:
            raise CheckpointError(str(err)) from err
        loaded = self.apply_load_hooks(read_rows(path, meta, "store storage"))
        if not isinstance(loaded, TensorDictBase) or loaded.batch_size[:1] != (n,):
            raise CheckpointError(f"checkpoint rows are not a TensorDict of {n} rows.")
        try:
            target.check_install(schema, loaded)
        except (TypeError, KeyError, ValueError) as err:
            raise CheckpointError(f"checkpoint rows do not fit this storage: {err}") from err

        def commit() -> None:
            target.install(schema, loaded)

        return commit


def _store_storage(storage: Storage, checkpointer: StorageCheckpointerBase) -> StoreStorage:
    if not isinstance(storage, StoreStorage):
        raise TypeError(f"{type(checkpointer).__name__} saves StoreStorage, not "
                        f"{type(storage).__name__}.")
    return storage


class StoreStorage(Storage):
    """A storage whose rows live on a Redis-compatible key-value server (TorchRL's
    ``StoreStorage``).

    The rows are kept in a :class:`~tensordict.store.TensorDictStore` of batch size
    ``[max_size]``, created at the first write from the structure of the data: tensors,
    TensorDicts (nested ones included), tensorclasses and non-tensor entries (strings and
    other Python values, which the store keeps as JSON, or pickled). The buffer's data then
    lives in the server's memory instead of this process's, and other processes can read it
    (``TensorDictStore.from_store(td_id=storage.td_id)``). Each read and write is one
    round-trip to the server.

    Needs the ``redis`` client: ``pip install "tdreplay-storages[store]"``.

    Parameters
    ----------
    max_size : int
        Capacity in rows.
    backend : str
        A label for the kind of server (``"redis"``, ``"dragonfly"``, ``"keydb"``, ...), kept
        by the store; every server speaks the same protocol. Defaults to ``"redis"``.
    host : str
        Host name of the server. Defaults to ``"localhost"``.
    port : int
        Port of the server. Defaults to ``6379``.
    db : int
        Database number on the server. Defaults to ``0``.
    compilable : bool
        Accepted as in TorchRL; no effect (the count of written rows is a plain int).
    checkpointer : StorageCheckpointerBase, optional
        Defaults to :class:`StoreStorageCheckpointer`, which saves the rows themselves.
    **store_kwargs
        Passed to :class:`~tensordict.store.TensorDictStore`, as TorchRL: ``client`` (a ready
        ``redis.asyncio.Redis`` client, e.g. ``fakeredis.aioredis.FakeRedis()`` in tests;
        ``host``, ``port`` and ``db`` are then ignored), ``prefix`` (the namespace of the keys
        on the server), ``unix_socket_path``, ``device`` (where reads put tensors), ``td_id``,
        ``cache_metadata``, and options of the Redis client (``password``, ...).
        ``batch_size`` is the storage's (``[max_size]``) and is refused.

    Notes
    -----
    - The data stays on the server when the storage is emptied or dropped: :meth:`empty`
      forgets the rows (as TorchRL's), and ``storage.store.clear_redis()`` deletes them.
    - Every write is checked against the structure of the first one before anything is sent:
      another kind of data, a missing entry, another row shape or a lossy dtype cast raise
      (naming the entry) and leave the storage and the server as they were. Data with a new
      entry adds it (zero-filled in the other rows).
    - ``state_dict()`` names the store on the server (TorchRL's keys: ``_td_id``, the
      connection, ``_len``) and the structure of a row; ``load_state_dict`` reconnects to that
      store. Checkpoints (``dumps`` / ``loads``, :class:`StoreStorageCheckpointer`) hold the
      rows themselves.
    - A ``client`` given is used by the storage's store from the store's own event-loop thread
      (``TensorDictStore``'s design) and is closed when the store is.

    Examples
    --------
    Without a server at hand, ``fakeredis`` stands in for one; with a server, drop ``client``
    (``StoreStorage(1000, host="localhost", port=6379)``).

    >>> from fakeredis.aioredis import FakeRedis
    >>> from tensordict import TensorDict
    >>> from tdreplay.core import TensorDictReplayBuffer
    >>> storage = StoreStorage(1000, client=FakeRedis())
    >>> rb = TensorDictReplayBuffer(storage=storage, batch_size=4)
    >>> data = TensorDict({"obs": torch.randn(10, 4), "action": torch.randn(10, 2)}, [10])
    >>> _ = rb.extend(data)
    >>> len(rb), rb.sample()["obs"].shape
    (10, torch.Size([4, 4]))
    >>> storage.get(torch.tensor([3]))["obs"].equal(data["obs"][3:4])
    True
    """

    _default_checkpointer = StoreStorageCheckpointer
    keeps_written_objects = False  # (the server keeps the bytes of what it is given)

    def __init__(
        self,
        max_size: int,
        *,
        backend: str = "redis",
        host: str = "localhost",
        port: int = 6379,
        db: int = 0,
        compilable: bool = False,
        checkpointer: StorageCheckpointerBase | None = None,
        **store_kwargs: Any,
    ) -> None:
        _require_store()
        check_instance(backend, str, "backend")
        check_instance(host, str, "host")
        if not is_int(port) or isinstance(port, bool) or not 0 < int(port) < 65536:
            raise ValueError(f"port must be an int in [1, 65535], got {port!r}.")
        if not is_int(db) or isinstance(db, bool) or int(db) < 0:
            raise ValueError(f"db must be a non-negative int, got {db!r}.")
        for name in _RESERVED:
            if name in store_kwargs:
                raise ValueError(f"{name} is set by the storage ([max_size]); do not pass it in "
                                 "store_kwargs.")
        super().__init__(max_size, checkpointer, compilable=compilable)
        self._backend = backend
        self._host = host
        self._port = int(port)
        self._db = int(db)
        self._store_kwargs = dict(store_kwargs)
        self._store: Any = None
        self._td_id: str | None = None
        self._schema: StoreSchema | None = None
        self._len = 0

    # ---- the store ---------------------------------------------------------------------------
    @property
    def initialized(self) -> bool:
        """Whether the store exists (it is created at the first write)."""
        return self._store is not None

    @property
    def store(self) -> Any:
        """The :class:`~tensordict.store.TensorDictStore` holding the rows (``None`` before the
        first write)."""
        return self._store

    @property
    def td_id(self) -> str | None:
        """The id of the store on the server (``None`` before the first write):
        ``TensorDictStore.from_store(td_id=...)`` connects another process to it."""
        return self._td_id

    @property
    def schema(self) -> StoreSchema | None:
        """The structure of a row (:class:`StoreSchema`), ``None`` before the first write."""
        return self._schema

    @property
    def shape(self) -> torch.Size | None:
        return None if self._store is None else torch.Size([self.max_size])

    @property
    def device(self) -> torch.device:
        device = self._store_kwargs.get("device")
        return torch.device("cpu") if device is None else torch.device(device)

    def _open(self, td_id: str | None = None, kwargs: dict[str, Any] | None = None,
              connection: tuple[str, str, int, int] | None = None) -> tuple[Any, str]:
        """``(store, td_id)``: a new ``TensorDictStore`` of ``[max_size]`` rows on this
        storage's server (or ``connection``: ``(backend, host, port, db)``), named ``td_id``
        (``None``: the ``td_id`` of ``store_kwargs``, else a new UUID)."""
        _require_store()
        from tensordict.store import TensorDictStore

        backend, host, port, db = connection or (self._backend, self._host, self._port, self._db)
        kwargs = dict(self._store_kwargs if kwargs is None else kwargs)
        td_id = td_id or kwargs.get("td_id") or str(uuid.uuid4())
        kwargs["td_id"] = td_id
        kwargs.update(backend=backend, host=host, port=port, db=db, batch_size=[self.max_size])
        store = TensorDictStore(**kwargs)
        return store, td_id

    def _keep(self, store: Any, td_id: str | None) -> Any:
        """Make ``store`` (named ``td_id``) the storage's store; returns the one it replaces."""
        old, self._store, self._td_id = self._store, store, td_id
        return old

    # ---- writing -----------------------------------------------------------------------------
    def set(self, cursor: int | slice | torch.Tensor | Sequence[int], data: Any, *,
            set_cursor: bool = True) -> None:
        if set_cursor is not True and set_cursor is not False:  # (one check when a bool)
            check_flag(set_cursor, "set_cursor")
        single = is_int(cursor)
        lead = 0 if single else 1
        td, kind, tensorclass, source = as_store_rows(data, lead)
        if lead and not td.batch_dims:
            raise ValueError("data for several rows must have a leading (batch) dimension, got "
                             "a batch size of ().")
        n = None if single else td.batch_size[0]
        index, top, last = write_index(cursor, n, self.max_size)
        classes = inner_first(nested_tensorclasses(source if kind == KIND_TC else td))
        written = StoreSchema.of(td, kind, tensorclass, lead, classes)
        schema = self._schema
        if schema is None:
            schema = written
        else:
            schema.check(written, "data")
            schema = schema.merged(written)
            td = cast_to_schema(td, schema)
        if top < 0:  # no row selected
            return
        store, td_id = ((self._store, self._td_id) if self._store is not None
                        else self._open())
        store[index] = td
        self._keep(store, td_id)
        self._schema = schema
        if top + 1 > self._len:
            self._len = top + 1
        if set_cursor:
            self.last_written_row = last

    # ---- reading -----------------------------------------------------------------------------
    def _from_store(self, td: TensorDictBase) -> Any:
        """What the store read gives back as the data written (a tensor, a tensorclass)."""
        schema = self._schema
        assert schema is not None
        if schema.row_batch:
            td.batch_size = torch.Size([*td.batch_size, *schema.row_batch])
        if schema.kind == KIND_TENSOR:
            return td.get(TENSOR_KEY)
        if schema.classes:
            td = with_classes(td, schema.classes)
        tensorclass: Any = schema.tensorclass
        if tensorclass is not None:
            return tensorclass.from_tensordict(td)
        return td

    def _read(self, index: Any) -> TensorDictBase:
        store = self._store
        if store is None:
            raise RuntimeError("cannot read from a StoreStorage that was never written.")
        return store[index]

    def get(self, index: int | torch.Tensor) -> Any:
        if self._store is None:
            raise RuntimeError("cannot read from a StoreStorage that was never written.")
        return self._from_store(self._read(read_index(index, self._len, self.max_size)))

    def __getitem__(self, index: Any) -> Any:
        rest: tuple[Any, ...] = ()
        if isinstance(index, tuple):
            index, rest = (index[0], index[1:]) if index else (slice(None), ())
        n = self._len
        if is_int(index) and -n <= int(index) < 0:
            index = int(index) + n  # the last written row, as for a list
        elif isinstance(index, torch.Tensor) and index.dtype is torch.bool:
            if index.ndim != 1 or index.shape[0] != n:
                raise IndexError(f"a boolean index must have one entry per written row ({n}), "
                                 f"got shape {tuple(index.shape)}.")
        elif not is_int(index) and not isinstance(index, slice):
            index = as_long_tensor(index, name="index")
            index = torch.where(index < 0, index + n, index)
        out = self.get(index)
        if rest:
            lead: tuple[Any, ...] = () if is_int(index) else (slice(None),)
            out = out[lead + rest]
        return out

    def __len__(self) -> int:
        return self._len

    def written_rows(self) -> TensorDictBase:
        """The written rows read from the server, as a TensorDict of batch size
        ``[len, *row batch]`` (a tensor storage's under the key ``"_tensor"``, a tensorclass's
        as a TensorDict): what checkpoints save. ``RuntimeError`` before the first write.

        Examples
        --------
        >>> from fakeredis.aioredis import FakeRedis
        >>> s = StoreStorage(10, client=FakeRedis())
        >>> s.set(slice(0, 3), torch.arange(3))
        >>> rows = s.written_rows()
        >>> rows.batch_size, rows["_tensor"].tolist()
        (torch.Size([3]), [0, 1, 2])
        """
        if self._store is None or self._schema is None:
            raise RuntimeError("the StoreStorage was never written: it has no rows.")
        td = self._read(slice(0, self._len))
        if self._schema.row_batch:
            td.batch_size = torch.Size([*td.batch_size, *self._schema.row_batch])
        return td

    # ---- lifecycle ---------------------------------------------------------------------------
    def empty(self) -> None:
        """Forget every written row (as TorchRL's: the store and its data stay on the server,
        to be overwritten by the next writes)."""
        self._len = 0
        self.last_written_row = None

    def state_dict(self) -> dict[str, Any]:
        """TorchRL's keys (``initialized``, ``_len``, ``_backend``, ``_host``, ``_port``,
        ``_db``, ``_store_kwargs``, ``_td_id``: the store on the server, not its data), and
        ``max_size`` and ``schema`` (the structure of a row).

        A ``client`` given in ``store_kwargs`` is left out (it is an open connection):
        ``load_state_dict`` into a storage built with a client reconnects through that one.
        """
        kwargs = {k: v for k, v in self._store_kwargs.items() if k != "client"}
        return {
            "initialized": self.initialized,
            "_len": self._len,
            "_backend": self._backend,
            "_host": self._host,
            "_port": self._port,
            "_db": self._db,
            "_store_kwargs": kwargs,
            "_td_id": self.td_id,
            "max_size": self.max_size,
            "schema": None if self._schema is None else self._schema.record(),
        }

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """``ValueError`` naming the field unless :meth:`load_state_dict` can load
        ``state_dict``; reads nothing from the server and changes nothing."""
        self._checked_state(state_dict)

    def _checked_state(self, state_dict: Any) -> StoreSchema | None:
        if not isinstance(state_dict, dict):
            raise ValueError(f"StoreStorage state_dict must be a dict, got "
                             f"{type(state_dict).__name__}.")
        for name in ("initialized", "_len"):
            if name not in state_dict:
                raise ValueError(f"StoreStorage state_dict lacks {name!r}.")
        if "max_size" in state_dict and state_dict["max_size"] != self.max_size:
            raise ValueError(f"state_dict['max_size'] is {state_dict['max_size']!r} but this "
                             f"StoreStorage has max_size={self.max_size}: a buffer of another "
                             "capacity cannot be restored into it.")
        length = state_dict["_len"]
        if not is_int(length) or isinstance(length, bool) or not 0 <= length <= self.max_size:
            raise ValueError(f"state_dict['_len'] is {length!r}, expected an int in "
                             f"[0, {self.max_size}].")
        if not state_dict["initialized"]:
            return None
        if not isinstance(state_dict.get("_td_id"), str):
            raise ValueError("state_dict['_td_id'] must name the store (a str) of an "
                             "initialized StoreStorage.")
        kwargs = state_dict.get("_store_kwargs", {})
        if not isinstance(kwargs, dict):
            raise ValueError("state_dict['_store_kwargs'] must be a dict.")
        if state_dict.get("schema") is None:
            return None  # (TorchRL's: the structure is read from the next write)
        try:
            return StoreSchema.from_record(state_dict["schema"], "state_dict['schema']")
        except CheckpointError as err:
            raise ValueError(f"state_dict['schema']: {err}") from err

    def saved_rows(self, state_dict: dict[str, Any]) -> int:
        return int(state_dict["_len"]) if state_dict["initialized"] else 0

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Reconnect to the store ``state_dict`` names (as TorchRL's), on the server it names
        (through this storage's ``client`` when it was built with one).

        ``ValueError`` when the state is not one of a StoreStorage of this ``max_size``, or
        when the server holds no such store; the storage is unchanged then."""
        schema = self._checked_state(state_dict)
        if not state_dict["initialized"]:
            self._len = 0
            self.last_written_row = None
            return
        td_id = state_dict["_td_id"]
        kwargs = {**state_dict.get("_store_kwargs", {}),
                  **{k: v for k, v in self._store_kwargs.items() if k == "client"}}
        store = self._store
        if store is None or self.td_id != td_id or \
                kwargs.get("prefix") != self._store_kwargs.get("prefix"):
            connection = (state_dict.get("_backend", self._backend),
                          state_dict.get("_host", self._host),
                          state_dict.get("_port", self._port),
                          state_dict.get("_db", self._db))
            store, _ = self._open(td_id, kwargs, connection)
            if not list(store.keys()):
                store.clear_redis()  # (only what opening it wrote: it held no entry)
                store.close()
                raise ValueError(f"state_dict['_td_id'] names the store {td_id!r}, which the "
                                 "server does not hold (deleted, or another server).")
        if schema is None and (old_schema := self._schema) is not None and store is self._store:
            schema = old_schema
        if schema is None:  # (a state of TorchRL's, without the structure of a row)
            schema = schema_of_store(store)
        old = self._keep(store, td_id)
        self._schema = schema
        self._len = int(state_dict["_len"])
        if old is not None and old is not store:
            old.close()

    # ---- what checkpoints use ----------------------------------------------------------------
    def layout_meta(self) -> dict[str, Any]:
        """The storage's structure as JSON-ready values (a checkpoint's ``storage.json``)."""
        return {"class": type(self).__name__, "max_size": self.max_size, "len": self._len,
                "initialized": self.initialized,
                "schema": None if self._schema is None else self._schema.record()}

    def check_install(self, schema: StoreSchema, rows: TensorDictBase) -> None:
        """``TypeError`` / ``KeyError`` / ``ValueError`` unless :meth:`install` can write
        ``rows`` (of ``schema``) here; changes nothing."""
        found = StoreSchema.of(rows, schema.kind, schema.tensorclass, 1, schema.classes)
        schema.check(found, "the rows")
        if self._schema is not None:
            self._schema.check(schema, "the rows")
        for path, entry in found.entries.items():
            held = schema.entries.get(path)
            if entry is not None and held is not None and entry[1] != held[1]:
                check_cast(as_key(path), rows.get(as_key(path)), held[1])

    def install(self, schema: StoreSchema, rows: TensorDictBase) -> None:
        """Write ``rows`` (of ``schema``, checked by :meth:`check_install`) as the written rows
        ``[0, len(rows))``, creating the store first if there is none."""
        target = schema if self._schema is None else self._schema.merged(schema)
        rows = cast_to_schema(rows, target)
        n = rows.batch_size[0]
        store, td_id = ((self._store, self._td_id) if self._store is not None
                        else self._open())
        store[slice(0, n)] = rows
        self._keep(store, td_id)
        self._schema, self._len = target, n

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(max_size={self.max_size}, len={len(self)}, "
                f"backend={self._backend!r}, host={self._host!r}, port={self._port}, "
                f"td_id={self.td_id!r})")
