"""The report of a run folder: its figures, the latency of its requests, its acceptance and budget over time."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from sparksim.report.inputs import inputs_section, read_warnings, warnings_section
from sparksim.report.page import Section, figure_html, number_text, paragraph, table_html

MAX_REQUEST_ROWS = 5_000  # a longer run's requests table is cut to its first rows (the file has them all)
BUDGET_BINS = 60  # the budget-over-time figure averages steps into this many spans of simulated time


def summary_rows(summary: dict[str, Any]) -> pd.DataFrame:
    """Return every scalar of summary.json as (key, value) rows, nested blocks' keys joined by dots.

    Values are text, as a reader wants them (a list on one line): a key and its value read
    side by side, and the table sorts by key.
    """
    rows: list[dict[str, Any]] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, list):
            rows.append({"key": prefix, "value": ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v)
                                                           for v in value)})
        else:
            rows.append({"key": prefix, "value": number_text(value)})

    walk("", summary)
    return pd.DataFrame(rows)


def latency_figure(requests: pd.DataFrame, window: tuple[float, float]) -> Any:
    """Return the TTFT and TPOT distributions of the requests that arrived in the steady window."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    steady = requests[(requests["arrival_at"] >= window[0]) & (requests["arrival_at"] <= window[1])]
    ttft = (steady["first_token_at"] - steady["arrival_at"]) * 1e3
    multi = steady[steady["output_tokens"] > 1]
    tpot = (multi["finish_at"] - multi["first_token_at"]) / (multi["output_tokens"] - 1) * 1e3
    fig = make_subplots(rows=1, cols=2, subplot_titles=("TTFT (ms)", "TPOT (ms)"))
    fig.add_trace(go.Histogram(x=ttft, nbinsx=60, name="TTFT", marker_color="#1f77b4"), row=1, col=1)
    fig.add_trace(go.Histogram(x=tpot, nbinsx=60, name="TPOT", marker_color="#ff7f0e"), row=1, col=2)
    fig.update_layout(template="plotly_white", margin={"t": 40, "r": 10}, showlegend=False, bargap=0.02)
    fig.update_yaxes(title_text="requests", row=1, col=1)
    return fig


def acceptance_figure(by_position: dict[str, list[float]]) -> Any:
    """Return the per-position acceptance: survival P(accepted ≥ k) and conditional P(k | k − 1)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for key, name in (("survival", "survival P(accepted ≥ k)"), ("conditional", "conditional P(k | k − 1)")):
        values = by_position.get(key, [])
        fig.add_trace(go.Scatter(x=list(range(1, len(values) + 1)), y=values, mode="lines+markers", name=name))
    fig.update_layout(template="plotly_white", margin={"t": 30, "r": 10}, xaxis_title="draft position k",
                      yaxis={"title": "probability", "range": [0, 1.02]})
    return fig


def budget_figure(steps: pd.DataFrame) -> Any:
    """Return the verification budget per request (1 + mean ℓ) and the batch's requests over simulated time."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    decode = steps[steps["num_requests"] > 0]
    start = decode["start_at"].to_numpy()
    width_s = max(float(start.max() - start.min()), 1e-9) / BUDGET_BINS
    span = np.minimum((start - start.min()) // width_s, BUDGET_BINS - 1)  # each step's span of time
    grouped = decode.groupby(span)
    at = start.min() + (grouped.size().index.to_numpy() + 0.5) * width_s  # the spans' middles
    requests = grouped["num_requests"].sum()
    budget = (requests + grouped["verified_drafts"].sum()) / requests
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=at, y=budget, mode="lines", name="verification budget per request"))
    fig.add_trace(go.Scatter(x=at, y=grouped["num_requests"].mean(), mode="lines", name="requests per step",
                             line={"dash": "dot"}), secondary_y=True)
    fig.update_layout(template="plotly_white", margin={"t": 30, "r": 10}, xaxis_title="simulated time (s)")
    fig.update_yaxes(title_text="tokens/step per request", secondary_y=False)
    fig.update_yaxes(title_text="requests per step", secondary_y=True)
    return fig


def run_sections(folder: Path) -> tuple[str, str, list[Section]]:
    """Return the title, the lead line and the sections of a run folder's report."""
    summary = json.loads((folder / "summary.json").read_text())
    window = summary.get("window", {})
    w0 = float(window.get("warmup_s", 0.0))
    w1 = float(summary.get("duration_s", math.inf)) - float(window.get("cooldown_s", 0.0))
    engine = "the live engine" if summary.get("engine") == "live" else "simulated"
    lead = (f"{folder}: {summary.get('policy_label', summary.get('policy'))} on {summary.get('scenario')}, seed "
            f"{summary.get('seed')}, {engine}; figures over the steady window {w0:g}–{w1:g} s")
    sections = [Section("Summary", "summary").add(
        paragraph(str(summary.get("counts_note", ""))) if summary.get("counts_note") else "",
        table_html(summary_rows({k: v for k, v in summary.items() if k != "counts_note"}),
                   table_id="summary-table", wrap=True))]
    requests_path = folder / "requests.parquet"
    requests = pd.read_parquet(requests_path) if requests_path.is_file() else None
    if requests is not None and len(requests):
        sections.append(Section("Latency", "latency").add(
            paragraph("Per request, of the requests that arrived in the steady window and finished."),
            figure_html(latency_figure(requests, (w0, w1)), "latency", 400)))
    if summary.get("acceptance_by_position", {}).get("survival"):
        sections.append(Section("Acceptance by position", "acceptance").add(
            figure_html(acceptance_figure(summary["acceptance_by_position"]), "acceptance", 380)))
    steps_path = folder / "steps.parquet"
    steps = pd.read_parquet(steps_path) if steps_path.is_file() else None
    if steps is not None and (steps["num_requests"] > 0).sum() > 1:
        sections.append(Section("Budget over time", "budget").add(
            paragraph(f"Decode steps averaged over {BUDGET_BINS} spans of simulated time."),
            figure_html(budget_figure(steps), "budget-time", 400)))
    if requests is not None:
        shown = requests.head(MAX_REQUEST_ROWS)
        cut = (f" The first {MAX_REQUEST_ROWS:,} of {len(requests):,} are shown; requests.parquet has them all."
               if len(requests) > MAX_REQUEST_ROWS else "")
        sections.append(Section("Every request", "requests").add(
            paragraph("One row per finished request (instants in simulated seconds). Click a column's name to "
                      "sort by it." + cut),
            table_html(shown, table_id="requests-table")))
    scenario = (folder / "scenario.yaml").read_text() if (folder / "scenario.yaml").is_file() else None
    data = yaml.safe_load(scenario) if scenario else {}
    data = data if isinstance(data, dict) else {}
    inputs = [(kind, str(data[kind]), None) for kind in ("profile", "traces") if data.get(kind)]
    sections.append(inputs_section(None, scenario, inputs))
    given = read_warnings(folder / "warnings.json")
    sections.append(warnings_section(None if given is None else [("this run", given)],
                                     "This run folder records no warnings: it was written before sparksim "
                                     "kept them, or by a tool that does not (run it again to see them)."))
    return f"{summary.get('scenario')} · {summary.get('policy_label', '')} · sparksim report", lead, sections
