"""``ImmutableDatasetWriter``: the writer of read-only datasets, which refuses every write."""

from __future__ import annotations

from typing import Any, NoReturn

from tdreplay.core import Writer


class ImmutableDatasetWriter(Writer):
    """A writer that refuses every write: datasets are read-only.

    Dataset replay buffers (e.g. ``MinariExperienceReplay``) use it so that ``add``,
    ``extend``, ``empty`` and in-place edits (``rb[i] = x``, ``set_``, ``set_at_``,
    ``update_``, ``write_all``) raise instead of changing the dataset (whose converted files
    later buffers read). They raise ``RuntimeError`` before anything changes; sampling,
    indexing and checkpointing work as usual.

    Examples
    --------
    >>> import torch
    >>> from tdreplay.core import ListStorage, ReplayBuffer
    >>> rb = ReplayBuffer(storage=ListStorage(4), writer=ImmutableDatasetWriter())
    >>> try:
    ...     rb.extend([torch.zeros(1)])
    ... except RuntimeError as err:
    ...     print(err)
    Cannot extend an immutable dataset: its ImmutableDatasetWriter refuses every write.
    >>> len(rb), rb.write_count
    (0, 0)
    """

    def _refuse(self, operation: str) -> NoReturn:
        raise RuntimeError(
            f"Cannot {operation} an immutable dataset: its {type(self).__name__} refuses every "
            "write."
        )

    def add(self, data: Any) -> NoReturn:
        """Always raises ``RuntimeError``: a dataset cannot be written to."""
        self._refuse("add to")

    def extend(self, data: Any) -> NoReturn:
        """Always raises ``RuntimeError``: a dataset cannot be written to."""
        self._refuse("extend")

    def check_edit(self) -> NoReturn:
        """Always raises ``RuntimeError``: a dataset's items cannot be changed in place
        (``rb[i] = x``, ``set_``, ``set_at_``, ``update_``, ``write_all``: the buffer asks
        before anything changes)."""
        self._refuse("edit")

    def check_empty(self) -> NoReturn:
        """Always raises ``RuntimeError``: a dataset cannot be emptied (``rb.empty()`` asks
        before anything changes), as TorchRL's."""
        self._refuse("empty")

    def empty(self, empty_write_count: bool = True) -> NoReturn:
        """Always raises ``RuntimeError``: a dataset cannot be emptied."""
        self._refuse("empty")
