"""The checkpointer of a storage written outside tdreplay: its ``state_dict`` in one file.

A storage class of your own (a subclass of :class:`~tdreplay.core.Storage` with ``set``,
``get``, ``__len__``, ``empty``, ``state_dict`` and ``load_state_dict``) needs no checkpointer
of its own for ``dumps`` / ``loads``: :class:`StateDictCheckpointer`, the default of such a
class, writes what its ``state_dict`` returns (through the save hooks) and gives it back to its
``check_state_dict`` and ``load_state_dict``. The file is written with ``torch.save`` and read
with ``torch.load(weights_only=False)``, as a ``ListStorage``'s items: load checkpoints you
trust. The built-in storages keep their own checkpointers (files per entry, memory maps).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .checkpoint import CheckpointError, load_torch_file, read_json, save_torch_file, write_json
from .storage_checkpointer import StorageCheckpointerBase

if TYPE_CHECKING:
    from .storage import Storage

__all__ = ["StateDictCheckpointer"]

STATE_FILE = "storage_state.pt"
META_FILE = "storage.json"


class StateDictCheckpointer(StorageCheckpointerBase["Storage"]):
    """Writes a storage's ``state_dict`` (save hooks applied) to ``storage_state.pt`` and reads it
    back, checked by the storage's ``check_state_dict`` before ``load_state_dict`` installs it.

    Examples
    --------
    >>> import tempfile, torch
    >>> from tdreplay.core import ReplayBuffer, Storage
    >>> class Rows(Storage):
    ...     def __init__(self, max_size):
    ...         super().__init__(max_size)
    ...         self.rows = {}
    ...     def set(self, cursor, data, *, set_cursor=True):
    ...         rows = range(*cursor.indices(self.max_size)) if isinstance(cursor, slice) \\
    ...             else torch.as_tensor(cursor).reshape(-1).tolist()
    ...         self.rows.update(zip(rows, data))
    ...     def get(self, index):
    ...         return [self.rows[i] for i in torch.as_tensor(index).reshape(-1).tolist()]
    ...     def __len__(self):
    ...         return len(self.rows)
    ...     def empty(self):
    ...         self.rows = {}
    ...     def state_dict(self):
    ...         return {"rows": dict(self.rows)}
    ...     def load_state_dict(self, state_dict):
    ...         self.rows = dict(state_dict["rows"])
    >>> rb = ReplayBuffer(storage=Rows(8))
    >>> _ = rb.extend(["a", "b", "c"])
    >>> type(rb.storage.checkpointer).__name__
    'StateDictCheckpointer'
    >>> with tempfile.TemporaryDirectory() as d:
    ...     rb.dumps(d)
    ...     restored = ReplayBuffer(storage=Rows(8))
    ...     restored.loads(d)
    >>> restored.storage.rows, restored.write_count
    ({0: 'a', 1: 'b', 2: 'c'}, 3)
    """

    def dumps(self, storage: Storage, path: Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = self.apply_save_hooks(storage.state_dict(), path=path)
        save_torch_file(state, path / STATE_FILE, weights_only=False)  # (any Python values)
        write_json(path / META_FILE, {"class": type(storage).__name__,
                                      "max_size": storage.max_size})

    def prepare_load(self, storage: Storage, path: Path) -> Callable[[], None]:
        path = Path(path)
        meta = read_json(path / META_FILE)
        if meta.get("class") != type(storage).__name__:
            raise CheckpointError(f"checkpoint holds a {meta.get('class')} but this buffer has a "
                                  f"{type(storage).__name__} ({str(path / META_FILE)!r}).")
        file = path / STATE_FILE
        state = self.apply_load_hooks(load_torch_file(file, weights_only=False))  # (trusted)
        try:
            storage.check_state_dict(state)
        except (ValueError, TypeError, KeyError) as err:
            raise CheckpointError(f"{err} (in {str(file)!r})") from err
        return lambda: storage.load_state_dict(state)
