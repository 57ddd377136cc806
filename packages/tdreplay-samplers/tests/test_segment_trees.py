"""Tests of the sum/min segment trees: both backends against each other and a numpy reference."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tdreplay.samplers import segment_trees as st_mod
from tdreplay.samplers.segment_trees import (
    FANOUT,
    MinSegmentTree,
    NumbaMinTree,
    NumbaSumTree,
    SegmentTree,
    SumSegmentTree,
    TorchMinTree,
    TorchSumTree,
    TreeLayout,
    _base,
    _factory,
    _layout,
    _numba,
    _numba_kernels,
    _torch,
)

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="CUDA not available")

# (backend, device) pairs; the numba tree and the torch tree on CPU always run.
BACKENDS = [
    pytest.param(("numba", "cpu"), id="numba"),
    pytest.param(("torch", "cpu"), id="torch-cpu"),
    pytest.param(("torch", "cuda"), id="torch-cuda", marks=needs_cuda),
]
TORCH_DEVICES = ["cpu"] + (["cuda"] if CUDA else [])
PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make(kind: str, capacity: int, backend: str, device: str, validate: bool | None = None
         ) -> SegmentTree:
    cls = SumSegmentTree if kind == "sum" else MinSegmentTree
    return cls(capacity, backend=backend, device=device, validate=validate)


def np_(x) -> np.ndarray:
    """Backend output -> numpy."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def flt(x) -> float:
    return float(np_(x))


def all_trees(kind: str, capacity: int) -> list[SegmentTree]:
    trees = [make(kind, capacity, "numba", "cpu")]
    trees += [make(kind, capacity, "torch", d) for d in TORCH_DEVICES]
    return trees


def raw(tree: SegmentTree) -> np.ndarray:
    """A copy of the whole flat node array (both backends share the layout), scratch zeroed."""
    arr = tree.nodes
    arr = arr.detach().cpu().numpy().copy() if isinstance(arr, torch.Tensor) else arr.copy()
    arr[TreeLayout.scratch] = 0.0
    return arr


def same_nodes(trees: list[SegmentTree]) -> np.ndarray:
    """Assert that every tree holds the same node array as the first; return that array."""
    nodes = [raw(t) for t in trees]
    for other in nodes[1:]:
        np.testing.assert_array_equal(nodes[0], other)
    return nodes[0]


