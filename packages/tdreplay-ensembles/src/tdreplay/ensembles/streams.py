"""Ending the streams of an ensemble's members: ``ReplayBufferEnsemble.end_streams`` (TorchRL's).

Each member holds one chronological stream of steps (one environment, one producer). When the
producers restart, the next steps they write must not be sampled as the continuation of the
last ones: :func:`end_streams` marks the newest step of each member as the end of its
trajectory, through the member's own ``update_if_present`` (so the write generations and the
write count do not change, and the member's slice sampler recomputes its trajectories).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase, is_tensor_collection

from tdreplay.core import ReplayBuffer, RoundRobinWriter
from tdreplay.core.utils import check_key

__all__ = ["StreamEndingMixin", "StreamEnds", "end_streams"]

#: one member's tail patch: ``(index, generation, patch)`` for ``update_if_present``
TailPatch = tuple[torch.Tensor, torch.Tensor, dict[Any, torch.Tensor]]


def _bool_entry(data: TensorDictBase, key: Any, name: str, member: int) -> torch.Tensor | None:
    value = data.get(key, None)
    if value is not None and (not isinstance(value, torch.Tensor) or value.dtype != torch.bool):
        raise TypeError(f"end_streams needs a boolean {name} {key!r}; member {member} stores "
                        f"{getattr(value, 'dtype', type(value).__name__)}.")
    return value


@dataclass(frozen=True)
class StreamEnds:
    """The entries ``end_streams`` reads and writes (checked by :meth:`of`), and the tail patch
    of one member (:meth:`tail_patch`).

    Examples
    --------
    >>> StreamEnds.of(("next", "done"), None, "truncated").truncated_key
    'truncated'
    >>> StreamEnds.of("done", "done", None)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: end_key, terminated_key and truncated_key must be distinct ...
    """

    end_key: Any
    terminated_key: Any
    truncated_key: Any

    @classmethod
    def of(cls, end_key: Any, terminated_key: Any, truncated_key: Any) -> StreamEnds:
        """The keys unravelled; ``TypeError`` for a malformed one, ``ValueError`` when two
        are the same entry."""
        ends = cls(check_key(end_key, "end_key"),
                   check_key(terminated_key, "terminated_key", optional=True),
                   check_key(truncated_key, "truncated_key", optional=True))
        keys = [k for k in (ends.end_key, ends.terminated_key, ends.truncated_key)
                if k is not None]
        if len(set(keys)) != len(keys):
            raise ValueError(f"end_key, terminated_key and truncated_key must be distinct "
                             f"entries, got {end_key!r}, {terminated_key!r} and "
                             f"{truncated_key!r}.")
        return ends

    def check_member(self, member: int, rb: ReplayBuffer) -> None:
        """``RuntimeError`` naming what member ``member`` lacks to have its stream ended."""
        storage, writer, sampler = rb.storage, rb.writer, rb.sampler
        lacks = []
        if storage.ndim != 1:
            lacks.append(f"a one-dimensional storage (it has ndim={storage.ndim})")
        if not storage.supports_conditional_update:
            lacks.append(f"a storage patched in place, e.g. LazyTensorStorage (it has "
                         f"{type(storage).__name__})")
        if not isinstance(writer, RoundRobinWriter) or not writer.tracks_generations:
            lacks.append(f"a round-robin writer built with track_generations=True (it has "
                         f"{writer!r})")
        end_keys = getattr(sampler, "end_keys", None) or (getattr(sampler, "end_key", None),)
        if self.end_key not in end_keys:
            lacks.append(f"a slice sampler reading end_key {self.end_key!r} (it has "
                         f"{type(sampler).__name__})")
        if lacks:
            raise RuntimeError(f"end_streams: member {member} needs " + "; ".join(lacks) + ".")

    def tail_patch(self, member: int, rb: ReplayBuffer) -> TailPatch | None:
        """The patch ending the stream of member ``member`` (checked with
        :meth:`check_member`; its lock held) at its newest step: ``None`` when it is empty.

        The end flag is set. The truncated flag, when stored, is also set unless the step
        already ended (end flag set) or terminated (a missing terminated entry reads False).
        ``KeyError`` when the end entry is not stored, ``TypeError`` when a flag is not
        boolean, ``RuntimeError`` when the member's steps carry several trajectory ids
        (restarted producers may reuse them, which a tail patch cannot separate)."""
        storage, writer = rb.storage, rb.writer
        written = len(storage)
        if not written:
            return None
        self._check_one_trajectory(member, rb)
        assert isinstance(writer, RoundRobinWriter)  # check_member
        index = torch.tensor([(writer.cursor - 1) % written])
        last = storage.get(index)
        done = _bool_entry(last, self.end_key, "end_key", member)
        if done is None:
            raise KeyError(f"end_streams: member {member} stores no end_key entry "
                           f"{self.end_key!r}.")
        patch = {self.end_key: torch.ones_like(done)}
        if self.truncated_key is not None:
            truncated = _bool_entry(last, self.truncated_key, "truncated_key", member)
            if truncated is not None:
                unfinished = ~done
                if self.terminated_key is not None:
                    terminated = _bool_entry(last, self.terminated_key, "terminated_key", member)
                    if terminated is not None:
                        unfinished &= ~terminated.reshape(done.shape)
                patch[self.truncated_key] = truncated | unfinished.reshape(truncated.shape)
        return index, writer.generations_of(index), patch

    @staticmethod
    def _check_one_trajectory(member: int, rb: ReplayBuffer) -> None:
        traj_key = getattr(rb.sampler, "traj_key", None)
        if traj_key is None:
            return
        data = rb.storage[:]  # a view of the written rows for a tensor storage
        ids = data.get(traj_key, None) if is_tensor_collection(data) else None
        if isinstance(ids, torch.Tensor) and ids.numel() and not bool((ids == ids[0]).all()):
            raise RuntimeError(
                f"end_streams: member {member}'s steps carry several trajectory ids under "
                f"{traj_key!r}; a member must hold one stream with one id (a per-stream key "
                "such as the environment index), or restarted producers may reuse old ids.")


def end_streams(buffers: Sequence[ReplayBuffer], ends: StreamEnds) -> None:
    """End the stream of every buffer in ``buffers`` (their locks held): each is checked and
    its tail patch computed before any is written, so an error changes none of them. A buffer
    listed twice is patched once; empty buffers are skipped."""
    members: list[tuple[int, ReplayBuffer]] = []
    for i, rb in enumerate(buffers):
        if all(rb is not seen for _, seen in members):
            members.append((i, rb))
    for i, rb in members:
        ends.check_member(i, rb)
    patches = [(rb, ends.tail_patch(i, rb)) for i, rb in members]
    for rb, tail in patches:
        if tail is not None:
            index, generation, patch = tail
            rb.update_if_present(index=index, generation=generation, patch=patch)


class StreamEndingMixin:
    """``end_streams`` of :class:`~tdreplay.ensembles.ReplayBufferEnsemble` (mixed into it)."""

    _rbs: tuple[ReplayBuffer, ...]
    _lock: Any

    def end_streams(self, *, end_key: Any = ("next", "done"),
                    terminated_key: Any = ("next", "terminated"),
                    truncated_key: Any = ("next", "truncated")) -> None:
        """Mark the newest step of each member as the end of its stream, before restarted
        producers append to the members (as TorchRL's).

        Each member holds one chronological stream: a one-dimensional storage patched in place
        (e.g. ``LazyTensorStorage``), a round-robin writer built with
        ``track_generations=True`` and a slice sampler reading ``end_key``. Its newest step
        (the one before the writer's cursor) gets ``end_key`` set and, when the entry is
        stored, ``truncated_key`` set too unless that step had already ended or terminated
        (``terminated_key`` is read, never written; a missing one reads False). So a slice
        never joins the old tail to the steps written after the restart.

        The patch goes through each member's ``update_if_present``: write counts and slot
        generations do not change, handles taken before stay valid, and the member's sampler
        recomputes its trajectories. The updates submitted to the members
        (``submit_update_if_present``) are waited for first; then the ensemble's and the
        members' locks are held throughout. Empty members are skipped; a member listed twice
        is patched once. Batches drawn ahead (``prefetch``) before the call are handed out as
        they were drawn. Quiesce the producers until it returns.

        Parameters
        ----------
        end_key : NestedKey
            The stored boolean end flag the slice samplers read. Defaults to
            ``("next", "done")``.
        terminated_key : NestedKey or None
            The stored terminal flag, never modified. Defaults to ``("next", "terminated")``.
        truncated_key : NestedKey or None
            The stored truncation flag set for unfinished tails (``None``: not patched).
            Defaults to ``("next", "truncated")``.

        Raises
        ------
        ValueError
            Two keys name the same entry. ``TypeError`` for a malformed key.
        RuntimeError
            A member does not meet the requirements above (the message names the member and
            what it lacks), or its sampler has a ``traj_key`` under which its steps carry
            several trajectory ids (restarted producers may reuse them). Stricter than
            TorchRL in one case: a sampler reading only end flags is checked too when its
            ``traj_key`` entry is stored.
        KeyError, TypeError
            A member does not store ``end_key``, or a flag is not boolean.

        Every member is checked, and every tail patch computed, before any is written: on an
        error no member changes.

        Examples
        --------
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tdreplay.core import RoundRobinWriter, TensorDictReplayBuffer
        >>> from tdreplay.samplers import SliceSampler
        >>> from tdreplay.storages import LazyTensorStorage
        >>> member = TensorDictReplayBuffer(
        ...     storage=LazyTensorStorage(8),
        ...     sampler=SliceSampler(slice_len=2, end_key=("next", "done")),
        ...     writer=RoundRobinWriter(track_generations=True))
        >>> done = torch.zeros(3, 1, dtype=torch.bool)
        >>> _ = member.extend(TensorDict({("next", "done"): done}, [3]))
        >>> from tdreplay.ensembles import ReplayBufferEnsemble
        >>> replay = ReplayBufferEnsemble(member)
        >>> replay.end_streams()
        >>> member[:]["next", "done"].flatten().tolist()
        [False, False, True]
        >>> member.write_count, member.writer.generations_of(torch.arange(3)).tolist()
        (3, [0, 0, 0])
        """
        ends = StreamEnds.of(end_key, terminated_key, truncated_key)
        for rb in self._rbs:
            rb.synchronize()
        with self._lock:
            end_streams(self._rbs, ends)
