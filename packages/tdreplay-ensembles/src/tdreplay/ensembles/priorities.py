"""The priority updates of a :class:`~tdreplay.ensembles.ReplayBufferEnsemble`: an ensemble
index (``sample["index"]``) goes to each member's sampler (see
:meth:`SamplerEnsemble.update_priority <tdreplay.ensembles.SamplerEnsemble.update_priority>`).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch
from tensordict import TensorDictBase

from tdreplay.core import ReplayBuffer, Sampler, Storage

__all__ = ["EnsemblePrioritiesMixin"]


class EnsemblePrioritiesMixin:
    """``update_priority`` and ``update_tensordict_priority`` of
    :class:`~tdreplay.ensembles.ReplayBufferEnsemble`, mixed in before
    :class:`~tdreplay.core.ReplayBuffer`."""

    _rbs: tuple[ReplayBuffer, ...]
    _lock: AbstractContextManager[Any]
    _sampler: Sampler
    _storage: Storage

    def update_priority(self, index: Any, priority: Any, *,
                        write_generation: Any = None) -> None:
        """Set the priorities of ``index``, an ensemble index (``sample["index"]``, or a list of
        its parts), through each member's sampler (:meth:`SamplerEnsemble.update_priority`).

        Every part's ``"buffer_ids"`` must hold integer ids of one member of the ensemble
        (``TypeError`` for a non-integer dtype, ``IndexError`` for an id outside
        ``[0, len(rb) - 1]``, which is never counted from the end, ``ValueError`` for a part
        naming several members, each naming ``buffer_ids``), checked before any member's
        priorities change: a refused index changes nothing. ``write_generation`` (the
        sample's ``"write_generation"``, of the index's shape) lets each prioritized member
        skip the rows overwritten since the sample, as a prioritized buffer's own update does.

        Examples
        --------
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tdreplay.samplers import TensorDictPrioritizedReplayBuffer
        >>> from tdreplay.ensembles import ReplayBufferEnsemble
        >>> from tdreplay.storages import LazyTensorStorage
        >>> members = [TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=0.4,
        ...                                              storage=LazyTensorStorage(4))
        ...            for _ in range(2)]
        >>> for member in members:
        ...     _ = member.extend(TensorDict({"x": torch.zeros(4)}, [4]))
        >>> rb = ReplayBufferEnsemble(*members, sample_from_all=True, batch_size=8)
        >>> s = rb.sample()
        >>> _ = members[1].extend(TensorDict({"x": torch.ones(4)}, [4]))  # overwritten since
        >>> rb.update_priority(s["index"], torch.full(s.shape, 10.0),
        ...                    write_generation=s["write_generation"])
        >>> round(members[1].sampler.total_priority, 3)  # its new rows keep priority 1 each
        4.0
        >>> members[0].sampler.total_priority > 4.0  # the other member's drawn rows: 10 each
        True
        """
        extra = {} if write_generation is None else {"write_generation": write_generation}
        with self._lock:
            self._sampler.update_priority(index, priority, storage=self._storage, **extra)

    def update_tensordict_priority(self, data: TensorDictBase) -> None:
        """Update priorities from a sample: ``data[priority_key]`` (the members' common
        ``priority_key``) at ``data["index"]``, with ``data["write_generation"]`` when present
        (see :meth:`update_priority`); ``KeyError`` naming what is missing.

        Examples
        --------
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tdreplay.samplers import TensorDictPrioritizedReplayBuffer
        >>> from tdreplay.ensembles import ReplayBufferEnsemble
        >>> from tdreplay.storages import LazyTensorStorage
        >>> members = [TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=0.4,
        ...                                              storage=LazyTensorStorage(4))
        ...            for _ in range(2)]
        >>> for member in members:
        ...     _ = member.extend(TensorDict({"x": torch.zeros(4)}, [4]))
        >>> rb = ReplayBufferEnsemble(*members, sample_from_all=True, batch_size=4)
        >>> sample = rb.sample()
        >>> sample["td_error"] = torch.full(sample.shape, 5.0)
        >>> rb.update_tensordict_priority(sample)
        >>> members[0].sampler.total_priority > 4.0
        True
        """
        keys = {getattr(rb, "priority_key", None) for rb in self._rbs}
        if len(keys) != 1 or None in keys:
            raise TypeError(f"update_tensordict_priority needs members that share one "
                            f"priority_key (TensorDict buffers), got {sorted(map(str, keys))}; "
                            "call update_priority(index, priority) instead.")
        (key,) = keys
        missing = [name for name in ("index", key) if data.get(name, None) is None]
        if missing:
            raise KeyError(f"update_tensordict_priority needs {missing} in data.")
        index, priority = data.get("index"), data.get(key)
        if isinstance(priority, torch.Tensor) and priority.ndim > len(index.batch_size) \
                and all(size == 1 for size in priority.shape[len(index.batch_size):]):
            priority = priority.reshape(index.batch_size)  # ([..., 1] as a member's method)
        self.update_priority(index, priority,
                             write_generation=data.get("write_generation", None))
