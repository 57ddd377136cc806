"""A buffer's sample unit: what each anchor its sampler draws becomes (``sample_unit=``).

:class:`SampleUnitMixin` is one of the rooms :class:`~tdreplay.core.ReplayBuffer` is built
from: ``sample`` expands the sampler's anchors through the unit (under the buffer's lock,
before the storage is read), and ``update_tensordict_priority`` hands a unit that expands
anchors into windows the per-record priorities to reduce to its anchors.
"""

from __future__ import annotations

from typing import Any

import torch

from .sample_units import SampleUnit
from .storage import Storage


class SampleUnitMixin:
    """``sample_unit`` (mixed into :class:`~tdreplay.core.ReplayBuffer`).

    Examples
    --------
    >>> from tdreplay.core import ReplayBuffer
    >>> from tdreplay.core.sample_units import Transition
    >>> rb = ReplayBuffer(sample_unit=Transition())
    >>> type(rb.sample_unit).__name__
    'Transition'
    >>> ReplayBuffer(sample_unit=object())  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: sample_unit must be a SampleUnit instance (...) or None, got object.
    """

    _storage: Storage
    _sample_unit: SampleUnit | None = None

    @property
    def sample_unit(self) -> SampleUnit | None:
        """What each drawn anchor becomes (``None``: one record, as :class:`Transition`)."""
        return self._sample_unit

    def set_sample_unit(self, sample_unit: SampleUnit | None) -> None:
        """Expand the anchors of later samples with ``sample_unit`` (``None``: do not)."""
        if sample_unit is not None and not isinstance(sample_unit, SampleUnit):
            raise TypeError("sample_unit must be a SampleUnit instance (Transition, Sequence, "
                            f"...) or None, got {type(sample_unit).__name__}.")
        self._sample_unit = sample_unit

    def _expand_anchors(self, index: Any, info: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """The sampler's ``index`` and ``info`` through the sample unit (the caller holds the
        lock, and calls this only when a sample unit is set)."""
        unit = self._sample_unit
        assert unit is not None
        return unit.expand(index, info, self._storage)

    def _anchor_priority(self, data: Any, priority: Any
                         ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(anchors, priorities)`` when the sample unit routes record priorities to anchors."""
        if self._sample_unit is None:
            return None
        return self._sample_unit.anchor_priority(data, priority)
