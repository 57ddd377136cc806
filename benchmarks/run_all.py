"""Run every ``bench_*.py`` script, collect their JSON lines into ``results/latest.json``.

Then draw them into ``results/latest.png`` (``plot_results.py``, needs matplotlib); the docs'
benchmarks page shows the table and the plot.

Usage: ``python benchmarks/run_all.py [name-filter ...]`` (run by ``nox -s bench``). With
filters, only the matching scripts run; the rows of the other scripts are kept from the previous
``latest.json``. Every row records the ``date`` it was measured.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, object]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "date": time.strftime("%Y-%m-%d"),
    }


def previous_rows(path: Path, rerun: set[str]) -> list[dict[str, object]]:
    """Rows of ``path`` (an earlier ``latest.json``) from scripts not in ``rerun``."""
    try:
        rows = json.loads(path.read_text())["results"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [row for row in rows if row.get("script") not in rerun]


def main(filters: list[str]) -> int:
    results: list[dict[str, object]] = []
    failed = []
    ran: set[str] = set()
    today = time.strftime("%Y-%m-%d")
    for script in sorted(HERE.glob("bench_*.py")):
        if filters and not any(f in script.stem for f in filters):
            continue
        print(f"== {script.name}", flush=True)
        ran.add(script.stem)
        proc = subprocess.run([sys.executable, str(script)], cwd=HERE, capture_output=True, text=True)
        for line in proc.stdout.splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                print(line)
                continue
            row["script"] = script.stem
            row["date"] = today
            results.append(row)
            print(f"  {row['name']:<55} {row['value']:>14,.1f} {row['unit']}")
        if proc.returncode:
            failed.append(script.name)
            print(proc.stderr[-3000:], file=sys.stderr)
    out = HERE / "results" / "latest.json"
    out.parent.mkdir(exist_ok=True)
    if filters:
        results = previous_rows(out, ran) + results
    out.write_text(json.dumps({"machine": machine(), "results": results}, indent=1))
    print(f"wrote {out}")
    if any(float(row["value"]) > 0 for row in results):
        from plot_results import plot  # matplotlib: installed by the bench nox session

        print(f"wrote {plot(out, out.with_suffix('.png'))}")
    if failed:
        print(f"failed: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
