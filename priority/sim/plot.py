"""Gain-vs-load figures in the style of PROSERVE's Fig. 10."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _load_of(result: dict[str, Any]) -> float:
    return float(result["rate_scale"] if "rate_scale" in result else result["rps"])


def plot_gain_vs_load(results: Sequence[dict[str, Any]], path: Path, *, title: str = "") -> None:
    """TDG ratio and SLO attainment per policy against load (one line per policy)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_policy: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for r in results:
        by_policy[r["policy"]].append((_load_of(r), r["tdg_ratio"], r["slo_attainment"]))
    x_label = "load (× native rate)" if results and "rate_scale" in results[0] else "requests/s"

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    markers = "os^Dv<>pP*X"
    for k, (policy, points) in enumerate(sorted(by_policy.items())):
        points.sort()
        loads = [p[0] for p in points]
        style = {
            "marker": markers[k % len(markers)],
            "linewidth": 2.4 if policy == "slide" else 1.4,
        }
        axes[0].plot(loads, [p[1] for p in points], label=policy, **style)
        axes[1].plot(loads, [p[2] for p in points], label=policy, **style)
    axes[0].set_ylabel("TDG ratio (gain / ideal)")
    axes[1].set_ylabel("SLO attainment")
    for ax in axes:
        ax.set_xlabel(x_label)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[1].legend(loc="lower left", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
