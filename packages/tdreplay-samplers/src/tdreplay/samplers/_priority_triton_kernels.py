"""The Triton kernels of :mod:`._priority_triton`, defined where Triton is installed (as
:mod:`.segment_trees._triton_kernels`, which says why this module is imported only there).
"""

from __future__ import annotations

import importlib.util

#: Whether Triton is installed, and so the kernels defined.
AVAILABLE = importlib.util.find_spec("triton") is not None

if AVAILABLE:
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["n"])
    def find_refused(priority, leaf, limit, refused, n, BLOCK: tl.constexpr):
        """Raise ``refused[0]`` to 1 if one of the ``n`` float64 ``priority`` values is NaN,
        infinite or negative, or its stored value ``leaf`` exceeds ``limit[0]`` (one atomic
        per program)."""
        lanes = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        live = lanes < n
        p = tl.load(priority + lanes, mask=live, other=0.0)
        stored = tl.load(leaf + lanes, mask=live, other=0.0)
        accepted = (p >= 0.0) & (p < float("inf")) & (stored <= tl.load(limit))  # NaN fails
        tl.atomic_max(refused, tl.max(tl.where(live & ~accepted, 1, 0), axis=0))

    @triton.jit(do_not_specialize=["n", "capacity", "n_written"])
    def keep_updates(index, priority, leaf, generation, token, refused, target, kept_leaf,
                     kept_priority, n, capacity, n_written, HAS_TOKEN: tl.constexpr,
                     BLOCK: tl.constexpr):
        """Which of the ``n`` updates apply: none if ``refused[0]``, else those whose slot
        ``index`` is in ``[0, capacity)``, below ``n_written``, written (generation ``> 0``)
        and, with ``HAS_TOKEN``, still of the generation ``token``. Writes ``target`` (the slot,
        ``-1`` where skipped), ``kept_leaf`` (``leaf``, ``1.0`` where skipped) and
        ``kept_priority`` (``priority``, ``-inf`` where skipped)."""
        lanes = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        live = lanes < n
        slot = tl.load(index + lanes, mask=live, other=-1)
        gen = tl.load(generation + tl.minimum(tl.maximum(slot, 0), capacity - 1), mask=live,
                      other=0)
        keep = ((slot >= 0) & (slot < capacity) & (slot < n_written) & (gen > 0)
                & (tl.load(refused) == 0))
        if HAS_TOKEN:
            keep = keep & (gen == tl.load(token + lanes, mask=live, other=0))
        tl.store(target + lanes, tl.where(keep, slot, -1), mask=live)
        stored = tl.load(leaf + lanes, mask=live, other=1.0)
        tl.store(kept_leaf + lanes, tl.where(keep, stored, 1.0), mask=live)
        p = tl.load(priority + lanes, mask=live, other=0.0)
        tl.store(kept_priority + lanes, tl.where(keep, p, float("-inf")), mask=live)
