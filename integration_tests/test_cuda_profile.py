"""benchmarks/cuda_profile.py, the profile of one prioritized cycle on CUDA trees, checked without
a GPU: each call's line and its hottest Python functions are printed. No timing is asserted."""

from __future__ import annotations

import re
import subprocess
import sys


def test_each_call_is_profiled_for_each_case_and_capacity(benchmark_script):
    script = benchmark_script("cuda_profile")
    cases = ["all_cuda", "memmap_cuda_trees", "cuda_cpu_trees"]
    done = subprocess.run([sys.executable, script.__file__, "--device", "cpu", "--capacities",
                           "3000", "5000", "--batch", "256", "--reps", "2", "--top", "5",
                           "--cases", *cases],
                          check=True, capture_output=True, text=True, timeout=600)
    heads = re.findall(r"^== (\w+) capacity (\d+) (\w+): ([\d.]+) ms wall, (\d+) kernels",
                       done.stdout, flags=re.MULTILINE)
    assert [head[:3] for head in heads] == [
        (case, c, name) for case in cases for c in ("3000", "5000")
        for name in ("sample", "update", "extend")]
    assert all(float(ms) > 0 and kernels == "0" for *_, ms, kernels in heads)  # host: none
    sections = done.stdout.split("== ")[1:]
    assert len(sections) == len(heads)
    assert all(len([line for line in s.splitlines()[1:] if line.strip()]) >= 5 for s in sections)


def test_the_all_cuda_example_is_the_default(benchmark_script):
    script = benchmark_script("cuda_profile")
    done = subprocess.run([sys.executable, script.__file__, "--device", "cpu", "--capacities",
                           "3000", "--batch", "256", "--reps", "2", "--top", "3"],
                          check=True, capture_output=True, text=True, timeout=600)
    assert re.findall(r"^== (\w+) capacity", done.stdout, flags=re.MULTILINE) == ["all_cuda"] * 3
