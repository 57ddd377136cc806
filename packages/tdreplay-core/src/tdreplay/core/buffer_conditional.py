"""Conditional updates of stored rows: ``rb.update_if_present`` (as TorchRL's).

:class:`ConditionalUpdateMixin` is one of the rooms :class:`~tdreplay.core.ReplayBuffer` is
built from. Round-robin writers recycle rows, so an index captured at sampling time may point
at another record by the time an asynchronous computation writes back; ``update_if_present``
patches only the rows whose write generation (:mod:`tdreplay.core.generations`) is still the
one captured with the index, and leaves the others untouched.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase, is_tensor_collection, unravel_key

from .sampler import Sampler
from .storage import Storage
from .utils import check_instance, patch_entries
from .writer import Writer

__all__ = ["ConditionalUpdateMixin", "ConditionalUpdateResult"]


@dataclass(frozen=True)
class ConditionalUpdateResult:
    """What :meth:`ConditionalUpdateMixin.update_if_present` did, record by record.

    ``updated``: bool tensor in the order of the indices passed, True where the record was
    live and got the patch. ``version_rejected``: with ``version_key`` only (else ``None``),
    True where the record was live but lost the version comparison. Every record is in exactly
    one of updated / version_rejected / stale.
    """

    updated: torch.Tensor
    version_rejected: torch.Tensor | None = None

    @property
    def updated_count(self) -> int:
        """Records that were live and patched."""
        return int(self.updated.sum())

    @property
    def version_rejected_count(self) -> int:
        """Records that were live but lost the version comparison."""
        return 0 if self.version_rejected is None else int(self.version_rejected.sum())

    @property
    def stale_count(self) -> int:
        """Records whose row was rewritten or emptied since the handle was taken."""
        return self.updated.numel() - self.updated_count - self.version_rejected_count


def _as_patch(patch: Any) -> dict[Any, torch.Tensor]:
    """``patch`` (a mapping or TensorDict of tensors) as ``{unravelled key: tensor}``."""
    out = {}
    for key, value in patch_entries(patch):
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"patch[{key!r}] must be a tensor, got {type(value).__name__}.")
        out[unravel_key(key)] = value
    return out


def _check_patch(patch: dict[Any, torch.Tensor], probe: TensorDictBase,
                 slots_shape: torch.Size) -> dict[Any, torch.Tensor]:
    """Check every entry against the stored leaf (``probe``: one stored item, batch [1]);
    return the entries reshaped to ``[records, *feature]``. ``KeyError`` for a key the
    storage lacks, ``ValueError`` for a shape or dtype that does not fit; nothing written."""
    records = slots_shape.numel()
    out = {}
    for key, value in patch.items():
        leaf = probe.get(key, None)
        if leaf is None or not isinstance(leaf, torch.Tensor):
            raise KeyError(f"patch key {key!r} is not an entry of the stored data (keys: "
                           f"{sorted(str(k) for k in probe.keys(True, True))}).")
        feature = leaf.shape[1:]
        if value.shape != slots_shape + feature:
            raise ValueError(f"patch[{key!r}] has shape {tuple(value.shape)}; the index "
                             f"addresses {tuple(slots_shape)} records of entry shape "
                             f"{tuple(feature)}, so it must be {tuple(slots_shape + feature)}.")
        if value.dtype != leaf.dtype:
            raise ValueError(f"patch[{key!r}] has dtype {value.dtype}; the stored entry is "
                             f"{leaf.dtype}.")
        out[key] = value.reshape((records, *feature))
    return out


def _version_entry(version_key: Any, version: Any, patch: dict[Any, torch.Tensor],
                   probe: TensorDictBase, records: int) -> tuple[Any, torch.Tensor]:
    """The checked version key and one incoming version per record (``ValueError`` /
    ``KeyError`` naming the argument)."""
    if isinstance(version_key, str) and "." in version_key:
        raise ValueError(f"Dotted-string version keys are not supported: got version_key "
                         f"{version_key!r}; pass the nested key as a tuple, e.g. "
                         f"{tuple(version_key.split('.'))!r}.")
    key = unravel_key(version_key)
    if key in patch:
        raise ValueError(f"version_key {key!r} may not appear in patch: it is written with "
                         "the accepted version.")
    leaf = probe.get(key, None)
    if leaf is None or not isinstance(leaf, torch.Tensor):
        raise KeyError(f"version_key {key!r} is not an entry of the stored data.")
    if any(d != 1 for d in leaf.shape[1:]):
        raise ValueError(f"version_key {key!r} must name a per-record scalar entry; the "
                         f"storage holds entry shape {tuple(leaf.shape[1:])}.")
    incoming = (torch.as_tensor(version, dtype=leaf.dtype) if not isinstance(version, torch.Tensor)
                else version)
    if incoming.dtype != leaf.dtype:
        raise ValueError(f"version has dtype {incoming.dtype}; the stored {key!r} is "
                         f"{leaf.dtype}.")
    while incoming.ndim > 1 and incoming.shape[-1] == 1:
        incoming = incoming.squeeze(-1)
    if incoming.ndim == 0:
        incoming = incoming.expand(records)
    elif incoming.ndim != 1 or incoming.numel() != records:
        raise ValueError(f"version must be a scalar or hold one entry per record, got shape "
                         f"{tuple(torch.as_tensor(version).shape)} for {records} records.")
    return key, incoming.reshape(records)


def _keep_best_per_slot(slots: torch.Tensor, incoming: torch.Tensor) -> torch.Tensor:
    """Mask of the rows that carry the highest incoming version of their slot (the last such
    row on ties): one write per slot, whatever the input order."""
    uniq, ids = torch.unique(slots, return_inverse=True)
    if uniq.numel() == ids.numel():
        return torch.ones_like(slots, dtype=torch.bool)
    best = torch.full((uniq.numel(),), 0, dtype=incoming.dtype)
    best = best.scatter_reduce(0, ids, incoming, "amax", include_self=False)
    is_max = incoming == best[ids]
    row = torch.arange(ids.numel())
    last = torch.full((uniq.numel(),), -1, dtype=torch.long)
    last = last.scatter_reduce(0, ids, torch.where(is_max, row, -1), "amax")
    return row == last[ids]


class ConditionalUpdateMixin:
    """``update_if_present`` (mixed into :class:`~tdreplay.core.ReplayBuffer`)."""

    _storage: Storage
    _sampler: Sampler
    _writer: Writer
    _lock: AbstractContextManager[Any]

    def update_if_present(self, *, index: Any, generation: Any, patch: Any,
                          version_key: Any = None, version: Any = None,
                          require_newer: bool = False) -> ConditionalUpdateResult:
        """Patch the stored records that still hold what ``(index, generation)`` saw.

        ``index``: slots, as ``extend`` returns them or a sample carries under ``"index"``;
        ``generation``: their write generations, as a sample carries under
        ``"index_generation"`` (or ``rb.writer.generations_of(index)``); ``patch``: a mapping
        (or TensorDict) of entries to overwrite, each shaped ``index.shape + entry shape``.
        A record whose row was rewritten or emptied since is skipped and never modified; a
        patched record keeps its generation (the handle keeps working).

        With ``version_key`` and ``version`` (a scalar, or one per record), a live record is
        patched only when ``version >= stored`` (``> stored`` with ``require_newer``), and the
        accepted version is written into ``version_key`` with the patch; of several handles on
        one slot only the one with the highest version applies.

        The whole patch is checked before anything is written (``KeyError`` for a key the
        storage lacks, ``ValueError`` for a shape or dtype that does not fit or a bad
        version). Needs a storage of TensorDicts (``Storage.supports_conditional_update``) and
        a writer built with ``track_generations=True``; ``RuntimeError`` otherwise. Runs
        under the buffer's lock.

        Examples
        --------
        (needs ``tdreplay-storages`` and ``tdreplay-writers``; the writers guide runs it):

        >>> from tensordict import TensorDict
        >>> from tdreplay.storages import LazyTensorStorage  # doctest: +SKIP
        >>> from tdreplay.writers import TensorDictRoundRobinWriter  # doctest: +SKIP
        >>> writer = TensorDictRoundRobinWriter(track_generations=True)  # doctest: +SKIP
        >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4),  # doctest: +SKIP
        ...                             writer=writer)
        >>> index = rb.extend(TensorDict({"x": torch.zeros(4)}, [4]))  # doctest: +SKIP
        >>> handle = rb.writer.generations_of(index)  # doctest: +SKIP
        >>> _ = rb.extend(TensorDict({"x": -torch.ones(1)}, [1]))  # doctest: +SKIP
        >>> result = rb.update_if_present(index=index, generation=handle,  # doctest: +SKIP
        ...                               patch={"x": torch.full((4,), 7.0)})
        >>> result.updated.tolist(), result.stale_count  # doctest: +SKIP
        ([False, True, True, True], 1)
        >>> rb[:]["x"].tolist()  # row 0 was rewritten: left as it is  # doctest: +SKIP
        [-1.0, 7.0, 7.0, 7.0]
        """
        storage, writer = self._storage, self._writer
        if not storage.supports_conditional_update or not writer.tracks_generations:
            raise RuntimeError(
                f"conditional updates are not supported by {type(storage).__name__} with "
                f"{type(writer).__name__}: the storage must hold TensorDicts (e.g. "
                "LazyTensorStorage) and the writer must track generations (e.g. "
                "TensorDictRoundRobinWriter(track_generations=True)).")
        check_instance(require_newer, bool, "require_newer")
        if isinstance(index, tuple):
            index = index[0]
        slots = torch.as_tensor(index, dtype=torch.long)
        captured = torch.as_tensor(generation, dtype=torch.long).reshape(-1).cpu()
        records = slots.numel()
        if captured.numel() != records:
            raise ValueError(f"index and generation must address the same records, got "
                             f"{records} indices and {captured.numel()} generations.")
        if (version_key is None) != (version is None):
            raise ValueError("version_key and version must be passed together.")
        entries = _as_patch(patch)
        flat = slots.reshape(-1).cpu()
        with self._lock:
            if not len(storage):
                return ConditionalUpdateResult(
                    torch.zeros(records, dtype=torch.bool),
                    None if version_key is None else torch.zeros(records, dtype=torch.bool))
            probe = storage.get(torch.zeros(1, dtype=torch.long))
            if not is_tensor_collection(probe):
                raise RuntimeError(f"conditional updates need a storage of TensorDicts; "
                                   f"{type(storage).__name__} holds {type(probe).__name__}.")
            values = _check_patch(entries, probe, slots.shape)
            live = (writer.generations_of(flat).cpu() == captured) & (captured >= 0)
            live &= storage.valid_slots_mask(flat).cpu()
            rejected = None
            if version_key is not None:
                key, incoming = _version_entry(version_key, version, entries, probe, records)
                rejected = torch.zeros(records, dtype=torch.bool)
                if live.any():
                    stored = storage.get(flat[live]).get(key).reshape(-1).cpu()
                    new = incoming[live].cpu()
                    ok = new > stored if require_newer else new >= stored
                    ok &= _keep_best_per_slot(flat[live], new)
                    rejected[live] = ~ok
                    live[live.clone()] = ok
                feature = probe.get(key).shape[1:]
                values[key] = incoming.reshape((records, *feature))
            if live.any():
                self._write_patch(flat[live], {k: v[live.to(v.device)] for k, v in
                                               values.items()})
        return ConditionalUpdateResult(live, rejected)

    def _write_patch(self, slots: torch.Tensor, values: dict[Any, torch.Tensor]) -> None:
        """Write checked entries at ``slots`` (lock held) and tell the sampler."""
        storage = self._storage
        shape = storage.shape
        if storage.ndim > 1 and shape is not None:
            where: Any = torch.unravel_index(slots, tuple(shape))
        else:
            where = slots
        for key, value in values.items():
            storage.set_key(key, value, where)
        self._sampler.mark_edited(list(values))
