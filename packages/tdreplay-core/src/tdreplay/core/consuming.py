""":class:`ConsumingSampler`: uniform sampling where an item is used up after it has been
sampled ``max_sample_count`` times (TorchRL's ``ConsumingSampler``, and what a buffer built
with ``consume_after_n_samples=`` samples with).

It lives in core, beside :class:`~tdreplay.core.RandomSampler`, because a bare buffer builds
one from ``consume_after_n_samples=`` and core imports no sibling; ``tdreplay.samplers`` serves
the same class.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import torch

from .sampler import Sampler
from .storage import Storage
from .utils import check_batch_size, check_not_empty, restore_attributes

_EXHAUSTED = ("Cannot sample from an empty storage: every item written has been consumed "
              "(sampled max_sample_count times); write new items first.")


def check_max_sample_count(value: Any, name: str = "max_sample_count") -> int:
    """``value`` as a Python int >= 1 (a Python or numpy integer; bools are refused):
    ``TypeError`` for another type, ``ValueError`` below 1, both naming ``name``.

    Examples
    --------
    >>> check_max_sample_count(2)
    2
    >>> check_max_sample_count(0, "consume_after_n_samples")
    Traceback (most recent call last):
    ...
    ValueError: consume_after_n_samples must be a positive integer, got 0.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be a positive integer, got {type(value).__name__} "
                        f"({value!r}).")
    if int(value) < 1:
        raise ValueError(f"{name} must be a positive integer, got {int(value)}.")
    return int(value)


class ConsumingMark:
    """A :meth:`ConsumingSampler.draw_mark`: the consumed slots, the slots known and
    ``ran_out`` when it was taken, and where the sampler's journal of draws stood.

    Examples
    --------
    >>> mark = ConsumingSampler().draw_mark()
    >>> mark.free.tolist(), mark.known, mark.ran_out, mark.start
    ([], 0, False, 0)
    """

    __slots__ = ("free", "known", "ran_out", "start", "__weakref__")

    def __init__(self, free: torch.Tensor, known: int, ran_out: bool, start: int) -> None:
        self.free, self.known, self.ran_out, self.start = free, known, ran_out, start


