"""The report of a sweep folder: the Pareto frontier, the budget against load, matched speedups, every point.

The figures are `sparksim.plotting.pareto`'s, made interactive: one legend entry per
policy (click it to hide that policy), each point's figures on hover, the same colours as
pareto.png, and the same frontier and speedup rules (`sparksim.studies.frontier`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from sparksim.config import read_yaml_mapping
from sparksim.metric_names import shown
from sparksim.plotting.pareto import figure_title, series_colors, series_labels, varied_columns
from sparksim.report.inputs import inputs_section, read_warnings, warnings_section
from sparksim.report.page import Section, figure_html, number_text, paragraph, table_html
from sparksim.sim.metrics import UNFINISHED_SHARE
from sparksim.studies.frontier import overloaded, pareto_frontier, series_of, series_speedups

# (column, name, unit) shown on hover and in the table, in this order, when the sweep has them
FIGURES = shown(
    "tput_per_gpu", "interactivity", "output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
    "p99_tpot_ms", "median_itl_ms", "mean_e2el_ms", "verify_budget_per_request", "mean_acceptance_length",
    "request_throughput",
)
COUNTS = ("completed", "steady_requests", "steady_unfinished", "steady_waiting", "engine_steps")
LOADS = ("workload.concurrency", "workload.rate")


def read_sweep_table(folder: Path) -> pd.DataFrame:
    """Return the sweep's table: sweep.parquet, else sweep.csv."""
    parquet = folder / "sweep.parquet"
    return pd.read_parquet(parquet) if parquet.is_file() else pd.read_csv(folder / "sweep.csv")


def point_name(row: Mapping[Any, Any], varied: list[str]) -> str:
    """Return a point's name as a reader finds it in the table: its label and swept values."""
    values = ", ".join(f"{k.removeprefix('workload.')}={row[k]}" for k in varied)
    return f"{row.get('label', row['policy'])} · {values}" if values else str(row.get("label", row["policy"]))


def hover_text(row: Mapping[Any, Any], varied: list[str], hot: bool) -> str:
    """Return a point's hover box: its policy, drafter and swept values, then each figure it has."""
    lines = [f"<b>{row.get('label', row['policy'])}</b>", f"policy: {row['policy']}"]
    if "drafter" in row:
        lines.append(f"drafter: {row['drafter']}")
    lines += [f"{k.removeprefix('workload.')}: {row[k]}" for k in varied]
    for key, name, unit in FIGURES:
        value = row.get(key)
        if isinstance(value, int | float) and math.isfinite(value):
            lines.append(f"{name}: {number_text(value)} {unit}")
    if "lossless" in row:
        lines.append("lossless: " + ("yes" if row["lossless"] else "NO"))
    if hot:
        lines.append(f"<i>queue still growing at the horizon: over {UNFINISHED_SHARE:.0%} of the steady "
                     "window's requests unfinished; left out of the speedups</i>")
    return "<br>".join(lines)


def frontier_figure(table: pd.DataFrame, hot: pd.Series, colors: dict[str, str]) -> Any:
    """Return the interactive Pareto figure: one legend entry per policy (its points and frontier)."""
    import plotly.graph_objects as go

    labels, varied = series_labels(table), varied_columns(table)
    fig = go.Figure()
    for label, color in colors.items():
        grp = table[labels == label]
        front = pareto_frontier(grp)
        on_front = grp.index.isin(front.index)
        symbols = ["x" if hot[i] else ("circle" if f else "circle-open") for i, f in zip(grp.index, on_front,
                                                                                          strict=True)]
        dash = "dash" if "lossless" in grp and not bool(grp["lossless"].iloc[0]) else "solid"
        # the legend shows the frontier's line (dashed: not lossless); its entry hides the points too
        fig.add_trace(go.Scatter(
            x=front["interactivity"], y=front["tput_per_gpu"], mode="lines", line={"color": color, "dash": dash},
            legendgroup=label, hoverinfo="skip", name=label))
        rows = grp.to_dict("records")
        fig.add_trace(go.Scatter(
            x=grp["interactivity"], y=grp["tput_per_gpu"], mode="markers", name=label, legendgroup=label,
            showlegend=False,
            marker={"color": color, "symbol": symbols, "size": 9, "line": {"width": 1.5, "color": color}},
            hovertext=[hover_text(r, varied, bool(hot[i])) for i, r in zip(grp.index, rows, strict=True)],
            hovertemplate="%{hovertext}<extra></extra>"))
    fig.update_layout(
        template="plotly_white", margin={"t": 40, "r": 10}, legend={"title": {"text": "policy (click to hide)"}},
        xaxis_title="interactivity (output tok/s per user)", yaxis_title="throughput per GPU (output tok/s)",
        updatemenus=[{"type": "buttons", "direction": "right", "x": 0, "y": 1.1, "xanchor": "left",
                      "buttons": [{"label": "linear axes", "method": "relayout",
                                   "args": [{"xaxis.type": "linear", "yaxis.type": "linear"}]},
                                  {"label": "log axes", "method": "relayout",
                                   "args": [{"xaxis.type": "log", "yaxis.type": "log"}]}]}])
    return fig


