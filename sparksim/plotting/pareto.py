"""Pareto frontier plots: throughput per GPU against tokens per second per user, one curve per policy.

A series is one full policy spec as the run labelled it (`static(gamma=1) · mtp-1`): two rows
with one policy name and different drafters are two series. Each series keeps its colour in
every figure (a fixed palette keyed by the label), the legend and the notes sit below the
axes so they never hide a point, and the matched-throughput speedups leave out points whose
queue was still growing at the horizon.
"""

from __future__ import annotations

import hashlib
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from sparksim.atomic import atomic_file
from sparksim.plotting import pyplot
from sparksim.sim.metrics import UNFINISHED_SHARE
from sparksim.studies.frontier import (
    overloaded,
    pareto_frontier,
    series_of,
    series_speedups,
    swept_columns,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.axis import Axis
    from matplotlib.figure import Figure

# Matplotlib's tab10 then Dark2: dark enough for thin lines, distinct side by side.
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02",
)
DEFAULT_TITLE = "Pareto frontier: throughput per GPU against tok/s per user"
# Where a point's label may sit, in points from the point, tried in order (x, y, ha, va):
# above right, below right, above left, below left, then further up and down.
LABEL_PLACES = ((4, 3, "left", "bottom"), (4, -3, "left", "top"), (-4, 3, "right", "bottom"),
                (-4, -3, "right", "top"), (4, 10, "left", "bottom"), (4, -10, "left", "top"))
COINCIDENT_PX = 6.0  # points of one series closer than this on screen share one label ("128, 256")
MARKER_PX = 4.0  # half the side of the square a point's marker is taken to cover


def series_labels(table: pd.DataFrame) -> pd.Series:
    """Return each row's series: the run's full policy label (drafter included), else its spec."""
    if "label" in table:
        return table["label"].astype(str)
    return table["policy"].astype(str)


def palette_index(label: str) -> int:
    """Return the palette slot of `label`: a hash, the same in every figure and process."""
    return int(hashlib.sha256(label.encode()).hexdigest(), 16) % len(PALETTE)


def series_colors(labels: Sequence[str]) -> dict[str, str]:
    """Give each label its palette colour; a label whose slot is taken here takes the next free one.

    Only a clash inside one figure moves a colour, so a policy keeps its colour across the
    figures of a study unless two of its policies hash alike.
    """
    taken: set[int] = set()
    colors = {}
    for label in dict.fromkeys(labels):
        slot = palette_index(label)
        while slot in taken and len(taken) < len(PALETTE):
            slot = (slot + 1) % len(PALETTE)
        taken.add(slot)
        colors[label] = PALETTE[slot]
    return colors


def varied_columns(table: pd.DataFrame) -> list[str]:
    """Return the swept keys (`workload.concurrency`, `seed`, ...): `frontier.swept_columns`."""
    return swept_columns(table)


