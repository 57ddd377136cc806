"""The :class:`Sampler` contract and the uniform samplers: :class:`RandomSampler` (with
replacement, the default of a bare buffer) and :class:`SamplerWithoutReplacement`."""

from __future__ import annotations

import abc
import warnings
from typing import Any

import numpy as np
import torch

from ._stateful import StateDictCheckpointMixin
from .process_sharing import SpawnChecked
from .storage import Storage
from .utils import check_batch_size, check_flag, check_not_empty, is_int


class Sampler(SpawnChecked, StateDictCheckpointMixin, abc.ABC):
    """Chooses which slots a batch is made of.

    Contract:

    - ``sample(storage, batch_size) -> (index, info)``: ``index`` is an int64 tensor of flat
      slots (any shape; the batch takes that shape), ``info`` a dict of extra per-item tensors
      (e.g. ``priority_weight``) the buffer attaches to the sample when asked.
    - ``extend(index)`` / ``add(index)``: told which slots were just written;
      ``mark_rewritten(index)`` which were overwritten by index assignment (``rb[i] = ...``);
      ``mark_update(index)`` which changed past the buffer (``rb.mark_update(index)``);
      ``mark_edited(keys)`` which entries were edited in place.
    - ``update_priority(index, priority)``: prioritized samplers only.
    - ``ran_out``: True once an epoch is over (samplers without replacement); the buffer's
      iterator stops there.
    - ``requires_batch_size``: True when the buffer must have a ``batch_size`` (checked when
      the buffer is built and by ``set_sampler``).
    - ``max_sample_count`` / ``sampleable_count(storage)`` / ``reusable_slots(storage, n)``:
      consuming samplers (items used up after being sampled so many times).
    - ``state_dict`` / ``load_state_dict`` / ``dumps`` / ``loads``: the whole sampling state.

    Examples
    --------
    A sampler implements ``sample`` at the least (TorchRL's ``Sampler`` subclasses run as
    they are):

    >>> import torch
    >>> from tdreplay.core import ListStorage, ReplayBuffer
    >>> class Newest(Sampler):   # the most recently written items
    ...     def sample(self, storage, batch_size):
    ...         n = len(storage)
    ...         return torch.arange(max(n - batch_size, 0), n), {}
    >>> rb = ReplayBuffer(storage=ListStorage(10), sampler=Newest())
    >>> _ = rb.extend(["a", "b", "c", "d"])
    >>> rb.sample(2)
    ['c', 'd']
    """

    _rng: torch.Generator | None = None
    #: True for samplers that keep priorities (``update_priority`` changes what is drawn); a
    #: TensorDict buffer then writes priorities that come with the data.
    is_prioritized: bool = False
    #: True for samplers that run out at the end of an epoch (without replacement); a buffer
    #: neither prefetches from them nor iterates past the epoch.
    finite_epochs: bool = False
    #: per-item entries this sampler adds to samples (bookkeeping, never stored when a sample is
    #: written back)
    info_keys: tuple[str, ...] = ()
    #: entries of a sample that ``update_tensordict_priority`` passes back to ``update_priority``
    #: as keyword arguments
    update_keys: tuple[str, ...] = ()
    #: False for samplers whose state (e.g. priority trees) lives in one process: a buffer that
    #: holds one refuses ``share()`` and being sent to another process (``buffer_sharing``),
    #: and the sampler itself refuses being pickled for a process being started
    #: (:meth:`check_shareable`, ``process_sharing``)
    shareable: bool = True
    not_shareable_message = (
        "Samplers of type {cls} cannot be shared between processes: their state (e.g. "
        "priority trees) lives in one process. Build the buffer with sync=False instead "
        "(TensorDictPrioritizedReplayBuffer(..., sync=False), or PrioritizedReplayBuffer(..., "
        "sync=False)): worker processes write through a uniform sampler and the learner keeps "
        "the prioritized one.")
    #: How many times ``sample`` returns an item before the item is consumed (it leaves the
    #: sampleable set until its slot is written again); ``None`` (the default): items are never
    #: consumed. A buffer whose sampler consumes reports :meth:`sampleable_count` as its
    #: ``len``, writes into :meth:`reusable_slots` first and refuses ``prefetch``
    #: (:class:`~tdreplay.core.ConsumingSampler`).
    max_sample_count: int | None = None
    #: True for samplers whose ``sample`` returns only slots written in the storage passed to
    #: it (in range by construction, an int64 tensor): the buffer then reads them with
    #: :meth:`~tdreplay.core.Storage.get_trusted`, which need not check them again. ``False``
    #: (the default): the buffer reads through :meth:`~tdreplay.core.Storage.get`, which checks.
    draws_written_slots: bool = False
    #: True for samplers whose :meth:`sample` changes state that a batch which then fails must
    #: give back (an epoch's position, the counts of a consuming sampler). A buffer takes a
    #: :meth:`draw_mark` before drawing from such a sampler, keeps its lock until the batch is
    #: complete (read, collated, transformed, info attached) and hands the mark to
    #: :meth:`undo_draws` if any step raises: a failed ``sample`` changes nothing. ``False``
    #: (the default): nothing is marked, and a failed sample costs only the random numbers
    #: drawn (those of the generator are never given back).
    stateful_draws: bool = False

    @abc.abstractmethod
    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[str, Any]]:
        """Return ``(index, info)`` for a batch of ``batch_size`` items."""

    def draw_mark(self) -> Any:
        """A record of the state the next draws change, for :meth:`undo_draws` (``None`` here:
        :attr:`stateful_draws` samplers override both).

        It stays valid while nothing but draws changes the sampler (a buffer holds its lock
        from the mark to the end of the batch: no write, ``empty`` or load in between). Marks
        may nest (an ensemble marks its members within its buffer's mark); the inner one is
        undone first. State that a draw only brings up to date with the storage (a trajectory
        index catching up with writes, a sampler catching up with other processes' writes) is
        not recorded: any next call would bring it up to date the same way.

        Examples
        --------
        >>> from tdreplay.core import ListStorage
        >>> storage = ListStorage(4)
        >>> storage.set(torch.arange(4), list("abcd"))
        >>> sampler = SamplerWithoutReplacement(shuffle=False)
        >>> mark = sampler.draw_mark()
        >>> sampler.sample(storage, 3)[0].tolist()
        [0, 1, 2]
        >>> sampler.undo_draws(mark)  # e.g. the batch's transform raised
        >>> sampler.sample(storage, 3)[0].tolist()  # the same items, as if never drawn
        [0, 1, 2]
        """
        return None

    def undo_draws(self, mark: Any) -> None:
        """Put back the state :meth:`draw_mark` recorded in ``mark``: the draws made since are
        undone (an epoch's items are drawn again, nothing stays consumed). Nothing here.

        Examples
        --------
        >>> sampler = RandomSampler()
        >>> sampler.undo_draws(sampler.draw_mark())  # nothing to undo
        >>> sampler.stateful_draws
        False
        """

    def extend(self, index: torch.Tensor) -> None:
        """Called after the slots ``index`` were written."""

    def add(self, index: int) -> None:
        """Called after one slot, ``index``, was written: :meth:`extend` of that slot, unless
        this sampler keeps the base's :meth:`extend`, which needs nothing (no tensor is made
        then)."""
        if type(self).extend is not Sampler.extend:
            self.extend(torch.as_tensor([index], dtype=torch.long))

    def check_write(self, data: Any) -> None:
        """Called before a write stores ``data`` (``extend``: the batch; ``add``: the item;
        ``rb[i] = ...``: the value), after the write-side transforms: raise to refuse it,
        nothing written. A sampler that reads entries of the stored data (e.g. trajectory
        ids) checks them here, so that bad values never reach the storage. Nothing by
        default; buffers call it only when a sampler overrides it.

        Examples
        --------
        >>> from tdreplay.core import ListStorage, RandomSampler, ReplayBuffer
        >>> class NoNegatives(RandomSampler):
        ...     def check_write(self, data):
        ...         if any(x < 0 for x in data):
        ...             raise ValueError("data: negative items are refused.")
        >>> rb = ReplayBuffer(storage=ListStorage(4), sampler=NoNegatives())
        >>> rb.extend([1, -2])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: data: negative items are refused.
        >>> len(rb)
        0
        """

    def check_edit(self) -> None:
        """Called before an index assignment (``rb[i] = ...``) writes anything: raise to refuse
        it (a sampler that could not follow it, e.g. one whose state lives in another
        process). Nothing by default."""

    def mark_update(self, index: torch.Tensor, *, storage: Storage | None = None) -> None:
        """Called by ``rb.mark_update(index)``: the items at ``index`` changed past the buffer
        (TorchRL's ``mark_update``; a prioritized sampler gives them the default priority).
        :meth:`extend` of them by default.

        ``storage`` is TorchRL's keyword (its buffer passes its storage). The default ignores
        it: the buffer checks ``index`` (flat slots) against its storage before telling the
        sampler. A sampler may use it to check a direct call's ``index``
        (``PrioritizedSampler`` refuses slots not written in it, changing nothing)."""
        self.extend(index)

    def mark_rewritten(self, index: torch.Tensor) -> None:
        """Called after an index assignment (``rb[i] = ...``, ``write_all``) rewrote the items
        at ``index`` (1-D int64): they hold new items, but were not written afresh.

        :meth:`mark_update` by default, so a sampler that overrides only that one keeps
        hearing of rewritten slots (e.g. a slice sampler, whose trajectories must be found
        again). A prioritized sampler overrides it to keep the slots' priorities, as
        TorchRL's ``rb[i] = ...`` leaves them (only the write generation moves on, so that
        priorities computed for the replaced items are skipped).

        Examples
        --------
        >>> from tdreplay.core import ListStorage, RandomSampler, ReplayBuffer
        >>> class Recording(RandomSampler):
        ...     def mark_update(self, index):
        ...         print("mark_update", index.tolist())
        >>> rb = ReplayBuffer(storage=ListStorage(4), sampler=Recording())
        >>> _ = rb.extend(["a", "b", "c"])
        >>> rb[1] = "B"  # the default mark_rewritten calls mark_update
        mark_update [1]
        >>> class Keeping(Recording):
        ...     def mark_rewritten(self, index):
        ...         print("mark_rewritten", index.tolist())
        >>> rb = ReplayBuffer(storage=ListStorage(4), sampler=Keeping())
        >>> _ = rb.extend(["a", "b", "c"])
        >>> rb[1] = "B"
        mark_rewritten [1]
        >>> rb.mark_update(1)  # an explicit mark_update is still one
        mark_update [1]
        """
        self.mark_update(index)

    def mark_edited(self, keys: list[Any] | None = None) -> None:
        """Called after entries of written items were edited in place (``set_``, ``set_at_``,
        ``update_``); ``keys`` names the entries edited (``None``: not known).

        Nothing by default; samplers that derive state from the stored data (e.g. trajectory
        boundaries) refresh it.
        """

    def update_priority(self, index: Any, priority: Any, *, storage: Storage | None = None) -> None:
        """Prioritized samplers override this; the others warn that nothing happens."""
        warnings.warn(
            f"update_priority() was called on a {type(self).__name__}, which is not prioritized: "
            "the priorities are ignored.",
            stacklevel=2,
        )

    def extend_with_priority(self, index: torch.Tensor, priority: Any, *,
                             storage: Storage | None = None) -> None:
        """Called after ``index`` (1-D) was written with priorities for it, one per slot, as
        :meth:`check_priority` returned them: :meth:`extend`, then :meth:`update_priority`.
        A prioritized sampler that can do both at once overrides it.

        Examples
        --------
        >>> import torch
        >>> from tdreplay.core import RandomSampler
        >>> class Recording(RandomSampler):
        ...     def extend(self, index):
        ...         print("extend", index.tolist())
        ...     def update_priority(self, index, priority, *, storage=None):
        ...         print("update", index.tolist(), priority.tolist())
        >>> Recording().extend_with_priority(torch.arange(2), torch.tensor([0.5, 2.0]))
        extend [0, 1]
        update [0, 1] [0.5, 2.0]
        """
        self.extend(index)
        self.update_priority(index, priority, storage=storage)

    def check_priority(self, priority: Any) -> Any:
        """Raise as ``update_priority`` would on these values, changing nothing; return them
        for ``update_priority``.

        Buffers call it before writing rows whose priorities come with the data, so bad
        priorities are refused before the buffer changes, and then pass what it returned to
        ``update_priority`` (in place of the values): a sampler may return them converted, so
        that the update does not convert them again. ``None`` (what samplers written for
        an earlier tdreplay return) stands for the values as given. Nothing to check here.

        Examples
        --------
        >>> values = torch.tensor([1.0, 2.0])
        >>> RandomSampler().check_priority(values) is values
        True
        """
        return priority

    def can_sample(self, storage: Storage, batch_size: int) -> bool:
        """Whether a batch of ``batch_size`` can be drawn from ``storage`` now (what
        ``rb.can_sample()`` asks, as TorchRL's samplers answer it): any item to draw by
        default; a sampler with further conditions overrides it.

        Examples
        --------
        >>> from tdreplay.core import ListStorage
        >>> storage = ListStorage(4)
        >>> RandomSampler().can_sample(storage, 2)
        False
        >>> storage.set(0, "a")
        >>> RandomSampler().can_sample(storage, 2)
        True
        """
        return self.sampleable_count(storage) > 0

    def sampleable_count(self, storage: Storage) -> int:
        """How many items of ``storage`` can be sampled now: what ``len(rb)`` reports.

        Every written item (``len(storage)``) by default; a consuming sampler
        (:attr:`max_sample_count`) leaves out the items it has consumed.

        Examples
        --------
        >>> from tdreplay.core import ListStorage
        >>> storage = ListStorage(4)
        >>> storage.set(torch.arange(3), ["a", "b", "c"])
        >>> RandomSampler().sampleable_count(storage)
        3
        """
        return len(storage)

    def reusable_slots(self, storage: Storage, max_count: int) -> torch.Tensor:
        """Slots whose items are consumed, which the next write of ``max_count`` items fills
        first (int64, at most ``max_count``, in the order to fill them). Changes nothing.

        None by default; a consuming sampler (:attr:`max_sample_count`) returns the slots it
        has consumed, oldest first, and the buffer writes there through the writer's
        :meth:`~tdreplay.core.Writer.extend_reusing` before the cursor advances.

        Examples
        --------
        >>> from tdreplay.core import ListStorage
        >>> RandomSampler().reusable_slots(ListStorage(4), 2).tolist()
        []
        """
        return torch.zeros(0, dtype=torch.long)

    @property
    def default_priority(self) -> float:
        """Priority an item gets when it is written (TorchRL's ``default_priority``): ``1.0``
        here; a prioritized sampler returns its current max priority.

        Examples
        --------
        >>> RandomSampler().default_priority
        1.0
        """
        return 1.0

    @property
    def ran_out(self) -> bool:
        """Whether the current epoch is exhausted (always False for samplers with replacement)."""
        return False

    @property
    def requires_batch_size(self) -> bool:
        """Whether this sampler needs the buffer to know its batch size in advance (``False``
        by default).

        A sampler that drops the incomplete last batch of an epoch (``drop_last=True``) can
        only tell where an epoch ends when every batch has the same, known size: a buffer
        refuses it (``ValueError``, as TorchRL) unless it was given a ``batch_size``.

        Examples
        --------
        >>> RandomSampler().requires_batch_size
        False
        """
        return False

    def set_rng(self, generator: torch.Generator | None) -> None:
        """Use ``generator`` for every random draw (reproducible sampling)."""
        self._rng = generator

    @property
    def generator(self) -> torch.Generator | None:
        """The generator of every random draw (``None``: torch's default generator).

        Examples
        --------
        >>> s = RandomSampler()
        >>> s.generator is None
        True
        >>> s.set_rng(torch.Generator().manual_seed(0))
        >>> isinstance(s.generator, torch.Generator)
        True
        """
        return self._rng

    def empty(self) -> None:
        """Forget everything about written slots (called by ``ReplayBuffer.empty``)."""

    def learn_written_slots(self, storage: Storage) -> None:
        """Forget everything about written slots (:meth:`empty`), then take the slots
        ``storage`` holds as written (:meth:`extend`; a prioritized sampler gives them its
        maximum priority). What a buffer does when its sampler is out of step with its
        storage: a storage set onto it, or restored or emptied past it.

        Examples
        --------
        >>> from tdreplay.core import ListStorage, SamplerWithoutReplacement
        >>> storage = ListStorage(8)
        >>> storage.set(range(3), ["a", "b", "c"])
        >>> sampler = SamplerWithoutReplacement()
        >>> sampler.learn_written_slots(storage)
        >>> sorted(sampler.sample(storage, 3)[0].tolist())
        [0, 1, 2]
        """
        self.empty()
        slots = torch.arange(len(storage))  # written slots: the first len(storage)
        written = slots[storage.valid_slots_mask(slots)]
        if written.numel():
            self.extend(written)

    def check_saved_slots(self, state_dict: dict[str, Any], slots: int) -> None:
        """Raise ``ValueError`` unless ``state_dict`` (accepted by :meth:`check_state_dict`)
        fits a storage restored with ``slots`` written slots (``0 .. slots - 1``); changes
        nothing. A buffer's ``load_state_dict`` calls it before anything loads
        (:meth:`ReplayBuffer.check_saved_parts
        <tdreplay.core.ReplayBuffer.check_saved_parts>`). The base accepts any; a sampler
        that keeps state per slot refuses a state that holds slots past them (it would draw
        slots the storage lacks at every sample).

        Examples
        --------
        >>> RandomSampler().check_saved_slots({}, slots=0)
        """

    def state_dict(self) -> dict[str, Any]:
        """The sampler's whole state (priorities, epoch, ...): empty here; a sampler that
        keeps state returns it (what the buffer's ``state_dict`` / ``dumps`` save). Its
        values are tensors and plain Python values (``dumps`` reads it back with
        ``torch.load(weights_only=True)`` and refuses a numpy array or a ``deque`` before
        writing: :mod:`tdreplay.core.loadable_state`)."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`, checked whole first (:meth:`check_state_dict`): a
        refused one changes nothing."""
        self.check_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class RandomSampler(Sampler):
    """Uniform sampling with replacement over the written slots.

    Parameters
    ----------
    replacement : bool
        TorchRL's ``replacement=``: ``RandomSampler(replacement=False, **kwargs)`` returns a
        :class:`SamplerWithoutReplacement` built from ``kwargs`` (``drop_last``, ``shuffle``),
        as TorchRL does. A subclass of :class:`RandomSampler` has no such variant and refuses
        ``replacement=False`` (``TypeError``).

    Examples
    --------
    >>> from tdreplay.core import ListStorage
    >>> s = ListStorage(10)
    >>> s.set(torch.arange(3), ["a", "b", "c"])
    >>> index, info = RandomSampler().sample(s, 5)
    >>> index.shape, bool(((index >= 0) & (index < 3)).all())
    (torch.Size([5]), True)
    >>> type(RandomSampler(replacement=False, drop_last=True)).__name__
    'SamplerWithoutReplacement'
    """

    def __new__(cls, *args: Any, replacement: bool = True, **kwargs: Any) -> Any:
        if cls is RandomSampler and isinstance(replacement, (bool, np.bool_)) and not replacement:
            return SamplerWithoutReplacement(*args, **kwargs)
        check_replacement(replacement, cls.__name__, variant=False)
        return super().__new__(cls)

    def __init__(self, *, replacement: bool = True) -> None:
        """``replacement`` was handled by ``__new__`` (only ``True`` reaches here)."""
        # an instance attribute: CPython 3.11 reads the class default of every draw slowly
        self._rng = None

    @property
    def draws_written_slots(self) -> bool:  # type: ignore[override]
        """True: ``torch.randint`` over ``[0, len(storage))``; a subclass that overrides
        :meth:`sample` is not taken on trust (``False``) unless it says so itself."""
        return type(self).sample is RandomSampler.sample

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[str, Any]]:
        if storage.compilable:
            count = storage.written_slots_tensor()
            if count is not None:
                return self._sample_compiled(count, batch_size), {}
        n = check_not_empty(storage)
        batch_size = check_batch_size(batch_size)
        rng = self._rng
        if rng is None:  # the same draws as generator=None, without the keyword's cost
            return torch.randint(n, (batch_size,)), {}
        return torch.randint(n, (batch_size,), generator=rng), {}

    def _sample_compiled(self, count: torch.Tensor, batch_size: int) -> torch.Tensor:
        """Uniform slots in ``[0, count)`` drawn with tensor ops only (no ``torch.randint``,
        whose bound ``torch.compile`` would specialize on): the path of storages that keep
        their count in a tensor (``compilable=True``)."""
        check_batch_size(batch_size)
        if not bool(count):
            check_not_empty([])  # raises the empty-storage error
        # float64: the product stays below ``count`` for any realistic count
        draw = torch.rand(batch_size, dtype=torch.float64, generator=self._rng)
        return (draw * count.to(draw.device)).long()