def internal_nodes(layout: TreeLayout) -> list[np.ndarray]:
    """Positions of the nodes that have children, per level (root level first)."""
    blocks = [layout.level(d + 1) for d in range(layout.depth)]
    return [
        np.arange(layout.offsets[d], layout.offsets[d] + (b.stop - b.start) // FANOUT)
        for d, b in enumerate(blocks)
    ]


def check_nodes_reduce_children(nodes: np.ndarray, layout: TreeLayout, kind: str) -> None:
    """Every internal node is exactly the reduction of its 8 children (pairwise for sums)."""
    for level, positions in enumerate(internal_nodes(layout)):
        start = layout.offsets[level + 1]
        children = nodes[start : start + FANOUT * len(positions)].reshape(-1, FANOUT)
        if kind == "sum":
            pairs = children[:, 0::2] + children[:, 1::2]
            expected = (pairs[:, 0] + pairs[:, 1]) + (pairs[:, 2] + pairs[:, 3])
        else:
            expected = children.min(1)
        np.testing.assert_array_equal(nodes[positions], expected)


def ref_update(leaves: np.ndarray, idx, vals) -> None:
    for i, v in zip(np.asarray(idx).tolist(), np.broadcast_to(vals, len(idx)).tolist()):
        leaves[i] = v


def ref_scan(leaves: np.ndarray, masses: np.ndarray) -> np.ndarray:
    """Smallest i with cumsum[i] > m after clamping m to [0, total); exact for integer leaves."""
    csum = np.cumsum(leaves)
    total = csum[-1]
    m = np.where(masses >= 0, masses, 0.0)
    m = np.minimum(m, np.nextafter(total, -np.inf))
    return np.searchsorted(csum, m, side="right")


# ---------------------------------------------------------------------------------------------
# strategies
# ---------------------------------------------------------------------------------------------
@st.composite
def scenarios(draw, int_values: bool):
    capacity = draw(st.integers(1, 2000))
    n_batches = draw(st.integers(1, 6))
    batches = []
    for _ in range(n_batches):
        b = draw(st.integers(0, 64))
        # indices drawn from a small pool make duplicates likely
        pool = draw(st.lists(st.integers(0, capacity - 1), min_size=1, max_size=max(1, b // 2 + 1)))
        idx = draw(st.lists(st.sampled_from(pool), min_size=b, max_size=b))
        if int_values:
            vals = draw(st.lists(st.integers(0, 1000).map(float), min_size=b, max_size=b))
        else:
            vals = draw(
                st.lists(
                    st.one_of(
                        st.just(0.0),
                        st.floats(1e-12, 1e6, allow_nan=False, allow_infinity=False),
                    ),
                    min_size=b,
                    max_size=b,
                )
            )
        batches.append((np.array(idx, dtype=np.int64), np.array(vals, dtype=np.float64)))
    return capacity, batches


def apply(trees: list[SegmentTree], batch) -> None:
    idx, vals = batch
    for t in trees:
        if t.backend == "torch":
            t.update(torch.from_numpy(idx).to(t.device), torch.from_numpy(vals).to(t.device))
        else:
            t.update(idx, vals)


# ---------------------------------------------------------------------------------------------
# property tests: backends agree with each other and with numpy
# ---------------------------------------------------------------------------------------------
@PROPS
@given(scenarios(int_values=True), st.data())
def test_sum_tree_matches_reference_exactly_with_integer_values(scn, data):
    capacity, batches = scn
    trees = all_trees("sum", capacity)
    leaves = np.zeros(capacity)
    for batch in batches:
        apply(trees, batch)
        ref_update(leaves, *batch)
        same_nodes(trees)
        for t in trees:
            assert flt(t.total()) == leaves.sum()
            assert flt(t.sum()) == leaves.sum()
            np.testing.assert_array_equal(np_(t.get(np.arange(capacity))), leaves)
    # range queries
    start = data.draw(st.integers(0, capacity))
    end = data.draw(st.integers(start, capacity))
    for t in trees:
        assert flt(t.query(start, end)) == leaves[start:end].sum()
    # scan: any mass, boundaries included (integer sums are exact)
    total = leaves.sum()
    if total > 0:
        masses = np.concatenate(
            [
                np.array(data.draw(st.lists(st.floats(-10, total + 10), max_size=50))),
                np.cumsum(leaves)[:50],  # exact boundaries
                [0.0, total, np.nextafter(total, np.inf), total * 2, np.inf, -np.inf, np.nan],
            ]
        )
        expected = ref_scan(leaves, masses)
        for t in trees:
            got = np_(t.scan_lower_bound(masses))
            np.testing.assert_array_equal(got, expected)
            assert (leaves[got] > 0).all()


@PROPS
@given(scenarios(int_values=False), st.data())
def test_sum_tree_float_values_agree_and_never_hit_zero(scn, data):
    capacity, batches = scn
    trees = all_trees("sum", capacity)
    leaves = np.zeros(capacity)
    for batch in batches:
        apply(trees, batch)
        ref_update(leaves, *batch)
    same_nodes(trees)
    total = leaves.sum()
    for t in trees:
        assert math.isclose(flt(t.total()), total, rel_tol=1e-9, abs_tol=0.0)
        start = data.draw(st.integers(0, capacity))
        end = data.draw(st.integers(start, capacity))
        assert math.isclose(flt(t.query(start, end)), leaves[start:end].sum(), rel_tol=1e-9)
    if total == 0:
        return
    masses = np.concatenate(
        [
            np.array(data.draw(st.lists(st.floats(0, 1), max_size=64))) * total,
            np.cumsum(leaves)[:64],  # float boundaries: both backends must still agree
            [total, np.nextafter(total, np.inf), 1e300],
        ]
    )
    results = [np_(t.scan_lower_bound(masses)) for t in trees]
    for r in results[1:]:
        np.testing.assert_array_equal(results[0], r)
    got = results[0]
    assert ((got >= 0) & (got < capacity)).all()
    assert (leaves[got] > 0).all()
    # away from boundaries the numpy reference agrees
    csum = np.cumsum(leaves)
    gap = np.min(np.abs(masses[:, None] - csum[None, :]), axis=1)
    safe = (gap > 1e-9 * total) & (masses < total * (1 - 1e-9))
    np.testing.assert_array_equal(got[safe], ref_scan(leaves, masses[safe]))


@PROPS
@given(scenarios(int_values=False), st.data())
def test_min_tree_matches_reference(scn, data):
    capacity, batches = scn
    trees = all_trees("min", capacity)
    leaves = np.full(capacity, np.inf)
    for batch in batches:
        apply(trees, batch)
        ref_update(leaves, *batch)
        same_nodes(trees)
        for t in trees:
            assert flt(t.min()) == leaves.min()
    start = data.draw(st.integers(0, capacity))
    end = data.draw(st.integers(start, capacity))
    expected = leaves[start:end].min() if end > start else np.inf
    for t in trees:
        assert flt(t.query(start, end)) == expected
        np.testing.assert_array_equal(np_(t[np.arange(capacity)]), leaves)


# ---------------------------------------------------------------------------------------------
# scan: adversarial inputs
# ---------------------------------------------------------------------------------------------
def check_scan_valid(trees, leaves, masses):
    results = [np_(t.scan_lower_bound(masses)) for t in trees]
    for r in results:
        assert ((r >= 0) & (r < len(leaves))).all()
        assert (leaves[r] > 0).all(), leaves[r[leaves[r] <= 0]]
        np.testing.assert_array_equal(r, results[0])
    return results[0]


def special_masses(leaves: np.ndarray, total: float, rng) -> np.ndarray:
    csum = np.cumsum(leaves)
    near = np.concatenate([csum, np.nextafter(csum, np.inf), np.nextafter(csum, -np.inf)])
    return np.concatenate(
        [
            near,
            rng.random(1000) * total,
            [0.0, -1.0, total, np.nextafter(total, np.inf), np.nextafter(total, -np.inf)],
            [total * (1 + 1e-12), 1e308, np.inf, np.nan],
        ]
    )


def test_scan_tiny_values_next_to_huge_ones():
    rng = np.random.default_rng(0)
    capacity = 1000
    leaves = np.zeros(capacity)
    pos = rng.choice(capacity, 60, replace=False)
    leaves[pos] = rng.choice([1e-300, 5e-324, 1e-20, 1.0, 1e20, 1e300, 3.3e-16], 60)
    trees = all_trees("sum", capacity)
    apply(trees, (np.arange(capacity), leaves))
    total = flt(trees[0].total())
    check_scan_valid(trees, leaves, special_masses(leaves, total, rng))


@pytest.mark.parametrize("capacity", [1, 2, 3, 7, 1000, 1025])
def test_scan_many_zeros_single_nonzero_leaf(capacity):
    rng = np.random.default_rng(capacity)
    for leaf in {0, capacity // 2, capacity - 1}:
        leaves = np.zeros(capacity)
        leaves[leaf] = 1e-5
        trees = all_trees("sum", capacity)
        apply(trees, (np.arange(capacity), leaves))
        got = check_scan_valid(trees, leaves, special_masses(leaves, 1e-5, rng))
        assert (got == leaf).all()


def test_scan_mass_at_or_above_total_returns_last_nonzero_leaf():
    leaves = np.array([0.0, 2.0, 0.0, 3.0, 0.0, 0.0])
    trees = all_trees("sum", 6)
    apply(trees, (np.arange(6), leaves))
    got = check_scan_valid(trees, leaves, np.array([5.0, 5.0 + 1e-12, 6.0, np.inf]))
    assert got.tolist() == [3, 3, 3, 3]
    got = check_scan_valid(trees, leaves, np.array([-1.0, 0.0, np.nan, 1.999, 2.0]))
    assert got.tolist() == [1, 1, 1, 1, 3]


def test_scan_after_many_random_updates_has_no_drift():
    rng = np.random.default_rng(1)
    capacity = 4099  # not a power of two
    trees = all_trees("sum", capacity)
    leaves = np.zeros(capacity)
    scale = 10.0 ** rng.integers(-30, 30, size=100_000)
    vals = rng.random(100_000) * scale
    vals[rng.random(100_000) < 0.3] = 0.0
    idx = rng.integers(0, capacity, size=100_000)
    for k in range(0, 100_000, 1000):
        batch = (idx[k : k + 1000], vals[k : k + 1000])
        apply(trees, batch)
        ref_update(leaves, *batch)
    tree = same_nodes(trees)
    # every internal node is exactly the sum of its children: nothing accumulated
    layout = trees[0].layout
    check_nodes_reduce_children(tree, layout, "sum")
    np.testing.assert_array_equal(tree[layout.leaf_offset : layout.leaf_offset + capacity], leaves)
    total = flt(trees[0].total())
    assert math.isclose(total, math.fsum(leaves), rel_tol=1e-12)
    check_scan_valid(trees, leaves, special_masses(leaves, total, rng))


def test_scan_regression_rounding_in_right_descent():
    """Without clamping m below the right child, this mass ends on the zero leaf 7.

    ``m - left`` rounds up to the right child's value on the way down (found by fuzzing).
    """
    leaves = np.array(
        [
            float.fromhex(h)
            for h in (
                "0x0.0p+0",
                "0x1.f9cf800000000p-21",
                "0x0.0p+0",
                "0x0.0p+0",
                "0x1.34dd400000000p+9",
                "0x0.0p+0",
                "0x1.47bc200000000p+15",
                "0x0.0p+0",
            )
        ]
    )
    mass = float.fromhex("0x1.4c8f95001f9cfp+15")
    trees = all_trees("sum", 8)
    apply(trees, (np.arange(8), leaves))
    assert mass < flt(trees[0].total())
    got = check_scan_valid(trees, leaves, np.array([mass]))
    assert got.tolist() == [6]


@pytest.mark.parametrize("seed", range(40))
def test_scan_random_adversarial_trees_never_hit_zero(seed):
    """Wide dynamic range and rounding-prone sums; masses at every float boundary."""
    rng = np.random.default_rng(100 + seed)
    capacity = int(rng.integers(1, 300))
    leaves = np.where(
        rng.random(capacity) < 0.5,
        0.0,
        rng.random(capacity) * 10.0 ** rng.integers(-18, 18, size=capacity),
    )
    if not leaves.any():
        leaves[rng.integers(capacity)] = 1.0
    trees = all_trees("sum", capacity)
    apply(trees, (np.arange(capacity), leaves))
    # tree sums in tree order, so probe masses at the tree's own internal prefix boundaries too
    total = flt(trees[0].total())
    internal = raw(trees[0])
    extra = np.concatenate([internal, np.nextafter(internal, -np.inf)])
    extra = extra[np.isfinite(extra)]
    check_scan_valid(trees, leaves, np.concatenate([special_masses(leaves, total, rng), extra]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_scan_output_shape_and_scalar(backend):
    tree = make("sum", 5, *backend)
    tree.update(np.array([1, 3]), 1.0)
    out = tree.scan_lower_bound(np.array([[0.5, 1.5], [0.0, 1.9]]))
    assert np_(out).tolist() == [[1, 3], [1, 3]]
    assert np_(out).dtype == np.int64
    assert int(np_(tree.scan_lower_bound(1.5))) == 3
    empty = np_(tree.scan_lower_bound(np.zeros(0)))
    assert empty.shape == (0,) and empty.dtype == np.int64


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b.values[0][1] == "cpu"])
def test_scan_on_empty_tree_raises(backend):
    tree = make("sum", 5, *backend)
    with pytest.raises(ValueError, match="total"):
        tree.scan_lower_bound(np.array([0.5]))


# ---------------------------------------------------------------------------------------------
# update semantics and cost
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_duplicate_indices_last_occurrence_wins(backend):
    tree = make("sum", 10, *backend)
    tree.update(np.array([3, 3, 5, 3, 5, 7]), np.array([1.0, 2.0, 3.0, 4.0, 0.0, 6.0]))
    assert np_(tree.get(np.array([3, 5, 7]))).tolist() == [4.0, 0.0, 6.0]
    assert flt(tree.total()) == 10.0
    mtree = make("min", 10, *backend)
    mtree.update(np.array([2, 2, 2]), np.array([1.0, 9.0, 5.0]))
    assert flt(mtree.min()) == 5.0


@pytest.mark.parametrize("device", TORCH_DEVICES)
def test_torch_duplicates_are_deterministic_for_large_batches(device):
    rng = np.random.default_rng(2)
    idx = rng.integers(0, 50, size=100_000)
    vals = rng.random(100_000)
    expected = np.zeros(50)
    ref_update(expected, idx, vals)
    for _ in range(3):
        tree = TorchSumTree(50, device=device)
        tree.update(torch.from_numpy(idx).to(device), torch.from_numpy(vals).to(device))
        np.testing.assert_array_equal(np_(tree.get(np.arange(50))), expected)
        ntree = NumbaSumTree(50)
        ntree.update(idx, vals)
        np.testing.assert_array_equal(raw(tree), raw(ntree))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["sum", "min"])
def test_update_touches_only_the_paths_of_the_updated_leaves(backend, kind):
    """O(B log C): only leaves in the batch and their ancestors change."""
    rng = np.random.default_rng(3)
    capacity = 100_003
    tree = make(kind, capacity, *backend)
    tree.update(np.arange(capacity), rng.random(capacity) + 1.0)
    before = raw(tree)
    idx = rng.integers(0, capacity, size=500)
    tree.update(idx, rng.random(500) + 0.5)
    changed = np.flatnonzero(raw(tree) != before)
    layout = tree.layout
    allowed = set()
    for leaf in idx.tolist():
        for level in range(layout.depth, -1, -1):
            allowed.add(layout.offsets[level] + (leaf >> (3 * (layout.depth - level))))
    assert set(changed.tolist()) <= allowed
    assert len(changed) <= len(idx) * (layout.depth + 1)
    check_nodes_reduce_children(raw(tree), layout, kind)


@pytest.mark.parametrize("backend", BACKENDS)
def test_big_capacity_small_batches(backend):
    """Capacity 10**7: hundreds of 1000-item updates + scans (would be hopeless if O(C))."""
    rng = np.random.default_rng(4)
    capacity = 10**7
    tree = make("sum", capacity, *backend)
    leaves = {}
    for _ in range(300):
        idx = rng.integers(0, capacity, size=1000)
        vals = rng.random(1000) + 0.1
        tree.update(idx, vals)
        for i, v in zip(idx.tolist(), vals.tolist()):
            leaves[i] = v
        out = np_(tree.scan_lower_bound(rng.random(1000) * flt(tree.total())))
        assert all(o in leaves for o in out.tolist())
    assert math.isclose(flt(tree.total()), math.fsum(leaves.values()), rel_tol=1e-9)
    del tree


@pytest.mark.parametrize("backend", BACKENDS)
def test_scalar_value_and_shapes(backend):
    tree = make("sum", 6, *backend)
    tree.update(np.array([[0, 1], [2, 3]]), 2.5)
    assert flt(tree.total()) == 10.0
    assert np_(tree.get(np.array([[0, 1], [4, 5]]))).tolist() == [[2.5, 2.5], [0.0, 0.0]]
    assert flt(tree[3]) == 2.5
    tree[4] = 1.0
    assert flt(tree.total()) == 11.0
    tree.update(np.array([], dtype=np.int64), np.array([]))
    assert flt(tree.total()) == 11.0
    assert len(tree) == 6


@pytest.mark.parametrize("backend", BACKENDS)
def test_inputs_of_the_other_kind_are_accepted(backend):
    tree = make("sum", 8, *backend)
    tree.update(torch.tensor([1, 2], dtype=torch.int32), torch.tensor([1.0, 2.0]))
    tree.update(np.array([3], dtype=np.int16), np.array([3.0], dtype=np.float32))
    tree.update([4, 5], [4.0, 5.0])
    assert flt(tree.total()) == 15.0
    assert np_(tree.scan_lower_bound(torch.tensor([0.5, 14.5]))).tolist() == [1, 5]
    assert np_(tree.scan_lower_bound([0.5, 14.5])).tolist() == [1, 5]


def test_numba_kernels_compile_once():
    tree = NumbaSumTree(100)
    tree.update(np.arange(5, dtype=np.int32), np.ones(5, dtype=np.float32))
    tree.update(torch.arange(5), torch.ones(5))
    tree.update([1, 2], 3)
    tree.scan_lower_bound(np.array([0.5], dtype=np.float32))
    tree.scan_lower_bound([1, 2])
    tree.query(1, 3)
    NumbaMinTree(7).update(np.array([1]), np.array([1.0]))
    NumbaSumTree(100).rebuild()
    NumbaMinTree(100).rebuild()
    kernels = (_numba_kernels.update_sum, _numba_kernels.update_min, _numba_kernels.scan,
               _numba_kernels.rebuild_sum, _numba_kernels.rebuild_min)
    for kernel in kernels:
        assert len(kernel.signatures) == 1, kernel


# ---------------------------------------------------------------------------------------------
# state, rebuild, construction and errors
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["sum", "min"])
@pytest.mark.parametrize("src", BACKENDS)
@pytest.mark.parametrize("dst", BACKENDS)
def test_state_dict_round_trip_across_backends(kind, src, dst):
    rng = np.random.default_rng(5)
    a = make(kind, 777, *src)
    idx = rng.integers(0, 777, size=300)
    a.update(idx, rng.random(300))
    sd = a.state_dict()
    assert set(sd) == {"capacity", "values"}
    assert sd["capacity"] == 777
    assert sd["values"].dtype == torch.float64 and sd["values"].device.type == "cpu"
    assert sd["values"].shape == (777,)
    b = make(kind, 777, *dst)
    b.update(np.array([1, 2]), np.array([100.0, 200.0]))  # overwritten by the load
    b.load_state_dict(sd)
    np.testing.assert_array_equal(raw(a), raw(b))
    masses = rng.random(100)
    if kind == "sum":
        masses *= flt(a.total())
        np.testing.assert_array_equal(
            np_(a.scan_lower_bound(masses)), np_(b.scan_lower_bound(masses))
        )
    # the state is a copy
    sd["values"].fill_(3.0)
    np.testing.assert_array_equal(raw(a), raw(b))


@pytest.mark.parametrize("backend", BACKENDS)
def test_load_state_dict_errors_leave_tree_unchanged(backend):
    tree = make("sum", 10, *backend)
    tree.update(np.arange(10), np.arange(10.0))
    before = raw(tree)
    good = tree.state_dict()
    bad = [
        ({"capacity": 11, "values": torch.zeros(11, dtype=torch.float64)}, "capacity"),
        ({"capacity": 10, "values": torch.zeros(9, dtype=torch.float64)}, "values"),
        ({"capacity": 10}, "values"),
        ({"values": good["values"]}, "capacity"),
        ({"capacity": "ten", "values": good["values"]}, "capacity"),
        ({"capacity": 10, "values": [1.0] * 10}, "values"),
        ("not a dict", "state_dict"),
    ]
    for sd, word in bad:
        with pytest.raises(ValueError, match=word):
            tree.load_state_dict(sd)
        np.testing.assert_array_equal(raw(tree), before)
    # numpy values are accepted, other float dtypes are converted
    tree.load_state_dict({"capacity": 10, "values": np.ones(10, dtype=np.float32)})
    assert flt(tree.total()) == 10.0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["sum", "min"])
def test_rebuild_recomputes_internal_nodes(backend, kind):
    rng = np.random.default_rng(6)
    tree = make(kind, 1000, *backend)
    tree.update(np.arange(1000), rng.random(1000))
    before = raw(tree)
    for positions in internal_nodes(tree.layout):
        tree.nodes[positions] = -7.0
    assert (raw(tree) != before).any()
    tree.rebuild()
    np.testing.assert_array_equal(raw(tree), before)


def test_factory_dispatch_and_attributes():
    t = SumSegmentTree(10)
    assert type(t) is NumbaSumTree and isinstance(t, SumSegmentTree) and isinstance(t, SegmentTree)
    assert (t.backend, t.capacity, t.device) == ("numba", 10, torch.device("cpu"))
    t = SumSegmentTree(10, backend="torch")
    assert type(t) is TorchSumTree and t.backend == "torch" and t.device.type == "cpu"
    assert type(SumSegmentTree(10, device="cpu")) is NumbaSumTree
    assert type(MinSegmentTree(10)) is NumbaMinTree
    m = MinSegmentTree(10, backend="torch", device="cpu")
    assert type(m) is TorchMinTree and isinstance(m, MinSegmentTree)
    assert type(TorchSumTree(3)) is TorchSumTree
    assert "capacity=10" in repr(m)
    for capacity, depth, leaves in [(1, 1, 1), (8, 1, 8), (9, 2, 16), (64, 2, 64), (65, 3, 128),
                                    (10**6, 7, 2**20), (2**20 + 1, 7, 2**20 + 2**18)]:
        layout = TreeLayout(capacity)
        assert (layout.depth, layout.leaf_count) == (depth, leaves)
        assert all(offset % FANOUT == 0 for offset in layout.offsets)
        assert layout.size - layout.leaf_offset >= capacity


@pytest.mark.parametrize("kind", ["sum", "min"])
@pytest.mark.parametrize("capacity", [1, 2, 3])
@pytest.mark.parametrize("backend", BACKENDS)
def test_tiny_capacities(kind, capacity, backend):
    tree = make(kind, capacity, *backend)
    ident = 0.0 if kind == "sum" else math.inf
    assert flt(tree.query()) == ident
    tree.update(np.array([capacity - 1]), np.array([2.0]))
    assert flt(tree.query()) == 2.0
    assert flt(tree.query(0, 0)) == ident
    if kind == "sum":
        assert np_(tree.scan_lower_bound(np.array([0.0, 1.0, 5.0]))).tolist() == [capacity - 1] * 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_inputs(backend):
    """With validation on (the default on CPU; asked for here on CUDA, where it syncs)."""
    tree = make("sum", 10, *backend, validate=True)
    for cap, exc in [(-1, ValueError), (0, ValueError), (2.5, TypeError), (True, TypeError)]:
        with pytest.raises(exc, match="capacity"):
            make("sum", cap, *backend, validate=True)
    tree.update(np.array([1]), np.array([1.0]))
    before = raw(tree)
    for idx in ([10], [-1], [0, 3, 12]):
        with pytest.raises(IndexError, match="index"):
            tree.update(np.array(idx), 1.0)
        with pytest.raises(IndexError, match="index"):
            tree.get(np.array(idx))
    with pytest.raises(TypeError, match="index"):
        tree.update(np.array([1.0]), 1.0)
    with pytest.raises(TypeError, match="index"):
        tree.get(torch.tensor([True]))
    with pytest.raises(ValueError, match="value"):
        tree.update(np.array([1, 2]), np.array([1.0, 2.0, 3.0]))
    for start, end in [(-1, 3), (3, 2), (0, 11)]:
        with pytest.raises(IndexError, match="start"):
            tree.query(start, end)
    np.testing.assert_array_equal(raw(tree), before)
    with pytest.raises(ValueError, match="backend"):
        SumSegmentTree(10, backend="jax")


def test_numba_backend_rejects_devices_and_validate_false():
    with pytest.raises(ValueError, match="device"):
        NumbaSumTree(10, device="cuda")
    with pytest.raises(ValueError, match="device"):
        NumbaSumTree(10).to("cuda")
    with pytest.raises(ValueError, match="validate"):
        NumbaMinTree(10, validate=False)
    with pytest.raises(ValueError, match="backend"):
        NumbaSumTree(10, backend="torch")
    t = NumbaSumTree(10)
    assert t.to("cpu") is t


@pytest.mark.parametrize("kind", ["sum", "min"])
@pytest.mark.parametrize("device", TORCH_DEVICES)
def test_torch_without_validation_ignores_out_of_range_indices(kind, device):
    """The CUDA default (no host sync): bad indices are dropped, reads give the identity."""
    tree = make(kind, 10, "torch", device, validate=None if device == "cuda" else False)
    assert not tree.validate
    ref = make(kind, 10, "torch", "cpu")
    tree.update(torch.tensor([1, -1, 10, 3, 99, 3]), torch.tensor([1.0, 5.0, 6.0, 2.0, 7.0, 4.0]))
    ref.update(torch.tensor([1, 3]), torch.tensor([1.0, 4.0]))
    ident = 0.0 if kind == "sum" else math.inf
    np.testing.assert_array_equal(raw(tree), raw(ref))
    assert np_(tree.get(torch.tensor([1, -5, 3, 10]))).tolist() == [1.0, ident, 4.0, ident]
    if kind == "sum":
        tree.update(torch.tensor([1, 3]), 0.0)
        assert int(tree.scan_lower_bound(torch.tensor([0.5]))) == 0  # empty: leaf 0, no raise


def test_torch_to_moves_the_tree():
    tree = TorchSumTree(5)
    tree.update(torch.tensor([2]), torch.tensor([3.0]))
    assert tree.to("cpu") is tree
    assert tree.device == torch.device("cpu") and tree.validate
    if CUDA:
        tree.to("cuda")
        assert tree.device.type == "cuda" and not tree.validate
        assert int(tree.scan_lower_bound(torch.tensor([1.0], device="cuda"))) == 2
        tree.to("cpu")
        assert flt(tree.total()) == 3.0


@needs_cuda
def test_cuda_operations_do_not_sync_the_host():
    tree = TorchSumTree(100_000, device="cuda")
    mtree = TorchMinTree(100_000, device="cuda")
    idx = torch.randint(0, 100_000, (4096,), device="cuda")
    vals = torch.rand(4096, device="cuda", dtype=torch.float64) + 0.1
    masses = torch.rand(4096, device="cuda", dtype=torch.float64)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        tree.update(idx, vals)
        mtree.update(idx, vals)
        out = tree.scan_lower_bound(masses * tree.total())
        tree.update(out, vals * 2)
        tree.get(out)
        mtree.min()
        tree.query(10, 5000)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    ref = NumbaSumTree(100_000)
    ref.update(idx.cpu().numpy(), vals.cpu().numpy())
    assert out.device.type == "cuda"
    np.testing.assert_array_equal(np_(out), ref.scan_lower_bound(np_(masses) * ref.total()))


def test_doctests():
    for mod in (st_mod, _layout, _base, _numba_kernels, _numba, _torch, _factory):
        result = doctest.testmod(mod, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert result.failed == 0, mod.__name__
