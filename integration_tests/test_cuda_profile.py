"""benchmarks/cuda_profile.py, the profile of one prioritized cycle on CUDA trees, checked without
a GPU: each call's line and its hottest Python functions are printed. No timing is asserted."""

from __future__ import annotations

import re
import subprocess
import sys


def test_each_call_is_profiled_for_each_capacity(benchmark_script):
    script = benchmark_script("cuda_profile")
    done = subprocess.run([sys.executable, script.__file__, "--device", "cpu", "--capacities",
                           "3000", "5000", "--batch", "256", "--reps", "2", "--top", "5"],
                          check=True, capture_output=True, text=True, timeout=600)
    heads = re.findall(r"^== capacity (\d+) (\w+): ([\d.]+) ms wall, (\d+) kernels",
                       done.stdout, flags=re.MULTILINE)
    assert [(c, name) for c, name, _, _ in heads] == [
        (c, name) for c in ("3000", "5000") for name in ("sample", "update", "extend")]
    assert all(float(ms) > 0 and kernels == "0" for _, _, ms, kernels in heads)  # host: none
    sections = done.stdout.split("== capacity")[1:]
    assert all(len([line for line in s.splitlines()[1:] if line.strip()]) >= 5 for s in sections)
