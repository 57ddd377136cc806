"""Run ``peers.py`` for tdreplay, its peers and the floor; merge into ``results/peers.json``.

Run by ``nox -s bench-peers`` (not in the default run), which makes a virtualenv for each peer
(cpprb, TorchRL: each with its own tensordict, all sharing the session's CPU torch) and passes
their interpreters with ``--python PEER=PATH``. tdreplay and the floor run with this
interpreter. Peers take turns, one workload group (and one buffer size of the scaling runs) at
a time, each in a process of its own: what else the machine runs then weighs on every peer
alike. The JSON lines are collected and merged:

- ``results``: every measurement, with its ``peer``;
- ``skipped``: what a peer could not run, and why (no memmap in cpprb, a buffer size that did
  not fit in memory, ...);
- ``ratios``: for every workload (and buffer size) tdreplay measured, tdreplay's speed over the
  best peer's (cpprb, TorchRL) and over the floor's: above 1 means tdreplay is faster
  (``*_cpu``: the same by each process's CPU time, less sensitive to the machine's load);
- ``machine``: as ``run_all.py`` records it, plus the load average before and after the run
  (other processes slow every peer down).

Then draws ``results/peers.png`` and ``results/scaling.png`` (``plot_peers.py``); the docs'
benchmarks page shows the table and both plots.

``--rounds N`` runs every step N times (the peers still taking turns) and keeps each
workload's median: a ratio then rests on N measurements of each side, taken minutes apart.

Usage: ``python benchmarks/peers_run.py [--python PEER=PATH ...] [--quick] [--seconds S]
[--rounds N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from plot_results import better

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "peers.json"
#: every peer, in the order they run and are shown
ORDER = ["tdreplay", "cpprb", "torchrl", "floor"]
#: the libraries tdreplay is compared with (the floor is not a library)
COMPETITORS = ["cpprb", "torchrl"]
SUBJECT, FLOOR = "tdreplay", "floor"
#: the workload groups of ``peers.py --only``, run in turn by every peer
GROUPS = ["uniform", "prioritized", "slices", "memmap"]


def parse_lines(stdout: str) -> dict[str, object]:
    """The JSON lines of one ``peers.py`` run: ``{"info", "results", "skipped"}`` (other lines,
    e.g. a library's log, are ignored)."""
    info: dict[str, object] = {}
    results, skipped = [], []
    for line in stdout.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict):
            continue
        if "peer_info" in row:
            info = row["peer_info"]
        elif "skipped" in row:
            skipped.append(row)
        elif "value" in row:
            results.append(row)
    return {"info": info, "results": results, "skipped": skipped}


def speedup(subject: float, other: float, unit: str) -> float | None:
    """How many times faster ``subject`` is than ``other`` (rates: subject / other; durations:
    other / subject); None when either is not a positive number."""
    if not (subject > 0 and other > 0):
        return None
    ratio = subject / other if better(unit) == "higher" else other / subject
    return round(ratio, 3)


def _key(row: dict) -> tuple[str, int | None]:
    return str(row["name"]), row.get("rows")


def _best(values: dict[str, float], unit: str) -> str | None:
    if not values:
        return None
    pick = max if better(unit) == "higher" else min
    return pick(values, key=values.__getitem__)


def ratios(runs: dict[str, dict], labels: dict[str, str] | None = None) -> list[dict]:
    """One row per workload (and buffer size) that tdreplay measured: its value, the best
    competitor's, the floor's, and tdreplay's speed-up over each (None where absent); the
    ``*_cpu`` entries compare the rates by CPU time (``cpu_rate``) where every side has one."""
    values: dict[tuple[str, int | None], dict[str, float]] = {}
    cpu: dict[tuple[str, int | None], dict[str, float]] = {}
    units: dict[str, str] = {}
    for peer, run in runs.items():
        for row in run.get("results", []):
            values.setdefault(_key(row), {})[peer] = float(row["value"])
            if row.get("cpu_rate") is not None:
                cpu.setdefault(_key(row), {})[peer] = float(row["cpu_rate"])
            units[str(row["name"])] = str(row["unit"])
    out = []
    for key, by_peer in values.items():
        name, rows = key
        if SUBJECT not in by_peer:
            continue
        unit = units[name]
        mine = by_peer[SUBJECT]
        rivals = {p: v for p, v in by_peer.items() if p in COMPETITORS}
        best = _best(rivals, unit)
        floor = by_peer.get(FLOOR)
        row = {"name": name, "label": (labels or {}).get(name, name), "unit": unit,
               SUBJECT: mine, "best_peer": best,
               "best_peer_value": rivals[best] if best else None,
               "vs_best_peer": speedup(mine, rivals[best], unit) if best else None,
               "peers": rivals, FLOOR: floor,
               "vs_floor": speedup(mine, floor, unit) if floor is not None else None}
        by_cpu = cpu.get(key, {})
        if SUBJECT in by_cpu:
            cpu_rivals = {p: v for p, v in by_cpu.items() if p in COMPETITORS}
            cpu_best = _best(cpu_rivals, unit)
            row["best_peer_cpu"] = cpu_best
            row["vs_best_peer_cpu"] = (speedup(by_cpu[SUBJECT], cpu_rivals[cpu_best], unit)
                                       if cpu_best else None)
            row["vs_floor_cpu"] = (speedup(by_cpu[SUBJECT], by_cpu[FLOOR], unit)
                                   if FLOOR in by_cpu else None)
        if rows is not None:
            row["rows"] = rows
        out.append(row)
    return out


