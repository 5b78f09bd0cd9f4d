"""Pareto frontier plots: throughput per GPU against tokens per second per user, one curve per policy."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from sparksim.atomic import atomic_file
from sparksim.plotting import pyplot


def plot_pareto(table: pd.DataFrame, out: Path | str, *, title: str = "",
                baseline: str | None = None) -> Path:
    """Draw every sweep point and each policy's frontier; mark policies that are not lossless.

    x: interactivity (tok/s/user), y: tput_per_gpu (tok/s/GPU), as in DSpark's Fig. 7. The PNG
    is written atomically (with its folder); MissingExtraError without matplotlib.
    """
    plt = pyplot()  # first, so a missing matplotlib fails before any work

    from sparksim.sweep import pareto_frontier, speedup_at_matched_throughput

    load = "workload.concurrency" if "workload.concurrency" in table else (
        "workload.rate" if "workload.rate" in table else None)
    if load is not None:
        fig, (ax, ax_b) = plt.subplots(1, 2, figsize=(12.5, 5.0), constrained_layout=True,
                                       gridspec_kw={"width_ratios": [3, 2]})
    else:
        fig, ax = plt.subplots(figsize=(7.5, 5.0), constrained_layout=True)
    for i, (policy, grp) in enumerate(table.groupby("policy", sort=False)):
        color = f"C{i % 10}"
        label = str(grp["label"].iloc[0]) if "label" in grp else str(policy)
        style = "--" if not bool(grp["lossless"].iloc[0]) else "-"
        ax.scatter(grp["interactivity"], grp["tput_per_gpu"], s=14, color=color, alpha=0.45)
        front = pareto_frontier(grp)
        ax.plot(front["interactivity"], front["tput_per_gpu"], style, color=color, lw=1.8, label=label)
        if load is not None:
            by_load = grp.sort_values(load)
            ax_b.plot(by_load[load], by_load["verify_budget_per_request"], style + "o", color=color,
                      ms=3, lw=1.5, label=label)
    if load is not None:
        # DSpark Fig. 8: tokens verified per request per step (bonus included) against load
        ax_b.set_xscale("log")
        ax_b.set_xlabel(load.removeprefix("workload."))
        ax_b.set_ylabel("verification budget per request (tokens/step)")
        ax_b.grid(True, alpha=0.3)
        ax_b.set_title("budget vs load")
    ax.set_xlabel("interactivity (output tok/s per user)")
    ax.set_ylabel("throughput per GPU (output tok/s)")
    ax.grid(True, alpha=0.3)
    base = baseline or str(table["policy"].iloc[0])
    notes = []
    for policy in table["policy"].unique():
        if policy == base:
            continue
        sp = speedup_at_matched_throughput(table, str(policy), base)
        if len(sp):
            notes.append(f"{policy} vs {base}: ×{sp['speedup'].min():.2f}–{sp['speedup'].max():.2f} tok/s/user")
    if notes:
        ax.text(0.99, 0.99, "at matched throughput\n" + "\n".join(notes), transform=ax.transAxes,
                ha="right", va="top", fontsize=8, bbox={"fc": "white", "alpha": 0.8, "lw": 0})
    ax.legend(fontsize=8, loc="lower left")
    ax.set_title(title or "Pareto frontier (dashed: not lossless)")
    out = Path(out)
    with atomic_file(out) as tmp:
        fig.savefig(tmp, format="png", dpi=130)
    plt.close(fig)
    return out
