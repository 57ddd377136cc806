"""The steps of ``sample`` between the sampler's draw and the read-side transforms.

:class:`ReadPathMixin` is one of the rooms :class:`~tdreplay.core.ReplayBuffer` is built from.
``sample`` draws ``(index, info)`` from the sampler under the buffer's lock, then:

1. :meth:`~ReadPathMixin._read_sampled` reads the items (lock held) through
   :meth:`~ReadPathMixin._get_drawn`, which skips the storage's second range check when the
   sampler draws written slots only;
2. the buffer collates them and :meth:`~ReadPathMixin._complete_sample` finishes the batch with
   the lock released (a subclass such as :class:`~tdreplay.core.HERReplayBuffer` relabels here);
3. :meth:`~ReadPathMixin.attach_info` writes ``index``, ``priority_weight``, ... into it.

With a sampler whose draws change state, the lock stays held through steps 2 and 3 and the
read-side transforms, and a step that raises undoes the draw (:mod:`tdreplay.core.buffer_draw`).
Subclasses override these hooks, never ``sample`` itself.
"""

from __future__ import annotations

from typing import Any

from .sample_units import SampleUnit
from .sampler import Sampler
from .storage import Storage
from .utils import check_flag


class ReadPathMixin:
    """The read-path hooks of ``sample`` (mixed into :class:`~tdreplay.core.ReplayBuffer`)."""

    _storage: Storage
    _sampler: Sampler
    _sample_unit: SampleUnit | None

    def _read_sampled(self, index: Any, info: dict[str, Any]) -> tuple[Any, Any]:
        """Read the sampled items at ``index``, the lock held: ``(items, extra)``.

        ``extra`` is what a subclass reads from the storage besides the items, under the same
        lock (e.g. :class:`~tdreplay.core.HERReplayBuffer`: the relabelling goals), handed
        to :meth:`_complete_sample`; ``None`` here.
        """
        return self._get_drawn(index), None

    def _get_drawn(self, index: Any) -> Any:
        """The storage's items at ``index``, just drawn by the sampler (lock held): read
        without checking again when the sampler draws written slots only and no sample unit
        changed them (:meth:`~tdreplay.core.Storage.get_trusted`)."""
        if self._sample_unit is None and self._sampler.draws_written_slots:
            return self._storage.get_trusted(index)
        return self._storage.get(index)

    def _complete_sample(self, data: Any, info: dict[str, Any], extra: Any) -> Any:
        """The collated batch, before ``info`` goes in and the read-side transforms run, with
        the lock released (held for a sampler with stateful draws); a subclass finishes it with
        ``extra`` (as is here)."""
        return data

    def attach_info(self, data: Any, info: dict[str, Any], only_missing: bool = False) -> Any:
        """Write the sampler's ``info`` (``index``, ``priority_weight``, ...) into a sampled
        batch and return it; identity here, TensorDict buffers set the entries.

        ``only_missing``: set only the entries ``data`` lacks (after read-side transforms).

        Examples
        --------
        >>> from tdreplay.core import ReplayBuffer
        >>> rb = ReplayBuffer()
        >>> rb.attach_info([1, 2], {"index": [0, 1]})
        [1, 2]
        """
        check_flag(only_missing, "only_missing")
        return data
