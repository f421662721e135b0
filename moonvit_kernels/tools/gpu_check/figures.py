"""The PNGs: each kernel's throughput as % of its baseline, and the tower's time per stage.

matplotlib is optional: without it no PNG is written and the report says so.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

KERNELS_PNG = "kernels_vs_baseline.png"
STAGES_PNG = "tower_stages.png"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_figures(rows: list[dict[str, Any]], out_dir: Path, title: str) -> list[str]:
    """Write the PNGs that have data; returns the file names written. ImportError without matplotlib."""
    plt = _pyplot()
    written = []
    kernels = [r for r in rows if r["section"] == "kernels" and r["pct_of_baseline"] != ""]
    if kernels:
        fig, ax = plt.subplots(figsize=(10, 0.28 * len(kernels) + 1.5))
        labels = [f"{r['backend']} {r['item']} {r['shape']}" for r in kernels]
        values = [float(r["pct_of_baseline"]) for r in kernels]
        colors = ["tab:blue" if r["unit"] == "TFLOP/s" else "tab:orange" for r in kernels]
        ax.barh(range(len(kernels)), values, color=colors)
        ax.set_yticks(range(len(kernels)), labels, fontsize=6)
        ax.invert_yaxis()
        ax.axvline(100, color="k", lw=0.8)
        ax.set_xlabel("% of baseline throughput (blue: FLOP-bound vs cuBLAS/SDPA, orange: bytes vs D2D copy)")
        ax.set_title(title, fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / KERNELS_PNG, dpi=110)
        plt.close(fig)
        written.append(KERNELS_PNG)
    stages = [r for r in rows if r["section"] == "stages" and not str(r["stage"]).startswith("layer, median")]
    if stages:
        runs: dict[str, dict[str, float]] = defaultdict(dict)
        for r in stages:
            runs[f"{r['item']} | {r['backend']}"][r["stage"]] = float(r["median_ms"])
        names = list(dict.fromkeys(r["stage"] for r in stages))
        fig, ax = plt.subplots(figsize=(10, 0.3 * len(runs) + 2))
        totals = [sum(v.values()) or 1.0 for v in runs.values()]
        left = [0.0] * len(runs)
        for s in names:
            widths = [100.0 * v.get(s, 0.0) / t for v, t in zip(runs.values(), totals, strict=True)]
            ax.barh(range(len(runs)), widths, left=left, label=s)
            left = [a + b for a, b in zip(left, widths, strict=True)]
        ax.set_yticks(range(len(runs)), [f"{k} ({t:.4g} ms)" for k, t in zip(runs, totals, strict=True)], fontsize=6)
        ax.invert_yaxis()
        ax.set_xlabel("% of the forward's time, by stage (total in brackets)")
        ax.legend(fontsize=6)
        ax.set_title(title, fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / STAGES_PNG, dpi=110)
        plt.close(fig)
        written.append(STAGES_PNG)
    return written
