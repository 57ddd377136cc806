"""Draw ``results/peers.json`` as ``results/peers.png`` and ``results/scaling.png``.

Run by ``peers_run.py`` (``nox -s bench-peers``); the docs' benchmarks page shows both.

- ``peers.png``: one panel per unit (rows/s, calls/s, cycles/s: higher is better), one group of
  bars per workload, one bar per peer (tdreplay, cpprb, TorchRL, the floor), labelled with its
  value; then a panel of tdreplay's speed-ups over the best peer and over the floor (x, higher
  is better, 1 = as fast). A peer that cannot run a workload has no bar there.
- ``scaling.png``: the cost of one call (µs, lower is better) against the number of rows in
  the buffer (log scale), for uniform ``sample(B)`` and prioritized cycles at B = 256 and 4096;
  a flat line is a cost independent of the buffer size.

Usage: ``python benchmarks/plot_peers.py [peers.json]``.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

from plot_results import _label, better

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "peers.json"
ORDER = ["tdreplay", "cpprb", "torchrl", "floor"]
COLORS = {"tdreplay": "#4c72b0", "cpprb": "#dd8452", "torchrl": "#55a868", "floor": "#8c8c8c"}
SCALING = ["scaling/uniform_sample_256", "scaling/uniform_sample_4096",
           "scaling/prioritized_cycle_B256", "scaling/prioritized_cycle_B4096"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _wrap(label: str) -> str:
    return textwrap.fill(label, 34)


def _rows(value: float, _pos: object = None) -> str:
    """``1M``, ``30M``, ``1.5M``: a number of rows (or rows/s) on an axis."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:g}{suffix}"
    return f"{value:g}"


def _subtitle(payload: dict) -> str:
    m = payload.get("machine", {})
    return (f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores, torch {m.get('torch', '?')}, "
            f"{m.get('date', '?')}; load average {m.get('loadavg_before', ['?'])[0]} before, "
            f"{m.get('loadavg_after', ['?'])[0]} after")


