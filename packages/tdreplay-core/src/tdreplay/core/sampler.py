"""The :class:`Sampler` contract and the default :class:`RandomSampler`."""

from __future__ import annotations

import abc
import warnings
from typing import Any

import torch

from ._stateful import StateDictCheckpointMixin
from .storage import Storage
from .utils import check_batch_size, check_not_empty


class Sampler(StateDictCheckpointMixin, abc.ABC):
    """Chooses which slots a batch is made of.

    Contract:

    - ``sample(storage, batch_size) -> (index, info)``: ``index`` is an int64 tensor of flat
      slots (any shape; the batch takes that shape), ``info`` a dict of extra per-item tensors
      (e.g. ``priority_weight``) the buffer attaches to the sample when asked.
    - ``extend(slots)`` / ``add(slot)``: told which slots were just written;
      ``mark_update(slots)`` which were overwritten by index assignment; ``mark_edited(keys)``
      which entries were edited in place.
    - ``update_priority(index, priority)``: prioritized samplers only.
    - ``ran_out``: True once an epoch is over (samplers without replacement); the buffer's
      iterator stops there.
    - ``requires_batch_size``: True when the buffer must have a ``batch_size`` (checked when
      the buffer is built and by ``set_sampler``).
    - ``state_dict`` / ``load_state_dict`` / ``dumps`` / ``loads``: the whole sampling state.
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

    @abc.abstractmethod
    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[str, Any]]:
        """Return ``(index, info)`` for a batch of ``batch_size`` items."""

    def extend(self, slots: torch.Tensor) -> None:
        """Called after ``slots`` were written."""

    def add(self, slot: int) -> None:
        """Called after one slot was written."""
        self.extend(torch.as_tensor([slot], dtype=torch.long))

    def mark_update(self, slots: torch.Tensor) -> None:
        """Called after ``slots`` were overwritten by index assignment (``rb[i] = ...``)."""
        self.extend(slots)

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

    def check_priority(self, priority: Any) -> None:
        """Raise as ``update_priority`` would on these values, changing nothing.

        Buffers call it before writing rows whose priorities come with the data, so bad
        priorities are refused before the buffer changes. Nothing to check here.
        """

    def item_info(self, slots: torch.Tensor) -> dict[str, torch.Tensor]:
        """The :attr:`update_keys` entries describing ``slots`` as they are now.

        A buffer refreshes them in a batch it has just written (e.g. a sample written back),
        so that a later priority update from that batch is not taken for a stale one.
        """
        return {}

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

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.check_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class RandomSampler(Sampler):
    """Uniform sampling with replacement over the written slots.

    Examples
    --------
    >>> from tdreplay.core import ListStorage
    >>> s = ListStorage(10)
    >>> s.set(torch.arange(3), ["a", "b", "c"])
    >>> index, info = RandomSampler().sample(s, 5)
    >>> index.shape, bool(((index >= 0) & (index < 3)).all())
    (torch.Size([5]), True)
    """

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[str, Any]]:
        n = check_not_empty(storage)
        check_batch_size(batch_size)
        return torch.randint(0, n, (batch_size,), generator=self._rng), {}
