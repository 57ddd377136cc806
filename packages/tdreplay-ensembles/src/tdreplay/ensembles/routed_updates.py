"""Conditional updates of a :class:`~tdreplay.ensembles.ReplayBufferEnsemble` (TorchRL
0.14.1's): ``update_if_present`` and ``submit_update_if_present`` send each handle (what a
routed ``extend`` returns, or a sample carries) to its member's ``update_if_present``.
"""

from __future__ import annotations

import functools
from concurrent.futures import Future
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDictBase

from tdreplay.core import ConditionalUpdateResult, ReplayBuffer
from tdreplay.core.utils import check_flag, patch_entries

from .routing import ensemble_handles, is_integer_tensor, member_groups

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["RoutedUpdatesMixin"]


#: one member's part of a routed update: ``(member, rows, update_if_present keyword arguments)``
_Part = tuple[int, torch.Tensor, dict[str, Any]]


@dataclass(frozen=True)
class _UpdatePlan:
    """A checked routed conditional update: its handles' shape and each member's part
    (``(member, rows, update_if_present keyword arguments)``)."""

    shape: torch.Size
    device: torch.device
    versioned: bool
    parts: list[_Part]


class RoutedUpdatesMixin:
    """``update_if_present`` and ``submit_update_if_present`` of
    :class:`~tdreplay.ensembles.ReplayBufferEnsemble` (mixed in before
    :class:`~tdreplay.core.ReplayBuffer`, whose ones refuse an ensemble's storage)."""

    _rbs: tuple[ReplayBuffer, ...]
    _lock: AbstractContextManager[Any]

    if TYPE_CHECKING:  # what the ReplayBuffer this is mixed into provides
        @property
        def is_alive(self) -> bool: ...
        def submit_update(self, update: Callable[[], Any]) -> Future[Any]: ...

    def update_if_present(self, *, index: Any, generation: Any, patch: Any,
                          version_key: Any = None, version: Any = None,
                          require_newer: bool = False) -> ConditionalUpdateResult:
        """Patch the records that still hold what their handles saw, each through its member's
        ``update_if_present`` (as TorchRL's).

        ``index``: ensemble handles, a TensorDict with ``"buffer_ids"`` and ``"index"``, as a
        routed :meth:`extend` returns them or a sample carries them under ``"index"``;
        ``generation``: one per handle (``"index_generation"`` of either); ``patch``: a
        mapping (or TensorDict) of entries shaped ``buffer_ids.shape + entry shape``;
        ``version_key`` / ``version`` (a scalar, or one per handle) and ``require_newer`` as
        for :meth:`~tdreplay.core.ReplayBuffer.update_if_present`, applied member by member.

        Returns a :class:`~tdreplay.core.ConditionalUpdateResult` whose masks have the shape
        of ``index["buffer_ids"]``. Every member must hold TensorDicts in a storage that
        supports conditional updates and have a writer tracking generations
        (``RuntimeError`` naming the members that do not). The handles, the generations and
        the patch are checked, and each member's part checked against its stored data, before
        any member is patched, under the ensemble's lock: an error patches no member.

        Examples
        --------
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tdreplay.core import RoundRobinWriter, TensorDictReplayBuffer
        >>> from tdreplay.storages import LazyTensorStorage
        >>> from tdreplay.ensembles import ReplayBufferEnsemble
        >>> rb = ReplayBufferEnsemble(
        ...     *(TensorDictReplayBuffer(storage=LazyTensorStorage(2),
        ...                              writer=RoundRobinWriter(track_generations=True))
        ...       for _ in range(2)), routing_key="agent")
        >>> handles = rb.extend(TensorDict(obs=torch.zeros(3), agent=torch.tensor([0, 1, 0]),
        ...                                batch_size=[3]))
        >>> _ = rb.extend(TensorDict(obs=torch.ones(1), agent=torch.tensor([0]), batch_size=[1]))
        >>> result = rb.update_if_present(index=handles, generation=handles["index_generation"],
        ...                               patch={"obs": torch.full((3,), 7.0)})
        >>> result.updated.tolist()  # member 0's slot 0 was rewritten since
        [False, True, True]
        >>> rb[0][:]["obs"].tolist(), rb[1][:]["obs"].tolist()
        ([1.0, 7.0], [7.0])
        """
        plan = self._plan_update(index, generation, patch, version_key, version, require_newer)
        return self._run_update(plan)

    def submit_update_if_present(self, *, index: Any, generation: Any, patch: Any,
                                 version_key: Any = None, version: Any = None,
                                 require_newer: bool = False
                                 ) -> Future[ConditionalUpdateResult]:
        """:meth:`update_if_present` on the ensemble's update thread: a future of its result.

        Checked now as :meth:`update_if_present` checks (a bad argument raises here and
        nothing is queued), then run in submission order with the ensemble's other submitted
        updates, as :meth:`~tdreplay.core.ReplayBuffer.submit_update_if_present` runs them. A
        batch the *ensemble* draws after this call waits for the update; a member buffer's own
        ``sample`` does not (``rb.synchronize()`` waits for every submitted update).

        Examples
        --------
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tdreplay.core import RoundRobinWriter, TensorDictReplayBuffer
        >>> from tdreplay.storages import LazyTensorStorage
        >>> from tdreplay.ensembles import ReplayBufferEnsemble
        >>> rb = ReplayBufferEnsemble(
        ...     *(TensorDictReplayBuffer(storage=LazyTensorStorage(2),
        ...                              writer=RoundRobinWriter(track_generations=True))
        ...       for _ in range(2)), routing_dim=0)
        >>> handles = rb.extend(TensorDict(obs=torch.zeros(2, 1), batch_size=[2, 1]))
        >>> future = rb.submit_update_if_present(
        ...     index=handles, generation=handles["index_generation"],
        ...     patch={"obs": torch.tensor([3.0, 4.0])})
        >>> future.result().updated.tolist(), rb[1][:]["obs"].tolist()
        ([True, True], [4.0])
        >>> rb.shutdown()
        """
        plan = self._plan_update(index, generation, patch, version_key, version, require_newer)
        if not self.is_alive:
            raise RuntimeError("A shut down replay buffer cannot accept updates "
                               "(submit_update_if_present after shutdown()).")
        with self._lock:
            self._check_update(plan.parts)
        return self.submit_update(functools.partial(self._run_update, plan))

    def _plan_update(self, index: Any, generation: Any, patch: Any, version_key: Any,
                     version: Any, require_newer: bool) -> _UpdatePlan:
        """The arguments checked (except against the stored data) and split among members."""
        lacking = [f"{i} ({type(rb.storage).__name__} with {type(rb.writer).__name__})"
                   for i, rb in enumerate(self._rbs)
                   if not rb.storage.supports_conditional_update
                   or not rb.writer.tracks_generations]
        if lacking:
            raise RuntimeError(
                "conditional updates of a ReplayBufferEnsemble need every member's storage to "
                "hold TensorDicts (e.g. LazyTensorStorage) and its writer to track generations "
                "(e.g. TensorDictRoundRobinWriter(track_generations=True)); members "
                f"{', '.join(lacking)} do not.")
        check_flag(require_newer, "require_newer")
        if (version_key is None) != (version is None):
            raise ValueError("version_key and version must be passed together.")
        ids, slots = ensemble_handles(index, len(self._rbs))
        shape, records = ids.shape, ids.numel()
        flat_slots = slots.reshape(records, *slots.shape[ids.ndim:])
        stamps = torch.as_tensor(generation)
        if not is_integer_tensor(stamps):
            raise TypeError(f"generation must hold integer generations, got dtype "
                            f"{stamps.dtype}.")
        if stamps.numel() != records:
            raise ValueError(f"generation must hold one generation per handle ({records}, the "
                             f"shape of index['buffer_ids'] {tuple(shape)}), got "
                             f"{stamps.numel()}.")
        stamps = stamps.reshape(records).to(torch.long)
        if isinstance(patch, TensorDictBase) and patch.batch_size != shape:
            raise ValueError(f"patch has batch size {list(patch.batch_size)}; a TensorDict patch "
                             f"must have the shape of index['buffer_ids'], {list(shape)}.")
        values = {}
        for key, value in patch_entries(patch):
            if not isinstance(value, torch.Tensor):
                raise ValueError(f"patch[{key!r}] must be a tensor, got {type(value).__name__}.")
            if value.shape[:len(shape)] != shape:
                raise ValueError(f"patch[{key!r}] has shape {tuple(value.shape)}; it must start "
                                 f"with the shape of index['buffer_ids'], {tuple(shape)}.")
            values[key] = value.reshape(records, *value.shape[len(shape):])
        versions = None
        if isinstance(version, torch.Tensor) and version.numel() > 1:
            if version.shape[:len(shape)] != shape:
                raise ValueError(f"version must be a scalar or start with the shape of "
                                 f"index['buffer_ids'], {tuple(shape)}; got "
                                 f"{tuple(version.shape)}.")
            versions = version.reshape(records, *version.shape[len(shape):])
        parts = []
        for member, rows in member_groups(ids.reshape(-1), len(self._rbs)):
            parts.append((member, rows, {
                "index": flat_slots[rows.to(flat_slots.device)],
                "generation": stamps[rows.to(stamps.device)],
                "patch": {k: v[rows.to(v.device)] for k, v in values.items()},
                "version_key": version_key,
                "version": version if versions is None else versions[rows.to(versions.device)],
                "require_newer": require_newer,
            }))
        return _UpdatePlan(shape, ids.device, version_key is not None, parts)

    def _check_update(self, parts: list[_Part]) -> None:
        """Check these members' parts against their stored data, writing nothing (the
        ensemble's lock held): a handle of generation ``-1`` is never live, so each member
        checks the whole part, then skips every record."""
        for member, _, kwargs in parts:
            self._rbs[member].update_if_present(
                **{**kwargs, "generation": torch.full_like(kwargs["generation"], -1)})

    def _run_update(self, plan: _UpdatePlan) -> ConditionalUpdateResult:
        records = plan.shape.numel()
        updated = torch.zeros(records, dtype=torch.bool)
        rejected = torch.zeros(records, dtype=torch.bool) if plan.versioned else None
        with self._lock:
            # the first member's update checks its part before it writes anything: only the
            # later ones need checking first (none for an update of one member)
            self._check_update(plan.parts[1:])
            for member, rows, kwargs in plan.parts:
                result = self._rbs[member].update_if_present(**kwargs)
                updated[rows] = result.updated.reshape(-1).cpu()
                if rejected is not None and result.version_rejected is not None:
                    rejected[rows] = result.version_rejected.reshape(-1).cpu()
        return ConditionalUpdateResult(
            updated.reshape(plan.shape).to(plan.device),
            None if rejected is None else rejected.reshape(plan.shape).to(plan.device))