def _value(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def workload_words(workload: Mapping[str, Any], varied: Sequence[str]) -> str:
    """Describe a resolved `workload` section in a few words, leaving out the swept keys."""
    shown = {k for k in varied if k.startswith("workload.")}
    kind = workload.get("kind", "closed")
    if kind == "closed":
        words = "closed loop" if "workload.concurrency" in shown else \
            f"closed loop, {workload.get('concurrency')} users"
        if workload.get("think_time_s"):
            words += f", think {_value(workload['think_time_s'])} s"
    elif kind == "replay":
        words = f"replay of {workload.get('arrivals_csv')}"
    else:
        words = f"{kind} arrivals" + ("" if "workload.rate" in shown else f" at {_value(workload.get('rate'))} req/s")
    lengths = workload.get("lengths", {}).get("source")
    if lengths:
        words += f", lengths from {lengths}"
    mix = workload.get("mix") or {}
    if mix and "workload.mix" not in shown:
        total = sum(mix.values()) or 1.0
        words += ", mix " + " ".join(f"{k} {100 * v / total:.0f} %" for k, v in mix.items())
    return words


def figure_title(meta: Mapping[str, Any] | None, varied: Sequence[str], title: str = "") -> str:
    """Return the figure's title: `title` (else the sweep's), then its profile, traces and workload."""
    meta = meta or {}
    head = title or str(meta.get("title") or DEFAULT_TITLE)
    about = []
    if meta.get("profile"):
        about.append(f"profile {meta['profile']}")
    if meta.get("traces"):
        about.append(f"traces {meta['traces']}")
    if isinstance(meta.get("workload"), Mapping):
        about.append(workload_words(meta["workload"], varied))
    return head if not about else head + "\n" + " · ".join(about)


def speedup_notes(table: pd.DataFrame, baseline: str | None) -> list[str]:
    """Return one line per series: its tok/s/user over the baseline's at matched throughput.

    `baseline` is a policy spec or a label (default: the first series). Points marked by
    `overloaded` are left out first, and a range found at a single throughput says so.
    """

    if table.empty:
        return []
    # the terminal table's series and speedups (`series_speedups`), named by their labels
    labels = series_labels(table)
    series = series_of(table)
    label_of = dict(zip(series, labels, strict=True))
    if baseline is not None and baseline in set(labels) and baseline not in set(series):
        baseline = str(series[labels == baseline].iloc[0])  # given as a label
    base_series, speedups = series_speedups(table, baseline if baseline is not None else str(series.iloc[0]))
    base = label_of.get(base_series, base_series)
    notes = []
    for name, sp in speedups:
        label = label_of[name]
        if len(sp) == 0:
            notes.append(f"{label} vs {base}: no throughput both reach")
        elif len(sp) == 1:
            row = sp.iloc[0]
            notes.append(f"{label} vs {base}: ×{row['speedup']:.2f} tok/s/user, at a single matched "
                         f"throughput ({row['tput_per_gpu']:,.0f} tok/s/GPU)")
        else:
            notes.append(f"{label} vs {base}: ×{sp['speedup'].min():.2f}–{sp['speedup'].max():.2f} tok/s/user "
                         f"over {sp['tput_per_gpu'].min():,.0f}–{sp['tput_per_gpu'].max():,.0f} tok/s/GPU "
                         f"({len(sp)} matched throughputs)")
    return notes


def plain_log_ticks(axis: Axis) -> None:
    """Put a log axis's ticks at 1, 2, 5 × 10^k and write them as plain numbers (1,000, not 10³)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _place(text: Any, place: tuple[float, float, str, str]) -> None:
    """Put annotation `text` at `place` (x, y offset in points, horizontal and vertical alignment)."""
    dx, dy, ha, va = place
    text.xyann = (dx, dy)
    text.set_horizontalalignment(ha)
    text.set_verticalalignment(va)


def _is_free(box: Any, frame: Any, taken: Sequence[Any], points: Sequence[Any]) -> bool:
    """Whether pixel box `box` lies inside `frame` and clear of the boxes `taken` and the `points`."""
    if box.x0 < frame.x0 or box.x1 > frame.x1 or box.y0 < frame.y0 or box.y1 > frame.y1:
        return False
    if any(box.overlaps(other) for other in taken):
        return False
    return not any(box.x0 - MARKER_PX < x < box.x1 + MARKER_PX and box.y0 - MARKER_PX < y < box.y1 + MARKER_PX
                   for x, y in points)


def declutter_labels(ax: Axes) -> None:
    """Place each point label of `ax` where it covers no other label, nor a point if it can help it.

    Labels are taken in the order they were drawn; each takes the first of LABEL_PLACES that
    stays inside the axes and clear of the labels already placed, trying first to clear
    every other point's marker too. Points of one series (one colour) that coincide on
    screen share one label ("128, 256"); a label with no free place is left out rather than
    drawn over another. Call it once the axes are final (scales, limits, layout): it works
    in pixels.
    """
    from matplotlib.text import Annotation

    fig = ax.get_figure()
    assert fig is not None
    fig.canvas.draw()  # lay the figure out: from here on, positions are final pixels
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    frame = ax.get_window_extent(renderer)
    labels = [t for t in ax.texts if isinstance(t, Annotation)]
    at = np.array([ax.transData.transform(t.xy) for t in labels]).reshape(-1, 2)  # (labels, 2) pixels
    kept: list[int] = []  # indices of the labels placed so far
    boxes: list[Any] = []  # their pixel boxes, in the same order
    for i, text in enumerate(labels):
        near = [k for k in kept if labels[k].get_color() == text.get_color()
                and np.hypot(*(at[k] - at[i])) < COINCIDENT_PX]
        if near:
            twin = labels[near[0]]
            twin.set_text(f"{twin.get_text()}, {text.get_text()}")
            boxes[kept.index(near[0])] = twin.get_window_extent(renderer)
            text.remove()
            continue
        others = at[np.hypot(*(at - at[i]).T) >= 0.5]
        options = []
        for place in LABEL_PLACES:
            _place(text, place)
            options.append((place, text.get_window_extent(renderer)))
        choice = next((place for place, box in options if _is_free(box, frame, boxes, others)), None) or \
            next((place for place, box in options if _is_free(box, frame, boxes, [])), None)
        if choice is None:
            text.remove()  # drawn, it would sit on another label and neither could be read
            continue
        _place(text, choice)
        kept.append(i)
        boxes.append(text.get_window_extent(renderer))


def pareto_figure(table: pd.DataFrame, *, meta: Mapping[str, Any] | None = None,
                  baseline: str | None = None, title: str = "", log: bool = False) -> Figure:
    """Draw every sweep point and each series' frontier; return the figure (not yet saved).

    Left, DSpark's Fig. 7: interactivity (tok/s/user) against tput_per_gpu, each point
    labelled with its swept value(s), filled on its series' frontier and hollow when
    dominated; right (when load was swept), DSpark's Fig. 8: the verification budget per
    request against load. One legend and the speedup notes sit below both panels. `log`
    draws the frontier panel on log axes (for throughputs spanning decades). The point
    labels are placed last (`declutter_labels`), so none covers another.
    """
    from matplotlib.lines import Line2D


    plt = pyplot()
    varied = varied_columns(table)
    load = next((k for k in ("workload.concurrency", "workload.rate") if k in table), None)
    labels = series_labels(table)
    colors = series_colors(list(labels))
    hot = overloaded(table)
    notes = speedup_notes(table, baseline)
    caption = ["Speedups at matched throughput per GPU, tok/s per user:"] + [f"  {n}" for n in notes]
    if hot.any():
        caption.append(f"{int(hot.sum())} point(s) marked × are left out of the speedups: over "
                       f"{UNFINISHED_SHARE:.0%} of the requests that arrived in the steady window were "
                       "unfinished at the horizon (queue still growing).")
    # a point without a figure (no request finished in its window) has no place on the axes
    drawn = pd.Series(np.isfinite(table[["interactivity", "tput_per_gpu"]].to_numpy(np.float64)).all(axis=1),
                      index=table.index)
    if not drawn.all():
        caption.append(f"{int((~drawn).sum())} point(s) not drawn: no tok/s per user or throughput "
                       "(no request finished in the steady window).")
    caption = [line for text in caption for line in textwrap.wrap(text, 150, subsequent_indent="      ")]

    n_series = len(colors)
    legend_rows = -(-(n_series + 3) // 3)
    fig = plt.figure(figsize=(13.0, 5.6 + 0.22 * legend_rows + 0.17 * len(caption)), layout="constrained")
    grid = fig.add_gridspec(3, 2 if load else 1, width_ratios=[3, 2] if load else [1],
                            height_ratios=[5.0, 0.25 + 0.22 * legend_rows, 0.1 + 0.17 * len(caption)])
    ax = fig.add_subplot(grid[0, 0])
    ax_b = fig.add_subplot(grid[0, 1]) if load else None
    ax_legend = fig.add_subplot(grid[1, :])
    ax_notes = fig.add_subplot(grid[2, :])
    for blank in (ax_legend, ax_notes):
        blank.set_axis_off()

    handles: list[Any] = []
    dominated_any = False
    for label in colors:
        grp = table[labels == label]
        color = colors[label]
        style = "-" if bool(grp["lossless"].iloc[0]) else "--"
        front = pareto_frontier(grp)
        on_front = grp.index.isin(front.index)
        dominated_any |= bool((drawn[grp.index] & ~on_front).any())  # a point not drawn is not dominated
        ax.scatter(grp.loc[on_front, "interactivity"], grp.loc[on_front, "tput_per_gpu"], s=22, color=color,
                   zorder=3)
        ax.scatter(grp.loc[~on_front, "interactivity"], grp.loc[~on_front, "tput_per_gpu"], s=22,
                   facecolors="none", edgecolors=color, zorder=3)
        (line,) = ax.plot(front["interactivity"], front["tput_per_gpu"], style, color=color, lw=1.8, label=label)
        handles.append(line)
        for _, row in grp.iterrows():
            label_text = ax.annotate("/".join(_value(row[k]) for k in varied),
                                     (row["interactivity"], row["tput_per_gpu"]), textcoords="offset points",
                                     xytext=(4, 3), fontsize=7, color=color)
            label_text.set_in_layout(False)  # moved by declutter_labels once the layout is final
        if ax_b is not None and load is not None:
            by_load = grp.sort_values(load)
            ax_b.plot(by_load[load], by_load["verify_budget_per_request"], style + "o", color=color,
                      ms=3, lw=1.5, label=label)
    if hot.any():
        ax.scatter(table.loc[hot, "interactivity"], table.loc[hot, "tput_per_gpu"], marker="x", s=60,
                   color="black", lw=1.0, zorder=4)
        if ax_b is not None and load is not None:  # its budget, at a load the system did not carry
            ax_b.scatter(table.loc[hot, load], table.loc[hot, "verify_budget_per_request"], marker="x",
                         s=60, color="black", lw=1.0, zorder=4)
    swept = ", ".join(k.removeprefix("workload.") for k in varied) or "point"
    handles.append(Line2D([], [], ls="", marker="o", color="gray", label="on its policy's frontier"))
    if dominated_any:
        handles.append(Line2D([], [], ls="", marker="o", mfc="none", color="gray",
                              label="dominated (a point of its policy is better on both axes)"))
    if not table["lossless"].astype(bool).all():
        handles.append(Line2D([], [], ls="--", color="gray", label="dashed: policy not lossless"))
    if hot.any():
        handles.append(Line2D([], [], ls="", marker="x", color="black", label="queue still growing at the horizon"))
    ax_legend.legend(handles=handles, loc="upper center", ncols=3, fontsize=8, frameon=False,
                     title=f"policies (same legend for both panels); numbers by the points: {swept}",
                     title_fontsize=8)
    ax_notes.text(0.0, 1.0, "\n".join(caption), transform=ax_notes.transAxes, ha="left", va="top", fontsize=8)

    ax.set_xlabel("interactivity (output tok/s per user)")
    ax.set_ylabel("throughput per GPU (output tok/s)")
    ax.grid(True, alpha=0.3)
    ax.set_title("throughput against interactivity (lines: each policy's frontier)", fontsize=10)
    if ax_b is not None and load is not None:
        # DSpark Fig. 8: tokens verified per request per step (bonus included) against load
        ax_b.set_xscale("log")
        plain_log_ticks(ax_b.xaxis)
        ax_b.set_xlabel(load.removeprefix("workload."))
        ax_b.set_ylabel("verification budget per request (tokens/step)")
        ax_b.grid(True, alpha=0.3)
        ax_b.set_title("budget against load", fontsize=10)
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
        plain_log_ticks(ax.xaxis)
        plain_log_ticks(ax.yaxis)
    fig.suptitle(figure_title(meta, varied, title), fontsize=11)
    declutter_labels(ax)
    return fig


def plot_pareto(table: pd.DataFrame, out: Path | str, *, meta: Mapping[str, Any] | None = None,
                baseline: str | None = None, title: str = "") -> Path:
    """Write `pareto_figure(table, meta=meta, baseline=baseline, title=title)` as a PNG, atomically.

    Raises MissingExtraError without matplotlib, before any work.
    """
    plt = pyplot()
    fig = pareto_figure(table, meta=meta, baseline=baseline, title=title)
    out = Path(out)
    with atomic_file(out) as tmp:
        fig.savefig(tmp, format="png", dpi=130)
    plt.close(fig)
    return out