class BatchLargerThanBufferError(ValueError, RuntimeError):
    """A batch without replacement (``drop_last=True``) asked for more items than the buffer
    holds.

    A ``ValueError`` as in TorchRL, and a ``RuntimeError`` as tdreplay raised before.

    Examples
    --------
    >>> [issubclass(BatchLargerThanBufferError, e) for e in (ValueError, RuntimeError)]
    [True, True]
    """


def check_replacement(replacement: Any, owner: str, *, variant: bool) -> bool:
    """Check a sampler's ``replacement=`` argument (TorchRL's spelling of the choice between a
    sampler and its without-replacement variant) and return it as a bool.

    ``variant``: whether the sampler samples without replacement. A sampler with replacement
    that has no without-replacement variant refuses ``replacement=False`` with a
    ``TypeError`` (as TorchRL); a sampler without replacement refuses ``replacement=True``
    with a ``ValueError`` (TorchRL ignores it, which would sample otherwise than asked).

    Examples
    --------
    >>> check_replacement(False, "SamplerWithoutReplacement", variant=True)
    False
    >>> check_replacement(False, "PrioritizedSampler", variant=False)
    Traceback (most recent call last):
    ...
    TypeError: PrioritizedSampler has no without-replacement variant; ...
    """
    flag = check_flag(replacement, "replacement")
    if variant and flag:
        raise ValueError(f"{owner} samples without replacement: replacement=True contradicts "
                         "it (leave replacement out, or use the sampler with replacement).")
    if not variant and not flag:
        raise TypeError(f"{owner} has no without-replacement variant; cannot be instantiated "
                        "with replacement=False.")
    return flag


