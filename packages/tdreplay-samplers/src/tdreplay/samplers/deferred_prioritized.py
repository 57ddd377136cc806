"""``DeferredPrioritizedSampler``: prioritized sampling in a buffer written by several processes
(what TorchRL's prioritized buffers do with ``sync=False``).

A :class:`~tdreplay.samplers.PrioritizedSampler` keeps its priority trees in one process's
memory, so a buffer holding one cannot be shared (:class:`~tdreplay.core.NotShareableError`):
the writes of other processes would go to their own copies of the trees. This sampler keeps the
prioritized sampler in the process that built it (the *learner*) and lets every process write:

- writes do not touch the trees. When the learner samples or updates priorities, the sampler
  first *catches up*: the rows written since it last looked, by any process, are found from the
  writer's ``write_count`` (round-robin order, which a shared storage keeps in shared memory)
  and get the max priority, as rows written through a prioritized sampler do. An ``empty`` or
  a restore of the storage by another process (however many rows were written after it) is
  seen from the storage's ``shared_reset_count()``: the trees then start afresh, with the rows
  the storage holds, and updates that carry the write generations of samples taken before
  are skipped as stale;
- in the learner, writes whose data brings priorities (a TensorDict's ``priority_key``) apply
  them after catching up, as with ``sync=True``; in other processes the sampler is not
  prioritized (:attr:`is_prioritized` is False there), so their rows get the max priority when
  the learner catches up, as TorchRL's ``sync=False`` buffers do for every write;
- sampling, ``update_priority`` and ``state_dict`` in another process raise ``RuntimeError``:
  the trees are the learner's. Sent to a process being started (spawn, forkserver), the sampler
  leaves the trees behind.

Examples
--------
>>> import torch
>>> from tdreplay.core import ListStorage, ReplayBuffer
>>> from tdreplay.samplers import PrioritizedSampler
>>> sampler = DeferredPrioritizedSampler(PrioritizedSampler(8, alpha=1.0, beta=1.0))
>>> rb = ReplayBuffer(storage=ListStorage(8), sampler=sampler)
>>> sampler.follow(rb.writer)
>>> rb.extend([torch.tensor(i) for i in range(4)]).tolist()
[0, 1, 2, 3]
>>> sampler.caught_up  # writes are not seen until the learner samples or updates
0
>>> rb.update_priority(torch.tensor([0, 1, 2]), torch.zeros(3))
>>> sampler.caught_up, rb.sample(4).tolist()  # only row 3 keeps a non-zero priority
(4, [3, 3, 3, 3])
"""

from __future__ import annotations

import os
from typing import Any

import torch

from tdreplay.core import RoundRobinWriter, Sampler, Storage, Writer
from tdreplay.core.process_sharing import sending_to_new_process
from tdreplay.core.utils import check_instance, restore_attributes

from .prioritized import PrioritizedSampler

__all__ = ["DeferredPrioritizedSampler"]

_STATE_KEYS = frozenset({"prioritized", "caught_up"})
#: ``_resets`` before the storage's reset count was read (a writer without a storage yet)
_UNREAD = -1


