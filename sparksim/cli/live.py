"""`sparksim live`: serve a scenario on the real built-in target and drafter, on this CPU.

`sparksim live` runs the workload in real time and writes the simulator's results folder;
`sparksim profile live` measures the engine's own step functions into a profile, so the
simulator (and the policies' cost model) price steps as this engine pays for them.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from sparksim.cli.common import check_out, console, err_console, friendly_errors

MODELS = Path("models/tinylm-d128-l6")
DEFAULT_PROFILE = "profiles/cpu-tinylm-d128-live-measured"
DEFAULT_TRACES = "traces/tinylm-d128-l6-dspark-recorded"


@friendly_errors
def live(
    scenario: Path | None = typer.Argument(None, help="scenario YAML (default: the embedded default, made live)"),
    policy: str | None = typer.Option("two-step", "--policy", help="policy name[:param=value,...]"),
    users: int | None = typer.Option(None, "--users", help="closed loop: this many users (sets workload)"),
    rate: float | None = typer.Option(None, "--rate", help="open loop: Poisson arrivals per second"),
    duration: float | None = typer.Option(None, "--duration", help="seconds of wall clock to serve"),
    set_: list[str] = typer.Option([], "--set", help="override a scenario key: --set run.warmup_s=5"),
    target: Path = typer.Option(MODELS / "target", "--target", help="built-in target folder"),
    drafter: Path = typer.Option(MODELS / "dspark", "--drafter", help="drafter folder (config, weights, calibration)"),
    profile: str = typer.Option(DEFAULT_PROFILE, "--profile", help="the engine's measured profile (prices decisions)"),
    traces: str = typer.Option(DEFAULT_TRACES, "--traces", help="trace set recorded on the same models: request mix and prompts"),
    prompts: Path | None = typer.Option(None, "--prompts", help="prompt file (default: the trace card's)"),
    threads: int = typer.Option(1, "--threads", help="torch threads"),
    out: Path | None = typer.Option(None, "--out", help="results folder (default results/live-<policy>-...)"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress line"),
) -> None:
    """Serve a workload on the real models in real time; write the simulator's results folder."""
    from sparksim.cli.common import need_torch
    from sparksim.cli.run import summary_table

    need_torch()
    from sparksim.live.run import LIVE_SCENARIO, live_simulate
    from sparksim.sim.runner import load_scenario, run_warnings, write_results

    presets = [f"{k}={v}" for k, v in LIVE_SCENARIO.items()]  # what the live engine runs
    sets = [f"profile={profile}", f"traces={traces}"]
    if users is not None:
        sets += ["workload.kind=closed", f"workload.concurrency={users}", f"cluster.max_concurrency={max(users, 1)}"]
    if rate is not None:
        sets += ["workload.kind=poisson", f"workload.rate={rate}"]
    if duration is not None:
        sets += [f"run.duration_s={duration}"]
    sc, base = load_scenario(scenario, [*sets, *set_], policy, presets=presets)
    sc = sc.model_copy(update={"name": f"live-{sc.name}"})
    target_out = out or live_out_dir(sc)
    check_out(target_out)

    def progress(now: float, steps: int) -> None:
        if not quiet:
            err_console.print(f"live {now:6.1f}/{sc.run.duration_s:.0f} s · {steps:,} steps", highlight=False)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = live_simulate(sc, base, target=target, drafter=drafter, prompts=prompts, threads=threads,
                               progress=progress)
    given = run_warnings(caught, result.summary)
    for message in given:
        err_console.print(f"[yellow]warning:[/] {escape(message)}", highlight=False)
    write_results(result, target_out, given)
    console.print(summary_table(result))
    console.print(f"{result.num_steps:,} live steps in {result.wall_s:.1f} s → {target_out}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add `live` to `app`."""
    app.command("live")(live)


def live_out_dir(sc: Any) -> Path:
    """results/<scenario>-<policy>-<load>-seed<seed>: the load is the users of a closed loop or the
    rate of an open one (`r20`), so runs at two rates never share a folder."""
    load = f"u{sc.workload.concurrency}" if sc.workload.kind == "closed" else f"r{sc.workload.rate:g}"
    return Path("results") / f"{sc.name}-{sc.policy.name}-{load}-seed{sc.seed}"
