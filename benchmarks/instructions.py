"""Instructions per call of the ``bench-peers`` workloads, counted by valgrind (callgrind).

Usage: ``python benchmarks/instructions.py [--python PEER=PATH ...] [--capacity N]
[--only WORKLOAD ...] [--jobs J]``; run by ``nox -s bench-instructions`` (not in the default
run; needs ``valgrind`` on the PATH: ``apt-get install valgrind``).

Timings on a shared 2-core machine move by 30-100% from one run to the next; an instruction
count does not (the same run counted twice differs by well under 1%). It measures what a
library adds per call, the part of a call that is not waiting for memory: the Python
wrappers, checks and dispatches that ``sample(256)`` or ``extend`` of 1,000 rows pays on top
of the floor's bare torch. It says nothing about cache misses (a gather from 1M random rows
costs the same instructions as one from 4,096), so it complements the timings of
``peers.py``, it does not replace them.

Every (peer, workload) runs in its own process under ``valgrind --tool=callgrind
--instr-atstart=no``: the buffer is built and filled (``peers.py``'s workloads, same rows,
same capacity) and the workload called 20 times to warm up, all uninstrumented; then the
worker signals through a file, this script switches instrumentation on
(``callgrind_control -i on``), and the worker makes ``calls`` calls and exits. The count
valgrind reports, divided by ``calls``, is the figure (the loop and the hand-over add a few
hundred instructions per call, the same for every peer). glibc copies blocks of more than a
few KiB with ``rep movsb``, which valgrind counts as one instruction per byte: the
instructions inside libc's ``memcpy`` / ``memmove`` are reported apart
(``outside_bulk_copy`` leaves them out), and the overhead figures use the count outside them.

tdreplay, the floor and ``floor_td`` (the floor behind TorchRL's interface: TensorDicts in and
out, the slots returned; see ``peers.py``) run with this interpreter, other peers (``cpprb``)
with the interpreter given by ``--python``. Results go to ``results/instructions.json``:
``{"machine", "results": [{"peer", "name", "instructions", "outside_bulk_copy", "calls",
"capacity"}], "overhead": [{"name", "tdreplay", "floor", "floor_td", "cpprb", "over_floor",
"over_floor_td"}]}`` (the overhead rows count outside the bulk copies; ``over_floor_td`` is
what tdreplay adds to the interface's own cost).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "instructions.json"
#: workload -> calls counted (about 10^8 instructions each on tdreplay)
WORKLOADS = {
    "extend_1k": 200,
    "sample_256": 400,
    "sample_4096": 100,
    "prioritized_cycle_B256": 200,
    "prioritized_cycle_B4096": 40,
}
PRIORITIZED = {"prioritized_cycle_B256": 256, "prioritized_cycle_B4096": 4096}
WARMUP = 20
#: where the worker waits for the go (``callgrind_control`` has switched instrumentation on)
HANDSHAKE_ENV = "TDREPLAY_INSTRUCTIONS_HANDSHAKE"
COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")
#: a line of ``callgrind_annotate``: ``N (x%)  file:function [object]``
ANNOTATED = re.compile(r"^\s*([\d,]+)\s+\([^)]*\)\s+(.*)$")
#: libc's bulk copies: ``rep movsb`` (glibc's copy above a few KiB) counts one instruction
#: per byte moved, so their count measures bytes, not work
BULK_COPY = re.compile(r"(memcpy|memmove)[^ ]*\s+\[[^]]*libc")


# ------------------------------------------------------------------------------------------
# Worker: one peer, one workload, in a process of its own under valgrind
# ------------------------------------------------------------------------------------------


def workload_call(peer_name: str, workload: str, capacity: int) -> Any:
    """The call that ``workload`` repeats, on a buffer of ``peer_name`` built and filled as
    ``peers.py`` does (``Unsupported`` where the peer has no such buffer)."""
    import peers

    peer = peers.PEERS[peer_name]()
    peer.load()
    if workload in PRIORITIZED:
        rb = peers.prioritized_buffer(peer, capacity)
        batch, cycle = PRIORITIZED[workload], rb.cycle
        assert cycle is not None
        prio = peers.priorities(peer, batch)
        return lambda: cycle(batch, next(prio))
    chunk = min(capacity, 10_000)
    chunks = peers.chunks_of(peer, chunk)
    rb = peer.uniform(capacity, next(chunks))
    peers.fill(rb, chunks, capacity, chunk)
    if workload == "extend_1k":
        small = peers.chunks_of(peer, 1_000)
        return lambda: rb.extend(next(small))
    batch = int(workload.rsplit("_", 1)[1])
    return lambda: rb.sample(batch)


def worker(peer_name: str, workload: str, calls: int, capacity: int) -> None:
    import numpy as np
    import peers
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    np.random.seed(0)
    handshake = Path(os.environ[HANDSHAKE_ENV])
    try:
        call = workload_call(peer_name, workload, capacity)
    except peers.Unsupported as why:
        (handshake / "unsupported").write_text(str(why))
        os._exit(0)
    for _ in range(WARMUP):
        call()
    # what the import and the fill made is frozen out of the collector's reach: a full
    # collection (it walks every tracked object, torch's included) would otherwise fall into
    # the counted calls or not depending on how many objects came before them (a few
    # thousand instructions per call, and a change in the script moved it)
    gc.collect()
    gc.freeze()
    (handshake / "ready").write_text(str(os.getpid()))
    while not (handshake / "go").exists():
        time.sleep(0.02)
    for _ in range(calls):
        call()
    os._exit(0)  # no interpreter teardown in the count


# ------------------------------------------------------------------------------------------
# Driver
# ------------------------------------------------------------------------------------------


def count(python: str, peer: str, workload: str, calls: int, capacity: int,
          keep: Path | None = None, timeout: float = 1800.0) -> dict[str, Any]:
    """Run one worker under callgrind; ``{"peer", "name", "instructions", ...}`` or
    ``{"peer", "name", "skipped": why}``. ``keep``: a folder for callgrind's profile
    (``callgrind_annotate`` reads it), named after the peer and workload."""
    row: dict[str, Any] = {"peer": peer, "name": workload}
    with tempfile.TemporaryDirectory(prefix="tdreplay-instructions-") as tmp:
        handshake = Path(tmp)
        profile = (keep or handshake) / f"callgrind.{peer}.{workload}"
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
               f"--callgrind-out-file={profile}",
               python, str(Path(__file__).resolve()), "--worker", peer, workload, str(calls),
               "--capacity", str(capacity)]
        env = dict(os.environ, PYTHONHASHSEED="0", **{HANDSHAKE_ENV: tmp})
        proc = subprocess.Popen(cmd, env=env, cwd=HERE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            err = _counted_run(proc, handshake, time.monotonic() + timeout)
        except BaseException:  # no worker left waiting for the go
            proc.kill()
            proc.communicate()
            raise
        if err is None:  # it ended (or ran out of time) before its signal
            proc.kill()
            late = proc.communicate()[1] or ""
            why = handshake / "unsupported"
            return {**row, "skipped": why.read_text() if why.exists() else
                    f"worker failed: {late.strip()[-500:]}"}
        found = COLLECTED.findall(err)
        if proc.returncode != 0 or not found:
            return {**row, "skipped": f"valgrind reported no count: {err.strip()[-500:]}"}
        total, copying = int(found[-1]), bulk_copy_instructions(profile)
    return {**row, "instructions": round(total / calls),
            "outside_bulk_copy": round((total - copying) / calls), "calls": calls,
            "capacity": capacity}


def _counted_run(proc: subprocess.Popen, handshake: Path, deadline: float) -> str | None:
    """Wait for the worker's signal, switch instrumentation on, let it run to the end: its
    stderr (valgrind's report), or ``None`` when it ended (or ran out of time) before the
    signal."""
    while not (handshake / "ready").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            return None
        time.sleep(0.2)
    subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], check=True,
                   capture_output=True)
    (handshake / "go").touch()
    _, err = proc.communicate(timeout=max(deadline - time.monotonic(), 1.0))
    return err


def bulk_copy_instructions(profile: Path) -> int:
    """Instructions counted in libc's ``memcpy`` / ``memmove`` of a callgrind profile."""
    annotated = subprocess.run(["callgrind_annotate", "--threshold=100", str(profile)],
                               capture_output=True, text=True, check=True).stdout
    return bulk_copy_in(annotated)


def bulk_copy_in(annotated: str) -> int:
    """The instructions of libc's ``memcpy`` / ``memmove`` lines in ``callgrind_annotate``'s
    output (self cost per function)."""
    total = 0
    for line in annotated.splitlines():
        match = ANNOTATED.match(line)
        if match and BULK_COPY.search(match.group(2)):
            total += int(match.group(1).replace(",", ""))
    return total


def overhead(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per workload: every peer's instructions per call outside libc's bulk copies, and
    tdreplay's over the floor's (what tdreplay adds per call)."""
    by_name: dict[str, dict[str, int]] = {}
    for row in results:
        if "outside_bulk_copy" in row:
            by_name.setdefault(row["name"], {})[row["peer"]] = row["outside_bulk_copy"]
    out = []
    for name in WORKLOADS:
        peers_of = by_name.get(name)
        if not peers_of:
            continue
        entry: dict[str, Any] = {"name": name, **peers_of}
        for floor in ("floor", "floor_td"):
            if "tdreplay" in peers_of and floor in peers_of:
                entry[f"over_{floor}"] = peers_of["tdreplay"] - peers_of[floor]
        out.append(entry)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=3, metavar=("PEER", "WORKLOAD", "CALLS"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--python", action="append", default=[], metavar="PEER=PATH",
                        help="the interpreter of another peer (e.g. cpprb=.../bin/python)")
    parser.add_argument("--capacity", type=int, default=1_000_000, help="buffer slots")
    parser.add_argument("--only", nargs="*", default=None, choices=sorted(WORKLOADS),
                        help="workloads to count (default: all)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="workers counted at once")
    parser.add_argument("--out", type=Path, default=OUT, help="where the JSON goes")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep callgrind's profiles in this folder (callgrind_annotate)")
    args = parser.parse_args(argv)
    if args.worker:
        peer, workload, calls = args.worker
        worker(peer, workload, int(calls), args.capacity)
        return
    missing = [tool for tool in ("valgrind", "callgrind_control", "callgrind_annotate")
               if shutil.which(tool) is None]
    if missing:
        sys.exit(f"{' and '.join(missing)} not found: install valgrind "
                 f"(Debian: apt-get install valgrind).")
    from peers_run import interpreters
    from run_all import machine

    # the floor behind TorchRL's interface: counted here only (it says where the instructions
    # go, not how fast anything is)
    pythons = {**interpreters(args.python), "floor_td": sys.executable}
    if args.keep is not None:
        args.keep = args.keep.resolve()
        args.keep.mkdir(parents=True, exist_ok=True)
    workloads = args.only or list(WORKLOADS)
    jobs = [(python, peer, name, WORKLOADS[name], args.capacity, args.keep)
            for name in workloads for peer, python in pythons.items()]
    with ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        results = list(pool.map(lambda job: count(*job), jobs))
    for row in results:
        print(json.dumps(row), flush=True)
    valgrind = subprocess.run(["valgrind", "--version"], capture_output=True, text=True)
    summary = {"machine": {**machine(), "valgrind": valgrind.stdout.strip()},
               "results": results, "overhead": overhead(results)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1) + "\n")
    for entry in summary["overhead"]:
        print(json.dumps(entry))


if __name__ == "__main__":
    main()