def budget_figure(table: pd.DataFrame, load: str, colors: dict[str, str], hot: pd.Series | None = None) -> Any:
    """Return the verification budget per request against load, one line per policy (DSpark Fig. 8);
    a point whose queue was still growing (`hot`) is an ×, as on the frontier."""
    import plotly.graph_objects as go

    labels, varied = series_labels(table), varied_columns(table)
    fig = go.Figure()
    for label, color in colors.items():
        grp = table[labels == label].sort_values(load)
        dash = "dash" if "lossless" in grp and not bool(grp["lossless"].iloc[0]) else "solid"
        grown = [bool(hot[i]) if hot is not None else False for i in grp.index]
        fig.add_trace(go.Scatter(
            x=grp[load], y=grp["verify_budget_per_request"], mode="lines+markers", name=label,
            line={"color": color, "dash": dash}, marker={"symbol": ["x" if g else "circle" for g in grown],
                                                            "size": [12 if g else 6 for g in grown]},
            hovertext=[hover_text(r, varied, g) for r, g in zip(grp.to_dict("records"), grown, strict=True)],
            hovertemplate="%{hovertext}<extra></extra>"))
    loads = sorted(table[load].dropna().unique())
    fig.update_layout(template="plotly_white", margin={"t": 30, "r": 10},
                      legend={"title": {"text": "policy (click to hide)"}},
                      xaxis={"title": load.removeprefix("workload."), "type": "log", "tickvals": loads,
                             "ticktext": [f"{v:g}" for v in loads]},
                      yaxis_title="verification budget per request (tokens/step, bonus included)")
    return fig


def speedups(table: pd.DataFrame, baseline: str) -> tuple[pd.DataFrame, Any]:
    """Return each policy's matched-throughput speedup over `baseline` as a summary table and a figure."""
    import plotly.graph_objects as go

    # the terminal table's and pareto.png's series and speedups (one series per drafter where
    # a policy was swept over drafters), each named by its label
    labels = dict(zip(series_of(table), series_labels(table), strict=True))
    colors = series_colors(list(labels.values()))
    fig = go.Figure()
    rows = []
    baseline, speedups_over = series_speedups(table, baseline)
    for policy, sp in speedups_over:
        row: dict[str, Any] = {"policy": labels[policy], "matched throughputs": len(sp)}
        if len(sp):
            row |= {"tput/GPU from": float(sp["tput_per_gpu"].min()), "tput/GPU to": float(sp["tput_per_gpu"].max()),
                    "speedup from": float(sp["speedup"].min()), "speedup to": float(sp["speedup"].max())}
            fig.add_trace(go.Scatter(
                x=sp["tput_per_gpu"], y=sp["speedup"], mode="lines+markers", name=labels[policy],
                line={"color": colors[labels[policy]]},
                hovertemplate=(f"<b>{labels[policy]}</b><br>at %{{x:,.0f}} tok/s/GPU: ×%{{y:.2f}} the "
                               "baseline's tok/s/user<extra></extra>")))
        rows.append(row)
    fig.add_hline(y=1.0, line={"color": "#888", "dash": "dot"})
    fig.update_layout(template="plotly_white", margin={"t": 30, "r": 10},
                      legend={"title": {"text": "policy (click to hide)"}},
                      xaxis={"title": "throughput per GPU (output tok/s), matched", "type": "log"},
                      yaxis_title=f"tok/s per user, × {labels.get(baseline, baseline)}'s")
    return pd.DataFrame(rows), fig


def points_table(table: pd.DataFrame, hot: pd.Series, warned: dict[str, int] | None) -> pd.DataFrame:
    """Return every point with the columns a reader sorts by: policy, swept values, figures, counts."""
    varied = varied_columns(table)
    shown = pd.DataFrame({"policy": series_labels(table)})
    for col in [*varied, "drafter", *(k for k, _, _ in FIGURES), *COUNTS]:
        if col in table.columns:
            shown[col] = table[col].to_numpy()
    if "lossless" in table.columns:
        shown["lossless"] = ["yes" if v else "NO" for v in table["lossless"]]
    shown["queue growing"] = ["yes" if h else "" for h in hot]
    if warned is not None:
        names = [point_name(r, varied) for r in table.to_dict("records")]
        shown["warnings"] = [warned.get(n, 0) for n in names]
    return shown


