"""``PrioritizedReplayBuffer`` and ``TensorDictPrioritizedReplayBuffer``.

The core buffers with a :class:`~tdreplay.samplers.prioritized.PrioritizedSampler` built for
their storage (``max_capacity`` = the storage's ``max_size``), its trees placed where the
storage lives unless ``sampler_device`` says otherwise. On top of the core buffers they pass the
sample's write generations with priority updates, so a priority computed for a row that was
overwritten meanwhile is dropped instead of landing on the new row.

``sync=False`` (as TorchRL's): the buffer samples through a
:class:`~tdreplay.samplers.DeferredPrioritizedSampler`, so that other processes can write into a
shared buffer (``shared=True`` with a ``LazyMemmapStorage`` or
``LazyTensorStorage(shared_init=True)``) while the process that built it keeps the priority
trees, catches up with their writes and samples by priority.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase

from tdreplay.core import (
    ListStorage,
    ReplayBuffer,
    Sampler,
    Storage,
    TensorDictReplayBuffer,
    Writer,
)
from tdreplay.core.utils import check_flag

from .deferred_prioritized import DeferredPrioritizedSampler
from .prioritized import PRIORITY_WEIGHT_KEY, PrioritizedSampler

__all__ = ["PrioritizedReplayBuffer", "TensorDictPrioritizedReplayBuffer"]


def _prioritized_sampler(storage: Storage, options: dict[str, Any], kwargs: dict[str, Any],
                         sync: bool) -> Sampler:
    """The buffer's sampler: ``kwargs["sampler"]`` (popped) when given and not None, as
    TorchRL's (``alpha``, ``beta``, ... then unused), else a :class:`PrioritizedSampler` built
    from ``options`` for ``storage``; behind a :class:`DeferredPrioritizedSampler` when not
    ``sync``."""
    check_flag(sync, "sync")
    sampler = kwargs.pop("sampler", None)
    if sampler is None:
        sampler = PrioritizedSampler(storage.max_size, **options)
        sampler.place_for(storage)
    elif options["device"] is not None:
        raise TypeError("sampler_device cannot be passed when sampler is provided (the "
                        "sampler's trees are where it was built).")
    elif not isinstance(sampler, Sampler):
        raise TypeError(f"sampler must be a Sampler, got {type(sampler).__name__}.")
    if sync:
        return sampler
    if not isinstance(sampler, PrioritizedSampler):
        raise TypeError(f"sync=False needs a PrioritizedSampler (its trees stay in this "
                        f"process), got sampler={type(sampler).__name__}.")
    if storage.ndim != 1:
        raise ValueError(f"prioritized buffers only support 1-D storages when sync=False, got "
                         f"storage.ndim={storage.ndim}.")
    return DeferredPrioritizedSampler(sampler)


class _PriorityUpdates(ReplayBuffer):
    """``update_priority`` that forwards the sample's write generations to the sampler, and
    ``sync`` / ``prioritized_sampler``."""

    def _follow_writes(self) -> None:
        """A ``sync=False`` buffer's sampler learns of writes from the buffer's writer."""
        if isinstance(self.sampler, DeferredPrioritizedSampler):
            self.sampler.follow(self.writer)

    @property
    def sync(self) -> bool:
        """False for a buffer built with ``sync=False`` (see the module docstring)."""
        return not isinstance(self.sampler, DeferredPrioritizedSampler)

    @property
    def prioritized_sampler(self) -> PrioritizedSampler:
        """The sampler that owns the priority trees: :attr:`sampler`, or with ``sync=False``
        the one the buffer keeps in this process (``RuntimeError`` in a worker process).

        Examples
        --------
        >>> rb = PrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=ListStorage(8), sync=False)
        >>> type(rb.sampler).__name__, type(rb.prioritized_sampler).__name__
        ('DeferredPrioritizedSampler', 'PrioritizedSampler')
        """
        sampler = self.sampler
        if isinstance(sampler, DeferredPrioritizedSampler):
            return sampler.prioritized
        if not isinstance(sampler, PrioritizedSampler):
            raise TypeError(f"this buffer samples with a {type(sampler).__name__}, not a "
                            "PrioritizedSampler.")
        return sampler

    def set_writer(self, writer: Writer) -> Writer:
        """Replace the writer (a ``sync=False`` buffer's sampler follows the new one)."""
        previous = super().set_writer(writer)
        self._follow_writes()
        return previous

    def set_sampler(self, sampler: Sampler) -> Sampler:
        """Replace the sampler (a :class:`DeferredPrioritizedSampler` follows the writer)."""
        previous = super().set_sampler(sampler)
        self._follow_writes()
        return previous


class PrioritizedReplayBuffer(_PriorityUpdates, ReplayBuffer):
    """A :class:`~tdreplay.core.ReplayBuffer` with proportional prioritized sampling.

    Parameters
    ----------
    alpha, beta, eps, dtype
        As :class:`PrioritizedSampler` (``eps`` defaults to ``1e-8``, ``dtype`` of the weights
        to ``torch.float``).
    storage : Storage, optional
        Defaults to ``ListStorage(1000)``; the sampler covers its ``max_size`` slots.
    sampler_device : str or torch.device, optional
        Where the priority trees live; by default where the storage lives (a CUDA storage gets
        CUDA trees, a CPU storage numba trees). E.g. CPU memmap storage + ``"cuda"`` trees.
    sampler_backend : {"numba", "torch"}, optional
        Tree backend (``backend`` of :class:`PrioritizedSampler`); by default numba on CPU.
    reduction, max_priority_within_buffer, stratified, skip_stale_updates
        As :class:`PrioritizedSampler`.
    sync : bool
        ``False``: other processes may write into the buffer (``shared=True`` or
        :meth:`~tdreplay.core.ReplayBuffer.share`, with a storage shared between processes);
        this process keeps the priority trees (:attr:`prioritized_sampler`) and catches up with
        their writes when it samples (:class:`~tdreplay.samplers.DeferredPrioritizedSampler`).
        Needs a storage of ``ndim == 1``. Defaults to True.
    **kwargs
        As :class:`~tdreplay.core.ReplayBuffer` (``writer``, ``batch_size``, ``transform``,
        ``generator``, ``shared``, ...). ``sampler``: as TorchRL's, a sampler given (not
        ``None``) is used instead of the one ``alpha``, ``beta``, ... would build (with
        ``sampler_device``: ``TypeError``).

    ``sample(..., return_info=True)`` returns ``info["priority_weight"]`` on the device of the
    sampled tensor and ``info["write_generation"]``; pass the latter back with
    ``update_priority(info["index"], priority, write_generation=info["write_generation"])``.

    Examples
    --------
    >>> rb = PrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=ListStorage(10), batch_size=3)
    >>> rb.extend([torch.tensor(float(i)) for i in range(5)]).tolist()
    [0, 1, 2, 3, 4]
    >>> data, info = rb.sample(return_info=True)
    >>> data.shape, info["priority_weight"].shape
    (torch.Size([3]), torch.Size([3]))
    >>> rb.update_priority(info["index"], torch.rand(3),
    ...                    write_generation=info["write_generation"])
    """

    def __init__(
        self,
        *,
        alpha: float,
        beta: float,
        eps: float = 1e-8,
        dtype: torch.dtype = torch.float,
        storage: Storage | None = None,
        sampler_device: str | torch.device | None = None,
        sampler_backend: str | None = None,
        reduction: str = "max",
        max_priority_within_buffer: bool = False,
        stratified: bool = False,
        skip_stale_updates: bool = True,
        sync: bool = True,
        **kwargs: Any,
    ) -> None:
        storage = storage if storage is not None else ListStorage(1000)
        sampler = _prioritized_sampler(storage, {
            "alpha": alpha, "beta": beta, "eps": eps, "dtype": dtype, "reduction": reduction,
            "max_priority_within_buffer": max_priority_within_buffer, "device": sampler_device,
            "backend": sampler_backend, "stratified": stratified,
            "skip_stale_updates": skip_stale_updates}, kwargs, sync)
        super().__init__(storage=storage, sampler=sampler, **kwargs)
        self._follow_writes()

    def attach_info(self, data: Any, info: dict[str, Any], only_missing: bool = False) -> Any:
        """Put ``info["priority_weight"]`` on the device of the sampled tensor (data unchanged)."""
        weight = info.get(PRIORITY_WEIGHT_KEY)
        device = getattr(data, "device", None)
        if isinstance(weight, torch.Tensor) and isinstance(device, torch.device) \
                and weight.device != device:
            info[PRIORITY_WEIGHT_KEY] = weight.to(device, non_blocking=True)
        return data


class TensorDictPrioritizedReplayBuffer(_PriorityUpdates, TensorDictReplayBuffer):
    """A :class:`~tdreplay.core.TensorDictReplayBuffer` with proportional prioritized sampling.

    Samples carry ``index``, ``priority_weight`` and ``write_generation``;
    :meth:`update_tensordict_priority` reads ``priority_key`` from a sample and updates the
    sampled slots (skipping those overwritten since). ``extend`` reads ``priority_key`` (when
    present) as the priorities of the new rows; rows without it get the max priority.

    Parameters
    ----------
    alpha, beta : float
        As :class:`PrioritizedSampler`.
    priority_key : str
        Entry holding priorities (``"td_error"``).
    eps, dtype, reduction, max_priority_within_buffer, stratified, skip_stale_updates
        As :class:`PrioritizedSampler`.
    storage : Storage, optional
        Defaults to ``ListStorage(1000)``.
    sampler_device : str or torch.device, optional
        Where the priority trees live; by default where the storage lives.
    sampler_backend : {"numba", "torch"}, optional
        Tree backend; by default numba on CPU, torch elsewhere.
    sync : bool
        ``False``: worker processes write into the shared buffer, this process keeps the
        priority trees (see :class:`PrioritizedReplayBuffer` and the example below).
    **kwargs
        As :class:`~tdreplay.core.TensorDictReplayBuffer`; ``sampler`` as in
        :class:`PrioritizedReplayBuffer`.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> from tdreplay.storages import LazyTensorStorage
    >>> rb = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(100),
    ...                                        batch_size=8)
    >>> data = TensorDict({"obs": torch.randn(10, 3), "td_error": torch.ones(10)}, [10])
    >>> rb.extend(data).tolist()
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    >>> sample = rb.sample()
    >>> sorted(k for k in sample.keys() if k != "obs")
    ['index', 'priority_weight', 'td_error', 'write_generation']
    >>> sample["td_error"] = torch.rand(8)
    >>> rb.update_tensordict_priority(sample)

    With ``sync=False`` and a storage shared between processes, worker processes (e.g.
    ``multiprocessing.Process(target=collect, args=(rb,))``) extend the buffer; the learner
    samples by priority, the rows written meanwhile at the max priority:

    >>> from tdreplay.storages import LazyMemmapStorage
    >>> rb = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, batch_size=4, shared=True,
    ...     sync=False, storage=LazyMemmapStorage(32, shared_init=True))
    >>> _ = rb.extend(TensorDict({"obs": torch.ones(8, 1)}, [8]))  # as a worker would
    >>> sample = rb.sample()
    >>> rb.prioritized_sampler.max_priority, sorted(sample.keys())[:2]
    (1.0, ['index', 'obs'])
    >>> sample["td_error"] = torch.full((4,), 3.0)
    >>> rb.update_tensordict_priority(sample)
    >>> rb.prioritized_sampler.max_priority
    3.0
    """

    def __init__(
        self,
        *,
        alpha: float,
        beta: float,
        priority_key: str = "td_error",
        eps: float = 1e-8,
        dtype: torch.dtype = torch.float,
        storage: Storage | None = None,
        sampler_device: str | torch.device | None = None,
        sampler_backend: str | None = None,
        reduction: str = "max",
        max_priority_within_buffer: bool = False,
        stratified: bool = False,
        skip_stale_updates: bool = True,
        sync: bool = True,
        **kwargs: Any,
    ) -> None:
        storage = storage if storage is not None else ListStorage(1000)
        sampler = _prioritized_sampler(storage, {
            "alpha": alpha, "beta": beta, "eps": eps, "dtype": dtype, "reduction": reduction,
            "max_priority_within_buffer": max_priority_within_buffer, "device": sampler_device,
            "backend": sampler_backend, "stratified": stratified,
            "skip_stale_updates": skip_stale_updates}, kwargs, sync)
        super().__init__(priority_key=priority_key, storage=storage, sampler=sampler, **kwargs)
        self._follow_writes()

    def extend(self, tensordicts: TensorDictBase, *, update_priority: bool | None = None
               ) -> Any:
        """As :meth:`~tdreplay.core.TensorDictReplayBuffer.extend`. With ``sync=False``, rows
        written by another process than the learner take no priorities from their data (they
        get the max priority when the learner catches up): ``update_priority=True`` there
        raises ``RuntimeError``, as TorchRL's."""
        update_priority = check_flag(update_priority, "update_priority", allow_none=True)
        if update_priority and not self.sampler.is_prioritized:
            raise RuntimeError(
                f"{type(self).__name__}.extend does not support updating priorities from "
                "writer processes (sync=False). Call update_tensordict_priority from the "
                "learner process instead.")
        return super().extend(tensordicts, update_priority=update_priority)

    def update_tensordict_priority(self, data: TensorDictBase) -> None:
        """As :meth:`~tdreplay.core.TensorDictReplayBuffer.update_tensordict_priority`;
        ``RuntimeError`` in a worker process of a ``sync=False`` buffer (the trees are the
        learner's)."""
        if not self.sync:
            _ = self.prioritized_sampler  # raises outside the learner
        super().update_tensordict_priority(data)
