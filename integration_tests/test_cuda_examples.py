"""benchmarks/cuda_examples.py, the GPU comparison with TorchRL, checked without a GPU: the three
reference cases run on the host (small), and the merge pairs the libraries' rows into ratios.
No timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

from tdreplay import data as tdreplay_data

SMALL = ["--device", "cpu", "--capacities", "20000", "--batch", "512", "--chunk", "5000",
         "--reps", "2"]


@pytest.fixture(scope="module")
def cuda_examples(benchmark_script):
    return benchmark_script("cuda_examples")


def test_the_three_cases_run_and_report_every_figure(cuda_examples, tmp_path):
    out = tmp_path / "cuda_tdreplay.json"
    subprocess.run([sys.executable, cuda_examples.__file__, *SMALL, "--out",
                    str(out)], check=True, capture_output=True, text=True, timeout=600)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["case"], r["capacity"], r["lib"]) for r in rows] == [
        ("all_cuda", 20000, "tdreplay"), ("memmap_cuda_trees", 20000, "tdreplay"),
        ("cuda_cpu_trees", 20000, "tdreplay")]
    for row in rows:
        assert "error" not in row
        assert sorted(row["ms"]) == ["extend", "sample", "update"]
        assert all(ms > 0 for ms in row["ms"].values()) and row["fill_s"] > 0
        assert row["cycles_per_s"] == pytest.approx(1e3 / (row["ms"]["sample"]
                                                          + row["ms"]["update"]))


def test_a_case_the_library_refuses_is_reported_with_its_error(cuda_examples):
    class Refusing:
        def LazyTensorStorage(self, *args, **kwargs):
            raise RuntimeError("CUDA prioritized replay buffers require a TorchRL CUDA wheel")

    row = cuda_examples.run_case(Refusing(), "all_cuda", "cpu", 1000, 64, 100, 1)
    assert row == {"error": "RuntimeError: CUDA prioritized replay buffers require a TorchRL "
                            "CUDA wheel"}


def test_a_library_without_sampler_device_keeps_its_trees_on_the_host(cuda_examples, tmp_path):
    """TorchRL before 0.13: cuda_cpu_trees is built without the argument, memmap_cuda_trees is
    refused with the reason (before anything touches the device)."""
    made = []

    def buffer_without_placement(*, alpha, beta, storage, batch_size, priority_key):
        made.append(storage)
        return tdreplay_data.TensorDictPrioritizedReplayBuffer(
            alpha=alpha, beta=beta, storage=storage, batch_size=batch_size,
            priority_key=priority_key)

    old = types.SimpleNamespace(
        __name__="old.data", LazyTensorStorage=tdreplay_data.LazyTensorStorage,
        LazyMemmapStorage=tdreplay_data.LazyMemmapStorage,
        TensorDictPrioritizedReplayBuffer=buffer_without_placement)
    assert not cuda_examples.takes_sampler_device(old)
    assert cuda_examples.takes_sampler_device(tdreplay_data)
    row = cuda_examples.run_case(old, "cuda_cpu_trees", "cpu", 1000, 64, 500, 1)
    assert "error" not in row and row["ms"]["sample"] > 0 and len(made) == 1
    row = cuda_examples.run_case(old, "memmap_cuda_trees", "cuda", 1000, 64, 500, 1)
    assert row == {"error": "TypeError: old.data.TensorDictPrioritizedReplayBuffer has no "
                            "sampler_device: its trees stay on the host"}
    assert len(made) == 1


def test_cases_picks_which_cases_run(cuda_examples, tmp_path):
    out = tmp_path / "one.json"
    subprocess.run([sys.executable, cuda_examples.__file__, *SMALL, "--cases", "cuda_cpu_trees",
                    "--out", str(out)], check=True, capture_output=True, text=True, timeout=600)
    assert [json.loads(row)["case"] for row in out.read_text().splitlines()] == ["cuda_cpu_trees"]


def line(**row) -> str:
    return json.dumps(row) + "\n"


def test_merge_gives_torchrl_time_over_tdreplay_time(cuda_examples, tmp_path):
    ours, theirs, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "cuda.json"
    ours.write_text(
        line(case="all_cuda", capacity=10, device="H100",
             ms={"extend": 1.0, "sample": 2.0, "update": 2.0}, cycles_per_s=250.0)
        + line(case="cuda_cpu_trees", capacity=10, device="H100",
               ms={"extend": 1.0, "sample": 1.0, "update": 1.0}, cycles_per_s=500.0))
    theirs.write_text(
        line(case="all_cuda", capacity=10, ms={"extend": 3.0, "sample": 4.0, "update": 16.0},
             cycles_per_s=50.0)
        + line(case="cuda_cpu_trees", capacity=10, error="RuntimeError: no CUDA wheel"))
    merged = cuda_examples.merge(ours, theirs, out)
    assert merged == json.loads(out.read_text())
    assert merged["device"] == "H100"
    first, second = merged["rows"]
    assert first["torchrl_time_over_tdreplay"] == {"extend": 3.0, "sample": 2.0, "update": 8.0,
                                                   "cycle": 5.0}
    assert second["torchrl_time_over_tdreplay"] == {}  # TorchRL refused: no ratio
    assert second["torchrl"]["error"] == "RuntimeError: no CUDA wheel"


def test_merge_without_a_torchrl_run_keeps_tdreplay_rows(cuda_examples, tmp_path):
    ours = tmp_path / "a.json"
    ours.write_text(line(case="all_cuda", capacity=10, device="cpu",
                         ms={"extend": 1.0, "sample": 1.0, "update": 1.0}, cycles_per_s=500.0))
    merged = cuda_examples.merge(ours, tmp_path / "missing.json", tmp_path / "cuda.json")
    assert [(r["case"], r["torchrl"]) for r in merged["rows"]] == [("all_cuda", {})]