def sweep_sections(folder: Path) -> tuple[str, str, list[Section]]:
    """Return the title, the lead line and the sections of a sweep folder's report."""
    table = read_sweep_table(folder).reset_index(drop=True)
    meta = read_yaml_mapping(folder / "sweep.yaml", "sweep.yaml") if (folder / "sweep.yaml").is_file() else {}
    varied = varied_columns(table)
    load = next((k for k in LOADS if k in table.columns), None)
    hot = overloaded(table)
    labels = series_labels(table)
    colors = series_colors(list(labels))
    title, _, about = figure_title(meta, varied).partition("\n")
    lead = (f"{folder}: {len(table)} points, {len(colors)} policies"
            + (f", over {', '.join(v.removeprefix('workload.') for v in varied)}" if varied else "")
            + (f" · {about}" if about else ""))

    frontier = Section("Pareto frontier", "frontier").add(
        paragraph("Throughput per GPU against tok/s per user (DSpark Fig. 7). Filled: on its policy's frontier; "
                  "hollow: dominated by a point of the same policy; ×: queue still growing at the horizon. "
                  "Lines join each policy's frontier (dashed: the policy is not lossless). Hover a point for its "
                  "figures; click a policy in the legend to hide it; the buttons switch to log axes."),
        figure_html(frontier_figure(table, hot, colors), "pareto-frontier"))
    missing = int(table["interactivity"].isna().sum()) if "interactivity" in table.columns else 0
    if missing:
        frontier.add(paragraph(f"{missing} point(s) have no interactivity (no request of the steady window "
                               "finished) and are not drawn; they are in the table below.", "note"))
    sections = [frontier]
    if load is not None and "verify_budget_per_request" in table.columns:
        sections.append(Section("Budget against load", "budget").add(
            paragraph("Tokens verified per request per step, bonus included (1 + mean ℓ), against load "
                      "(DSpark Fig. 8): static policies are flat; adaptive ones shrink it where a verified "
                      "token stops paying for itself. × marks a load whose queue was still growing "
                      "at the horizon (the system did not carry it)."),
            figure_html(budget_figure(table, load, colors, hot), "budget-load", 440)))
    baseline = str(meta.get("baseline") or table["policy"].iloc[0])
    summary, fig = speedups(table, baseline)
    speed = Section("Matched-throughput speedups", "speedups").add(paragraph(
        f"Each policy's tok/s per user over {baseline}'s at the same throughput per GPU, both frontiers "
        f"interpolated at the baseline's own throughputs inside the range both reach; points whose queue was "
        f"still growing ({int(hot.sum())} here) are left out."))
    if len(summary):
        speed.add(table_html(summary, sortable=False, table_id="speedup-table"))
    if fig.data:
        speed.add(figure_html(fig, "speedups", 420))
    sections.append(speed)

    given = read_warnings(folder / "warnings.json")
    warned = None if given is None else [(point_name(p, varied), p["warnings"]) for p in given]
    counts = None if warned is None else {name: len(messages) for name, messages in warned}
    headers = {key: f"{name} ({unit})" for key, name, unit in FIGURES} | {
        k: k.removeprefix("workload.") for k in varied}
    sections.append(Section("Every point", "points").add(
        paragraph("Click a column's name to sort by it (again to reverse); hover it for the sweep table's "
                  "column name."),
        table_html(points_table(table, hot, counts), headers=headers, table_id="points-table")))
    recorded: dict[str, str] = meta["inputs"] if isinstance(meta.get("inputs"), dict) else {}
    inputs = [(kind, str(meta[key]), recorded.get(key)) for kind, key in (("profile", "profile"), ("traces", "traces"))
              if meta.get(key)]
    scenario = (folder / "scenario.yaml").read_text() if (folder / "scenario.yaml").is_file() else None
    how = {k: v for k, v in meta.items() if k not in ("workload", "inputs")}
    sections.append(inputs_section(how, scenario, inputs, "with the sweep's --set applied, before each point's "
                                                          "policy and swept values"))
    sections.append(warnings_section(warned, "This sweep folder records no warnings: it was written before "
                                             "sparksim kept them (run the sweep again to see them)."))
    return f"{title} · sparksim report", lead, sections
