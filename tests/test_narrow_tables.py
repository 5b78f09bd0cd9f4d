"""The CLI's tables read whole in an 80-column terminal: no policy, verdict, metric or title cut.

Rich crops a table wider than the terminal at its right edge, so a verdict came out as
"consistent w" and `bias --exact` lost its titles and verdicts; a column that may not wrap
(or a minimum width that does not fit) is what pushes a table past the edge.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

import sparksim.cli.capacity
import sparksim.cli.policies
import sparksim.cli.run
import sparksim.cli.sweep
from sparksim.cli import app
from sparksim.cli.policies import bias_lab_table, exact_tables
from sparksim.policies import REGISTRY

WIDTH = 80
BORDERS = "┃│┏┡└┗┣┠┌├╭╰"  # a line of a table starts with one of these and must end with one too
runner = CliRunner()


def render(*tables: Table) -> str:
    console = Console(width=WIDTH, record=True, color_system=None)
    for table in tables:
        console.print(table)
    return console.export_text()


def check_uncut(text: str) -> str:
    """Assert every table line fits and is closed by its right border; return the text, whitespace folded.

    Lines of prose are printed soft-wrapped (the terminal wraps them), so only tables are held to the width.
    """
    for line in text.splitlines():
        if line[:1] in BORDERS:
            assert len(line) <= WIDTH, line
            assert line.rstrip()[-1] in "┃│┓┩┘┛┫┨┐┤╮╯", f"cut at the right edge: {line!r}"
    return " ".join(text.split())


@pytest.fixture
def narrow(monkeypatch: pytest.MonkeyPatch) -> Iterator[Console]:
    """The console every CLI module prints its tables to, 80 columns wide, recording."""
    console = Console(width=WIDTH, record=True, color_system=None)
    for module in (sparksim.cli.run, sparksim.cli.sweep, sparksim.cli.capacity, sparksim.cli.policies):
        monkeypatch.setattr(module, "console", console)
    yield console


def tiny_sets(profile: Path, traces: Path) -> list[str]:
    sets = []
    for s in (f"profile={profile}", f"traces={traces}", "run.duration_s=6", "run.cooldown_s=2"):
        sets += ["--set", s]
    return sets


def test_policies_shows_every_name_and_its_losslessness(narrow: Console) -> None:
    sparksim.cli.policies.list_policies()
    raw = narrow.export_text()
    text = check_uncut(raw)
    assert "verification policies" in text
    for name, cls in REGISTRY.items():
        assert f"│ {name} " in raw, name
        assert cls.paper.split()[0] in text


def test_the_bias_lab_keeps_each_verdict_whole() -> None:
    labels = ["argmax [not lossless]", "greedy", "dynamic-sd(acceptance=0.7,warmup=10,max_k=2)",
              "smartspec(alpha=0.7,decay=0.85,interval=20,no_spec_bonus=1.1,max_k=2)"]
    df = pd.DataFrame({"label": labels, "p_first_A": [0.837, 0.685, 0.718, 0.707],
                       "stderr": [0.0117, 0.0147, 0.0142, 0.0144], "z": [11.7, -1.0, 1.3, 0.5],
                       "biased": [True, False, False, False]})  # the lab's verdict (biaslab.BIASED_Z)
    raw = render(bias_lab_table(df, 1000))
    text = check_uncut(raw)
    assert "bias lab: P(first token = A), 0.7 for a lossless policy; 1000 trials each" in text
    assert raw.count("consistent with lossless") == 3 and raw.count(" biased ") == 1
    for name in ("argmax", "greedy", "dynamic-sd", "smartspec"):
        assert name in raw
    assert "+11.7" in raw and "0.8370" in raw


def test_bias_exact_on_the_paper_case_keeps_titles_and_verdicts(narrow: Console) -> None:
    result = runner.invoke(app, ["bias", "--exact", "--mc", "50"])
    assert result.exit_code == 0, result.output
    raw = narrow.export_text()
    text = check_uncut(raw)
    for title in ("exact first-token bias, γ = 2, batch R = 1: paper App. A", "verdict per policy",
                  "Monte Carlo TV at each policy's worst context, 95% bootstrap CI",
                  "lossless to float precision: max TV < 1e-09"):
        assert title in text
    assert "│ greedy " in raw and "│ lossless " in raw and "│ biased " in raw


def test_bias_exact_on_real_contexts_keeps_every_verdict_whole() -> None:
    # the shape `bias_exact.summarise` returns, with the longest labels and verdicts there are
    labels = ["two-step(delay=0,ema=0.0,initial_budget=2) [not lossless]", "greedy",
              "smartspec(alpha=0.7,decay=0.85,interval=20,no_spec_bonus=1.1,max_k=2)"]
    worst = [(3, "code:a@66", 1.3e-16), (1, "code:a@91", 2.8e-17), (2, "math:b@124", 9.1e-18)]
    summary = pd.DataFrame({
        "policy": ["two-step:delay=0", "greedy", "smartspec"], "label": labels,
        "claims_lossless": [False, True, True], "contexts": [200] * 3, "mean_tv": [0.012, 4.25e-17, 0.03],
        "max_tv": [0.15, 1.33e-16, 0.2], "worst": [worst] * 3, "depends_on_x1": [17, 0, 120],
        "mean_p_verify": [0.5, 1.0, 0.9], "lossless": [False, True, False]})
    summary.loc[0, "lossless"] = True  # a policy not claiming losslessness that shows no bias here
    checks = pd.DataFrame({"context": [3, 3, 1], "mc_tv_witness": ["0.0000 [0.0000, 0.0000]"] * 3,
                           "mc_tv_split": ["-0.0200 [-0.1400, 0.1000]"] * 3})
    tables, named = exact_tables(summary, pd.DataFrame(), checks, app_a=False)
    raw = render(*tables)
    text = check_uncut(raw)
    for title in ("verdict per policy", "where the bias is, and why",
                  "Monte Carlo TV at each policy's worst context"):
        assert title in text
    assert "no bias on these contexts" in raw and "BIASED (claims lossless)" in raw and "│ lossless " in raw
    assert "1.33e-16" in raw and "17/200" in raw and "4.25e-17" in raw
    assert named == {3: "code:a@66", 1: "code:a@91", 2: "math:b@124"}


def test_run_shows_every_metric_name_whole(sloped_profile: Path, varied_traces: Path, tmp_path: Path,
                                           narrow: Console) -> None:
    result = runner.invoke(app, ["run", "--policy", "static:gamma=1", *tiny_sets(sloped_profile, varied_traces),
                                 "--out", str(tmp_path / "r"), "-q"])
    assert result.exit_code == 0, result.output
    raw = narrow.export_text()
    check_uncut(raw)
    for _, label, _ in sparksim.cli.run.SHOWN:
        assert f"│ {label} " in raw, label
    for label in ("drafter paid for", "KV capacity", "preemptions"):
        assert f"│ {label} " in raw


def test_sweep_and_capacity_keep_policy_names_and_speedups_whole(
    sloped_profile: Path, varied_traces: Path, tmp_path: Path, narrow: Console
) -> None:
    sets = tiny_sets(sloped_profile, varied_traces)
    result = runner.invoke(app, ["sweep", "--vary", "workload.concurrency=1,8", "--policy", "static:gamma=1",
                                 "--policy", "two-step:delay=2,initial_budget=3", "--workers", "1",
                                 "--out", str(tmp_path / "sw"), *sets])
    assert result.exit_code == 0, result.output
    raw = narrow.export_text()
    text = check_uncut(raw)
    assert "matched-throughput speedup of tok/s/user over static:gamma=1" in text
    assert "│ two-step:delay=2,initial_budget=3 " in raw and "speedup range" in raw
    narrow.export_text(clear=True)
    result = runner.invoke(app, ["capacity", "--policy", "two-step:delay=2,initial_budget=3,ema=0.5", "--slo",
                                 "p90_tpot_ms=1", "--lo", "1", "--hi", "160", "--tol", "8", "--workers", "1",
                                 "--out", str(tmp_path / "cap"), *sets])
    assert result.exit_code == 0, result.output
    raw = narrow.export_text()
    text = check_uncut(raw)
    assert "capacity (requests/s) under p90_tpot_ms ≤ 1, 1 seed(s)" in text
    assert "capacity (mean ± SE)" in raw and "below 1" in raw
    body = [line.split("│")[1].strip() for line in raw.splitlines() if line.startswith("│")]
    assert "".join(body) == "two-step:delay=2,initial_budget=3,ema=0.5"  # folded, never cut


def test_bias_span_keeps_each_verdict_whole() -> None:
    from sparksim.cli.policies import span_table

    rows = [{"context": c, "policy": label, "max_tv_lower_bound": 0.0123, "ci95_low": -0.004, "ci95_high": 0.031,
             "at_position": 17, "positions_ci_above_0": hits, "min_p_holm": p, "biased": hits > 0}
            for c in (0, 1) for label, hits, p in (("two-step(delay=2,ema=0.0,initial_budget=2)", 0, 0.73),
                                                    ("argmax [not lossless]", 3, 1.2e-05))]
    raw = render(span_table(rows))
    check_uncut(raw)
    assert raw.count("no detectable bias") == 2 and raw.count(" biased ") == 2
    assert raw.count("1.2e-05") == 2 and raw.count("0.73") == 2
    assert "CI > 0 at 3 positions" in " ".join(raw.replace("│", " ").split())
