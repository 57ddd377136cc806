"""``WriterEnsemble``: the writers of several buffers, kept together, never written through."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import torch

from tdreplay.core import Storage, Writer

from ._members import (
    MembersShareable,
    check_members_state_dict,
    dump_members,
    load_members_state_dict,
    members_state_dict,
    prepare_members,
    select_members,
)
from .storage import StorageEnsemble


class WriterEnsemble(MembersShareable, Writer):
    """The writers of several buffers, as one component of a :class:`ReplayBufferEnsemble`.

    Writing through it is refused: each writer writes into its own buffer's storage, so extend
    one buffer of the ensemble (``rb[i].extend(...)``). It carries the writers' state into the
    ensemble's ``state_dict`` and checkpoints. It is shareable between processes only if every
    writer is (``shareable``); otherwise ``check_shareable()``, pickling it for a process being
    started and sharing a buffer holding it raise :class:`~tdreplay.core.NotShareableError`
    naming the writer (its position and class) and giving its own message.

    Parameters
    ----------
    *writers : Writer
        One writer per buffer.

    Examples
    --------
    >>> from tdreplay.core import ListStorage, RoundRobinWriter
    >>> w0, w1 = RoundRobinWriter(), RoundRobinWriter()
    >>> w0.register_storage(ListStorage(4))
    >>> _ = w0.extend([1, 2, 3])
    >>> writers = WriterEnsemble(w0, w1)
    >>> writers.write_count, writers[0] is w0, len(writers)
    (3, True, 2)
    >>> writers.shareable  # round-robin writers keep only counters
    True
    """

    def __init__(self, *writers: Writer) -> None:
        if not writers:
            raise ValueError("WriterEnsemble needs at least one writer.")
        for i, writer in enumerate(writers):
            if not isinstance(writer, Writer):
                raise TypeError(f"writers[{i}] must be a Writer instance, got "
                                f"{type(writer).__name__}.")
            if isinstance(writer, WriterEnsemble):
                raise TypeError(f"writers[{i}] is a WriterEnsemble: ensembles do not nest.")
        super().__init__()
        self._writers: tuple[Writer, ...] = tuple(writers)

    @property
    def writers(self) -> tuple[Writer, ...]:
        """The writers, one per buffer."""
        return self._writers

    def _sharing_members(self) -> tuple[Writer, ...]:
        return self._writers

    def register_storage(self, storage: Storage) -> None:
        """Attach the :class:`StorageEnsemble` (each writer keeps its own buffer's storage)."""
        if not isinstance(storage, StorageEnsemble):
            raise TypeError(f"a WriterEnsemble works with a StorageEnsemble, got "
                            f"{type(storage).__name__}.")
        if len(storage) != len(self._writers):
            raise ValueError(f"the StorageEnsemble has {len(storage)} storages but the "
                             f"WriterEnsemble has {len(self._writers)} writers.")
        self._storage = storage

    def add(self, data: Any) -> int | torch.Tensor:
        raise RuntimeError("a WriterEnsemble cannot write: extend one buffer of the ensemble "
                           "instead (rb[i].add(...)).")

    def extend(self, data: Any) -> torch.Tensor:
        raise RuntimeError("a WriterEnsemble cannot write: extend one buffer of the ensemble "
                           "instead (rb[i].extend(...)).")

    @property
    def write_count(self) -> int:
        """Items written by all the writers."""
        return sum(writer.write_count for writer in self._writers)

    @write_count.setter
    def write_count(self, value: int) -> None:
        raise AttributeError("the write count of a WriterEnsemble is the sum of its writers' "
                             "counts and cannot be set: set it on one writer (writers[i]).")

    def empty(self, empty_write_count: bool = True) -> None:
        for writer in self._writers:
            writer.empty(empty_write_count)

    def __getitem__(self, index: Any) -> Writer | WriterEnsemble:
        """``ensemble[i]``: the i-th writer; a slice, sequence or 1-D tensor: a
        :class:`WriterEnsemble` of the selected writers."""
        positions = select_members(index, len(self._writers), "writers")
        if isinstance(positions, int):
            return self._writers[positions]
        return WriterEnsemble(*(self._writers[i] for i in positions))

    def __len__(self) -> int:
        """Number of writers."""
        return len(self._writers)

    # ---- state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"0": writers[0].state_dict(), ...}``."""
        return members_state_dict(self._writers)

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        check_members_state_dict(self._writers, state_dict, "WriterEnsemble")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; on failure every writer is left as it was."""
        load_members_state_dict(self._writers, state_dict, "WriterEnsemble")

    def dumps(self, path: Any) -> None:
        """Write each writer's checkpoint into ``path/<i>``."""
        dump_members(self._writers, Path(path), "WriterEnsemble")

    def prepare_load(self, path: Any) -> Any:
        """Read and check every writer's checkpoint; return a function installing them."""
        return prepare_members(self._writers, Path(path), "WriterEnsemble")

    def __repr__(self) -> str:
        writers = textwrap.indent(f"writers=({', '.join(map(repr, self._writers))})", " " * 4)
        return f"{type(self).__name__}(\n{writers})"