def run_peer(peer: str, python: str, flags: list[str]) -> dict[str, object]:
    """Run ``peers.py PEER *flags`` with ``python``; its parsed lines, exit code and time."""
    print(f"== {peer} {' '.join(flags)}", flush=True)
    start = time.perf_counter()
    proc = subprocess.run([python, str(HERE / "peers.py"), peer, *flags], cwd=HERE,
                          capture_output=True, text=True)
    parsed = parse_lines(proc.stdout)
    for row in parsed["results"]:
        where = f" rows={row['rows']:,}" if "rows" in row else ""
        print(f"  {row['name'] + where:<50} {row['value']:>16,.1f} {row['unit']}")
    for row in parsed["skipped"]:
        where = f" rows={row['rows']:,}" if "rows" in row else ""
        print(f"  {row['name'] + where:<50} skipped: {row['skipped']}")
    parsed["returncode"] = proc.returncode
    parsed["seconds"] = round(time.perf_counter() - start, 1)
    if proc.returncode:
        parsed["error"] = proc.stderr[-3000:]
        print(proc.stderr[-3000:], file=sys.stderr)
    return parsed


def median_rows(rows: list[dict]) -> list[dict]:
    """One row per workload (and buffer size) of ``rows``, which may hold several rounds of
    each: its ``value`` and ``cpu_rate`` are the medians over the rounds, ``round_values`` the
    values of every round (a workload measured once is kept as it is)."""
    groups: dict[tuple[str, int | None], list[dict]] = {}
    for row in rows:
        groups.setdefault(_key(row), []).append(row)
    out = []
    for group in groups.values():
        if len(group) == 1:
            out.append(group[0])
            continue
        merged = {**group[0], "value": statistics.median(float(r["value"]) for r in group),
                  "round_values": [r["value"] for r in group]}
        cpu = [float(r["cpu_rate"]) for r in group if r.get("cpu_rate") is not None]
        if cpu:
            merged["cpu_rate"] = statistics.median(cpu)
        out.append(merged)
    return out


def unique_skips(rows: list[dict]) -> list[dict]:
    """``rows`` (skipped workloads) without the repeats of later rounds."""
    first: dict[tuple[str, int | None], dict] = {}
    for row in rows:
        first.setdefault(_key(row), row)
    return list(first.values())


def accumulate(total: dict[str, object], part: dict[str, object]) -> dict[str, object]:
    """``total`` (one peer's runs so far) with the run ``part`` added."""
    errors = [e for e in (total.get("error"), part.get("error")) if e]
    out = {"info": part.get("info") or total.get("info", {}),
           "results": [*total.get("results", []), *part.get("results", [])],
           "skipped": [*total.get("skipped", []), *part.get("skipped", [])],
           "returncode": max(int(total.get("returncode", 0)), int(part.get("returncode", 0))),
           "seconds": round(float(total.get("seconds", 0)) + float(part.get("seconds", 0)), 1)}
    if errors:
        out["error"] = "\n".join(errors)
    return out


