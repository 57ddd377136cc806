"""``StorageEnsemble``: the storages of several buffers, read together, never written."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tdreplay.core import Compose, Storage, StorageCheckpointerBase, Transform
from tdreplay.core.transform import as_transform

from ._members import (
    MembersShareable,
    check_members_state_dict,
    dump_members,
    index_parts,
    load_members_state_dict,
    members_state_dict,
    prepare_members,
    select_members,
    select_one,
)


class StorageEnsembleCheckpointer(StorageCheckpointerBase):
    """Checkpointer of :class:`StorageEnsemble`: each storage saved by its own checkpointer.

    The directory holds ``ensemble.json`` (the member classes) and ``0/``, ``1/``, ... written
    by each storage's ``dumps``. Loading reads and checks every member before any changes.

    Examples
    --------
    >>> import tempfile
    >>> import torch
    >>> from tdreplay.core import ListStorage
    >>> ensemble = StorageEnsemble(ListStorage(4), ListStorage(4))
    >>> ensemble[0].set(torch.arange(2), ["a", "b"])
    >>> with tempfile.TemporaryDirectory() as d:
    ...     ensemble.dumps(d)
    ...     restored = StorageEnsemble(ListStorage(4), ListStorage(4))
    ...     restored.loads(d)
    >>> restored[0][:], len(restored[1])
    (['a', 'b'], 0)
    """

    def dumps(self, storage: StorageEnsemble, path: Path) -> None:
        dump_members(storage.storages, path, "StorageEnsemble")

    def prepare_load(self, storage: StorageEnsemble, path: Path) -> Callable[[], None]:
        return prepare_members(storage.storages, path, "StorageEnsemble")


def _as_compose(transform: Any, position: int) -> Compose | None:
    if transform is None or isinstance(transform, Compose):
        return transform
    if not isinstance(transform, Transform) and not callable(transform):
        raise TypeError(f"transforms[{position}] must be a Transform, a callable or None, got "
                        f"{type(transform).__name__}.")
    return Compose(as_transform(transform))


class StorageEnsemble(MembersShareable, Storage):
    """The storages of several buffers, read as one by a :class:`ReplayBufferEnsemble`.

    Parameters
    ----------
    *storages : Storage
        One storage per buffer.
    transforms : sequence of Transform, callable or None, optional
        The sample-side transform of each buffer (``None`` for none), one per storage. A
        transform that is not a :class:`~tdreplay.core.Compose` is wrapped in one.

    Notes
    -----
    - Writing is refused: extend one buffer of the ensemble instead (``rb[i].extend(...)``).
    - ``get(index)`` takes the index a :class:`SamplerEnsemble` draws (entries ``"index"``
      and ``"buffer_ids"``, one row per part) and returns ``[(buffer_id, data), ...]``, the
      raw items of each part. The buffer ensemble then collates each part with its buffer's
      ``collate_fn`` and runs that buffer's transform on it, so a transform sees a batch just
      as its own buffer would give it.
    - ``len(ensemble)`` is the number of storages, as in TorchRL; ``ensemble[i]`` is the i-th
      storage and ``ensemble[1:]`` a smaller ensemble.
    - ``max_size`` is the sum of the storages' capacities.
    - It is shareable between processes only if every storage is (``shareable``: a
      ``LazyMemmapStorage`` or ``LazyTensorStorage(shared_init=True)``, not a ``ListStorage``
      or a plain tensor storage); otherwise ``check_shareable()``, pickling it for a process
      being started and sharing a buffer holding it raise
      :class:`~tdreplay.core.NotShareableError` naming the storage (its position and class)
      and giving its own message. Each buffer of a :class:`ReplayBufferEnsemble` holds its
      own storage's process lock; the ensemble has none of its own.

    Examples
    --------
    >>> import torch
    >>> from tdreplay.core import ListStorage
    >>> from tensordict import TensorDict
    >>> ensemble = StorageEnsemble(ListStorage(10), ListStorage(10))
    >>> ensemble[1].set(torch.arange(3), ["a", "b", "c"])
    >>> index = TensorDict(index=torch.tensor([[2, 0]]), buffer_ids=torch.tensor([1]),
    ...                    batch_size=[1])
    >>> ensemble.get(index)
    [(1, ['c', 'a'])]
    >>> len(ensemble), ensemble.max_size
    (2, 20)
    >>> ensemble.shareable  # list storages keep their items in this process
    False
    """

    _default_checkpointer = StorageEnsembleCheckpointer

    def __init__(
        self,
        *storages: Storage,
        transforms: Sequence[Transform | Callable[[Any], Any] | None] | None = None,
    ) -> None:
        if not storages:
            raise ValueError("StorageEnsemble needs at least one storage.")
        for i, storage in enumerate(storages):
            if not isinstance(storage, Storage):
                raise TypeError(f"storages[{i}] must be a Storage instance, got "
                                f"{type(storage).__name__}.")
            if isinstance(storage, StorageEnsemble):
                raise TypeError(f"storages[{i}] is a StorageEnsemble: ensembles do not nest.")
        composed: list[Compose | None] | None = None
        if transforms is not None:
            if isinstance(transforms, (str, bytes)) or not isinstance(transforms, Sequence):
                raise TypeError(f"transforms must be a sequence with one entry per storage, got "
                                f"{type(transforms).__name__}.")
            if len(transforms) != len(storages):
                raise ValueError(f"transforms must have one entry per storage ({len(storages)}), "
                                 f"got {len(transforms)}.")
            composed = [_as_compose(t, i) for i, t in enumerate(transforms)]
        super().__init__(sum(storage.max_size for storage in storages))
        self._storages: tuple[Storage, ...] = tuple(storages)
        self._transforms: list[Compose | None] | None = composed

    @property
    def storages(self) -> tuple[Storage, ...]:
        """The storages, one per buffer."""
        return self._storages

    def _sharing_members(self) -> tuple[Storage, ...]:
        return self._storages

    @property
    def transforms(self) -> list[Compose | None] | None:
        """The sample-side transform of each buffer (``None`` when none was given)."""
        return self._transforms

    # ---- writing is refused ---------------------------------------------------------------------
    def set(self, cursor: Any, data: Any, *, set_cursor: bool = True) -> None:
        raise RuntimeError("a StorageEnsemble cannot be written to: write to one of its storages "
                           "(or extend one buffer of the ReplayBufferEnsemble, rb[i].extend(...)).")

    def __setitem__(self, index: Any, value: Any) -> None:
        self.set(index, value)

    # ---- reading --------------------------------------------------------------------------------
    def get(self, index: Any) -> list[tuple[int, Any]]:
        """Read each part of an ensemble index: ``[(buffer_id, items), ...]``.

        ``index`` is a TensorDict (or a list of TensorDicts, one per part) whose leading
        dimension runs over the parts; each part holds ``"index"`` (slots in its storage) and
        ``"buffer_ids"`` (its storage, one id or one per slot).
        """
        parts = index_parts(index, "StorageEnsemble.get expects the index a SamplerEnsemble draws: "
                                   "a TensorDict with 'index' and 'buffer_ids' entries, one row "
                                   "per part.")
        out = []
        for position, (ids, rows) in enumerate(parts):
            ids = ids.reshape(-1)
            if ids.numel() == 0 or bool((ids != ids[0]).any()):
                raise ValueError(f"part {position} of the index must come from one buffer, got "
                                 f"buffer_ids {ids.unique().tolist()}.")
            buffer_id = select_one(int(ids[0]), len(self._storages), "storages")
            out.append((buffer_id, self._storages[buffer_id].get(rows)))
        return out

    def __getitem__(self, index: Any) -> Any:
        """``ensemble[i]``: the i-th storage; ``ensemble[i, rows]``: ``ensemble[i][rows]``;
        a slice, sequence or 1-D tensor: a :class:`StorageEnsemble` of the selected storages."""
        if isinstance(index, tuple):
            if not index:
                return self
            selected = self[index[0]]
            if len(index) == 1:
                return selected
            rest = index[1] if len(index) == 2 else index[1:]
            if isinstance(selected, StorageEnsemble):
                return [storage[rest] for storage in selected.storages]
            return selected[rest]
        positions = select_members(index, len(self._storages), "storages")
        if isinstance(positions, int):
            return self._storages[positions]
        transforms = None if self._transforms is None else [self._transforms[i] for i in positions]
        return StorageEnsemble(*(self._storages[i] for i in positions), transforms=transforms)

    def __len__(self) -> int:
        """Number of storages."""
        return len(self._storages)

    @property
    def revision(self) -> int:
        """:attr:`~tdreplay.core.Storage.revision` of the ensemble: it changes whenever one of its
        storages changes (written through the ensemble or through its own buffer).

        Examples
        --------
        >>> from tdreplay.core import ListStorage
        >>> first, second = ListStorage(4), ListStorage(4)
        >>> ensemble = StorageEnsemble(first, second)
        >>> before = ensemble.revision
        >>> second.set(0, "x")
        >>> ensemble.revision != before
        True
        """
        return super().revision + sum(storage.revision for storage in self._storages)

    @property
    def restore_count(self) -> int:
        """Restores and empties of the ensemble and of its storages: a member emptied or
        restored through its own buffer (``rb[0].empty()``) moves it too, so the ensemble
        drops the batches it drew ahead of the rows that member no longer holds.

        Examples
        --------
        >>> from tdreplay.core import ListStorage
        >>> first, second = ListStorage(4), ListStorage(4)
        >>> ensemble = StorageEnsemble(first, second)
        >>> before = ensemble.restore_count
        >>> second.empty()
        >>> ensemble.restore_count != before
        True
        """
        return super().restore_count + sum(storage.restore_count for storage in self._storages)

    def empty(self) -> None:
        for storage in self._storages:
            storage.empty()

    # ---- state ----------------------------------------------------------------------------------
    saves_seam = False  # (each member storage keeps its own last_written_row)
    #: each member storage tells its own buffers of its resets, under their locks; the
    #: ensemble's buffer follows them from restore_count (its lock is its members' locks)
    tells_readers_of_resets = False

    def state_dict(self) -> dict[str, Any]:
        """``{"0": storages[0].state_dict(), ...}``."""
        return members_state_dict(self._storages)

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Raise ``ValueError`` unless ``state_dict`` has one entry per storage, each accepted
        by its storage's ``check_state_dict``; changes nothing."""
        check_members_state_dict(self._storages, state_dict, "StorageEnsemble")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; on failure every storage is left as it was."""
        load_members_state_dict(self._storages, state_dict, "StorageEnsemble")

    def register_save_hook(self, hook: Callable[[Any], Any]) -> None:
        """Register ``hook`` on every storage (it runs on each storage's contents)."""
        for storage in self._storages:
            storage.register_save_hook(hook)

    def register_load_hook(self, hook: Callable[[Any], Any]) -> None:
        """Register ``hook`` on every storage (it runs on each storage's contents)."""
        for storage in self._storages:
            storage.register_load_hook(hook)

    def __repr__(self) -> str:
        storages = textwrap.indent(f"storages=({', '.join(map(repr, self._storages))})", " " * 4)
        transforms = textwrap.indent(f"transforms={self._transforms}", " " * 4)
        return f"{type(self).__name__}(\n{storages},\n{transforms})"

