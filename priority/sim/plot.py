"""Gain-vs-load figures in the style of PROSERVE's Fig. 10."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def _load_of(result: dict[str, Any]) -> float:
    return float(result["rate_scale"] if "rate_scale" in result else result["rps"])


def plot_gain_vs_load(results: Sequence[dict[str, Any]], path: Path, *, title: str = "") -> None:
    """TDG ratio and SLO attainment per policy against load (one line per policy)."""
    x_label = "load (× native rate)" if results and "rate_scale" in results[0] else "requests/s"
    plot_metrics_vs_load(
        results,
        path,
        metrics=(("tdg_ratio", "TDG ratio (gain / ideal)"), ("slo_attainment", "SLO attainment")),
        load_of=_load_of,
        x_label=x_label,
        title=title,
    )


def plot_metrics_vs_load(
    results: Sequence[dict[str, Any]],
    path: Path,
    *,
    metrics: Sequence[tuple[str, str]],
    load_of: Callable[[dict[str, Any]], float],
    x_label: str,
    title: str = "",
    highlight: str = "slide",
) -> None:
    """One panel per ``(key, y label)`` metric (each a share in [0, 1]), one line per policy
    against load; ``highlight`` is drawn thicker (the goodput bench plots GMAX this way)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_policy: dict[str, list[tuple[float, ...]]] = defaultdict(list)
    for r in results:
        by_policy[r["policy"]].append((load_of(r), *(float(r[key]) for key, _ in metrics)))

    fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 4.2), squeeze=False)
    panels = axes[0]
    markers = "os^Dv<>pP*X"
    colors = plt.get_cmap("tab10" if len(by_policy) <= 10 else "tab20")
    for k, (policy, points) in enumerate(sorted(by_policy.items())):
        points.sort()
        loads = [p[0] for p in points]
        style = {
            "marker": markers[k % len(markers)],
            "color": colors(k % colors.N),
            "linewidth": 2.4 if policy == highlight else 1.4,
        }
        for m, ax in enumerate(panels):
            ax.plot(loads, [p[m + 1] for p in points], label=policy, **style)
    for ax, (_, label) in zip(panels, metrics, strict=True):
        ax.set_ylabel(label)
        ax.set_xlabel(x_label)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    panels[-1].legend(loc="lower left", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