def merge(runs: dict[str, dict], machine: dict[str, object],
          labels: dict[str, str]) -> dict[str, object]:
    """The payload of ``peers.json``: machine, peers, every result and skip, the ratios."""
    results, skipped = [], []
    for peer, run in runs.items():
        results += [{"peer": peer, **row} for row in run.get("results", [])]
        skipped += [{"peer": peer, **row} for row in run.get("skipped", [])]
    peers = {peer: {**run.get("info", {}), "seconds": run.get("seconds"),
                    "returncode": run.get("returncode"),
                    **({"error": run["error"]} if run.get("error") else {})}
             for peer, run in runs.items()}
    return {"machine": machine, "peers": peers, "labels": labels,
            "ratios": ratios(runs, labels), "results": results, "skipped": skipped}


def _fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def print_table(rows: list[dict]) -> None:
    print(f"{'workload':<62} {'vs best peer':>18} {'vs floor':>9}   by CPU time: "
          f"{'vs best peer':>18} {'vs floor':>9}")
    for row in rows:
        label = row["label"] + (f" [{row['rows']:,} rows]" if "rows" in row else "")
        best = f"{_fmt_ratio(row['vs_best_peer'])} ({row['best_peer']})" if row["best_peer"] \
            else "-"
        cpu = row.get("best_peer_cpu")
        best_cpu = f"{_fmt_ratio(row.get('vs_best_peer_cpu'))} ({cpu})" if cpu else "-"
        print(f"{label:<62} {best:>18} {_fmt_ratio(row['vs_floor']):>9}   {'':13}"
              f"{best_cpu:>18} {_fmt_ratio(row.get('vs_floor_cpu')):>9}")


def interpreters(items: list[str]) -> dict[str, str]:
    """Each peer's interpreter: this one for tdreplay and the floor, and ``PATH`` for every
    ``PEER=PATH`` of ``items`` (``--python``; made absolute, not resolved: a virtualenv's
    python is a link)."""
    pythons = {SUBJECT: sys.executable, FLOOR: sys.executable}
    for item in items:
        peer, _, path = item.partition("=")
        if not path:
            raise SystemExit(f"--python takes PEER=PATH, got {item!r}")
        pythons[peer] = os.path.abspath(path)
    return pythons


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", action="append", default=[], metavar="PEER=PATH",
                        help="interpreter of a peer's virtualenv (cpprb=..., torchrl=...)")
    parser.add_argument("--peers", nargs="*", default=None, help=f"subset of {ORDER}")
    parser.add_argument("--quick", action="store_true", help="smaller buffers in the scaling runs")
    parser.add_argument("--seconds", type=float, default=None, help="timing per measurement")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every step this many times, the peers still taking turns; "
                             "each workload's value is its median over the rounds")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)

    pythons = interpreters(args.python)
    flags = ["--seconds", str(args.seconds)] if args.seconds is not None else []

    from peers import METRICS, QUICK_SIZES, SCALING_SIZES  # torch, tensordict: everywhere
    from run_all import machine as machine_info

    machine = {**machine_info(), "loadavg_before": [round(x, 2) for x in os.getloadavg()],
               "quick": args.quick}
    peers = [p for p in ORDER if not args.peers or p in args.peers]
    for peer in [p for p in peers if p not in pythons]:
        print(f"== {peer}: no interpreter given (--python {peer}=PATH), not run", file=sys.stderr)
    peers = [p for p in peers if p in pythons]
    steps = [["--only", group] for group in GROUPS]
    steps += [["--only", "scaling", "--sizes", str(size)]
              for size in (QUICK_SIZES if args.quick else SCALING_SIZES)]
    runs: dict[str, dict] = {peer: {} for peer in peers}
    start = time.perf_counter()
    rounds = max(args.rounds, 1)
    for _ in range(rounds):
        for step in steps:  # peers take turns: the machine's load weighs on each alike
            for peer in peers:
                runs[peer] = accumulate(runs[peer], run_peer(peer, pythons[peer], step + flags))
    for run in runs.values():
        run["results"] = median_rows(run.get("results", []))
        run["skipped"] = unique_skips(run.get("skipped", []))
    machine["rounds"] = rounds
    machine["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    machine["seconds"] = round(time.perf_counter() - start, 1)
    payload = merge(runs, machine, {name: label for name, (label, _) in METRICS.items()})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=1))
    print(f"wrote {args.out}")
    print_table(payload["ratios"])

    from plot_peers import plot_peers, plot_scaling  # matplotlib: installed by the session

    print(f"wrote {plot_peers(args.out, args.out.with_name('peers.png'))}")
    print(f"wrote {plot_scaling(args.out, args.out.with_name('scaling.png'))}")
    failed = [peer for peer, run in runs.items() if run["returncode"]]
    if failed:
        print(f"failed: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
