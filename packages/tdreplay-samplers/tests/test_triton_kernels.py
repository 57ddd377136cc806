"""The Triton kernels of the CUDA segment trees: the sum tree's one-kernel descent (the same
leaves as the numba scan, for every mass, capacity and edge case) and the recomputation of the
ancestors of updated leaves (the same nodes as the tensor ops and the numba kernels). With a GPU
they run compiled on CUDA; without one, under Triton's interpreter on the host: Triton reads
``TRITON_INTERPRET=1`` when it is first imported (and tensordict imports it), so
``test_kernel_tests_pass_under_the_interpreter`` runs this file again in a child process started
with it."""

from __future__ import annotations

import importlib.util
import math
import os
import pickle
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

from tdreplay.core import ListStorage
from tdreplay.samplers import PrioritizedSampler
from tdreplay.samplers.segment_trees import (
    NumbaMinOverSumTree,
    NumbaMinTree,
    NumbaSumTree,
    TorchMinOverSumTree,
    TorchMinTree,
    TorchSumTree,
    TreeLayout,
    _triton,
)
from tdreplay.samplers.segment_trees._torch import update_together

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if importlib.util.find_spec("triton") is None:
    pytest.skip("needs Triton (the samplers' test extra)", allow_module_level=True)
#: Whether the kernel runs in this process: compiled on a GPU, or under the interpreter
RUNS_HERE = DEVICE == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
KERNEL_TESTS = 36


@pytest.mark.skipif(RUNS_HERE, reason="the kernel tests run in this process")
def test_kernel_tests_pass_under_the_interpreter():
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=importlib",
         "-o", "consider_namespace_packages=true", __file__],
        env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=600)
    summary = child.stdout.strip().splitlines()[-1] if child.stdout.strip() else child.stderr
    assert child.returncode == 0, child.stdout[-4000:] + child.stderr[-2000:]
    assert re.search(rf"\b{KERNEL_TESTS} passed\b", summary), summary  # two-GPU test: skipped


@pytest.fixture(autouse=True)
def kernel_runs_here(request, monkeypatch):
    """The kernel runs in this process (else the test is skipped: the child process runs it);
    no launch has failed yet."""
    if request.node.name == "test_kernel_tests_pass_under_the_interpreter":
        return
    if not RUNS_HERE:
        pytest.skip("runs in the child process of test_kernel_tests_pass_under_the_interpreter")
    monkeypatch.setattr(_triton, "_failed", set())
    assert _triton.runs_on(torch.device(DEVICE))


def served_calls(monkeypatch, module, name: str, served) -> list[bool]:
    """Wrap ``module.name`` for the test: the list it returns gets ``served(result)`` of each
    call."""
    calls: list[bool] = []
    function = getattr(module, name)

    def counting(*args, **kwargs):
        result = function(*args, **kwargs)
        calls.append(served(result))
        return result

    monkeypatch.setattr(module, name, counting)
    return calls


@pytest.fixture
def launches(monkeypatch):
    """Whether each scan ran in the kernel (it returns ``None`` where it could not run)."""
    return served_calls(monkeypatch, _triton, "descend", lambda leaves: leaves is not None)


def filled(capacity: int, seed: int) -> tuple[TorchSumTree, NumbaSumTree]:
    """The same random priorities (a seventh of them zero) in a device tree and a numba tree."""
    g = torch.Generator().manual_seed(seed)
    index = torch.randint(0, capacity, (min(capacity, 500),), generator=g)
    values = torch.rand(index.shape, generator=g, dtype=torch.float64)
    values[::7] = 0.0
    values[0] = 1.0
    device_tree = TorchSumTree(capacity, device=DEVICE, validate=False)
    host_tree = NumbaSumTree(capacity)
    device_tree.update(index.to(DEVICE), values.to(DEVICE))
    host_tree.update(index.numpy(), values.numpy())
    return device_tree, host_tree