class SamplerWithoutReplacement(Sampler):
    """Draws each written slot exactly once per epoch, in shuffled (or storage) order.

    An epoch covers the slots written when it started. As TorchRL's, a sample that finds the
    storage holding more (or fewer) items than when the epoch started starts a new epoch over
    all of them. :attr:`ran_out` turns True with the batch that ends an epoch, which ends
    iteration over the buffer; the next epoch is drawn then (as TorchRL draws it).

    Parameters
    ----------
    drop_last : bool
        Drop the last batch of an epoch when it would be smaller than ``batch_size``. The
        buffer must then be built with a ``batch_size`` (``ValueError`` otherwise, as TorchRL:
        :attr:`requires_batch_size`).
    shuffle : bool
        Shuffle each epoch (``False`` walks the slots in storage order).
    replacement : bool
        TorchRL's ``replacement=``: only ``False`` (what this sampler does) is accepted.

    Raises
    ------
    BatchLargerThanBufferError
        From :meth:`sample` with ``drop_last=True`` when the buffer holds fewer items than a
        batch (a ``ValueError`` and a ``RuntimeError``).

    Examples
    --------
    >>> from tdreplay.core import ListStorage
    >>> s = ListStorage(10)
    >>> s.set(torch.arange(5), list("abcde"))
    >>> sampler = SamplerWithoutReplacement(shuffle=False)
    >>> [sampler.sample(s, 2)[0].tolist() for _ in range(3)], sampler.ran_out
    ([[0, 1], [2, 3], [4]], True)
    >>> _ = sampler.sample(s, 2)  # [0, 1]; then two items are written mid-epoch
    >>> s.set(torch.arange(5, 7), list("fg"))
    >>> sampler.sample(s, 7)[0].tolist()  # a new epoch over all 7 items
    [0, 1, 2, 3, 4, 5, 6]
    """

    finite_epochs = True
    stateful_draws = True  # the epoch's position

    def __init__(self, drop_last: bool = False, shuffle: bool = True, *,
                 replacement: bool = False) -> None:
        check_replacement(replacement, type(self).__name__, variant=True)
        self.drop_last = check_flag(drop_last, "drop_last")
        self.shuffle = check_flag(shuffle, "shuffle")
        self._order: torch.Tensor | None = None
        self._pos = 0
        self._ran_out = False

    def _start_epoch(self, n: int) -> None:
        self._order = torch.randperm(n, generator=self._rng) if self.shuffle else torch.arange(n)
        self._pos = 0
        self._ran_out = False

    def can_sample(self, storage: Storage, batch_size: int) -> bool:
        """As TorchRL's: with ``drop_last``, whether the storage holds a whole batch; else
        whether it holds any item.

        Examples
        --------
        >>> from tdreplay.core import ListStorage
        >>> storage = ListStorage(8)
        >>> storage.set(torch.arange(3), [0, 1, 2])
        >>> SamplerWithoutReplacement(drop_last=True).can_sample(storage, 4)
        False
        >>> SamplerWithoutReplacement().can_sample(storage, 4)
        True
        """
        count = self.sampleable_count(storage)
        return count >= batch_size if self.drop_last else count > 0

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[str, Any]]:
        check_batch_size(batch_size)
        n = check_not_empty(storage)
        if self.drop_last and n < batch_size:
            raise BatchLargerThanBufferError(
                f"The batch size ({batch_size}) is greater than the storage capacity ({n}): "
                "with drop_last=True no batch can be drawn without repeating items. Use a "
                "smaller batch, drop_last=False or a sampler with replacement.")
        # as TorchRL: an epoch is a permutation of the storage as long as it was when the epoch
        # started; a storage that grew (or shrank) since starts a new one over every item
        order = self._order
        remaining = 0 if order is None or order.numel() != n else order.numel() - self._pos
        if remaining == 0 or (self.drop_last and remaining < batch_size):
            self._start_epoch(n)
        perm = self._order
        assert perm is not None  # set by _start_epoch
        index = perm[self._pos: self._pos + batch_size]
        self._pos += index.numel()
        remaining = perm.numel() - self._pos
        ran_out = remaining == 0 or (self.drop_last and remaining < batch_size)
        if ran_out:
            # the next epoch is drawn now, as TorchRL draws it (the same draws from a seeded
            # generator); ``ran_out`` tells iteration to stop
            self._start_epoch(n)
        self._ran_out = ran_out
        return index, {}

    def draw_mark(self) -> tuple[torch.Tensor | None, int, bool]:
        """The epoch's order, position and ``ran_out``: references only (a draw moves the
        position and may start a new epoch, a new tensor; it never changes an order in
        place)."""
        return self._order, self._pos, self._ran_out

    def undo_draws(self, mark: tuple[torch.Tensor | None, int, bool]) -> None:
        """Back to the epoch and position of ``mark`` (see :meth:`Sampler.undo_draws`)."""
        self._order, self._pos, self._ran_out = mark

    @property
    def ran_out(self) -> bool:
        return self._ran_out

    @property
    def len_storage(self) -> int:
        """Number of items the current epoch covers (TorchRL's ``len_storage``): the storage's
        length at the last :meth:`sample`; ``0`` before the first one and after ``empty``.
        Read-only.

        Examples
        --------
        >>> from tdreplay.core import ListStorage
        >>> storage, sampler = ListStorage(8), SamplerWithoutReplacement()
        >>> storage.set(torch.arange(3), list("abc"))
        >>> sampler.len_storage
        0
        >>> _ = sampler.sample(storage, 2)
        >>> sampler.len_storage
        3
        """
        order = self._order
        return 0 if order is None else order.numel()

    @property
    def requires_batch_size(self) -> bool:
        """``drop_last``: only a known batch size tells which last batch is incomplete, so a
        buffer built without ``batch_size`` refuses this sampler with ``drop_last=True``."""
        return self.drop_last

    def empty(self) -> None:
        self._order = None
        self._pos = 0
        self._ran_out = False

    def state_dict(self) -> dict[str, Any]:
        return {
            "perm": torch.empty(0, dtype=torch.long) if self._order is None
            else self._order.clone(),
            "has_perm": self._order is not None,
            "pos": self._pos,
            "ran_out": self._ran_out,
        }

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """``ValueError`` unless ``state_dict`` has this sampler's keys, an int64 1-dim
        ``perm`` of the slots ``0..len(perm) - 1``, bool flags and a ``pos`` within the epoch:
        all checked before a buffer loads any of its parts."""
        super().check_state_dict(state_dict)
        if "perm" not in state_dict:
            return  # a subclass keeping its epoch in its own entries checks them itself
        perm = state_dict["perm"]
        if not isinstance(perm, torch.Tensor) or perm.dtype != torch.long or perm.ndim != 1:
            raise ValueError("SamplerWithoutReplacement state_dict 'perm' must be a 1-dim int64 "
                             "tensor.")
        n = perm.numel()
        if n and (int(perm.min()) < 0 or int(perm.max()) >= n
                  or int(torch.bincount(perm, minlength=n).max()) > 1):
            # an epoch is a permutation of the slots written when it began
            raise ValueError(f"SamplerWithoutReplacement state_dict 'perm' is not a "
                             f"permutation of the {n} slots of its epoch.")
        pos = state_dict["pos"]
        if not is_int(pos) or not 0 <= int(pos) <= perm.numel():
            raise ValueError(f"SamplerWithoutReplacement state_dict 'pos'={pos!r} is not an int "
                             f"within the epoch of {perm.numel()} slots.")
        for flag in ("has_perm", "ran_out"):
            if not isinstance(state_dict[flag], (bool, np.bool_)):
                raise ValueError(f"SamplerWithoutReplacement state_dict {flag!r} must be a bool, "
                                 f"got {state_dict[flag]!r}.")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.check_state_dict(state_dict)
        self._order = state_dict["perm"].clone() if state_dict["has_perm"] else None
        self._pos = int(state_dict["pos"])
        self._ran_out = bool(state_dict["ran_out"])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(drop_last={self.drop_last}, shuffle={self.shuffle})"
