"""The scale curves as a markdown table and a PNG (matplotlib, no screen needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.scale import Curve

COLOURS = {"replicad": "#1f77b4", "clickhouse": "#d62728"}
LABELS = {"replicad": "replicad", "clickhouse": "ClickHouse 18.16"}


def _num(v: float) -> str:
    if v != v:  # NaN
        return "—"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def markdown(curves: Sequence[Curve], plot_path: Path | None) -> str:
    from bench.scale import growth

    lines = []
    if plot_path is not None:
        lines += [f"![scale curves]({plot_path.name})", ""]
    lines += ["Each system measured alone on the same ZooKeeper server (bench/scale.py); growth order = the "
              "log-log slope of the figure against the work (flat < 0.2, sub-linear < 0.8, linear < 1.25, "
              "worse above); for a rate a falling slope is the bad direction (-0.2 or below: falling).", "",
              "| curve | work | replicad | ClickHouse 18.16 | ratio |", "|:---|---:|---:|---:|---:|"]
    for c in curves:
        ours = {p.x: p.value for p in c.points.get("replicad", [])}
        theirs = {p.x: p.value for p in c.points.get("clickhouse", [])}
        for x in c.xs():
            a, b = ours.get(x, float("nan")), theirs.get(x, float("nan"))
            ratio = f"{a / b:.2f}×" if b and b == b and a == a else "—"
            lines.append(f"| {c.title} ({c.unit}) | {x:,} {c.x_label} | {_num(a)} | {_num(b)} | {ratio} |")
    lines += ["", "| curve | replicad growth | ClickHouse growth |", "|:---|:---|:---|"]
    for c in curves:
        cells = []
        for system in ("replicad", "clickhouse"):
            pts = c.points.get(system, [])
            if c.key == "clients" and len(pts) >= 2:
                cells.append(f"speed-up {pts[-1].value / pts[0].value:.1f}× from {pts[0].x} to {pts[-1].x} "
                             "clients")
                continue
            slope, name = growth([p.x for p in pts], [p.value for p in pts], c.higher_is_better)
            cells.append(f"{name} (slope {slope:.2f})")
        lines.append(f"| {c.title} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def plot(curves: Sequence[Curve], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 3
    rows = (len(curves) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.8 * rows), squeeze=False)
    for ax, c in zip(axes.flat, curves, strict=False):
        for system, pts in c.points.items():
            ax.plot([p.x for p in pts], [p.value for p in pts], marker="o", color=COLOURS.get(system),
                    label=LABELS.get(system, system))
        ax.set_xscale("log")
        ax.set_title(c.title, fontsize=10)
        ax.set_xlabel(c.x_label)
        ax.set_ylabel(c.unit)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(curves):]:
        ax.set_visible(False)
    fig.suptitle("replicad vs ClickHouse 18.16: how cost grows with the work", fontsize=12)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
