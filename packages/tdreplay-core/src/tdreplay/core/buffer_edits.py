"""In-place edits of a buffer's stored items: ``rb[i] = ...``, ``set_``, ``set_at_``, ``update_``.

:class:`InPlaceEditsMixin` is one of the rooms :class:`~tdreplay.core.ReplayBuffer` is built
from: every edit holds the buffer's lock and tells the sampler which slots or entries changed
(so priorities and trajectory boundaries follow the data): ``rb[i] = ...`` calls
:meth:`~tdreplay.core.Sampler.mark_rewritten` of the slots rewritten, in this buffer's sampler
and in those of the other buffers of the storage. As a write, an edit in a forked child
of a buffer it cannot share raises ``NotShareableError`` (its edit would be lost to the others).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

from tensordict import is_tensor_collection

from .sampler import Sampler
from .storage import Storage
from .transform_state import write_side_undone_on_failure
from .utils import check_flag, leading_dim
from .writer import Writer

SelfT = TypeVar("SelfT", bound="InPlaceEditsMixin")


class InPlaceEditsMixin:
    """Index assignment and in-place entry edits (mixed into :class:`ReplayBuffer`)."""

    _storage: Storage
    _sampler: Sampler
    _writer: Writer
    _lock: AbstractContextManager[Any]

    if TYPE_CHECKING:  # what the buffer this is mixed into provides
        def _write_side(self, data: Any) -> Any: ...
        def _swap_value(self, index: Any, value: Any) -> tuple[Any, Any]: ...
        def _check_writing_process(self) -> None: ...
        def _check_storage_writers(self, action: str) -> None: ...
        def _tell_readers_edited(self, keys: Any) -> None: ...
        def _tell_readers_rewritten(self, slots: Any) -> None: ...

    @write_side_undone_on_failure
    def __setitem__(self, index: Any, value: Any) -> None:
        # along dim_extend, as TorchRL's (tdreplay.core.buffer_dim_extend)
        index, value = self._swap_value(index, self._write_side(value))
        with self._lock:
            self._check_editable()  # a forked child edits only what is shared; a dataset not
            self._sampler.check_edit()
            self._sampler.check_write(value)
            rows = self._storage.index_to_rows(index, value)
            slots = self._storage.rows_to_slots(rows).reshape(-1)
            value = self._writer.prepare_assignment(value, slots)  # (the writer's own entries)
            written = self._storage.rows_written
            self._storage[index] = value
            appended = self._storage.rows_written - written
            if appended > 0:  # rows past the written ones (write_all)
                self._writer.rows_appended(written, appended)
            generations = self._storage.slot_generations  # (tracked by a writer)
            if generations is not None:  # a rewritten row is another record
                generations.bump(rows, self._storage.rows_capacity)
            # rewritten, not written afresh: a prioritized sampler keeps the slots' priorities
            # (as TorchRL's rb[i] = ...), a slice sampler finds the trajectories again
            self._sampler.mark_rewritten(slots)
            self._tell_readers_rewritten(slots)  # the other buffers of the storage

    def _check_editable(self) -> None:
        """Raise before an in-place edit changes anything: in a forked child of a buffer it
        cannot share (the edit would be lost to the others), or when a writer of the storage
        refuses edits (a read-only dataset's)."""
        self._check_writing_process()
        self._check_storage_writers("edit")

    def write_all(self, data: Any, end: int | None = None) -> None:
        """Write ``data`` back in physical order: ``rb[:end] = data``.

        ``end`` defaults to the leading size of ``data``.
        """
        if end is None:
            end = leading_dim(data)
        self[:end] = data

    def set_(self: SelfT, key: Any, value: Any) -> SelfT:
        """Set entry ``key`` of every written row in place: ``value`` is laid out as the
        storage holds the rows (``rb.storage[:][key]``; for an ``ndim=2`` storage time-major
        ``[T, envs]``, not ``rb[:]``'s ``[envs, T]``), as TorchRL's ``set_``.

        Examples
        --------
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tdreplay.core import ReplayBuffer
        >>> from tdreplay.storages import LazyTensorStorage
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(8))
        >>> _ = rb.extend(TensorDict({"r": torch.zeros(3)}, [3]))
        >>> _ = rb.set_("r", torch.tensor([1.0, 2.0, 3.0]))
        >>> rb[:]["r"].tolist()
        [1.0, 2.0, 3.0]
        """
        with self._lock:
            self._check_editable()
            self._storage.set_key(key, value)
            self._sampler.mark_edited([key])
            self._tell_readers_edited([key])
        return self

    def set_at_(self: SelfT, key: Any, value: Any, index: Any) -> SelfT:
        """Set entry ``key`` at storage rows ``index`` in place (``rb.storage[:]``'s
        layout, as :meth:`set_`).

        Examples
        --------
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tdreplay.core import ReplayBuffer
        >>> from tdreplay.storages import LazyTensorStorage
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(8))
        >>> _ = rb.extend(TensorDict({"r": torch.zeros(3)}, [3]))
        >>> _ = rb.set_at_("r", torch.tensor([7.0]), torch.tensor([1]))
        >>> rb[:]["r"].tolist()
        [0.0, 7.0, 0.0]
        """
        with self._lock:
            self._check_editable()
            self._storage.set_key(key, value, index)
            self._sampler.mark_edited([key])
            self._tell_readers_edited([key])
        return self

    def update_(self: SelfT, input_dict_or_td: Any, clone: bool = False, *,
                keys_to_update: Any = None) -> SelfT:
        """Update the written rows in place from a dict or TensorDict laid out as the
        storage holds them (see :meth:`set_`); ``keys_to_update``: only these entries.

        Examples
        --------
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tdreplay.core import ReplayBuffer
        >>> from tdreplay.storages import LazyTensorStorage
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(4))
        >>> _ = rb.extend(TensorDict({"r": torch.zeros(2), "d": torch.zeros(2)}, [2]))
        >>> _ = rb.update_({"r": torch.tensor([1.0, 2.0]), "d": torch.ones(2)},
        ...                keys_to_update=["r"])
        >>> rb[:]["r"].tolist(), rb[:]["d"].tolist()
        ([1.0, 2.0], [0.0, 0.0])
        """
        check_flag(clone, "clone")
        with self._lock:
            self._check_editable()
            self._storage.update_(input_dict_or_td, clone=clone, keys_to_update=keys_to_update)
            if keys_to_update is not None:
                edited = list(keys_to_update)
            elif is_tensor_collection(input_dict_or_td):
                edited = list(input_dict_or_td.keys(include_nested=True, leaves_only=True))
            elif isinstance(input_dict_or_td, dict):
                edited = list(input_dict_or_td)
            else:
                edited = None
            self._sampler.mark_edited(edited)
            self._tell_readers_edited(edited)
        return self

