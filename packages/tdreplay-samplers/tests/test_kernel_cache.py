"""Compiled numba kernels kept on disk (_kernel_cache.on_disk): a second process loads the
segment-tree kernels instead of compiling them; the fused prioritized kernels, which call
kernels of another module (a change there would go unnoticed by numba), are never cached."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from numba import njit

from tdreplay.samplers import _priority_numba as fused
from tdreplay.samplers import _trajectory_index
from tdreplay.samplers._kernel_cache import on_disk
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


def test_only_kernels_calling_no_other_module_are_cached():
    cached = [tree_kernels.update_sum, tree_kernels.update_min, tree_kernels.rebuild_sum,
              tree_kernels.rebuild_min, tree_kernels.refresh_min_over_sum,
              tree_kernels.rebuild_min_over_sum, tree_kernels.scan,
              _trajectory_index._write_chunks]
    assert all(kernel.stats.cache_path is not None for kernel in cached)
    # they call the tree kernels: numba would keep their stale code after a tree kernel changed
    for kernel in (fused.extend_kernel, fused.sample_kernel, fused.update_kernel):
        assert kernel.stats.cache_path is None


def test_a_kernel_numba_cannot_cache_still_compiles_and_runs():
    namespace: dict = {}
    exec("def triple(x):\n    return 3 * x\n", namespace)  # no source file: no cache location
    kernel = on_disk(njit(namespace["triple"]))
    assert kernel(14) == 42
    assert kernel.stats.cache_path is None
