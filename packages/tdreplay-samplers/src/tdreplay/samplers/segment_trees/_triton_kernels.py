"""The Triton kernels of :mod:`._triton`, defined where Triton is installed (Triton is no
dependency of this package: :mod:`._triton` imports this module only where it is).

Triton decides at import whether the kernels are compiled or run by its interpreter
(``TRITON_INTERPRET=1``), so that holds for the whole process.
"""

from __future__ import annotations

import importlib.util

from ._reductions import MIN_POSITIVE, SUM

#: Whether Triton is installed, and so the kernels defined.
AVAILABLE = importlib.util.find_spec("triton") is not None

if AVAILABLE:
    import triton
    import triton.language as tl

    # what the kernels may read of the module (Triton reads constexpr globals only)
    _SUM = tl.constexpr(SUM)
    _MIN_POSITIVE = tl.constexpr(MIN_POSITIVE)

    @triton.jit
    def _children(block, live):
        """The 8 children at ``block`` (``0.0`` in the lanes that are not ``live``)."""
        return (tl.load(block + 0, mask=live, other=0.0), tl.load(block + 1, mask=live, other=0.0),
                tl.load(block + 2, mask=live, other=0.0), tl.load(block + 3, mask=live, other=0.0),
                tl.load(block + 4, mask=live, other=0.0), tl.load(block + 5, mask=live, other=0.0),
                tl.load(block + 6, mask=live, other=0.0), tl.load(block + 7, mask=live, other=0.0))

    @triton.jit
    def _below(x):
        """``nextafter(x, -inf)`` for float64 ``x > 0``: the bits minus one."""
        return (x.to(tl.int64, bitcast=True) - 1).to(tl.float64, bitcast=True)

    @triton.jit
    def _step(m, go, left, right):
        """One binary step: where going right, ``min(m - left, below(right))``."""
        return tl.where(go, tl.minimum(m - left, _below(right)), m)

    @triton.jit
    def descent(tree, offsets, mass, limit, out, n, DEPTH: tl.constexpr, BLOCK: tl.constexpr):
        """Walk each of the ``n`` masses from the root to its leaf (``out``): at each level, over
        the 8 children of the node at ``tree + offsets[level] + 8 * node``, the binary steps of
        ``_numba_kernels.scan`` over halves, pairs and children."""
        lanes = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        live = lanes < n
        m = tl.load(mass + lanes, mask=live, other=0.0)
        m = tl.minimum(tl.where(m >= 0.0, m, 0.0), tl.load(limit))  # into [0, limit]; NaN -> 0
        node = tl.zeros([BLOCK], dtype=tl.int64)
        for level in tl.static_range(1, DEPTH + 1):
            block = tree + tl.load(offsets + level) + node * 8
            c0, c1, c2, c3, c4, c5, c6, c7 = _children(block, live)
            left_half = (c0 + c1) + (c2 + c3)
            go_half = m >= left_half
            m = _step(m, go_half, left_half, (c4 + c5) + (c6 + c7))
            q0 = tl.where(go_half, c4, c0)
            q1 = tl.where(go_half, c5, c1)
            q2 = tl.where(go_half, c6, c2)
            q3 = tl.where(go_half, c7, c3)
            left_pair = q0 + q1
            go_pair = m >= left_pair
            m = _step(m, go_pair, left_pair, q2 + q3)
            d0 = tl.where(go_pair, q2, q0)
            d1 = tl.where(go_pair, q3, q1)
            go_child = m >= d0
            m = _step(m, go_child, d0, d1)
            node = (node * 8 + go_half.to(tl.int64) * 4 + go_pair.to(tl.int64) * 2
                    + go_child.to(tl.int64))
        tl.store(out + lanes, node, mask=live)

    @triton.jit
    def _lesser(a, b):
        """The lesser of ``a`` and ``b``, NaN if either is (as ``torch.minimum``)."""
        return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)

    @triton.jit
    def _positive(c):
        """``c`` where it is positive, else ``+inf`` (NaN too: ``torch.where(c > 0, c, inf)``)."""
        return tl.where(c > 0.0, c, float("inf"))

    @triton.jit
    def _recompute(children, parents, node, live, OP: tl.constexpr):
        """Store at ``parents + node`` the reduction of the 8 ``children`` at ``8 * node``, as
        :class:`~._torch.TorchSumTree` / :class:`~._torch.TorchMinTree` reduce a block, pairwise
        in the same order (``OP``: ``SUM``, ``MIN`` or ``MIN_POSITIVE``)."""
        c0, c1, c2, c3, c4, c5, c6, c7 = _children(children + node * 8, live)
        if OP == _SUM:
            value = ((c0 + c1) + (c2 + c3)) + ((c4 + c5) + (c6 + c7))
        else:
            if OP == _MIN_POSITIVE:
                c0 = _positive(c0)
                c1 = _positive(c1)
                c2 = _positive(c2)
                c3 = _positive(c3)
                c4 = _positive(c4)
                c5 = _positive(c5)
                c6 = _positive(c6)
                c7 = _positive(c7)
            # halves, then pairs, then the last two (``_torch._block_minima``)
            q0 = _lesser(c0, c4)
            q1 = _lesser(c1, c5)
            q2 = _lesser(c2, c6)
            q3 = _lesser(c3, c7)
            value = _lesser(_lesser(q0, q2), _lesser(q1, q3))
        tl.store(parents + node, value, mask=live)

    @triton.jit(do_not_specialize=["n", "shift"])
    def refresh_level(index, n, shift, children0, parents0, children1, parents1, children2,
                      parents2, OP0: tl.constexpr, OP1: tl.constexpr, OP2: tl.constexpr,
                      TREES: tl.constexpr, EVERY: tl.constexpr, BLOCK: tl.constexpr):
        """Recompute ``n`` nodes of one level in each of ``TREES`` (1 to 3) trees of one layout
        (tree ``k``: its level ``parents<k>`` from its blocks of 8 ``children<k>``, reduced
        with ``OP<k>``): the nodes ``index[j] >> shift`` (ancestors of leaves, duplicates
        allowed: they store the same value), or with ``EVERY`` the nodes ``0 .. n - 1``."""
        lanes = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        live = lanes < n
        if EVERY:
            node = lanes
        else:
            node = tl.load(index + lanes, mask=live, other=0) >> shift
        _recompute(children0, parents0, node, live, OP0)
        if TREES > 1:
            _recompute(children1, parents1, node, live, OP1)
        if TREES > 2:
            _recompute(children2, parents2, node, live, OP2)
