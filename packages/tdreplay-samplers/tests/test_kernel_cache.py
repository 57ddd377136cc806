"""Compiled numba kernels kept on disk (_kernel_cache.on_disk): a second process loads the
segment-tree kernels and the fused prioritized kernels instead of compiling them; the fused
kernels, which call kernels of another module, compile again when that module changes
(their cache key holds its source fingerprint)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from numba import njit

from tdreplay.samplers import _priority_numba as fused
from tdreplay.samplers import _trajectory_index
from tdreplay.samplers._kernel_cache import on_disk, source_fingerprint
from tdreplay.samplers.segment_trees import _numba_kernels as tree_kernels

# A process that builds a numba sum tree, updates and scans it, and prints what numba's cache
# did for the two tree kernels it ran.
_RUN_TREE = """
import json
import torch
from tdreplay.samplers.segment_trees import NumbaSumTree, _numba_kernels as k
tree = NumbaSumTree(1000)
tree.update(torch.arange(10), torch.arange(1.0, 11.0))
found = tree.scan_lower_bound(torch.tensor([0.5, 54.0]))
stats = {name: getattr(k, name).stats for name in ("update_sum", "scan")}
print(json.dumps({"found": found.tolist(),
                  "hits": {n: sum(s.cache_hits.values()) for n, s in stats.items()},
                  "misses": {n: sum(s.cache_misses.values()) for n, s in stats.items()}}))
"""


def _run_tree(cache_dir) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache_dir)}
    out = subprocess.run([sys.executable, "-c", _RUN_TREE], env=env, capture_output=True,
                         text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_the_tree_kernels_from_disk(tmp_path):
    first = _run_tree(tmp_path)
    assert first["misses"] == {"update_sum": 1, "scan": 1}  # compiled, then written to disk
    assert first["hits"] == {"update_sum": 0, "scan": 0}
    assert list(tmp_path.rglob("*.nbi")) and list(tmp_path.rglob("*.nbc"))
    second = _run_tree(tmp_path)
    assert second["hits"] == {"update_sum": 1, "scan": 1}  # loaded: nothing compiled
    assert second["misses"] == {"update_sum": 0, "scan": 0}
    assert second["found"] == first["found"] == [0, 9]  # the same kernels, the same answers


# A process that runs a prioritized sampler's fused kernels (built for the tree kernels'
# fingerprint given as argv[1], or the installed one) and prints what numba's cache did.
_RUN_FUSED = """
import json, sys
import numpy as np
import torch
from tdreplay.samplers import PrioritizedSampler, _priority_numba as fused
from tdreplay.storages import LazyTensorStorage
from tdreplay.samplers._kernel_cache import source_fingerprint
if len(sys.argv) > 1:
    version = int(sys.argv[1])
    fused.extend_kernel, fused.sample_kernel, fused.update_kernel = fused.fused_kernels(version)
storage = LazyTensorStorage(100)
storage.set(torch.arange(10), torch.zeros(10))
sampler = PrioritizedSampler(100, alpha=1.0, beta=1.0)
sampler.extend(torch.arange(10))
sampler.update_priority(torch.arange(10), torch.arange(1.0, 11.0))
np.random.seed(0)  # CPU draws come from NumPy's generator, as in TorchRL
index, info = sampler.sample(storage, 64)
kernels = {"extend": fused.extend_kernel, "sample": fused.sample_kernel,
           "update": fused.update_kernel}
print(json.dumps({"index": index.tolist(), "weight": info["priority_weight"].tolist(),
                  "hits": {n: sum(k.stats.cache_hits.values()) for n, k in kernels.items()},
                  "misses": {n: sum(k.stats.cache_misses.values()) for n, k in kernels.items()}}))
"""


def _run_fused(cache_dir, *argv: str) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache_dir)}
    out = subprocess.run([sys.executable, "-c", _RUN_FUSED, *argv], env=env,
                         capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


ALL_FUSED = {"extend": 1, "sample": 1, "update": 1}
NONE_FUSED = {"extend": 0, "sample": 0, "update": 0}


def test_a_second_process_loads_the_fused_kernels_from_disk(tmp_path):
    first = _run_fused(tmp_path)
    assert first["misses"] == ALL_FUSED and first["hits"] == NONE_FUSED
    second = _run_fused(tmp_path)
    assert second["hits"] == ALL_FUSED and second["misses"] == NONE_FUSED
    assert second["index"] == first["index"] and second["weight"] == first["weight"]


def test_fused_kernels_compile_again_when_the_tree_kernels_change(tmp_path):
    installed = str(source_fingerprint(tree_kernels))
    _run_fused(tmp_path, installed)  # compiled and kept for the installed tree kernels
    changed = _run_fused(tmp_path, str(int(installed) ^ 1))  # as if the tree kernels changed
    assert changed["misses"] == ALL_FUSED and changed["hits"] == NONE_FUSED  # not the stale code
    again = _run_fused(tmp_path, installed)  # both versions stay on disk
    assert again["hits"] == ALL_FUSED and again["misses"] == NONE_FUSED


def test_every_kernel_is_cached():
    kernels = [tree_kernels.update_sum, tree_kernels.update_min, tree_kernels.rebuild_sum,
               tree_kernels.rebuild_min, tree_kernels.refresh_min_over_sum,
               tree_kernels.rebuild_min_over_sum, tree_kernels.scan,
               _trajectory_index._write_chunks, fused.extend_kernel, fused.sample_kernel,
               fused.update_kernel]
    assert all(kernel.stats.cache_path is not None for kernel in kernels)


def test_the_fused_kernels_close_over_the_tree_kernels_fingerprint():
    version = source_fingerprint(tree_kernels)
    for kernel in (fused.extend_kernel, fused.sample_kernel, fused.update_kernel):
        assert [cell.cell_contents for cell in kernel.py_func.__closure__] == [version]


def test_a_source_fingerprint_follows_the_file(tmp_path, monkeypatch):
    module_file = tmp_path / "kernels_v.py"
    module_file.write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib
    module = importlib.import_module("kernels_v")
    before = source_fingerprint(module)
    assert before == source_fingerprint(module) and 0 <= before < 2**63
    module_file.write_text("X = 2\n")
    assert source_fingerprint(module) != before
    assert source_fingerprint(module, tree_kernels) != source_fingerprint(module)


def test_a_kernel_numba_cannot_cache_still_compiles_and_runs():
    namespace: dict = {}
    exec("def triple(x):\n    return 3 * x\n", namespace)  # no source file: no cache location
    kernel = on_disk(njit(namespace["triple"]))
    assert kernel(14) == 42
    assert kernel.stats.cache_path is None
