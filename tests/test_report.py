"""`sparksim report`: one HTML page per results folder, checked in a real browser.

Why: a report is read in a browser, not in Python. The page must open with no network (its
JavaScript embedded), draw its figures once scripts have run, carry every point with its
figures on hover, sort its tables, and show what the runs were made from and what they
warned about. Headless Chromium loads each page as a reader's browser would.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from sparksim.cli import app
from sparksim.errors import MissingExtraError
from sparksim.studies.sweep import grid, parse_vary, run_sweep, study_inputs, write_sweep

from .sweep_tables import two_drafter_sweep

pytest.importorskip("plotly")

CHROMIUM = next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(name)), None)
needs_browser = pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium here (apt-get install chromium)")
POLICIES = ["static:gamma=1", "two-step"]
VARY = "workload.concurrency=4,8,32,128"
runner = CliRunner()


def chromium(tmp: Path, *args: str) -> str:
    """Run headless Chromium with `args` (its own profile folder under `tmp`, no network); return its output."""
    assert CHROMIUM is not None
    # every fetch goes to a proxy that is not there: the page must draw from the file alone
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           f"--user-data-dir={tmp / 'chromium-profile'}", "--virtual-time-budget=10000",
                           "--proxy-server=http://127.0.0.1:9", *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory, sloped_profile: Path, varied_traces: Path) -> Path:
    """A real sweep folder: two policies over four loads; the 128-user points, over the cluster's 64,
    warn, and their queues grow."""
    base = [f"profile={sloped_profile}", f"traces={varied_traces}", "run.duration_s=3",
            "cluster.max_concurrency=64"]
    table = run_sweep(None, base, grid(parse_vary([VARY]), POLICIES), workers=1)
    refs, scenario = study_inputs(None, base)
    meta = {"scenario": "embedded default", "vary": [VARY], "policies": POLICIES,
            "set": base, "title": "test sweep", "baseline": POLICIES[0], **refs}
    return write_sweep(tmp_path_factory.mktemp("report") / "sw", table, meta, scenario=scenario)


def embedded_figures(page: str) -> dict[str, list[dict]]:
    """Return each figure's traces as the page hands them to Plotly.newPlot, by the figure's div id."""
    found = {}
    for div, data in re.findall(r'Plotly\.newPlot\(\s*"([^"]+)",\s*(\[.*?\]),\s*\{', page, flags=re.S):
        found[div] = json.loads(data)
    return found


def test_a_sweep_writes_a_report_that_needs_no_network(sweep_dir: Path) -> None:
    page = (sweep_dir / "report.html").read_text()
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=|<img[^>]+src=|@import", page)  # nothing to fetch
    assert page.count("plotly.js v") >= 1 and len(page) > 1_000_000  # the library itself, embedded
    figures = embedded_figures(page)
    assert {"figure-pareto-frontier", "figure-budget-load", "figure-speedups"} <= set(figures)
    points = [t for t in figures["figure-pareto-frontier"] if t.get("mode") == "markers"]
    lines = [t for t in figures["figure-pareto-frontier"] if t.get("mode") == "lines"]
    # one legend entry per policy: its frontier line, grouped with its points
    assert len(points) == len(lines) == 2 and all(t["legendgroup"] == t["name"] for t in points + lines)
    assert all(t.get("showlegend") is not False for t in lines) and all(t["showlegend"] is False for t in points)
    table = pd.read_parquet(sweep_dir / "sweep.parquet")
    hover = [h for t in points for h in t["hovertext"]]
    assert len(hover) == len(table) == 8
    for text in hover:
        for words in ("policy: ", "drafter: ", "concurrency: ", "throughput per GPU: ", "interactivity: ",
                      "mean TTFT: ", "p99 TPOT: ", "verify budget per request: ", "mean acceptance length: "):
            assert words in text, (words, text)
    two_step = table.loc[table["policy"] == "two-step"].iloc[-1]
    assert any(f"{two_step['tput_per_gpu']:,.1f} tok/s/GPU" in h and "concurrency: 128" in h
               and "queue still growing" in h for h in hover)


def test_the_report_holds_every_point_the_inputs_cards_and_the_warnings(sweep_dir: Path) -> None:
    page = (sweep_dir / "report.html").read_text()
    body = page[page.index('id="points-table"'):]
    assert body[:body.index("</table>")].count("<tr>") == 1 + 8  # the header and every point
    assert page.count('<span class="badge synthetic">synthetic</span>') >= 2  # profile and traces cards
    assert "tests/conftest.py" in page  # the cards' command
    assert "<h3>The scenario, resolved</h3>" in page and "max_concurrency: 64" in page
    warned = json.loads((sweep_dir / "warnings.json").read_text())
    assert len(warned) == 2 and {w["workload.concurrency"] for w in warned} == {128}
    assert "workload.concurrency=128 is more than the cluster runs at once" in page
    assert "from 2 run(s)" in page


def test_the_sweep_table_keeps_no_warnings_and_stays_reproducible(sweep_dir: Path, tmp_path: Path) -> None:
    # Why: the table is compared byte for byte between runs; messages belong beside it.
    assert "warnings" not in (sweep_dir / "sweep.csv").read_text().splitlines()[0]
    again = write_sweep(tmp_path / "again", pd.read_parquet(sweep_dir / "sweep.parquet"), {"title": "t"})
    assert (again / "sweep.csv").read_bytes() == (sweep_dir / "sweep.csv").read_bytes()
    assert not (again / "warnings.json").exists()  # a table without warnings does not claim none


@needs_browser
def test_the_browser_draws_every_policy_and_sorts_the_points(sweep_dir: Path, tmp_path: Path) -> None:
    url = (sweep_dir / "report.html").as_uri()
    dom = chromium(tmp_path, "--dump-dom", url)
    # Plotly drew each figure (its class and SVG appear only once its script has run)
    for div in ("figure-pareto-frontier", "figure-budget-load", "figure-speedups"):
        assert re.search(rf'id="{div}" class="[^"]*js-plotly-plot', dom), div
    assert dom.count('class="main-svg"') >= 6
    legend = re.findall(r'class="legendtext"[^>]*>([^<]*)<', dom)
    table = pd.read_parquet(sweep_dir / "sweep.parquet")
    assert set(table["label"]) <= set(legend)
    # #sort=-tput_per_gpu: the points table starts at the highest throughput
    dom = chromium(tmp_path, "--dump-dom", url + "#sort=-tput_per_gpu")
    rows = dom[dom.index('id="points-table"'):]
    first = re.search(r"<tbody><tr>(.*?)</tr>", rows, flags=re.S)
    assert first is not None
    values = [float(v) for v in re.findall(r'data-value="([^"]+)"', first.group(1))]
    assert table["tput_per_gpu"].max() in values


@needs_browser
def test_a_screenshot_of_the_report_is_not_blank(sweep_dir: Path, tmp_path: Path) -> None:
    from PIL import Image

    shot = tmp_path / "report.png"
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,900", (sweep_dir / "report.html").as_uri())
    pixels = np.asarray(Image.open(shot).convert("RGB")).reshape(-1, 3).astype(int)
    assert len(pixels) == 1200 * 900
    inked = (pixels.min(axis=1) < 235).mean()
    assert inked > 0.03, inked  # text, axes and points, not an empty page
    assert len(np.unique(pixels, axis=0)) > 200  # anti-aliased text and coloured series, not a flat error page
    saturated = pixels[pixels.max(axis=1) - pixels.min(axis=1) > 60]  # the policies' colours
    assert len(np.unique(saturated, axis=0)) > 20


def test_report_of_a_run_folder_and_a_capacity_folder(sloped_profile: Path, varied_traces: Path,
                                                       tmp_path: Path) -> None:
    sets = []
    for s in (f"profile={sloped_profile}", f"traces={varied_traces}", "run.duration_s=3"):
        sets += ["--set", s]
    run_dir = tmp_path / "run"
    assert runner.invoke(app, ["run", "--policy", "greedy", *sets, "--out", str(run_dir), "-q"]).exit_code == 0
    result = runner.invoke(app, ["report", str(run_dir)])
    assert result.exit_code == 0, result.output
    page = (run_dir / "report.html").read_text()
    assert {"figure-latency", "figure-acceptance", "figure-budget-time"} <= set(embedded_figures(page))
    assert 'id="requests-table"' in page and "tput_per_gpu" in page
    warned = json.loads((run_dir / "warnings.json").read_text())  # a 3 s run leaves requests unfinished
    assert len(warned) == 1 and "were unfinished at the horizon" in warned[0]
    assert "were unfinished at the horizon" in page[page.index('id="warnings"'):]
    cap_dir = tmp_path / "cap"
    result = runner.invoke(app, ["capacity", "--policy", "static:gamma=1", "--slo", "p90_tpot_ms=8", "--lo", "1",
                                 "--hi", "160", "--tol", "40", "--workers", "1", "--out", str(cap_dir), *sets])
    assert result.exit_code == 0, result.output
    out = tmp_path / "elsewhere" / "cap.html"
    result = runner.invoke(app, ["report", str(cap_dir), "--out", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert {"figure-capacity-bars", "figure-capacity-runs"} <= set(embedded_figures(page))
    runs = json.loads((cap_dir / "capacity.json").read_text())["policies"][0]["runs_made"]
    body = page[page.index('id="runs-table"'):]
    assert body[:body.index("</table>")].count("<tr>") == 1 + len(runs)
    assert '<span class="badge synthetic">synthetic</span>' in page


def test_a_folder_that_holds_no_results_is_refused_naming_it(tmp_path: Path) -> None:
    result = runner.invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 1
    assert f"{tmp_path}: not a sweep, capacity or run folder" in " ".join(result.output.split())


def test_without_plotly_a_sweep_says_so_and_leaves_no_old_report(
    sweep_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sparksim.report import build_report

    monkeypatch.setitem(sys.modules, "plotly", None)  # `import plotly` now raises ImportError
    with pytest.raises(MissingExtraError, match=r'plotly is not installed; install the plot extra: pip install'):
        build_report(sweep_dir)
    out = tmp_path / "sw"
    shutil.copytree(sweep_dir, out)
    write_sweep(out, pd.read_parquet(out / "sweep.parquet"), {"title": "t"})
    assert not (out / "report.html").exists() and (out / "sweep.parquet").exists()


def test_the_reports_speedups_and_capacity_notes_follow_the_tables_rules() -> None:
    # The report's speedups had put a policy's drafters on one frontier (the terminal table
    # and pareto.png draw one per drafter), and its capacity bars never showed what "above"
    # or "below the range" means (the statuses are written in full).
    pytest.importorskip("plotly")
    from sparksim.report.capacity_page import capacity_figure
    from sparksim.report.sweep_page import speedups
    from sparksim.studies.capacity import ABOVE, BELOW

    table, _ = speedups(two_drafter_sweep(), "static:gamma=1")
    assert dict(zip(table["policy"], table["speedup from"].round(6), strict=True)) == {
        "static(gamma=1)·dspark-5": 1.5, "two-step·mtp-1": 2.0, "two-step·dspark-5": 3.0}
    bars = [{"label": name, "policy": name, "capacity": cap, "capacity_se": None, "lowest": None, "runs": 2,
             "status": status} for name, cap, status in (("a", 64.0, ABOVE), ("b", None, BELOW))]
    fig = capacity_figure(bars, "users", 1.0)
    assert "a lower bound" in fig.data[0].hovertemplate
    assert "it missed the SLOs at 1" in fig.data[1].hovertemplate


def test_the_budget_against_load_marks_a_growing_queue_as_the_frontier_does() -> None:
    from sparksim.report.sweep_page import budget_figure
    from sparksim.studies.frontier import overloaded

    table = pd.DataFrame({"policy": "two-step", "label": "two-step", "lossless": True,
                          "workload.concurrency": [1, 8, 64], "verify_budget_per_request": [6.0, 5.0, 4.0],
                          "interactivity": [200.0, 150.0, 20.0], "tput_per_gpu": [200.0, 1200.0, 1300.0],
                          "steady_requests": [50, 50, 10], "steady_unfinished": [0, 0, 40]})
    hot = overloaded(table)
    assert hot.tolist() == [False, False, True]
    (trace,) = budget_figure(table, "workload.concurrency", {"two-step": "#123456"}, hot).data
    assert list(trace.marker.symbol) == ["circle", "circle", "x"]
    assert "queue" in trace.hovertext[2] and "queue" not in trace.hovertext[0]
