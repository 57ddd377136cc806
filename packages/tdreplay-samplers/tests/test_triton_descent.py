"""The sum tree's one-kernel Triton descent (CUDA trees): the same leaves as the numba scan, for
every mass, capacity and edge case. With a GPU it runs compiled on CUDA; without one, under
Triton's interpreter on the host: Triton reads ``TRITON_INTERPRET=1`` when it is first imported
(and tensordict imports it), so ``test_kernel_tests_pass_under_the_interpreter`` runs this file
again in a child process started with it."""

from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

from tdreplay.samplers.segment_trees import NumbaSumTree, TorchSumTree, _triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if importlib.util.find_spec("triton") is None:
    pytest.skip("needs Triton (the samplers' test extra)", allow_module_level=True)
#: Whether the kernel runs in this process: compiled on a GPU, or under the interpreter
RUNS_HERE = DEVICE == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
KERNEL_TESTS = 16


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


@pytest.fixture
def launches(monkeypatch):
    """How many scans the kernel served (it returns ``None`` where it could not run)."""
    served = []
    descend = _triton.descend

    def counting(*args, **kwargs):
        leaves = descend(*args, **kwargs)
        served.append(leaves is not None)
        return leaves

    monkeypatch.setattr(_triton, "descend", counting)
    return served


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

    monkeypatch.setattr(builtins, "__import__", failing)
    device_tree, host_tree = filled(100, seed=4)
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