@pytest.mark.parametrize("capacity", [1, 2, 7, 8, 9, 64, 65, 1000, 4097, 100_000])
def test_leaves_match_the_numba_scan(capacity, launches):
    device_tree, host_tree = filled(capacity, seed=capacity)
    total = float(host_tree.total())
    g = torch.Generator().manual_seed(1)
    masses = torch.cat([
        torch.rand(2000, generator=g, dtype=torch.float64) * 1.2 * total - 0.1 * total,
        torch.tensor([0.0, total, np.nextafter(total, 0.0), math.nan, -1.0, math.inf],
                     dtype=torch.float64),
    ])
    leaves = device_tree.scan_lower_bound(masses.to(DEVICE))
    assert launches == [True]
    assert leaves.dtype == torch.int64 and leaves.device.type == DEVICE
    expected = host_tree.scan_lower_bound(masses.numpy())
    np.testing.assert_array_equal(leaves.cpu().numpy(), expected)


def test_every_leaf_is_reached_at_its_own_prefix_sums(launches):
    """Masses at each leaf's lower edge and just below its upper edge land on it."""
    priorities = torch.tensor([0.5, 0.0, 2.0, 1e-300, 3.0, 0.0, 0.25, 7.0, 1.0], dtype=torch.float64)
    tree = TorchSumTree(len(priorities), device=DEVICE, validate=False)
    tree.update(torch.arange(len(priorities), device=DEVICE), priorities.to(DEVICE))
    edges = torch.cumsum(priorities, 0) - priorities
    live = (priorities > 1e-200).nonzero().flatten()
    lower = edges[live]
    upper = torch.nextafter(edges[live] + priorities[live], torch.tensor(-math.inf, dtype=torch.float64))
    leaves = tree.scan_lower_bound(torch.cat([lower, upper]).to(DEVICE)).cpu()
    assert leaves.tolist() == live.tolist() * 2
    assert launches == [True]


def test_shape_empty_batch_and_empty_tree(launches):
    tree = TorchSumTree(10, device=DEVICE, validate=False)
    assert tree.scan_lower_bound(torch.tensor([0.5, 0.0], device=DEVICE)).cpu().tolist() == [0, 0]
    tree.update(torch.tensor([3, 6], device=DEVICE), torch.tensor([1.0, 1.0], device=DEVICE))
    masses = torch.tensor([[0.5, 1.5, 1.0], [0.0, 1.99, 2.0]], device=DEVICE)
    assert tree.scan_lower_bound(masses).cpu().tolist() == [[3, 6, 6], [3, 6, 6]]
    empty = tree.scan_lower_bound(torch.empty(0, 4, device=DEVICE))
    assert empty.shape == (0, 4) and empty.dtype == torch.int64
    assert launches == [True, True, True]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_tree_on_another_gpu_than_the_current_one(launches):
    tree = TorchSumTree(1000, device="cuda:1", validate=False)
    tree.update(torch.tensor([10, 500, 999]), torch.tensor([1.0, 2.0, 3.0]))
    with torch.cuda.device(0):
        leaves = tree.scan_lower_bound(torch.tensor([0.5, 1.5, 3.5, 5.9], dtype=torch.float64))
    assert leaves.device == torch.device("cuda:1") and launches == [True]
    assert leaves.cpu().tolist() == [10, 500, 999, 999]


def test_a_failed_launch_warns_once_and_falls_back_to_tensor_ops(monkeypatch, launches):
    from tdreplay.samplers.segment_trees import _triton_kernels

    class Unlaunchable:
        def __getitem__(self, grid):
            raise RuntimeError("no compiler for this device")

    monkeypatch.setattr(_triton_kernels, "descent", Unlaunchable())
    device_tree, host_tree = filled(1000, seed=3)
    masses = torch.rand(300, dtype=torch.float64) * float(host_tree.total())
    with pytest.warns(RuntimeWarning, match="no compiler for this device"):
        first = device_tree.scan_lower_bound(masses.to(DEVICE))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = device_tree.scan_lower_bound(masses.to(DEVICE))
    assert launches == [False]  # the second scan did not try the kernel again
    assert not _triton.runs_on(device_tree.device)  # the tree's device: cuda:0, not cuda
    expected = host_tree.scan_lower_bound(masses.numpy())
    np.testing.assert_array_equal(first.cpu().numpy(), expected)
    np.testing.assert_array_equal(second.cpu().numpy(), expected)


