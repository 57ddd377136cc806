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
from tdreplay.samplers import _priority_split as split
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


# A process that runs a prioritized sampler's fused kernels once per tree-kernel fingerprint
# given in argv ("installed": the installed tree kernels'), each time with kernels freshly built
# by fused_kernels (numba compiles them or loads them from disk), and prints, per run, the draws
# and what numba's cache did.
_RUN_FUSED = """
import json, sys
import numpy as np
import torch
from tdreplay.samplers import PrioritizedSampler, _priority_numba as fused
from tdreplay.samplers._kernel_cache import source_fingerprint
from tdreplay.samplers.segment_trees import _numba_kernels as tree_kernels
from tdreplay.storages import LazyTensorStorage
runs = []
for arg in sys.argv[1:]:
    version = source_fingerprint(tree_kernels) if arg == "installed" else int(arg)
    (fused.extend_kernel, fused.sample_kernel, fused.update_kernel,
     fused.extend_prioritized_kernel, fused.sample_range_kernel) = fused.fused_kernels(version)
    storage = LazyTensorStorage(100)
    storage.set(torch.arange(12), torch.zeros(12))
    sampler = PrioritizedSampler(100, alpha=1.0, beta=1.0)
    sampler.extend(torch.arange(10))
    sampler.update_priority(torch.arange(10), torch.arange(1.0, 11.0))
    sampler.extend_with_priority(torch.arange(10, 12),
                                 sampler.check_priority(torch.tensor([2.0, 3.0])))
    np.random.seed(0)  # CPU draws come from NumPy's generator, as in TorchRL
    index, info = sampler.sample(storage, 64)
    kernels = {"extend": fused.extend_kernel, "sample": fused.sample_kernel,
               "update": fused.update_kernel, "extend_prioritized": fused.extend_prioritized_kernel}
    runs.append({"index": index.tolist(), "weight": info["priority_weight"].tolist(),
                 "hits": {n: sum(k.stats.cache_hits.values()) for n, k in kernels.items()},
                 "misses": {n: sum(k.stats.cache_misses.values()) for n, k in kernels.items()}})
print(json.dumps(runs))
"""


def _run_fused(cache_dir, *versions: str) -> list[dict]:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache_dir)}
    out = subprocess.run([sys.executable, "-c", _RUN_FUSED, *versions], env=env,
                         capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


ALL_FUSED = {"extend": 1, "sample": 1, "update": 1, "extend_prioritized": 1}
NONE_FUSED = {"extend": 0, "sample": 0, "update": 0, "extend_prioritized": 0}


def test_fused_kernels_load_from_disk_and_compile_again_for_changed_tree_kernels(tmp_path):
    [first] = _run_fused(tmp_path, "installed")
    assert first["misses"] == ALL_FUSED and first["hits"] == NONE_FUSED  # compiled, kept
    other = str(source_fingerprint(tree_kernels) ^ 1)  # as if the tree kernels had changed
    loaded, changed, again = _run_fused(tmp_path, "installed", other, "installed")
    assert loaded["hits"] == ALL_FUSED and loaded["misses"] == NONE_FUSED  # a second process
    assert loaded["index"] == first["index"] and loaded["weight"] == first["weight"]
    assert changed["misses"] == ALL_FUSED and changed["hits"] == NONE_FUSED  # not stale code
    assert changed["index"] == first["index"]  # compiled from the same (real) tree kernels
    assert again["hits"] == ALL_FUSED and again["misses"] == NONE_FUSED  # both kept on disk


def test_every_kernel_is_cached():
    kernels = [tree_kernels.update_sum, tree_kernels.update_min, tree_kernels.rebuild_sum,
               tree_kernels.rebuild_min, tree_kernels.refresh_min_over_sum,
               tree_kernels.rebuild_min_over_sum, tree_kernels.scan,
               _trajectory_index._write_chunks, fused.extend_kernel, fused.sample_kernel,
               fused.update_kernel, fused.extend_prioritized_kernel, fused.sample_range_kernel,
               split.check_kernel,
               split.update_part_kernel, split.update_top_kernel]
    assert all(kernel.stats.cache_path is not None for kernel in kernels)


def test_the_split_kernels_close_over_the_fingerprint_of_what_they_inline():
    version = source_fingerprint(tree_kernels, fused)
    for kernel in (split.check_kernel, split.update_part_kernel, split.update_top_kernel):
        assert [cell.cell_contents for cell in kernel.py_func.__closure__] == [version]


def test_the_fused_kernels_close_over_the_tree_kernels_fingerprint():
    version = source_fingerprint(tree_kernels)
    for kernel in (fused.extend_kernel, fused.sample_kernel, fused.update_kernel,
                   fused.extend_prioritized_kernel, fused.sample_range_kernel):
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
