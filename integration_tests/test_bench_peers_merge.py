"""The merge of ``nox -s bench-peers`` (``benchmarks/peers_run.py``): what the peers print
becomes results, skips and ratios (tdreplay over the best peer and over the floor). No timing."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def peers_run(benchmark_script):
    return benchmark_script("peers_run")


def line(**row) -> str:
    return json.dumps(row)


def test_parse_lines_keeps_info_results_and_skips_and_ignores_logs(peers_run):
    stdout = "\n".join([
        line(peer_info={"peer": "torchrl", "version": "0.14.1"}),
        "2026-11-23 [torchrl][INFO] Initialized LazyTensorStorage",
        line(name="sample_256", value=1464.5, unit="calls/s", runs=[1.0, 2.0, 3.0]),
        line(name="prioritized_cycle_B256", skipped="C++ extension does not load"),
        "[1, 2]",
        line(name="scaling/uniform_sample_256", value=10.0, unit="calls/s", rows=1_000_000),
    ])
    parsed = peers_run.parse_lines(stdout)
    assert parsed["info"] == {"peer": "torchrl", "version": "0.14.1"}
    assert [r["name"] for r in parsed["results"]] == ["sample_256", "scaling/uniform_sample_256"]
    assert parsed["results"][1]["rows"] == 1_000_000
    assert parsed["skipped"] == [{"name": "prioritized_cycle_B256",
                                  "skipped": "C++ extension does not load"}]


def result(name, value, unit="calls/s", **extra):
    return {"name": name, "value": value, "unit": unit, **extra}


RUNS = {
    "tdreplay": {"results": [result("sample_256", 200.0, cpu_rate=150.0),
                             result("extend_1k", 30.0),
                             result("slices_32x32", 1500.0),
                             result("scaling/uniform_sample_256", 90.0, rows=1_000_000),
                             result("scaling/uniform_sample_256", 60.0, rows=10_000_000),
                             result("dumps", 2.0, unit="s")]},
    "cpprb": {"results": [result("sample_256", 100.0, cpu_rate=50.0), result("extend_1k", 40.0),
                          result("scaling/uniform_sample_256", 45.0, rows=1_000_000),
                          result("scaling/uniform_sample_256", 40.0, rows=10_000_000),
                          result("dumps", 3.0, unit="s")],
              "skipped": [{"name": "slices_32x32", "skipped": "cpprb has no slice sampler"}]},
    "torchrl": {"results": [result("sample_256", 50.0, cpu_rate=100.0),
                            result("extend_1k", 10.0),
                            result("slices_32x32", 150.0), result("dumps", 1.0, unit="s")]},
    "floor": {"results": [result("sample_256", 400.0, cpu_rate=300.0),
                          result("extend_1k", 60.0),
                          result("scaling/uniform_sample_256", 180.0, rows=1_000_000)]},
}


def by_key(rows):
    return {(r["name"], r.get("rows")): r for r in rows}


def test_ratios_against_the_best_peer_and_the_floor(peers_run):
    rows = by_key(peers_run.ratios(RUNS, {"sample_256": "sample(256)"}))
    assert len(rows) == 6  # one per workload and size that tdreplay measured

    sample = rows["sample_256", None]
    assert sample["label"] == "sample(256)"
    assert (sample["tdreplay"], sample["best_peer"], sample["best_peer_value"]) == \
        (200.0, "cpprb", 100.0)
    assert sample["vs_best_peer"] == 2.0 and sample["floor"] == 400.0
    assert sample["vs_floor"] == 0.5
    assert sample["peers"] == {"cpprb": 100.0, "torchrl": 50.0}  # the floor is no peer
    # by CPU time: the best peer is the one fastest by CPU time
    assert (sample["best_peer_cpu"], sample["vs_best_peer_cpu"]) == ("torchrl", 1.5)
    assert sample["vs_floor_cpu"] == 0.5

    extend = rows["extend_1k", None]  # slower than cpprb: below 1
    assert "vs_best_peer_cpu" not in extend  # no CPU rates measured
    assert extend["best_peer"] == "cpprb" and extend["vs_best_peer"] == 0.75
    assert extend["vs_floor"] == 0.5

    slices = rows["slices_32x32", None]  # cpprb skipped it, no floor
    assert (slices["best_peer"], slices["vs_best_peer"]) == ("torchrl", 10.0)
    assert slices["floor"] is None and slices["vs_floor"] is None

    # each buffer size is its own workload
    assert rows["scaling/uniform_sample_256", 1_000_000]["vs_best_peer"] == 2.0
    assert rows["scaling/uniform_sample_256", 1_000_000]["vs_floor"] == 0.5
    assert rows["scaling/uniform_sample_256", 10_000_000]["vs_best_peer"] == 1.5
    assert rows["scaling/uniform_sample_256", 10_000_000]["vs_floor"] is None
    assert rows["scaling/uniform_sample_256", 10_000_000]["rows"] == 10_000_000

    # seconds: lower is better, the best peer is the fastest, speed-up = theirs / ours
    dumps = rows["dumps", None]
    assert (dumps["best_peer"], dumps["best_peer_value"]) == ("torchrl", 1.0)
    assert dumps["vs_best_peer"] == 0.5


def test_ratios_without_peers_or_with_zero_values(peers_run):
    runs = {"tdreplay": {"results": [result("sample_256", 0.0), result("extend_1k", 5.0)]},
            "cpprb": {"results": [result("sample_256", 10.0)]},
            "torchrl": {"results": [result("memmap_sample_256", 10.0)]}}
    rows = by_key(peers_run.ratios(runs))
    assert rows["sample_256", None]["vs_best_peer"] is None  # no speed-up of a zero rate
    assert rows["extend_1k", None]["best_peer"] is None
    assert rows["extend_1k", None]["vs_best_peer"] is None
    assert ("memmap_sample_256", None) not in rows  # tdreplay did not measure it
    assert peers_run.speedup(3.0, 2.0, "rows/s") == 1.5
    assert peers_run.speedup(3.0, 2.0, "ms") == 0.667


def test_merge_tags_rows_with_their_peer(peers_run):
    runs = {peer: {**run, "info": {"version": peer}, "returncode": 0, "seconds": 1.0}
            for peer, run in RUNS.items()}
    runs["torchrl"] = {**runs["torchrl"], "returncode": 1, "error": "Traceback ..."}
    payload = peers_run.merge(runs, {"cores": 2}, {"sample_256": "sample(256)"})
    assert payload["machine"] == {"cores": 2}
    assert payload["peers"]["cpprb"] == {"version": "cpprb", "seconds": 1.0, "returncode": 0}
    assert payload["peers"]["torchrl"]["error"] == "Traceback ..."
    assert len(payload["results"]) == sum(len(run["results"]) for run in RUNS.values())
    assert {r["peer"] for r in payload["results"] if r["name"] == "sample_256"} == \
        {"tdreplay", "cpprb", "torchrl", "floor"}
    assert payload["skipped"] == [{"peer": "cpprb", "name": "slices_32x32",
                                   "skipped": "cpprb has no slice sampler"}]
    assert payload["ratios"] == peers_run.ratios(runs, {"sample_256": "sample(256)"})
    json.dumps(payload)  # what peers.json holds


def test_accumulate_joins_one_peers_runs(peers_run):
    total = {}
    for part in ({"info": {"version": "1"}, "results": [result("sample_256", 1.0)],
                  "skipped": [], "returncode": 0, "seconds": 1.5},
                 {"info": {}, "results": [result("extend_1k", 2.0)],
                  "skipped": [{"name": "memmap_sample_256", "skipped": "no memmap"}],
                  "returncode": 1, "seconds": 2.0, "error": "Traceback"}):
        total = peers_run.accumulate(total, part)
    assert total["info"] == {"version": "1"}
    assert [r["name"] for r in total["results"]] == ["sample_256", "extend_1k"]
    assert total["skipped"] == [{"name": "memmap_sample_256", "skipped": "no memmap"}]
    assert (total["returncode"], total["seconds"], total["error"]) == (1, 3.5, "Traceback")


def test_rounds_collapse_to_their_median(peers_run):
    rows = [result("sample_256", 100.0, cpu_rate=90.0), result("extend_1k", 7.0),
            result("sample_256", 300.0, cpu_rate=80.0),
            result("scaling/uniform_sample_256", 5.0, rows=1_000_000),
            result("sample_256", 120.0, cpu_rate=70.0),
            result("scaling/uniform_sample_256", 9.0, rows=3_000_000)]
    merged = by_key(peers_run.median_rows(rows))
    assert len(merged) == 4  # one per workload and buffer size
    sample = merged["sample_256", None]
    assert (sample["value"], sample["cpu_rate"]) == (120.0, 80.0)  # medians of 3 rounds
    assert sample["round_values"] == [100.0, 300.0, 120.0]
    assert merged["extend_1k", None] == result("extend_1k", 7.0)  # measured once: as it was
    assert merged["scaling/uniform_sample_256", 3_000_000]["value"] == 9.0
    skips = [{"name": "slices_32x32", "skipped": "no slice sampler"}] * 2
    assert peers_run.unique_skips(skips) == skips[:1]


def test_interpreters_of_the_peers(peers_run, tmp_path, monkeypatch):
    import os
    import sys

    monkeypatch.chdir(tmp_path)
    pythons = peers_run.interpreters(["cpprb=venv/bin/python"])
    assert pythons == {"tdreplay": sys.executable, "floor": sys.executable,
                       "cpprb": os.path.join(str(tmp_path), "venv", "bin", "python")}
    with pytest.raises(SystemExit, match="PEER=PATH"):
        peers_run.interpreters(["cpprb"])
