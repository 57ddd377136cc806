"""``update_if_present`` of the served buffers (``ReplayBuffer.update_if_present`` run
where the buffer lives): :class:`RemoteConditionalUpdateMixin` for ``RayReplayBuffer`` (one
actor call checks and patches; ``submit_update_if_present`` queues the update on the actor's
buffer and returns a :class:`RemoteUpdateFuture`), :class:`ShardedConditionalUpdateMixin` for
``ShardedReplayBuffer`` (global slots, each shard patching its own records, the results merged
back in the order of the records)."""

from __future__ import annotations

from concurrent.futures import Future, InvalidStateError
from typing import Any, TypeVar

import numpy as np
import torch

from tdreplay.core import ConditionalUpdateResult
from tdreplay.core.utils import check_flag, patch_entries

from ._ray import call_error
from ._shard_calls import ShardCalls
from ._sharding import split_slots
from ._wire import pack, unpack
from .client import ActorClient
from .errors import RemoteCallTimeoutError

__all__ = ["RemoteConditionalUpdateMixin", "RemoteUpdateFuture", "ShardedConditionalUpdateMixin"]

T = TypeVar("T")


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


class RemoteUpdateFuture(Future[T]):
    """A ``concurrent.futures.Future`` of an update running in a buffer actor.

    Settled by the actor's answer: its result (a copy owned by the caller), or the error the
    update raised, as its own type (:class:`~tdreplay.distributed.BufferActorDiedError` if the
    actor died). :meth:`result` and :meth:`exception` wait at most the buffer's
    ``call_timeout`` by default (``timeout`` overrides it), then raise
    :class:`~tdreplay.distributed.RemoteCallTimeoutError` (a ``TimeoutError``): the update may
    still run. It cannot be cancelled: the update is queued in the actor already.
    """

    def __init__(self, call_timeout: float | None, what: str, label: str) -> None:
        super().__init__()
        self.set_running_or_notify_cancel()  # (queued remotely: cancel() returns False)
        self._call_timeout = call_timeout
        self._what = what
        self._label = label

    def settle_with(self, ray_future: Future[Any]) -> None:
        """Settle when ``ray_future`` (``ObjectRef.future()`` of the actor's answer, a
        :class:`~._wire.Packed` result) does, its Ray errors translated as a call's."""
        def settle(done: Future[Any]) -> None:
            try:
                err = done.exception()
                if err is None:
                    self.set_result(unpack(done.result(), copy=True))
                else:
                    self.set_exception(call_error(err, self._what, self._label))
            except InvalidStateError:  # (settled already)
                pass
            except BaseException as unpack_error:  # noqa: BLE001 - reaches the caller
                self.set_exception(unpack_error)
        ray_future.add_done_callback(settle)

    def _limit(self, timeout: float | None) -> float | None:
        return self._call_timeout if timeout is None else timeout

    def _timed_out(self, limit: float | None) -> RemoteCallTimeoutError:
        return RemoteCallTimeoutError(
            f"{self._what} on buffer actor {self._label} got no answer within {limit} s: the "
            "actor is busy, hung or unreachable; the update may still be applied later.",
            actor=self._label)

    def result(self, timeout: float | None = None) -> T:
        """The update's result, waiting at most ``timeout`` s (default ``call_timeout``)."""
        limit = self._limit(timeout)
        try:
            return super().result(limit)
        except TimeoutError:
            if self.done():  # the update's own error
                raise
            raise self._timed_out(limit) from None

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The update's error (``None`` if it succeeded), waiting as :meth:`result`."""
        limit = self._limit(timeout)
        try:
            return super().exception(limit)
        except TimeoutError:
            raise self._timed_out(limit) from None


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
        require_newer = check_flag(require_newer, "require_newer")  # (nothing sent otherwise)
        kwargs = {"index": index, "generation": generation, "patch": patch,
                  "version_key": version_key, "version": version, "require_newer": require_newer}
        return unpack(self._client.call("update_if_present", pack(kwargs)))

    def submit_update_if_present(self, *, index: Any, generation: Any, patch: Any,
                                 version_key: Any = None, version: Any = None,
                                 require_newer: bool = False
                                 ) -> RemoteUpdateFuture[ConditionalUpdateResult]:
        """:meth:`update_if_present` queued on the actor's buffer, as that buffer's
        :meth:`~tdreplay.core.ReplayBuffer.submit_update_if_present`: a future of its
        ``ConditionalUpdateResult`` (a :class:`RemoteUpdateFuture`).

        The actor checks the arguments against the stored data before this returns: a bad one
        raises here, as its own type, and nothing is queued. The update then runs on the
        actor buffer's update worker, in submission order; batches any client draws after
        this returns wait for it and see it, and :meth:`synchronize` waits for it. The
        arguments are copied to the actor: they may be changed once this returns.
        ``future.result()`` waits at most ``call_timeout`` by default.

        Examples
        --------
        >>> from functools import partial
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tdreplay.core import SamplerWithoutReplacement, TensorDictReplayBuffer
        >>> from tdreplay.distributed import RayReplayBuffer
        >>> from tdreplay.storages import LazyTensorStorage
        >>> from tdreplay.writers import TensorDictRoundRobinWriter
        >>> rb = RayReplayBuffer(storage=partial(LazyTensorStorage, 4),
        ...                      writer=partial(TensorDictRoundRobinWriter, track_generations=True),
        ...                      sampler=SamplerWithoutReplacement,
        ...                      replay_buffer_cls=TensorDictReplayBuffer, batch_size=4)
        >>> _ = rb.extend(TensorDict({"value": torch.zeros(4)}, [4]))
        >>> s = rb.sample()  # the 4 rows, each once
        >>> future = rb.submit_update_if_present(index=s["index"],
        ...                                      generation=s["index_generation"],
        ...                                      patch={"value": torch.ones(4)})
        >>> future.result().updated_count
        4
        >>> rb[:]["value"].tolist()
        [1.0, 1.0, 1.0, 1.0]
        >>> rb.close()
        """
        require_newer = check_flag(require_newer, "require_newer")  # (nothing sent otherwise)
        kwargs = {"index": index, "generation": generation, "patch": patch,
                  "version_key": version_key, "version": version, "require_newer": require_newer}
        client = self._client
        token = client.call("submit_update_if_present", pack(kwargs))
        future: RemoteUpdateFuture[ConditionalUpdateResult] = RemoteUpdateFuture(
            client.call_timeout, "submit_update_if_present", client.label)
        future.settle_with(client.submit("update_result", token, client.limit_timeout).future())
        return future


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
        require_newer = check_flag(require_newer, "require_newer")
        flat, shard = split_slots(index, self._offsets)
        records = flat.numel()
        captured = torch.as_tensor(generation, dtype=torch.long).reshape(-1)
        if captured.numel() != records:
            raise ValueError(f"index and generation must address the same records, got "
                             f"{records} indices and {captured.numel()} generations.")
        rows = _patch_rows(patch, torch.as_tensor(index).shape)
        if isinstance(version, (list, tuple, np.ndarray)):  # (one per record, as a tensor is)
            version = torch.as_tensor(version)
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
