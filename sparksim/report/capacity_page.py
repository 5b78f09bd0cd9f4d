"""The report of a capacity folder: each policy's capacity under the SLOs, and every run the search made."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from sparksim.plotting.pareto import series_colors
from sparksim.report.inputs import inputs_section, warnings_section
from sparksim.report.page import Section, figure_html, paragraph, table_html
from sparksim.studies.capacity import ABOVE, BELOW, FOUND


def capacity_figure(policies: list[dict[str, Any]], unit: str, lo: float) -> Any:
    """Return a bar per policy: its capacity (mean over seeds, ± standard error), or a note when below the range."""
    import plotly.graph_objects as go

    colors = series_colors([p["label"] for p in policies])
    fig = go.Figure()
    for p in policies:
        value = p["capacity"] if p["capacity"] is not None else 0.0
        words = {FOUND: "", ABOVE: " (a lower bound: it met the SLOs at the top of the range)",
                 BELOW: f" (below the range: it missed the SLOs at {lo:g})"}.get(p["status"], f" ({p['status']})")
        fig.add_trace(go.Bar(
            x=[p["label"]], y=[value], name=p["label"], marker_color=colors[p["label"]],
            error_y={"type": "data", "array": [p["capacity_se"] or 0.0], "visible": p["capacity_se"] is not None},
            hovertemplate=(f"<b>{p['label']}</b><br>policy: {p['policy']}<br>capacity: %{{y:.4g}} {unit}"
                           + (f" ± {p['capacity_se']:.2g}" if p["capacity_se"] is not None else "")
                           + f"<br>lowest seed: {p['lowest'] if p['lowest'] is not None else '–'}"
                           + f"<br>runs: {p['runs']}{words}<extra></extra>")))
    fig.update_layout(template="plotly_white", margin={"t": 30, "r": 10}, showlegend=False,
                      yaxis_title=f"capacity ({unit})")
    return fig


def runs_figure(runs: pd.DataFrame, unit: str) -> Any:
    """Return every run of the search: load across, policy down, green where it met the SLOs."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for meets, color, name in ((True, "#1a7f37", "met the SLOs"), (False, "#cf222e", "missed them")):
        part = runs[runs["meets"] == meets]
        fig.add_trace(go.Scatter(
            x=part["load"], y=part["policy"], mode="markers", name=name,
            marker={"color": color, "size": 10, "symbol": "circle" if meets else "x"},
            hovertext=[f"<b>{r['policy']}</b><br>load: {r['load']:.4g} {unit}, seed {r['seed']}<br>"
                       + ("met every SLO" if r["meets"] else f"missed: {r['why not']}")
                       for r in part.to_dict("records")],
            hovertemplate="%{hovertext}<extra></extra>"))
    fig.update_layout(template="plotly_white", margin={"t": 30, "r": 10, "l": 10},
                      xaxis_title=f"load ({unit})", legend={"title": {"text": "run (click to hide)"}})
    return fig


def capacity_sections(folder: Path) -> tuple[str, str, list[Section]]:
    """Return the title, the lead line and the sections of a capacity folder's report."""
    data = json.loads((folder / "capacity.json").read_text())
    meta, policies = data.get("meta", {}), data.get("policies", [])
    unit, lo = str(meta.get("unit", "")), float(meta.get("lo", math.nan))
    slos = ", ".join(f"{k} ≤ {v:g}" for k, v in meta.get("slo", {}).items())
    lead = (f"{folder}: {len(policies)} policies under {slos}; {meta.get('load', 'load')} searched "
            f"{meta.get('lo', '?'):g}–{meta.get('hi', '?'):g} {unit} to within {meta.get('tol', '?'):g}, "
            f"seeds {meta.get('seeds')}")
    caps = pd.DataFrame([{"policy": p["label"], "spec": p["policy"], "status": p["status"],
                          "capacity": p["capacity"] if p["capacity"] is not None else math.nan,
                          "± SE": p["capacity_se"] if p["capacity_se"] is not None else math.nan,
                          "lowest": p["lowest"] if p["lowest"] is not None else math.nan, "runs": p["runs"]}
                         for p in policies])
    runs = pd.DataFrame([{"policy": p["label"], "seed": r["seed"], "load": r["load"], "meets": r["meets"],
                          "why not": r["why_not"], "warnings": len(r.get("warnings", []))}
                         for p in policies for r in p.get("runs_made", [])])
    sections = [
        Section("Capacity per policy", "capacity").add(
            paragraph(f"Capacity: the {meta.get('capacity', '')}. Overload: {meta.get('overloaded', '')}."),
            figure_html(capacity_figure(policies, unit, lo), "capacity-bars", 420),
            table_html(caps, table_id="capacity-table")),
        Section("Every run made", "runs").add(
            paragraph("Each run of the bisection, per policy and seed; hover one for why it missed. Click a "
                      "column's name to sort by it."),
            figure_html(runs_figure(runs, unit), "capacity-runs", 120 + 40 * len(policies)),
            table_html(runs, table_id="runs-table", wrap=True)),
    ]
    recorded: dict[str, str] = meta["inputs"] if isinstance(meta.get("inputs"), dict) else {}
    inputs = [(kind, str(meta[kind]), recorded.get(kind)) for kind in ("profile", "traces") if meta.get(kind)]
    how = {k: v for k, v in meta.items() if k not in ("slo_keys", "inputs")}
    scenario = (folder / "scenario.yaml").read_text() if (folder / "scenario.yaml").is_file() else None
    sections.append(inputs_section(how, scenario, inputs, "with the search's --set applied, before each run's "
                                                          "policy, load and seed"))
    kept = all("warnings" in r for p in policies for r in p.get("runs_made", []))
    given = [(f"{p['label']} at {r['load']:g} {unit}, seed {r['seed']}", r["warnings"])
             for p in policies for r in p.get("runs_made", []) if r.get("warnings")] if kept else None
    sections.append(warnings_section(given, "This capacity folder records no warnings: it was written before "
                                            "sparksim kept them (run the search again to see them)."))
    return f"capacity under {slos} · sparksim report", lead, sections