class DeferredPrioritizedSampler(Sampler):
    """Prioritized sampling by one process of a buffer that several processes write (see the
    module docstring); shareable, unlike the :class:`PrioritizedSampler` it holds.

    Parameters
    ----------
    prioritized : PrioritizedSampler
        The sampler kept in this process (the learner).
    writer : Writer, optional
        The buffer's writer, whose ``write_count`` tells which rows were written; or call
        :meth:`follow` once the buffer is built (the prioritized buffers do it).

    The storage must have ``ndim == 1`` (rows are slots) and be written in round-robin order.

    Examples
    --------
    What a prioritized buffer built with ``sync=False`` samples through (more in the module
    docstring):

    >>> import torch
    >>> from tensordict import TensorDict
    >>> from tdreplay.core import ListStorage
    >>> from tdreplay.samplers import TensorDictPrioritizedReplayBuffer
    >>> rb = TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=1.0, storage=ListStorage(8),
    ...                                        sync=False)
    >>> type(rb.sampler).__name__
    'DeferredPrioritizedSampler'
    >>> _ = rb.extend(TensorDict({"x": torch.arange(4.0)}, [4]))
    >>> rb.sampler.caught_up  # the trees catch up when the learner samples
    0
    >>> _ = rb.sample(2)
    >>> rb.sampler.caught_up
    4
    """

    shareable = True
    #: (the default of a copy pickled before the attribute existed)
    _resets: int | None = _UNREAD
    info_keys = PrioritizedSampler.info_keys
    update_keys = PrioritizedSampler.update_keys

    def __init__(self, prioritized: PrioritizedSampler, writer: Writer | None = None) -> None:
        self._prioritized: PrioritizedSampler | None = check_instance(
            prioritized, PrioritizedSampler, "prioritized")
        self._writer: Writer | None = None
        self._caught_up = 0
        #: the storage's ``shared_reset_count()`` the trees are in step with
        self._resets = _UNREAD
        self._learner_pid = os.getpid()
        if writer is not None:
            self.follow(writer)

    def follow(self, writer: Writer) -> None:
        """Learn of writes from ``writer``'s ``write_count`` from now on (the rows it wrote
        before count as seen, except those the prioritized sampler finds in the storage)."""
        if not isinstance(writer, Writer):
            raise TypeError(f"writer must be a Writer instance, got {type(writer).__name__}.")
        self._writer = writer
        self._caught_up = writer.write_count
        self._resets = self._storage_resets()

    def _storage_resets(self) -> int | None:
        """The ``shared_reset_count()`` of the followed writer's storage now (``_UNREAD``
        before it has one)."""
        try:
            storage = self._writer.storage if self._writer is not None else None
        except RuntimeError:  # no storage registered yet
            storage = None
        return storage.shared_reset_count() if storage is not None else _UNREAD

    # ---- where the trees are -------------------------------------------------------------------
    @property
    def in_learner(self) -> bool:
        """Whether this process holds the priority trees: the process that built the sampler,
        or one that unpickled a copy made otherwise than for a process being started (a file,
        a queue). A forked child is not (it writes; the trees are its parent's)."""
        return self._prioritized is not None and os.getpid() == self._learner_pid

    @property
    def is_prioritized(self) -> bool:  # type: ignore[override]
        """True in the learner, False in other processes (their writes bring no priorities)."""
        return self.in_learner

    @property
    def prioritized(self) -> PrioritizedSampler:
        """The :class:`PrioritizedSampler`; ``RuntimeError`` in another process than the
        learner's."""
        if not self.in_learner:
            raise RuntimeError(
                "a worker process cannot sample, update priorities or read the priority trees "
                "of a buffer built with sync=False: they live in the process that built it "
                "(the learner); do that there.")
        assert self._prioritized is not None
        return self._prioritized

    @property
    def caught_up(self) -> int:
        """The writer's ``write_count`` the trees have caught up with."""
        return self._caught_up

    @property
    def alpha(self) -> Any:  # a float, or a tensor when one was given
        """The prioritized sampler's ``alpha`` (settable, e.g. by a scheduler)."""
        return self.prioritized.alpha

    @alpha.setter
    def alpha(self, value: float | torch.Tensor) -> None:
        self.prioritized.alpha = value

    @property
    def beta(self) -> Any:  # a float, or a tensor when one was given
        """The prioritized sampler's ``beta`` (settable, e.g. by a scheduler)."""
        return self.prioritized.beta

    @beta.setter
    def beta(self, value: float | torch.Tensor) -> None:
        self.prioritized.beta = value

    # ---- catching up ---------------------------------------------------------------------------
    def catch_up(self, storage: Storage) -> None:
        """Give the rows written since the last catch-up (by any process) the max priority.

        The rows are the last ``write_count - caught_up`` rows written before the writer's
        cursor, in round-robin order (all of them once that many fill the storage). The trees
        start afresh, with every row the storage holds, when its rows were replaced since: its
        ``shared_reset_count()`` changed (an ``empty`` or a restore by another process, however
        many rows were written after it) or the write count went back.
        """
        prioritized = self.prioritized
        if self._writer is None:
            raise RuntimeError("DeferredPrioritizedSampler has no writer to follow: call "
                               "follow(rb.writer) (the prioritized buffers do).")
        count = self._writer.write_count
        resets = storage.shared_reset_count()  # (None: a storage in one process)
        restart = count < self._caught_up
        if resets != self._resets:
            restart |= self._resets != _UNREAD
            self._resets = resets
        if restart:
            prioritized.empty()
            self._caught_up = 0
        if count == self._caught_up:
            return
        capacity = storage.max_size
        # the rows before the cursor (which a buffer emptied without resetting its write count
        # sets back to 0); a writer without one: the count's round-robin position. No more
        # rows than the storage holds: a count ahead of them (a restored write count, a
        # storage emptied elsewhere) must not give unwritten rows a priority
        end = self._writer.cursor if isinstance(self._writer, RoundRobinWriter) else count
        new = min(count - self._caught_up, len(storage), capacity)
        rows = torch.arange(end - new, end) % capacity
        prioritized.extend(storage.rows_to_slots(rows).reshape(-1))
        self._caught_up = count

    # ---- the sampler contract ------------------------------------------------------------------
    def extend(self, index: torch.Tensor) -> None:
        """Nothing: the learner learns of every write when it catches up."""

    def check_edit(self) -> None:
        """Refuse an index assignment outside the learner: the learner catches up with the
        writer's writes only (its shared counters), so it would never learn that the row holds
        a new item, which would keep the priority of the one it replaced."""
        if not self.in_learner:
            raise RuntimeError(
                "rb[i] = ... in a worker of a sync=False prioritized buffer: the learner would not "
                "see that the row holds a new item (it catches up with extends only), and the "
                "item would keep the replaced one's priority. Write with extend in the worker, "
                "or assign in the learner.")

    def mark_update(self, index: torch.Tensor, *, storage: Storage | None = None) -> None:
        """``rb.mark_update(index)``: the rows get the max priority (in the learner)."""
        if self.in_learner:
            self.prioritized.mark_update(index)

    def mark_rewritten(self, index: torch.Tensor) -> None:
        """Rows overwritten by index assignment keep their priority and get a new write
        generation (in the learner; see :meth:`PrioritizedSampler.mark_rewritten`)."""
        if self.in_learner:
            self.prioritized.mark_rewritten(index)

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[str, Any]]:
        """Catch up, then draw as the prioritized sampler (learner only)."""
        self.catch_up(storage)
        return self.prioritized.sample(storage, batch_size)

    def update_priority(self, index: Any, priority: Any, *, storage: Storage | None = None,
                        **kwargs: Any) -> None:
        """Catch up (when the buffer passes its storage), then set the priorities (learner
        only; see :meth:`PrioritizedSampler.update_priority`)."""
        if storage is not None:
            self.catch_up(storage)
        self.prioritized.update_priority(index, priority, storage=storage, **kwargs)

    def check_priority(self, priority: Any) -> Any:
        """As :meth:`PrioritizedSampler.check_priority` (nothing outside the learner)."""
        if self.in_learner:
            return self.prioritized.check_priority(priority)
        return priority

    def empty(self) -> None:
        """Forget every priority; the rows written from now on are caught up with later."""
        if self.in_learner:
            self.prioritized.empty()
        self._caught_up = self._writer.write_count if self._writer is not None else 0
        self._resets = self._storage_resets()

    def set_rng(self, generator: torch.Generator | None) -> None:
        super().set_rng(generator)
        if self._prioritized is not None:
            self._prioritized.set_rng(generator)

    # ---- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"prioritized": its state_dict, "caught_up": int}`` (learner only)."""
        return {"prioritized": self.prioritized.state_dict(), "caught_up": self._caught_up}

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """``ValueError`` naming the field unless ``state_dict`` fits; changes nothing."""
        if not isinstance(state_dict, dict) or set(state_dict) != _STATE_KEYS:
            got = sorted(state_dict) if isinstance(state_dict, dict) else type(state_dict)
            raise ValueError(f"DeferredPrioritizedSampler state_dict must have the keys "
                             f"{sorted(_STATE_KEYS)}, got {got}.")
        count = state_dict["caught_up"]
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"DeferredPrioritizedSampler state_dict['caught_up'] must be an "
                             f"int >= 0, got {count!r}.")
        self.prioritized.check_state_dict(state_dict["prioritized"])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (checked first: a bad one changes nothing)."""
        self.check_state_dict(state_dict)
        self.prioritized.load_state_dict(state_dict["prioritized"])
        self._caught_up = int(state_dict["caught_up"])
        self._resets = self._storage_resets()  # (the buffer restores its storage first)

    def __getstate__(self) -> dict[str, Any]:
        """A copy for a process being started leaves the trees behind (see the module)."""
        state = self.__dict__.copy()
        if sending_to_new_process():
            state["_prioritized"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A copy that kept the trees (a file, a queue) is the learner where it is unpickled."""
        restore_attributes(self, state)
        if self._prioritized is not None:
            self._learner_pid = os.getpid()

    def __repr__(self) -> str:
        inner = repr(self._prioritized) if self.in_learner else "in another process"
        return f"{type(self).__name__}({inner}, caught_up={self._caught_up})"
