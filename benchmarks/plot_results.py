"""Draw ``results/latest.json`` as ``results/latest.png`` (run by ``run_all.py``).

One panel per unit (rows/s, calls/s, s, %, x, ...), so every axis compares like with like;
each panel's title says whether higher or lower is better. One horizontal bar per
measurement, labelled with its value; measurements that share a name (the same benchmark at
several settings) are told apart by the settings that differ (e.g. ``level=3``). An axis is
logarithmic only when its values span more than two orders of magnitude. The documentation's
benchmarks page shows this plot next to the table of the same results.

Usage: ``python benchmarks/plot_results.py [results.json [plot.png]]``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "latest.json"
PLOT = HERE / "results" / "latest.png"

#: units where a smaller value is better (durations, sizes); every other unit is a rate, a
#: ratio or a saving, where higher is better
LOWER_IS_BETTER = {"s", "ms", "us", "ns", "bytes", "B", "KB", "MB", "GB", "MiB", "GiB"}
#: keys of a result row that are not settings of the measurement (they never tell rows apart)
NOT_SETTINGS = {"name", "value", "unit", "script", "date", "median", "cpu_rate",
                "cpu_cycles_per_s", "loadavg_1m", "us_per_step", "batches_per_s", "raw_bytes",
                "compressed_bytes", "bytes"}


def better(unit: str) -> str:
    """``"lower"`` or ``"higher"``: which way is better for values in ``unit``."""
    return "lower" if unit in LOWER_IS_BETTER else "higher"


def _label(value: float, unit: str) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f} {unit}"
    return f"{value:,.3g} {unit}"


def labels(rows: list[dict]) -> list[str]:
    """One distinct label per row: its name, plus the settings that tell apart rows of the
    same name (``compressed.ratio (level=3)``)."""
    out = []
    for row in rows:
        same = [r for r in rows if r["name"] == row["name"]]
        label = str(row["name"])
        if len(same) > 1:
            keys = sorted({k for r in same for k in r} - NOT_SETTINGS)
            differ = [k for k in keys if len({json.dumps(r.get(k)) for r in same}) > 1]
            if differ:
                label += " (" + ", ".join(f"{k}={row.get(k)}" for k in differ) + ")"
        out.append(label)
    for i, label in enumerate(out):  # still equal (no setting differs): number them
        if out.count(label) > 1:
            out[i] = f"{label} #{out[:i].count(label) + 1}"
    return out


def panels(results: list[dict]) -> dict[str, list[tuple[str, float]]]:
    """``{unit: [(label, value), ...]}`` in the order of the results (positive values only:
    a bar of zero or less says nothing on these axes)."""
    by_unit: dict[str, list[dict]] = {}
    for row in results:
        by_unit.setdefault(str(row["unit"]), []).append(row)
    out = {}
    for unit, rows in by_unit.items():
        kept = [(label, float(row["value"])) for label, row in zip(labels(rows), rows)
                if float(row["value"]) > 0]
        if kept:
            out[unit] = kept
    return out


def plot(results_path: Path = RESULTS, out: Path = PLOT) -> Path:
    """Write the plot of ``results_path`` to ``out`` and return ``out``."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    payload = json.loads(results_path.read_text())
    groups = panels(payload.get("results", []))
    if not groups:
        raise ValueError(f"{results_path} holds no positive results to plot.")

    heights = [len(rows) + 1.6 for rows in groups.values()]
    fig, axes = plt.subplots(len(groups), 1, figsize=(11, 0.3 * sum(heights) + 1.2),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, (unit, rows) in zip(axes[:, 0], groups.items()):
        names = [label for label, _ in rows][::-1]
        values = [value for _, value in rows][::-1]
        direction = better(unit)
        color = "#4c72b0" if direction == "higher" else "#c44e52"
        bars = ax.barh(range(len(rows)), values, color=color)
        log = max(values) / min(values) > 100
        if log:
            ax.set_xscale("log")
            ax.set_xlim(min(values) / 3, max(values) * 40)  # room for the labels
        else:
            ax.set_xlim(0, max(values) * 1.35)
        ax.set_yticks(range(len(rows)), names, fontsize=8)
        for bar, value in zip(bars, values):
            x = bar.get_width() * (1.1 if log else 1.0) + (0 if log else max(values) * 0.01)
            ax.text(x, bar.get_y() + bar.get_height() / 2, _label(value, unit), va="center",
                    fontsize=7)
        scale = ", log scale" if log else ""
        ax.set_title(f"{unit}: {direction} is better{scale}", fontsize=9, loc="left")
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(axis="x", which="major", alpha=0.3)
    machine = payload.get("machine", {})
    summary = ", ".join(f"{key}: {value}" for key, value in machine.items() if value is not None)
    fig.suptitle(f"tdreplay benchmarks ({summary})", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.45 / fig.get_figheight()))  # room for the title
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


if __name__ == "__main__":
    args = [Path(a) for a in sys.argv[1:3]]
    print(f"wrote {plot(*args)}")
