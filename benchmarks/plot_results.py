"""Draw ``results/latest.json`` as ``results/latest.png`` (run by ``run_all.py``).

One panel per benchmark script, one horizontal bar per measurement, on a log scale (the
measurements have different units: each bar is labelled with its value and unit). The
documentation's benchmarks page shows this plot next to the table of the same results.

Usage: ``python benchmarks/plot_results.py [results.json [plot.png]]``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "latest.json"
PLOT = HERE / "results" / "latest.png"


def _label(value: float, unit: str) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f} {unit}"
    return f"{value:,.3g} {unit}"


def plot(results_path: Path = RESULTS, out: Path = PLOT) -> Path:
    """Write the plot of ``results_path`` to ``out`` and return ``out``."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    payload = json.loads(results_path.read_text())
    groups: dict[str, list[dict]] = {}
    for row in payload.get("results", []):
        if float(row["value"]) > 0:  # a log axis cannot show zero or negative values
            groups.setdefault(str(row.get("script", "results")), []).append(row)
    if not groups:
        raise ValueError(f"{results_path} holds no positive results to plot.")

    heights = [len(rows) + 1.5 for rows in groups.values()]
    fig, axes = plt.subplots(len(groups), 1, figsize=(11, 0.32 * sum(heights) + 1.2),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, (script, rows) in zip(axes[:, 0], groups.items()):
        names = [row["name"] for row in rows][::-1]
        values = [float(row["value"]) for row in rows][::-1]
        units = [str(row["unit"]) for row in rows][::-1]
        bars = ax.barh(range(len(rows)), values, color="#4c72b0")
        ax.set_xscale("log")
        ax.set_yticks(range(len(rows)), names, fontsize=8)
        ax.set_xlim(min(values) / 3, max(values) * 40)  # room for the labels
        for bar, value, unit in zip(bars, values, units):
            ax.text(bar.get_width() * 1.1, bar.get_y() + bar.get_height() / 2,
                    _label(value, unit), va="center", fontsize=7)
        ax.set_title(f"{script}.py", fontsize=9, loc="left")
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