class ConsumingSampler(Sampler):
    """Uniform sampling without replacement within a batch, where each item can be drawn
    ``max_sample_count`` times in all before it is consumed.

    A consumed item leaves the sampleable set until its slot is written again: ``len(rb)``
    counts the items still sampleable, a batch holds at most that many items (fewer than
    ``batch_size`` near the end), and sampling when none is left raises ``RuntimeError``
    ("Cannot sample from an empty storage"). :attr:`ran_out` turns True with the batch that
    consumes the last item, which ends iteration over the buffer. New writes go into consumed
    slots first, oldest consumed first (:meth:`reusable_slots`), and then where the writer's
    cursor points, skipping the slots just reused; a write into a slot (``extend``, ``add``,
    ``rb[i] = ...``) makes it sampleable again with its count at zero.

    As TorchRL's: 1-dimensional storages only, no prefetch, and the writer must write at given
    rows (:attr:`~tdreplay.core.Writer.supports_write_at`, e.g.
    :class:`~tdreplay.core.RoundRobinWriter`). The counts, the sampleable set and the consumed
    slots are saved by ``state_dict`` / ``dumps``. Its state lives in this process
    (:attr:`shareable` is False).

    Parameters
    ----------
    max_sample_count : int
        How many times an item is returned before it is consumed (default 1).

    Examples
    --------
    >>> from tdreplay.core import ListStorage, ReplayBuffer
    >>> rb = ReplayBuffer(storage=ListStorage(10), sampler=ConsumingSampler(), batch_size=3)
    >>> rb.extend([torch.tensor(i) for i in range(4)]).tolist()
    [0, 1, 2, 3]
    >>> first = rb.sample()
    >>> len(first), len(rb)
    (3, 1)
    >>> second = rb.sample()  # only one item is left
    >>> sorted(first.tolist() + second.tolist()), len(rb), rb.sampler.ran_out
    ([0, 1, 2, 3], 0, True)

    The next write reuses the consumed slots, oldest consumed first:

    >>> rb.extend([torch.tensor(10), torch.tensor(11)]).tolist() == first.tolist()[:2]
    True
    >>> len(rb)
    2
    """

    finite_epochs = True  # iteration ends when every item is consumed; never prefetched
    shareable = False  # counts and consumed slots live in this process
    stateful_draws = True  # a batch that fails gives its items back (draw_mark, undo_draws)

    def __init__(self, max_sample_count: int = 1) -> None:
        self._max_sample_count = check_max_sample_count(max_sample_count)
        self._counts = torch.zeros(0, dtype=torch.long)  # per slot: times sampled
        self._live = torch.zeros(0, dtype=torch.bool)  # per slot: still sampleable
        self._known = 0  # slots [0, _known) are written, as far as this sampler knows
        self._free = torch.zeros(0, dtype=torch.long)  # consumed slots, oldest first, unique
        self._ran_out = False
        self._open_journal()

    def _open_journal(self) -> None:
        """No mark open, nothing journaled (also what a copy of the sampler starts with)."""
        self._marks: weakref.WeakSet[ConsumingMark] = weakref.WeakSet()  # the open marks
        self._journal: list[torch.Tensor] = []  # slots of each draw since the oldest open mark

    @property  # (a plain attribute, None, on Sampler)
    def max_sample_count(self) -> int:
        """How many times an item is returned before it is consumed; set to a positive
        integer (``TypeError`` / ``ValueError`` naming it otherwise, nothing changed).

        Examples
        --------
        >>> sampler = ConsumingSampler()
        >>> sampler.max_sample_count = 3
        >>> sampler.max_sample_count = 0
        Traceback (most recent call last):
        ...
        ValueError: max_sample_count must be a positive integer, got 0.
        >>> sampler.max_sample_count
        3
        """
        return self._max_sample_count

    @max_sample_count.setter
    def max_sample_count(self, value: int) -> None:
        self._max_sample_count = check_max_sample_count(value)

    @property
    def _limit(self) -> int:
        """``max_sample_count`` as an int."""
        return self._max_sample_count

    # ---- bookkeeping -----------------------------------------------------------------------------
    def _grow(self, size: int) -> None:
        """Make room for ``size`` slots (the tables double, so growing is amortized)."""
        have = self._counts.numel()
        if size <= have:
            return
        new = max(size, 2 * have, 16)
        counts = torch.zeros(new, dtype=torch.long)
        live = torch.zeros(new, dtype=torch.bool)
        counts[:have] = self._counts
        live[:have] = self._live
        self._counts, self._live = counts, live

    def _sync(self, storage: Storage) -> None:
        """Follow the storage's length: slots written behind this sampler's back (e.g. a
        ``TensorStorage`` built from data) become sampleable, slots past a shrunken storage
        are forgotten."""
        if storage.ndim != 1:
            raise ValueError(f"{type(self).__name__} only supports 1-dimensional storages, "
                             f"got storage.ndim={storage.ndim}.")
        n = len(storage)
        if n > self._known:
            self._grow(n)
            self._counts[self._known:n] = 0
            self._live[self._known:n] = True
            self._known = n
            self._ran_out = False
        elif n < self._known:
            self._counts[n:self._known] = 0
            self._live[n:self._known] = False
            self._free = self._free[self._free < n]
            self._known = n

    def extend(self, index: torch.Tensor) -> None:
        """The slots ``index`` were written: they are sampleable again, their counts back at
        zero."""
        index = torch.as_tensor(index, dtype=torch.long).reshape(-1).cpu()
        if not index.numel():
            return
        top = int(index.max()) + 1
        self._grow(top)
        self._counts[index] = 0
        self._live[index] = True
        self._known = max(self._known, top)
        if self._free.numel():
            self._free = self._free[~torch.isin(self._free, index)]
        self._ran_out = False

    # ---- sampling --------------------------------------------------------------------------------
    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[str, Any]]:
        """Draw ``min(batch_size, sampleable)`` distinct sampleable slots uniformly; each one's
        count goes up by one, and those reaching ``max_sample_count`` are consumed."""
        check_batch_size(batch_size)
        self._sync(storage)
        live = torch.nonzero(self._live[:self._known]).reshape(-1)
        if not live.numel():
            self._ran_out = True
            check_not_empty(storage)  # (nothing written, or emptied: not "consumed")
            raise RuntimeError(_EXHAUSTED)
        take = min(batch_size, live.numel())
        index = live[torch.randperm(live.numel(), generator=self._rng)[:take]]
        self._counts[index] += 1
        consumed = index[self._counts[index] >= self._limit]
        if consumed.numel():
            self._live[consumed] = False
            self._free = torch.cat([self._free, consumed])
        self._ran_out = not bool(self._live[:self._known].any())
        if self._marks:  # a batch being drawn under a mark: journaled, to be given back
            self._journal.append(index)
        return index, {}

    def draw_mark(self) -> ConsumingMark:
        """A mark for :meth:`undo_draws`: the consumed slots (a reference: draws replace the
        tensor), and from now on, while the mark lives, the slots of every draw (a journal
        of references, dropped with the last open mark).

        Examples
        --------
        >>> from tdreplay.core import ListStorage
        >>> storage, sampler = ListStorage(4), ConsumingSampler()
        >>> storage.set(torch.arange(3), ["a", "b", "c"])
        >>> mark = sampler.draw_mark()
        >>> _ = sampler.sample(storage, 2)
        >>> sampler.sampleable_count(storage)
        1
        >>> sampler.undo_draws(mark)  # e.g. the batch's transform raised
        >>> sampler.sampleable_count(storage), sampler.reusable_slots(storage, 3).tolist()
        (3, [])
        """
        if not self._marks:
            self._journal.clear()
        mark = ConsumingMark(self._free, self._known, self._ran_out, len(self._journal))
        self._marks.add(mark)
        return mark

    def undo_draws(self, mark: ConsumingMark) -> None:
        """Give back the items of the draws made since ``mark``: their counts go down again,
        the items they consumed are sampleable again (see :meth:`Sampler.undo_draws`)."""
        for index in reversed(self._journal[mark.start:]):
            self._counts[index] -= 1
            back = index[~self._live[index] & (self._counts[index] < self._limit)]
            self._live[back] = True
        del self._journal[mark.start:]
        # slots past a storage that shrank since were forgotten (_sync); growth made items
        # sampleable, which ran_out must not hide
        free, known = mark.free, self._known
        self._free = free if known >= mark.known else free[free < known]
        self._ran_out = mark.ran_out and known <= mark.known
        self._marks.discard(mark)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_marks"], state["_journal"]  # a copy has no mark open
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        restore_attributes(self, state)
        self._open_journal()

    def sampleable_count(self, storage: Storage) -> int:
        """Items of ``storage`` not consumed yet (what ``len(rb)`` reports).

        Examples
        --------
        >>> from tdreplay.core import ListStorage
        >>> storage, sampler = ListStorage(4), ConsumingSampler()
        >>> storage.set(torch.arange(3), ["a", "b", "c"])
        >>> _ = sampler.sample(storage, 2)
        >>> sampler.sampleable_count(storage)
        1
        """
        self._sync(storage)
        return int(self._live[:self._known].sum())

    def reusable_slots(self, storage: Storage, max_count: int) -> torch.Tensor:
        """The consumed slots the next write goes into, oldest consumed first, at most
        ``max_count`` (int64). Changes nothing: a slot stays reusable until it is written.

        Examples
        --------
        >>> from tdreplay.core import ListStorage
        >>> storage, sampler = ListStorage(4), ConsumingSampler()
        >>> storage.set(torch.arange(3), ["a", "b", "c"])
        >>> index, _ = sampler.sample(storage, 2)
        >>> sampler.reusable_slots(storage, 5).tolist() == index.tolist()
        True
        """
        self._sync(storage)
        return self._free[:max(int(max_count), 0)].clone()

    @property
    def ran_out(self) -> bool:
        """Whether the last batch consumed the last sampleable item (until the next write)."""
        return self._ran_out

    def empty(self) -> None:
        self._counts = torch.zeros(0, dtype=torch.long)
        self._live = torch.zeros(0, dtype=torch.bool)
        self._known = 0
        self._free = torch.zeros(0, dtype=torch.long)
        self._ran_out = False

    # ---- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``max_sample_count``, the per-slot ``sample_count`` and ``sampleable`` flags of the
        written slots, the consumed ``free_slots`` (oldest first) and ``ran_out``: copies."""
        return {
            "max_sample_count": self._limit,
            "sample_count": self._counts[:self._known].clone(),
            "sampleable": self._live[:self._known].clone(),
            "free_slots": self._free.clone(),
            "ran_out": self._ran_out,
        }

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Refuse a state that is not one of a ``ConsumingSampler`` (``ValueError`` naming the
        field); changes nothing.

        Examples
        --------
        >>> state = ConsumingSampler().state_dict()
        >>> state["free_slots"] = torch.tensor([3])
        >>> ConsumingSampler().check_state_dict(state)
        Traceback (most recent call last):
        ...
        ValueError: ConsumingSampler state_dict['free_slots'] must name consumed slots below 0 ...
        """
        super().check_state_dict(state_dict)
        owner = f"{type(self).__name__} state_dict"
        try:
            count = check_max_sample_count(state_dict["max_sample_count"])
        except TypeError as err:
            raise ValueError(f"{owner}['max_sample_count']: {err}") from err
        counts, live, free = (state_dict[k] for k in ("sample_count", "sampleable", "free_slots"))
        for key, value, dtype in (("sample_count", counts, torch.long),
                                  ("sampleable", live, torch.bool),
                                  ("free_slots", free, torch.long)):
            if not isinstance(value, torch.Tensor) or value.dtype != dtype or value.ndim != 1:
                got = (f"{value.dtype}, {value.ndim}-D" if isinstance(value, torch.Tensor)
                       else type(value).__name__)
                raise ValueError(f"{owner}[{key!r}] must be a 1-D {dtype} tensor, got {got}.")
        if counts.numel() != live.numel():
            raise ValueError(f"{owner}['sample_count'] ({counts.numel()} slots) and "
                             f"['sampleable'] ({live.numel()}) must have the same length.")
        if counts.numel() and int(counts.min()) < 0:
            raise ValueError(f"{owner}['sample_count'] holds negative counts.")
        known = counts.numel()
        if free.numel():
            free_cpu = free.cpu()
            if (int(free_cpu.min()) < 0 or int(free_cpu.max()) >= known
                    or free_cpu.unique().numel() != free_cpu.numel()
                    or bool(live.cpu()[free_cpu].any())
                    or bool((counts.cpu()[free_cpu] < count).any())):
                raise ValueError(f"{owner}['free_slots'] must name consumed slots below {known} "
                                 f"once each (sampled max_sample_count={count} times, not "
                                 f"sampleable), got {free_cpu.tolist()[:8]}.")
        consumed = int((~live.cpu()).sum())
        if free.numel() != consumed:  # each consumed slot listed (else it is lost for good)
            missing = torch.nonzero(~live.cpu()).reshape(-1)
            missing = missing[~torch.isin(missing, free.cpu())]
            raise ValueError(f"{owner}['free_slots'] must name every consumed slot (not "
                             f"sampleable) once: {consumed} are consumed, it names "
                             f"{free.numel()} (missing {missing.tolist()[:8]}).")
        if not isinstance(state_dict["ran_out"], (bool, np.bool_)):
            raise ValueError(f"{owner}['ran_out'] must be a bool, got "
                             f"{type(state_dict['ran_out']).__name__}.")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (copies: the sampler never shares the caller's
        tensors)."""
        self.check_state_dict(state_dict)
        self._max_sample_count = int(state_dict["max_sample_count"])
        self._counts = state_dict["sample_count"].detach().cpu().clone()
        self._live = state_dict["sampleable"].detach().cpu().clone()
        self._known = self._counts.numel()
        self._free = state_dict["free_slots"].detach().cpu().clone()
        self._ran_out = bool(state_dict["ran_out"])

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(max_sample_count={self.max_sample_count}, "
                f"sampleable={int(self._live[:self._known].sum())}, "
                f"consumed={self._free.numel()})")
