"""The reads of a :class:`~tdreplay.ensembles.ReplayBufferEnsemble` that join its members'
parts (``rb[:, idx]``, :meth:`~EnsembleReadsMixin.read_all_in_order`) and the sampler's info
written into a joined sample (:meth:`~EnsembleReadsMixin.attach_info`: the ensemble index is a
TensorDict of ``buffer_ids`` and member indices).
"""

from __future__ import annotations

import warnings
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDictBase, is_tensor_collection

from tdreplay.core import ListStorage, ReplayBuffer, TensorDictReplayBuffer

if TYPE_CHECKING:
    from collections.abc import Callable

    from tdreplay.core import Compose

    from .storage import StorageEnsemble

__all__ = ["EnsembleReadsMixin"]

_TD_INFO_WRITER: list[TensorDictReplayBuffer] = []


def _td_info_writer() -> TensorDictReplayBuffer:
    """A TensorDictReplayBuffer whose ``attach_info`` writes a sampler's per-item info into a
    TensorDict part as TensorDict buffers do (it reads only its arguments), made once."""
    if not _TD_INFO_WRITER:
        _TD_INFO_WRITER.append(TensorDictReplayBuffer(storage=ListStorage(1)))
    return _TD_INFO_WRITER[0]


class EnsembleReadsMixin:
    """Joined reads and the info of joined samples, mixed into
    :class:`~tdreplay.ensembles.ReplayBufferEnsemble` before
    :class:`~tdreplay.core.ReplayBuffer`."""

    _rbs: tuple[ReplayBuffer, ...]
    _lock: AbstractContextManager[Any]
    _storage_ensemble: StorageEnsemble
    _transform: Compose
    _collate_fn: Callable[[Any], Any]
    if TYPE_CHECKING:  # what the ReplayBuffer this is mixed into provides
        def __getitem__(self, index: Any) -> Any: ...

    def _read_joined(self, positions: list[int], index: Any) -> Any:
        """``index`` of the buffers at ``positions``, each part collated and transformed by its
        buffer, joined, then transformed by the ensemble."""
        with self._lock:
            parts = [(i, self._storage_ensemble.storages[i][index]) for i in positions]
        data = self._collate_fn(parts)
        if len(self._transform):
            data = self._transform(data)
        return data

    def read_all_in_order(self, end: int | None = None) -> Any:
        """Every buffer's contents in physical order (``rb[:, :end]``), joined."""
        return self[slice(None), slice(None, end)]

    def attach_info(self, data: Any, info: dict[str, Any], only_missing: bool = False) -> Any:
        index = info.get("index")
        if is_tensor_collection(data):
            return self._attach_to(data, index, info, only_missing)
        if isinstance(data, list) and index is not None:
            # parts kept apart by collate_fn: each part gets its own slice of the index and info
            part_indices = list(index.unbind(0)) if is_tensor_collection(index) else list(index)
            if len(part_indices) == len(data):
                return [self._attach_to(part, part_indices[j],
                                        {k: v[j] for k, v in info.items() if k != "index"},
                                        only_missing)
                        for j, part in enumerate(data)]
        return data

    def _attach_to(self, data: Any, index: Any, info: dict[str, Any],
                   only_missing: bool = False) -> Any:
        if not is_tensor_collection(data):
            return data
        if isinstance(index, TensorDictBase):
            index, info = _joined_like(data.batch_size, index, info)
        # the sampler's tensor entries (priority_weight, ...) go in as TensorDictReplayBuffer
        # writes them; the ensemble index (a TensorDict) is written below
        data = _td_info_writer().attach_info(data, info, only_missing)
        if not isinstance(index, TensorDictBase):
            return data
        if only_missing and data.get("index", None) is not None:
            return data
        batch = data.batch_size
        if batch[: index.batch_dims] != index.batch_size:
            warnings.warn(f"the ensemble's collate_fn made a sample of batch size "
                          f"{tuple(batch)}, which does not line up with its index of batch size "
                          f"{tuple(index.batch_size)} (parts, items): 'index' is only in the "
                          "info dict (sample(return_info=True)).", stacklevel=5)
            return data
        if index.batch_size == batch:
            index = index.copy()  # its own TensorDict over the same tensors; expand costs ~10x
        else:
            while index.batch_dims < len(batch):
                index = index.unsqueeze(-1)
            index = index.expand(batch)
        if data.is_locked:
            data = data.unlock_()
        data.set("index", index)
        return data


def _joined_like(batch: torch.Size, index: TensorDictBase, info: dict[str, Any]
                 ) -> tuple[TensorDictBase, dict[str, Any]]:
    """``index`` and ``info`` with their parts dim merged into the items dim when the
    ensemble's ``collate_fn`` joined the parts that way (``torch.cat``: a sample of batch size
    ``[parts * items, ...]``); as they are otherwise."""
    if index.batch_dims < 2 or batch[: index.batch_dims] == index.batch_size:
        return index, info
    flat = index.flatten(0, 1)
    if batch[: flat.batch_dims] != flat.batch_size:
        return index, info
    lead = index.batch_size[:2]
    return flat, {key: value.flatten(0, 1) if isinstance(value, torch.Tensor)
                  and value.shape[:2] == lead else value for key, value in info.items()}
