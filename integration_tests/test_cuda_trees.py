"""benchmarks/cuda_trees.py, the device tree micro-benchmark, checked without a GPU: every row is
written, and both ways (Triton kernels and tensor ops) agree. No timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys


def test_rows_for_each_capacity_and_operation(benchmark_script, tmp_path):
    script = benchmark_script("cuda_trees")
    out = tmp_path / "trees.json"
    subprocess.run([sys.executable, script.__file__, "--device", "cpu", "--capacities", "100",
                    "5000", "--batch", "64", "--reps", "2", "--out", str(out)],
                   check=True, capture_output=True, text=True, timeout=600)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["capacity"], r["op"]) for r in rows] == [
        (100, "descent"), (100, "sum update"), (100, "min refresh"),
        (5000, "descent"), (5000, "sum update"), (5000, "min refresh")]
    for row in rows:
        assert row["batch"] == 64 and row["device"] == "cpu"
        assert row["same_result"] is True
        assert row["triton_ms"] > 0 and row["tensor_ops_ms"] > 0