def test_a_broken_triton_install_warns_and_falls_back(monkeypatch, launches):
    import builtins

    real_import = builtins.__import__

    def failing(name, globals=None, locals=None, fromlist=(), level=0):
        if fromlist and "_triton_kernels" in fromlist:
            raise ImportError("libtriton.so: cannot open shared object file")
        return real_import(name, globals, locals, fromlist, level)

    device_tree, host_tree = filled(100, seed=4)  # (its update runs the refresh kernel)
    monkeypatch.setattr(builtins, "__import__", failing)
    masses = torch.rand(50, dtype=torch.float64) * float(host_tree.total())
    with pytest.warns(RuntimeWarning, match="libtriton.so"):
        leaves = device_tree.scan_lower_bound(masses.to(DEVICE))
    assert launches == []  # the kernel was never tried
    np.testing.assert_array_equal(leaves.cpu().numpy(), host_tree.scan_lower_bound(masses.numpy()))


def test_tdreplay_triton_0_switches_the_kernel_off(monkeypatch, launches):
    device_tree, host_tree = filled(1000, seed=5)
    masses = torch.rand(200, dtype=torch.float64) * float(host_tree.total())
    monkeypatch.setenv("TDREPLAY_TRITON", "0")
    off = device_tree.scan_lower_bound(masses.to(DEVICE))
    monkeypatch.setenv("TDREPLAY_TRITON", "1")
    on = device_tree.scan_lower_bound(masses.to(DEVICE))
    assert launches == [True]  # only the second scan used the kernel
    np.testing.assert_array_equal(off.cpu().numpy(), on.cpu().numpy())
    np.testing.assert_array_equal(on.cpu().numpy(), host_tree.scan_lower_bound(masses.numpy()))


def test_host_trees_keep_tensor_ops_unless_interpreted(monkeypatch, launches):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # runs_on reads it at each call
    assert not _triton.runs_on(torch.device("cpu"))
    tree = TorchSumTree(10)
    tree.update(torch.tensor([2]), torch.tensor([1.0]))
    assert tree.scan_lower_bound(torch.tensor([0.5])).tolist() == [2]
    assert launches == []


def test_a_tree_pickled_before_the_kernel_descends_with_it(launches):
    """A tree pickled by a tdreplay without the kernel lacks the kernel's level offsets: they
    are made again when it loads."""
    device_tree, host_tree = filled(1000, seed=6)
    old_state = {k: v for k, v in device_tree.__dict__.items() if k != "_level_starts"}
    restored = TorchSumTree.__new__(TorchSumTree)
    restored.__setstate__(pickle.loads(pickle.dumps(old_state)))
    masses = torch.rand(100, dtype=torch.float64) * float(host_tree.total())
    leaves = restored.scan_lower_bound(masses.to(DEVICE))
    assert launches == [True]
    np.testing.assert_array_equal(leaves.cpu().numpy(), host_tree.scan_lower_bound(masses.numpy()))


# ---- the ancestors of updated leaves ----------------------------------------------------------
@pytest.fixture
def refreshes(monkeypatch):
    """Whether each ancestor refresh ran in the kernel (``False``: a launch failed)."""
    return served_calls(monkeypatch, _triton, "refresh", bool)


def same_nodes(device_nodes: torch.Tensor, expected: torch.Tensor | np.ndarray,
               rtol: float = 0.0) -> None:
    """Bit for bit (or within ``rtol``), but any NaN for a NaN (its sign and payload are the
    device's), and not the never-read scratch position, where the torch trees send ignored
    writes."""
    got = device_nodes.cpu().clone()
    want = torch.as_tensor(expected).clone()
    if len(got) > TreeLayout.scratch:
        got[TreeLayout.scratch] = want[TreeLayout.scratch] = 0.0
    nan = got.isnan()
    assert torch.equal(nan, want.isnan())
    if rtol:
        torch.testing.assert_close(got[~nan], want[~nan], rtol=rtol, atol=0)
    else:
        assert torch.equal(got[~nan].view(torch.int64), want[~nan].view(torch.int64))


