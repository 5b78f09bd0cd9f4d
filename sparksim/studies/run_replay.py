"""Replays a measured run through the simulator, and compares its stage latencies with the measurement.

`predict` replays the run's arrivals on a profile with the run's engine settings (plain
decoding) and returns each request's predicted TTFT and E2E; `stage_table` sets the mean
per load stage beside the measured one; `stability_margin` says how much more load the
prediction carries before its queue grows.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from sparksim.config import parse_scenario
from sparksim.cost.card import read_card
from sparksim.errors import ConfigError
from sparksim.sim.runner import simulate
from sparksim.studies.measured_runs import PREFIX_COLUMNS, EngineSettings, MeasuredRun


def replay_columns(run: MeasuredRun) -> list[str]:
    """The columns of a run a replay reads: lengths, and its shared prefixes where the engine cached them."""
    cols = ["arrival_s", "prompt_tokens", "output_tokens"]
    if run.settings.prefix_caching and set(PREFIX_COLUMNS) <= set(run.requests.columns):
        cols += list(PREFIX_COLUMNS)
    return cols


def settings_on(settings: EngineSettings, profile: Path) -> EngineSettings:
    """`settings` with any unset limit filled by vLLM's default on the profile's GPU (its card's
    `hardware`, and `memory.hbm_bytes` over its GPUs)."""
    if settings.max_num_seqs is not None and settings.max_num_batched_tokens is not None:
        return settings
    problems: list[str] = []
    card = read_card(Path(profile) / "card.yaml", problems)
    if problems or not isinstance(card, dict):
        raise ConfigError(f"profile {profile}: {'; '.join(problems) or 'card.yaml is not a mapping'}")
    memory = card.get("memory")
    memory = memory if isinstance(memory, dict) else {}
    gpus = card.get("gpus_per_replica") or 1
    hbm = memory.get("hbm_bytes")
    per_gpu = float(hbm) / gpus if isinstance(hbm, int | float) and isinstance(gpus, int) else None
    return settings.resolved(str(card.get("hardware", "an unnamed GPU")), per_gpu)


def replay_scenario(run: MeasuredRun, profile: Path, arrivals_csv: Path,
                    horizon_s: float | None = None) -> dict[str, Any]:
    """The scenario that replays `run` on `profile` with the run's engine settings (plain
    decoding), until `horizon_s` (default: long after the last arrival, for the queue to drain)."""
    st = settings_on(run.settings, profile)
    last = float(run.requests["arrival_s"].max())
    cluster: dict[str, Any] = {
        "replicas": 1, "max_concurrency": st.max_num_seqs, "max_batch_tokens": st.max_num_batched_tokens,
        "prefill": {"mode": "colocated", "schedule": "chunked", "chunk_tokens": st.max_num_batched_tokens},
    }
    if st.kv_capacity_tokens is not None:
        cluster["kv_capacity_tokens"] = st.kv_capacity_tokens
    if st.prefix_caching and PREFIX_COLUMNS[0] in run.requests.columns:
        cluster["prefix_cache"] = {"enabled": True, "block_tokens": st.block_size}
    return {
        "name": f"replay-{run.name}", "profile": str(profile), "cluster": cluster,
        "workload": {"kind": "replay", "arrivals_csv": str(arrivals_csv)},
        "policy": {"name": "static", "gamma": 0},
        # long enough for a stable engine to drain; an overloaded one leaves requests unfinished
        "run": {"duration_s": horizon_s if horizon_s is not None else last + max(600.0, 0.5 * last),
                "warmup_s": 0.0, "cooldown_s": 0.0},
    }


def predict(run: MeasuredRun, profile: Path, work: Path) -> pd.DataFrame:
    """Replay `run` on `profile`: each request's predicted TTFT and E2E in ms (engine side;
    a request still unfinished when the replay ends counts the time it waited until then)."""
    work.mkdir(parents=True, exist_ok=True)
    csv = work / f"{run.name}-arrivals.csv"
    run.requests[replay_columns(run)].to_csv(csv, index=False)  # always: settings may differ by call
    sc = parse_scenario(replay_scenario(run, profile, csv))
    req = simulate(sc).requests.set_index("request_id").reindex(range(len(run.requests)))
    end = sc.run.duration_s
    arrival = run.requests["arrival_s"].to_numpy()
    first = req["first_token_at"].fillna(end).to_numpy()
    finish = req["finish_at"].fillna(end).to_numpy()
    return pd.DataFrame({"stage": run.requests["stage"].to_numpy(),
                         "ttft_ms": (first - arrival) * 1e3, "e2e_ms": (finish - arrival) * 1e3,
                         "finished": req["finish_at"].notna().to_numpy()})


def stability_margin(run: MeasuredRun, stage: int, profile: Path, work: Path, *,
                     tol: float = 0.02, most: float = 4.0) -> float:
    """How many times the stage's load the prediction says the engine carries before its queue
    grows: the largest factor f (to `tol`, at most `most`) such that the stage's requests,
    replayed alone with their arrival gaps divided by f, leave no more than UNFINISHED_SHARE
    of them still waiting for their first token when the last one has arrived. Below 1: the
    prediction calls the measured load itself an overload."""
    from sparksim.sim.metrics import UNFINISHED_SHARE

    rows = run.requests[run.requests["stage"] == stage]
    if rows.empty:
        raise ConfigError(f"{run.name} has no stage {stage}")
    t0 = float(rows["arrival_s"].min())

    def stable(f: float) -> bool:
        scaled = rows.assign(arrival_s=(rows["arrival_s"] - t0) / f).reset_index(drop=True)
        part = MeasuredRun(f"{run.name}-s{stage}-x{f:.4f}", run.path, scaled, run.settings)
        csv = work / f"{part.name}.csv"
        scaled[replay_columns(part)].to_csv(csv, index=False)
        horizon = float(scaled["arrival_s"].max()) + 1e-6
        sc = parse_scenario(replay_scenario(part, profile, csv, horizon_s=horizon))
        waiting = int(simulate(sc).summary["steady_waiting"])  # the whole replay is the window
        return waiting <= UNFINISHED_SHARE * len(scaled)

    work.mkdir(parents=True, exist_ok=True)
    lo, hi = (1.0, most) if stable(1.0) else (1.0 / most, 1.0)
    if lo == 1.0 and stable(most):
        return most
    while hi / lo > 1 + tol:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if stable(mid) else (lo, mid)
    return lo


def stage_table(run: MeasuredRun, pred: pd.DataFrame, request_overhead_ms: float = 0.0) -> pd.DataFrame:
    """Per load stage: measured and predicted mean TTFT and E2E (ms), their errors, and
    whether the prediction left requests unfinished (an overload)."""
    rows = []
    counted = run.requests["counted"].to_numpy()
    for stage, real in run.requests[counted].groupby("stage"):
        got = pred[counted & (pred["stage"] == stage).to_numpy()]
        rows.append({
            "run": run.name, "stage": int(str(stage)), "requests": len(real),
            "uncounted": int((~run.requests.loc[run.requests["stage"] == stage, "counted"]).sum()),
            "rate": len(real) / max(float(real["arrival_s"].max() - real["arrival_s"].min()), 1e-9),
            "ttft_real": float(real["ttft_ms"].mean()),
            "ttft_sim": float(got["ttft_ms"].mean()) + request_overhead_ms,
            "e2e_real": float(real["e2e_ms"].mean()),
            "e2e_sim": float(got["e2e_ms"].mean()) + request_overhead_ms,
            "unfinished": int((~got["finished"]).sum()),
        })
    out = pd.DataFrame(rows)
    out["ttft_err"] = out["ttft_sim"] / out["ttft_real"] - 1
    out["e2e_err"] = out["e2e_sim"] / out["e2e_real"] - 1
    return out


def stage_errors(table: pd.DataFrame) -> list[dict[str, Any]]:
    """A stage table's errors as card entries."""
    return [{"run": str(run), "stage": int(stage), "ttft_err": round(float(t), 4), "e2e_err": round(float(e), 4)}
            for run, stage, t, e in zip(table["run"], table["stage"], table["ttft_err"], table["e2e_err"],
                                        strict=True)]
