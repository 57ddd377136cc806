"""The error a memory-mapped storage raises when its files cannot be trusted."""

from __future__ import annotations


class DamagedStorageError(RuntimeError):
    """The files of a memory-mapped storage reopened from its ``scratch_dir`` (``existsok=True``,
    another process, a pickled copy) are not what its layout says: a data file missing or of
    another size, a layout or config file that does not parse, counters past the capacity, a
    state file that lost them, or a record of an unfinished write that no writer makes (or
    whose journal cannot be read). Raised instead of mapping zeros where committed rows were,
    or dropping rows a damaged record names; the files are left as they are.
    """

    __module__ = "tdreplay.storages.memmap_storage"  # where it is imported from (and named)
