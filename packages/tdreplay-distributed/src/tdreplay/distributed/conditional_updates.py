"""``update_if_present`` of the served buffers (``ReplayBuffer.update_if_present`` run
where the buffer lives): :class:`RemoteConditionalUpdateMixin` for ``RayReplayBuffer`` (one
actor call checks and patches), :class:`ShardedConditionalUpdateMixin` for
``ShardedReplayBuffer`` (global slots, each shard patching its own records, the results merged
back in the order of the records)."""

from __future__ import annotations

from typing import Any

import torch

from tdreplay.core import ConditionalUpdateResult
from tdreplay.core.utils import patch_entries

from ._shard_calls import ShardCalls
from ._sharding import split_slots
from ._wire import pack, unpack
from .client import ActorClient

__all__ = ["RemoteConditionalUpdateMixin", "ShardedConditionalUpdateMixin"]


def _patch_rows(patch: Any, index_shape: torch.Size) -> dict[Any, torch.Tensor]:
    """``patch`` (a mapping or TensorDict of entries shaped ``[*index_shape, *entry]``) as
    ``{key: tensor [records, *entry]}``; ``ValueError`` naming an entry of another shape."""
    out = {}
    lead = len(index_shape)
    for key, value in patch_entries(patch):
        if not isinstance(value, torch.Tensor) or value.shape[:lead] != index_shape:
            raise ValueError(f"patch[{key!r}] must be a tensor shaped like the index "
                             f"{tuple(index_shape)} followed by the entry's shape.")
        out[key] = value.reshape((index_shape.numel(), *value.shape[lead:]))
    return out


class RemoteConditionalUpdateMixin:
    """``update_if_present`` in the buffer actor (mixed into ``RayReplayBuffer``)."""

    _client: ActorClient

    def update_if_present(self, *, index: Any, generation: Any, patch: Any,
                          version_key: Any = None, version: Any = None,
                          require_newer: bool = False) -> ConditionalUpdateResult:
        """Patch the stored records that still hold what ``(index, generation)`` saw, in the
        actor (as :meth:`~tdreplay.core.ReplayBuffer.update_if_present`, of which it returns
        the ``ConditionalUpdateResult``).

        The remote buffer's writer must track generations (e.g.
        ``writer=partial(TensorDictRoundRobinWriter, track_generations=True)``): samples then
        carry ``"index_generation"``. The check and the patch run in one actor call, so no
        write lands between them.

        Examples
        --------
        >>> from functools import partial
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tdreplay.core import TensorDictReplayBuffer
        >>> from tdreplay.distributed import RayReplayBuffer
        >>> from tdreplay.storages import LazyTensorStorage
        >>> from tdreplay.writers import TensorDictRoundRobinWriter
        >>> rb = RayReplayBuffer(storage=partial(LazyTensorStorage, 4), batch_size=4,
        ...                      writer=partial(TensorDictRoundRobinWriter, track_generations=True),
        ...                      replay_buffer_cls=TensorDictReplayBuffer)
        >>> _ = rb.extend(TensorDict({"x": torch.zeros(4)}, [4]))
        >>> s = rb.sample()
        >>> _ = rb.extend(TensorDict({"x": -torch.ones(1)}, [1]))  # row 0 is rewritten
        >>> result = rb.update_if_present(index=s["index"], generation=s["index_generation"],
        ...                               patch={"x": torch.full((4,), 7.0)})
        >>> result.stale_count == int((s["index"] == 0).sum()), sorted(rb[:]["x"].tolist())[0]
        (True, -1.0)
        >>> rb.close()
        """
        kwargs = {"index": index, "generation": generation, "patch": patch,
                  "version_key": version_key, "version": version, "require_newer": require_newer}
        return unpack(self._client.call("update_if_present", pack(kwargs)))


class ShardedConditionalUpdateMixin:
    """``update_if_present`` over global slots (mixed into ``ShardedReplayBuffer``)."""

    _offsets: torch.Tensor
    _calls: ShardCalls
    _call_timeout: float | None

    def update_if_present(self, *, index: Any, generation: Any, patch: Any,
                          version_key: Any = None, version: Any = None,
                          require_newer: bool = False) -> ConditionalUpdateResult:
        """Patch the records at global slots ``index`` whose write generation is still
        ``generation`` (as :meth:`~tdreplay.core.ReplayBuffer.update_if_present`; samples of a
        sharded buffer carry global ``index`` and their shard's ``index_generation``).

        Every shard checks and patches its own records in one actor call. The shards are
        built alike, so a patch one refuses (a key it lacks, a shape or dtype that does not
        fit) every non-empty shard refuses; the error is raised.
        """
        flat, shard = split_slots(index, self._offsets)
        records = flat.numel()
        captured = torch.as_tensor(generation, dtype=torch.long).reshape(-1)
        if captured.numel() != records:
            raise ValueError(f"index and generation must address the same records, got "
                             f"{records} indices and {captured.numel()} generations.")
        rows = _patch_rows(patch, torch.as_tensor(index).shape)
        per_record = isinstance(version, torch.Tensor) and version.numel() == records > 1
        calls, masks = [], []
        for k in range(len(self._offsets) - 1):
            mask = shard == k
            if not bool(mask.any()):
                continue
            kwargs = {"index": flat[mask] - self._offsets[k], "generation": captured[mask],
                      "patch": {key: value[mask] for key, value in rows.items()},
                      "version_key": version_key,
                      "version": version.reshape(-1)[mask] if per_record else version,
                      "require_newer": require_newer}
            calls.append((k, "update_if_present", (pack(kwargs),)))
            masks.append(mask)
        updated = torch.zeros(records, dtype=torch.bool)
        rejected = None if version_key is None else torch.zeros(records, dtype=torch.bool)
        results = self._calls.strict(calls, "update_if_present", self._call_timeout)
        for mask, packed in zip(masks, results):
            result: ConditionalUpdateResult = unpack(packed)
            updated[mask] = result.updated.reshape(-1)
            if rejected is not None and result.version_rejected is not None:
                rejected[mask] = result.version_rejected.reshape(-1)
        return ConditionalUpdateResult(updated, rejected)
