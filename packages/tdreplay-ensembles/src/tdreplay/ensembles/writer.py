"""``WriterEnsemble``: the writers of several buffers, kept together, never written through."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase

from tdreplay.core import Storage, Writer
from tdreplay.core.utils import check_flag

from ._members import (
    MembersShareable,
    check_members_state_dict,
    dump_members,
    load_members_state_dict,
    members_state_dict,
    prepare_members,
    select_members,
)
from .routing import ensemble_handles
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

    @property
    def tracks_generations(self) -> bool:  # type: ignore[override]
        """Whether every writer tracks write generations: then an ensemble sample carries
        ``"index_generation"`` and a routed ``extend`` returns it (as TorchRL's)."""
        return all(writer.tracks_generations for writer in self._writers)

    @property
    def info_keys(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("index_generation",) if self.tracks_generations else ()

    def generations_of(self, index: Any) -> torch.Tensor:
        """The write generation of each handle of ``index``, a TensorDict of ensemble handles
        (``"buffer_ids"`` and member-local ``"index"``: what a routed ``extend`` returns, or
        ``sample["index"]``), from its member's writer: int64, shaped like ``"buffer_ids"``
        (``-1`` from a writer that does not track generations).

        Examples
        --------
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tdreplay.core import ListStorage, RoundRobinWriter
        >>> w0, w1 = (RoundRobinWriter(track_generations=True) for _ in range(2))
        >>> for w in (w0, w1):
        ...     w.register_storage(ListStorage(2))
        >>> _ = w1.extend([1, 2, 3])
        >>> handles = TensorDict(buffer_ids=torch.tensor([1, 1]), index=torch.tensor([0, 1]))
        >>> WriterEnsemble(w0, w1).generations_of(handles).tolist()
        [1, 0]
        """
        ids, slots = ensemble_handles(index, len(self._writers))
        flat_ids = ids.reshape(-1).cpu()
        flat_slots = slots.reshape(flat_ids.numel(), *slots.shape[ids.ndim:])
        out = torch.full((flat_ids.numel(),), -1, dtype=torch.long)
        for member in flat_ids.unique().tolist():
            rows = (flat_ids == member).nonzero().reshape(-1)
            stamps = self._writers[member].generations_of(flat_slots[rows.to(flat_slots.device)])
            out[rows] = stamps.reshape(rows.numel(), -1)[:, 0].cpu()
        return out.reshape(ids.shape).to(ids.device)

    def sample_info(self, index: Any) -> dict[str, Any]:
        """``{"index_generation": generations_of(index)}`` when every writer tracks
        generations (a list, one per part, for an index of parts of different shapes)."""
        if not self.tracks_generations:
            return {}
        if isinstance(index, TensorDictBase):
            return {"index_generation": self.generations_of(index)}
        return {"index_generation": [self.generations_of(part) for part in index]}

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

    def check_empty(self) -> None:
        """Every writer's :meth:`~tdreplay.core.Writer.check_empty` (before any is emptied)."""
        for writer in self._writers:
            writer.check_empty()

    def empty(self, empty_write_count: bool = True) -> None:
        check_flag(empty_write_count, "empty_write_count")  # (before any writer is emptied)
        self.check_empty()
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