def updates(capacity: int, seed: int, rounds: int = 5) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Batches of 1 to 700 updates (duplicates included), a fifth of the values zero."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in [1, 3, 50, 700, 9][:rounds]:
        index = torch.randint(0, capacity, (n,), generator=g)
        values = torch.rand(n, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(
            -5, 5, (n,), generator=g)
        values[::5] = 0.0
        out.append((index, values))
    return out


@pytest.mark.parametrize("capacity", [1, 2, 7, 8, 9, 64, 65, 1000, 4097, 100_000])
def test_refreshed_ancestors_match_the_numba_trees(capacity, refreshes):
    sums = TorchSumTree(capacity, device=DEVICE, validate=False)
    mins = TorchMinOverSumTree(sums)
    negated = TorchMinTree(capacity, device=DEVICE, validate=False)  # a max tree, as samplers keep
    host_sums, host_negated = NumbaSumTree(capacity), NumbaMinTree(capacity)
    host_mins = NumbaMinOverSumTree(host_sums)
    batches = updates(capacity, seed=capacity)
    for index, values in batches:
        sums.update(index.to(DEVICE), values.to(DEVICE))
        mins.refresh(index.to(DEVICE))
        negated.update(index.to(DEVICE), (-values).to(DEVICE))
        host_sums.update(index.numpy(), values.numpy())
        host_mins.refresh(index.numpy())
        host_negated.update(index.numpy(), -values.numpy())
    assert refreshes == [True] * 3 * len(batches)
    same_nodes(sums.nodes, host_sums.nodes)
    same_nodes(mins.nodes, host_mins.nodes)
    same_nodes(negated.nodes, host_negated.nodes)
    assert float(sums.total()) == pytest.approx(float(host_sums.total()), rel=0, abs=0)


@pytest.mark.parametrize("capacity", [9, 4097, 100_000])
def test_trees_updated_together_match_the_numba_trees(capacity, refreshes):
    """The sum, max (a min tree of negated values) and min-over-sums trees of a prioritized
    sampler, their ancestors recomputed by one launch per level for the three."""
    sums = TorchSumTree(capacity, device=DEVICE, validate=False)
    mins = TorchMinOverSumTree(sums)
    negated = TorchMinTree(capacity, device=DEVICE, validate=False)
    host_sums, host_negated = NumbaSumTree(capacity), NumbaMinTree(capacity)
    host_mins = NumbaMinOverSumTree(host_sums)
    batches = updates(capacity, seed=capacity + 1)
    for index, values in batches:
        update_together([(sums, values.to(DEVICE)), (negated, (-values).to(DEVICE))],
                        index.to(DEVICE), mins)
        host_sums.update(index.numpy(), values.numpy())
        host_mins.refresh(index.numpy())
        host_negated.update(index.numpy(), -values.numpy())
    assert refreshes == [True] * len(batches)  # one refresh of the three trees per update
    same_nodes(sums.nodes, host_sums.nodes)
    same_nodes(mins.nodes, host_mins.nodes)
    same_nodes(negated.nodes, host_negated.nodes)


def test_ignored_entries_and_nan_give_the_tensor_ops_nodes(monkeypatch, refreshes):
    """Indices out of range are ignored without validation (they recompute the ancestors of leaf
    0, unchanged); a NaN leaf makes its ancestors NaN; the min over sums skips it."""
    capacity = 5000
    trees = {}
    for switch in ("0", "1"):
        monkeypatch.setenv("TDREPLAY_TRITON", switch)
        sums = TorchSumTree(capacity, device=DEVICE, validate=False)
        mins = TorchMinOverSumTree(sums)
        negated = TorchMinTree(capacity, device=DEVICE, validate=False)
        for index, values in updates(capacity, seed=7):
            index[-2:] = torch.tensor([-1, capacity])[-len(index):]
            values[:1] = math.nan
            sums.update(index.to(DEVICE), values.to(DEVICE))
            mins.refresh(index.clamp(0, capacity - 1).to(DEVICE))
            negated.update(index.to(DEVICE), (-values).to(DEVICE))
        trees[switch] = (sums.nodes, mins.nodes, negated.nodes)
    assert refreshes == [True] * 15  # only with the switch on
    assert trees["1"][0][0].isnan() and not trees["1"][1][0].isnan()
    for kernel, tensor_ops in zip(trees["1"], trees["0"]):
        same_nodes(kernel, tensor_ops.cpu())


def test_a_failed_refresh_warns_once_and_falls_back_to_tensor_ops(monkeypatch, refreshes):
    from tdreplay.samplers.segment_trees import _triton_kernels

    class Unlaunchable:
        def __getitem__(self, grid):
            raise RuntimeError("out of resources: shared memory")

    monkeypatch.setattr(_triton_kernels, "refresh_level", Unlaunchable())
    sums = TorchSumTree(1000, device=DEVICE, validate=False)
    host = NumbaSumTree(1000)
    (first, first_values), (second, second_values) = updates(1000, seed=8, rounds=2)
    with pytest.warns(RuntimeWarning, match="out of resources: shared memory"):
        sums.update(first.to(DEVICE), first_values.to(DEVICE))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sums.update(second.to(DEVICE), second_values.to(DEVICE))
    assert refreshes == [False]  # the second update did not try the kernel again
    host.update(first.numpy(), first_values.numpy())
    host.update(second.numpy(), second_values.numpy())
    same_nodes(sums.nodes, host.nodes)


def test_prioritized_sampler_on_device_trees_draws_as_on_numba_trees(refreshes):
    """A prioritized sampler's whole cycle (extend, sample, update) on device trees, with the
    kernels: the same draws as on the numba trees, and the same priorities and weights up to
    the last bits of ``pow`` (CUDA's float64 ``pow`` is within 2 ulp, not correctly rounded as
    the host's is; under the interpreter both are the host's, bit for bit)."""
    capacity = 3000
    samplers = [PrioritizedSampler(capacity, alpha=0.7, beta=0.5, backend=backend,
                                   device=DEVICE if backend == "torch" else None)
                for backend in ("torch", "numba")]
    g = torch.Generator().manual_seed(9)
    steps = []
    for _ in range(3):
        steps.append((torch.randint(0, capacity, (400,), generator=g),
                      torch.rand(400, generator=g) * 5))
    storage = ListStorage(capacity)
    storage.set(torch.arange(capacity), list(range(capacity)))
    drawn = []
    for sampler in samplers:
        sampler.extend(torch.arange(capacity))
        sampler.set_rng(torch.Generator().manual_seed(1))  # the same uniforms for both
        draws = []
        for index, priority in steps:
            sampler.update_priority(index, priority)
            slots, info = sampler.sample(storage, 256)
            draws.append((slots.cpu(), info["priority_weight"].cpu()))
        drawn.append(draws)
    assert refreshes and all(refreshes)
    torch_state, numba_state = (s.state_dict()["priorities"] for s in samplers)
    pow_rtol = 0.0 if DEVICE == "cpu" else 1e-14
    same_nodes(torch_state, numba_state, rtol=pow_rtol)
    for (slots, weights), (host_slots, host_weights) in zip(*drawn):
        assert torch.equal(slots, host_slots)
        torch.testing.assert_close(weights, host_weights, rtol=pow_rtol, atol=0)


# ---- which entries of a priority update apply ---------------------------------------------------
@pytest.fixture
def decided(monkeypatch):
    """Whether each device priority update was decided by the kernels (``None``: tensor ops)."""
    from tdreplay.samplers import _priority_kernels

    return served_calls(monkeypatch, _priority_kernels, "kept_updates",
                        lambda kept: kept is not None)


def priority_updates(capacity: int, written: int) -> list[dict]:
    """Updates with duplicates, -1 and out-of-range slots, unwritten slots, stale tokens, and
    batches that one refused value cancels (NaN, inf, negative, overflowing once raised to
    alpha 2)."""
    g = torch.Generator().manual_seed(11)
    out = []
    for n, bad in [(300, None), (64, math.nan), (500, None), (20, math.inf), (100, -0.5),
                   (7, 1e300), (1, None), (2000, None)]:
        index = torch.randint(-1, capacity + 3, (n,), generator=g)
        priority = torch.rand(n, generator=g, dtype=torch.float64) * 4
        priority[::9] = 0.0
        if bad is not None:
            priority[n // 2] = bad
        token = torch.randint(0, 3, (n,), generator=g) if n % 2 == 0 else None
        out.append({"index": index, "priority": priority.float() if n == 500 else priority,
                    "token": token})
    return out


def test_priority_updates_are_decided_as_by_tensor_ops(monkeypatch, decided):
    """A sampler on device trees (no validation, as on CUDA): the same priorities, max priority
    and tree nodes whether its updates are decided by the kernels or by tensor ops."""
    capacity, written = 3000, 2500
    storage = ListStorage(capacity)
    storage.set(torch.arange(written), list(range(written)))
    results = {}
    for switch in ("0", "1"):
        monkeypatch.setenv("TDREPLAY_TRITON", switch)
        sampler = PrioritizedSampler(capacity, alpha=2.0, beta=0.5, backend="torch",
                                     device=DEVICE, validate=False,
                                     max_priority_within_buffer=True)
        # the sampler was told of every slot, the storage holds fewer: slots past them are
        # written for the sampler, but an update there belongs to no item
        sampler.extend(torch.arange(capacity))
        initial = sampler.state_dict()["priorities"].clone()
        for step in priority_updates(capacity, written):
            token = step["token"]
            sampler.update_priority(step["index"].to(DEVICE), step["priority"].to(DEVICE),
                                    storage=storage,
                                    write_generation=None if token is None else token.to(DEVICE))
        state = sampler.state_dict()
        results[switch] = (state["priorities"], sampler.max_priority, sampler.min_priority)
    steps = len(priority_updates(capacity, written))
    assert decided == [False] * steps + [True] * steps  # the kernels run with the switch on
    kernel, tensor_ops = results["1"], results["0"]
    same_nodes(kernel[0], tensor_ops[0])
    assert kernel[1:] == tensor_ops[1:]
    changed = int((kernel[0][:written] != initial[:written]).sum())
    assert 0 < changed < written  # some updates applied, not all
    same_nodes(kernel[0][written:], initial[written:])  # nothing past the storage's items


def test_a_refused_value_cancels_the_whole_update_in_the_kernels(decided):
    sampler = PrioritizedSampler(100, alpha=1.0, beta=0.5, backend="torch", device=DEVICE,
                                 validate=False)
    sampler.extend(torch.arange(100))
    before = sampler.state_dict()["priorities"].clone()
    sampler.update_priority(torch.tensor([3, 4, 5], device=DEVICE),
                            torch.tensor([2.0, math.nan, 3.0], device=DEVICE))
    assert torch.equal(sampler.state_dict()["priorities"], before)
    sampler.update_priority(torch.tensor([3, 4, 5], device=DEVICE),
                            torch.tensor([2.0, 7.0, 3.0], device=DEVICE))
    after = sampler.state_dict()["priorities"]
    assert after[3:6].tolist() == [2.0 + sampler.eps, 7.0 + sampler.eps, 3.0 + sampler.eps]
    assert sampler.max_priority == pytest.approx(7.0 + sampler.eps)
    assert decided == [True, True]


def test_a_failed_decision_kernel_warns_and_falls_back(monkeypatch, decided):
    from tdreplay.samplers import _priority_triton_kernels

    class Unlaunchable:
        def __getitem__(self, grid):
            raise RuntimeError("no kernel image is available")

    monkeypatch.setattr(_priority_triton_kernels, "find_refused", Unlaunchable())
    sampler = PrioritizedSampler(100, alpha=1.0, beta=0.5, backend="torch", device=DEVICE,
                                 validate=False)
    sampler.extend(torch.arange(100))
    with pytest.warns(RuntimeWarning, match="no kernel image is available"):
        sampler.update_priority(torch.tensor([1, 2], device=DEVICE),
                                torch.tensor([5.0, 6.0], device=DEVICE))
    assert decided == [False]
    assert sampler.state_dict()["priorities"][1:3].tolist() == [5.0 + sampler.eps,
                                                               6.0 + sampler.eps]