def fixed_panels(payload: dict) -> dict[str, dict[str, dict[str, float]]]:
    """``{unit: {workload name: {peer: value}}}`` of the workloads at one buffer size."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for row in payload.get("results", []):
        if "rows" in row or float(row["value"]) <= 0:
            continue
        out.setdefault(row["unit"], {}).setdefault(row["name"], {})[row["peer"]] = \
            float(row["value"])
    return out


def plot_peers(results: Path = RESULTS, out: Path | None = None) -> Path:
    """``peers.png`` of ``results``; returns its path."""
    plt = _pyplot()
    payload = json.loads(results.read_text())
    out = out or results.with_name("peers.png")
    labels = payload.get("labels", {})
    panels = fixed_panels(payload)
    ratios = [r for r in payload.get("ratios", []) if "rows" not in r]
    bars_of = {unit: sum(len(by_peer) + 1 for by_peer in work.values())
               for unit, work in panels.items()}
    heights = [n + 1.5 for n in bars_of.values()] + [2 * len(ratios) + 2.5]
    fig, axes = plt.subplots(len(heights), 1, figsize=(11, 0.22 * sum(heights) + 1.2),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, (unit, work) in zip(axes[:, 0], panels.items()):
        y, ticks, names = 0.0, [], []
        values = [v for by_peer in work.values() for v in by_peer.values()]
        log = max(values) / min(values) > 100
        for name, by_peer in work.items():
            peers = [p for p in ORDER if p in by_peer]
            top = y
            for peer in peers:
                ax.barh(-y, by_peer[peer], color=COLORS[peer], height=0.9,
                        label=peer if peer not in ax.get_legend_handles_labels()[1] else None)
                x = by_peer[peer] * (1.05 if log else 1.0) + (0 if log else max(values) * 0.01)
                ax.text(x, -y, f"{peer}: {_label(by_peer[peer], unit)}", va="center",
                        fontsize=6.5)
                y += 1
            ticks.append(-(top + y - 1) / 2)
            names.append(_wrap(labels.get(name, name)))
            y += 1
        if log:
            ax.set_xscale("log")
            ax.set_xlim(min(values) / 2, max(values) * 30)
        else:
            ax.set_xlim(0, max(values) * 1.45)
            ax.xaxis.set_major_formatter(_rows)
        ax.set_yticks(ticks, names, fontsize=7.5)
        ax.set_title(f"{unit}: {better(unit)} is better" + (", log scale" if log else ""),
                     fontsize=9, loc="left")
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(axis="x", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    ax = axes[-1, 0]
    y, ticks, names = 0.0, [], []
    shown = [v for r in ratios for v in (r["vs_best_peer"], r["vs_floor"]) if v]
    for r in ratios:
        best = r["best_peer"]
        for key, color, text in (("vs_best_peer", COLORS.get(best, "black"), f"/ {best}"),
                                 ("vs_floor", COLORS["floor"], "/ floor")):
            if r[key]:
                ax.barh(-y, r[key], color=color, height=0.9)
                ax.text(r[key] * 1.03, -y, f"{r[key]:.2f}x {text}", va="center", fontsize=6.5)
            y += 1
        ticks.append(-(y - 1.5))
        names.append(_wrap(labels.get(r["name"], r["name"])))
        y += 1
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_xscale("log")
    if shown:
        ax.set_xlim(min(min(shown), 1.0) / 1.5, max(max(shown), 1.0) * 3)
    ax.set_yticks(ticks, names, fontsize=7.5)
    ax.set_title("x (tdreplay's speed over the best peer's, bar in that peer's colour, and "
                 "over the floor's): higher is better,\nabove 1 = tdreplay faster, log scale",
                 fontsize=9, loc="left")
    ax.tick_params(axis="x", labelsize=7)
    ax.grid(axis="x", alpha=0.3)
    fig.suptitle(f"tdreplay and its peers, same workloads, one run ({_subtitle(payload)})",
                 fontsize=8.5)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.45 / fig.get_figheight()))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def scaling_series(payload: dict, name: str) -> dict[str, list[tuple[int, float]]]:
    """``{peer: [(rows, µs per call), ...]}`` of the scaling workload ``name``."""
    out: dict[str, list[tuple[int, float]]] = {}
    for row in payload.get("results", []):
        if row["name"] == name and "rows" in row and float(row["value"]) > 0:
            out.setdefault(row["peer"], []).append((int(row["rows"]), 1e6 / float(row["value"])))
    return {peer: sorted(points) for peer, points in out.items()}


def plot_scaling(results: Path = RESULTS, out: Path | None = None) -> Path:
    """``scaling.png`` of ``results``; returns its path."""
    plt = _pyplot()
    payload = json.loads(results.read_text())
    out = out or results.with_name("scaling.png")
    labels = payload.get("labels", {})
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), squeeze=False)
    for ax, name in zip(axes.flat, SCALING):
        series = scaling_series(payload, name)
        for peer in [p for p in ORDER if p in series]:
            xs, ys = zip(*series[peer])
            ax.plot(xs, ys, marker="o", color=COLORS[peer], label=peer)
            ax.annotate(f"{ys[-1]:,.0f}", (xs[-1], ys[-1]), fontsize=6.5,
                        textcoords="offset points", xytext=(4, 0))
        ax.set_xscale("log")
        sizes = sorted({x for points in series.values() for x, _ in points})
        ax.set_xticks(sizes, [_rows(x) for x in sizes])
        ax.minorticks_off()
        ax.set_ylim(bottom=0)
        ax.set_xlabel("rows in the buffer (log scale)", fontsize=8)
        ax.set_ylabel("µs per call", fontsize=8)
        ax.set_title(f"{labels.get(name, name)}\nµs per call: lower is better",
                     fontsize=8.5, loc="left")
        ax.tick_params(labelsize=7)
        ax.grid(which="both", alpha=0.3)
        if series:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no results", transform=ax.transAxes, ha="center")
    skipped = sorted({f"{s['peer']} {s['rows']:,} rows ({s['skipped']})"
                      for s in payload.get("skipped", [])
                      if "rows" in s and "GiB available" in s["skipped"]})
    note = ("; not measured: " + "; ".join(skipped)) if skipped else ""
    fig.suptitle(f"Cost against buffer size, 33-byte rows, 1 torch thread "
                 f"({_subtitle(payload)}){note}", fontsize=8, wrap=True)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS
    print(f"wrote {plot_peers(path)}")
    print(f"wrote {plot_scaling(path)}")
