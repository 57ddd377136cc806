"""How a tensor storage allocates the leaves it is about to fill (imports no storage).

The policy, for the memory of a storage's first layout (:func:`allocate_unfilled`):

- **No zero fill.** The rows are about to be written; zeroing them first touches every page
  once more (a 1M-row first fill spent most of its time there). The memory is left
  uninitialised, so the storage itself must never expose a row it did not write: its ``set``
  refuses a write past the rows written so far that would skip rows, and the write path
  zero-fills any row it would skip over all the same (see ``_row_writes.before_write`` and
  :class:`~tdreplay.storages.tensor_storage.TensorStorage`).
- **Huge pages for large CPU leaves**, without an environment variable: a CPU leaf of at least
  :data:`HUGE_PAGE_MIN_BYTES` is allocated by numpy, whose allocator asks Linux to back large
  arrays with transparent huge pages (``madvise(MADV_HUGEPAGE)``, honoured when
  ``/sys/kernel/mm/transparent_hugepage/enabled`` is ``madvise`` or ``always``). Random row
  reads of a large storage then miss the TLB far less. Smaller leaves use ``torch.empty``.
  Their first byte is on a cache line (:data:`CACHE_LINE`), as ``torch.empty``'s is.
- Other devices: ``torch.empty`` on that device.

The tensors are ordinary CPU tensors: they pickle, ``share_memory_()`` and ``copy_`` as any.

Examples
--------
>>> x = allocate_unfilled(torch.Size([4, 3]), torch.float32, torch.device("cpu"))
>>> x.shape, x.dtype, x.is_contiguous()
(torch.Size([4, 3]), torch.float32, True)
>>> big = allocate_unfilled(torch.Size([1 << 20, 8]), torch.float32, torch.device("cpu"))
>>> big.untyped_storage().nbytes() == (1 << 20) * 8 * 4, big.data_ptr() % CACHE_LINE
(True, 0)
"""

from __future__ import annotations

import math

import numpy as np
import torch

#: CPU leaves at least this large come from numpy's allocator, which advises huge pages for
#: allocations of 4 MiB and more. Huge pages pay off in random reads of large storages (issue
#: 19: uniform ``sample(4096)`` at 100M rows, 1,055 -> 1,788/s) and in the first fill: one page
#: fault per 2 MiB instead of per 4 KiB. A 1M-row first fill (277-byte rows, 10k-row extends,
#: 2-core VM) runs at 13-21M rows/s on huge pages against 4.4-6.5M on 4 KiB pages. A virtual
#: machine can make the first touch of huge pages slow: with free page reporting (the benchmark
#: guest boots with ``page_reporting_order=11``), free blocks of 8 MiB and more are handed back
#: to the host, and touching them again faults into the host. 2 MiB pages come from such
#: blocks, 4 KiB pages mostly from memory freed shortly before. Measured on such a 2-core guest
#: (2026-11-27, three runs): a process's first 1M-row fill ran at 1.6-5.4M rows/s, its next two
#: at 29-41M (memory the process had just freed); 277 MB of new huge pages filled in 0.55 s, or
#: in 0.016-0.021 s right after 18 GiB had been touched, against 0.10 s on 4 KiB pages; the
#: kernel's compaction stalls stayed at 0. cpprb's numpy arrays pay the same (3.0-3.2M rows/s
#: on its first fill). (An earlier 1 GiB threshold was set from a slow figure that came from
#: buffers kept alive by a reference cycle until a gc pass, so that every new buffer needed
#: fresh huge pages; a dropped buffer now frees its memory at once.)
HUGE_PAGE_MIN_BYTES = 4 << 20
#: where the leaves numpy allocates begin: on a cache line, as ``torch.empty``'s do. numpy's
#: large allocations begin 16 bytes past a page (its allocator's header), which costs every
#: 64-byte-multiple row a cache line more and slows the copies into the storage: extends of
#: 1,000 transition rows (277 bytes) into 1M rows, 31 / 23 / 31 us a call on aligned leaves
#: against 39 / 33 / 37 on leaves 16 bytes off (three rounds, same process, 2026-11-29).
CACHE_LINE = 64


def allocate_unfilled(shape: torch.Size, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A contiguous tensor of ``shape`` and ``dtype`` on ``device`` whose values are
    unspecified (not zero-filled): see the module's policy."""
    if device.type != "cpu":
        return torch.empty(shape, dtype=dtype, device=device)
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = math.prod(shape) * itemsize
    if nbytes < HUGE_PAGE_MIN_BYTES:
        return torch.empty(shape, dtype=dtype)
    raw = np.empty(nbytes + CACHE_LINE - 1, dtype=np.uint8)
    start = -raw.ctypes.data % CACHE_LINE
    # (the tensor's storage begins at the aligned byte: offset 0, exactly ``nbytes`` long)
    return torch.from_numpy(raw[start:start + nbytes]).view(dtype).reshape(shape)
