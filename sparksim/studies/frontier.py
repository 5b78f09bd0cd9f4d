"""Pareto frontiers of a sweep: throughput per GPU against tok/s per user, and matched speedups.

Pure pandas/numpy, shared by `sparksim sweep`'s table, its figure and the analyses, so the
numbers a reader sees in the terminal and on the plot come from one rule.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from sparksim.sim.metrics import UNFINISHED_SHARE


def overloaded(table: pd.DataFrame) -> pd.Series:
    """Return, per row, whether its queue was still growing at the horizon.

    That is: more than UNFINISHED_SHARE of the steady window's arrivals still waiting to
    start decoding (`steady_waiting`). Requests still decoding are not counted: at a load
    the system carries, a long response that arrived late in the window is unfinished too.
    A table written before `steady_waiting` was kept uses every unfinished request; one
    without the census columns marks no row.
    """
    if not {"steady_unfinished", "steady_requests"} <= set(table.columns):
        return pd.Series(False, index=table.index)
    unfinished = table["steady_unfinished"].fillna(0).astype(float)
    arrived = table["steady_requests"].fillna(0).astype(float) + unfinished
    waiting = (table["steady_waiting"].fillna(0).astype(float) if "steady_waiting" in table.columns
               else unfinished)
    return (arrived > 0) & (waiting > UNFINISHED_SHARE * arrived)


def pareto_frontier(df: pd.DataFrame, x: str = "interactivity", y: str = "tput_per_gpu") -> pd.DataFrame:
    """Return the points no other point beats on both x and y, sorted by x."""
    pts = df[[x, y]].to_numpy(np.float64)
    keep = []
    for i, (xi, yi) in enumerate(pts):
        if not np.isfinite([xi, yi]).all():
            continue
        dominated = ((pts[:, 0] >= xi) & (pts[:, 1] >= yi) & ((pts[:, 0] > xi) | (pts[:, 1] > yi))).any()
        if not dominated:
            keep.append(i)
    return df.iloc[keep].sort_values(x)


def speedup_at_matched_throughput(
    df: pd.DataFrame, policy: str, baseline: str, levels: Sequence[float] | None = None
) -> pd.DataFrame:
    """Tokens/s per user of `policy` over `baseline` at equal throughput per GPU.

    Both frontiers are interpolated (log-linear in throughput) at each level, which defaults
    to the baseline frontier's own throughputs inside the range both policies reach.
    """
    a = pareto_frontier(df[df["policy"] == policy]).sort_values("tput_per_gpu")
    b = pareto_frontier(df[df["policy"] == baseline]).sort_values("tput_per_gpu")
    if len(a) < 2 or len(b) < 2:
        return pd.DataFrame(columns=["tput_per_gpu", "interactivity_policy", "interactivity_baseline", "speedup"])
    lo = max(a["tput_per_gpu"].min(), b["tput_per_gpu"].min())
    hi = min(a["tput_per_gpu"].max(), b["tput_per_gpu"].max())
    lv = np.asarray(levels if levels is not None else b["tput_per_gpu"], np.float64)
    lv = lv[(lv >= lo) & (lv <= hi)]
    ia = np.interp(np.log(lv), np.log(a["tput_per_gpu"]), a["interactivity"])
    ib = np.interp(np.log(lv), np.log(b["tput_per_gpu"]), b["interactivity"])
    return pd.DataFrame({"tput_per_gpu": lv, "interactivity_policy": ia,
                         "interactivity_baseline": ib, "speedup": ia / ib})


def series_of(table: pd.DataFrame) -> pd.Series:
    """Return each row's series, as the terminal's table and the figure compare them: its policy
    spec, with the drafter it paid for (`spec · drafter`) where one spec's rows paid for several
    (a sweep over `policy.drafter`), so two drafters' points never share one frontier."""
    spec = table["policy"].astype(str)
    if "drafter" not in table.columns:
        return spec
    drafter = table["drafter"].astype(str)
    several = drafter.groupby(spec).transform("nunique") > 1
    return spec.where(~several, spec + " · " + drafter)


def series_speedups(table: pd.DataFrame, baseline: str) -> tuple[str, list[tuple[str, pd.DataFrame]]]:
    """Return the baseline series and each other series' `speedup_at_matched_throughput` over it.

    `baseline` is a series or a policy spec (then its first series, in table order); points
    marked by `overloaded` are left out first.
    """
    series = series_of(table)
    base = baseline
    if baseline not in set(series):
        hits = series[table["policy"].astype(str) == baseline]
        base = str(hits.iloc[0]) if len(hits) else baseline
    kept = table.assign(policy=series)[~overloaded(table)]
    return base, [(name, speedup_at_matched_throughput(kept, name, base))
                  for name in dict.fromkeys(series) if name != base]


# a scenario's top-level keys a sweep may vary (`--vary seed=0,1,2`): a row's column of that
# name is a swept value, as is every dotted one (`workload.concurrency`); no metric is so named
TOP_LEVEL_KEYS = ("name", "seed", "profile", "lookup", "traces", "trace_block")


def swept_columns(table: pd.DataFrame) -> list[str]:
    """Return a sweep table's swept keys, in column order: dotted names and top-level keys."""
    return [c for c in table.columns if "." in str(c) or c in TOP_LEVEL_KEYS]
