"""Calibrate an analytic profile to a user's own measured runs (`sparksim profile calibrate`).

A user who served real traffic has per-request measurements: when each request arrived,
its prompt and output lengths, and its measured TTFT and end-to-end latency. Replayed
through sparksim with the engine's settings, a profile predicts each load stage's mean
TTFT and E2E. Calibration fits a few *named physical* parameters of the analytic model
(`PARAMETERS`: GEMM and attention efficiencies, the per-step overhead, and a per-request
latency outside the engine's steps) so the predictions meet the measurements, starting
from the sourced defaults, inside physical bounds and pulled towards the defaults by a
weak prior (`PRIOR_WEIGHT`). Nothing else moves: the model's shape, the CUDA-graph sizes,
the drafter and verification terms keep their analytic form (runs without speculation
cannot see them), and the card of the calibrated profile says so.

The fit is scipy's bounded least squares over log-errors of the stage means, each
prediction a full discrete-event replay of the measured arrivals. `held_out_errors` fits
without one run and predicts it: the error a user should expect on a run the fit has not
seen.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shlex
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sparksim.config import parse_scenario
from sparksim.cost.analytic import HW_OPTIONS, build_analytic, options_from_command
from sparksim.cost.profile import load_profile, write_profile
from sparksim.errors import ConfigError, FormatError
from sparksim.sim.runner import simulate


@dataclass(frozen=True)
class FitParameter:
    """One parameter calibration may move: its bounds and how strongly the default holds it."""

    name: str
    lo: float
    hi: float
    log: bool  # fitted as log(value) (a ratio-like quantity), else as the value itself
    prior_scale: float  # one prior standard deviation: in log units if `log`, else in the value's
    what: str


PARAMETERS: dict[str, FitParameter] = {p.name: p for p in (
    FitParameter("compute_eff", 0.2, 1.0, True, 0.5,
                 "fraction of dense peak FLOP/s that large (prefill-sized) GEMMs reach"),
    FitParameter("mem_eff", 0.3, 1.0, True, 0.5,
                 "fraction of HBM bandwidth that weight-streaming (decode-sized) GEMMs reach"),
    FitParameter("attn_compute_eff", 0.1, 1.0, True, 0.5,
                 "fraction of dense peak FLOP/s that prefill attention reaches"),
    FitParameter("attn_mem_eff", 0.2, 1.0, True, 0.5,
                 "fraction of HBM bandwidth that decode attention's KV read reaches"),
    FitParameter("step_overhead_ms", 0.0, 10.0, False, 2.0,
                 "fixed CPU cost of every engine step (scheduling, input preparation, sampling), ms"),
    FitParameter("request_overhead_ms", 0.0, 500.0, False, 100.0,
                 "latency of every request outside the engine's steps (HTTP, tokenisation, "
                 "streaming; measured at the client), added to TTFT and E2E, ms"),
)}
DEFAULT_FIT = ("compute_eff", "mem_eff", "step_overhead_ms", "request_overhead_ms")
PRIOR_WEIGHT = 0.01  # the prior's residuals against the stages' (a weak pull towards the defaults)
TTFT_WEIGHT = 0.5  # a TTFT residual against an E2E one (TTFT is noisier, ms on ms)
BINS = 4  # length quantiles per stage the fit compares mean latencies in
NEAR_BOUND = 0.03  # a fitted value this close (share of its range) to a bound is tried at the bound
REQUIRED = ("arrival_s", "prompt_tokens", "output_tokens", "ttft_ms", "e2e_ms")
PREFIX_COLUMNS = ("prefix_group", "prefix_tokens")  # optional: a request's shared prefix (replayed when cached)


# --------------------------------------------------------------------------- engine settings


@dataclass(frozen=True)
class EngineSettings:
    """What the real engine ran with, as sparksim needs it to replay a run."""

    max_num_seqs: int = 256  # vLLM's default on a GPU (V1)
    max_num_batched_tokens: int = 2048
    tensor_parallel_size: int = 1
    block_size: int = 16
    kv_capacity_tokens: int | None = None  # None: the profile's own estimate
    max_model_len: int | None = None
    prefix_caching: bool = False
    source: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


# vLLM's flags this reads, to EngineSettings fields (short forms as vLLM spells them)
_VLLM_FLAGS = {
    "--max-num-seqs": "max_num_seqs", "--max-num-batched-tokens": "max_num_batched_tokens",
    "--tensor-parallel-size": "tensor_parallel_size", "-tp": "tensor_parallel_size",
    "--block-size": "block_size", "--max-model-len": "max_model_len",
    "--num-gpu-blocks-override": "num_gpu_blocks",
}
_KV_LOG = re.compile(r"GPU KV cache size:\s*([\d,]+)\s*tokens")


def parse_vllm_flags(text: str) -> dict[str, Any]:
    """Read the engine settings from a `vllm serve` command line (and, if pasted with it, the
    start-up log line `GPU KV cache size: N tokens`). Flags sparksim does not model are ignored;
    `ignored` lists them."""
    out: dict[str, Any] = {}
    kv = _KV_LOG.search(text)
    command = _KV_LOG.sub("", text)
    argv = shlex.split(command, comments=False)
    ignored: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        flag, eq, inline = arg.partition("=")
        if flag in ("--enable-prefix-caching", "--no-enable-prefix-caching"):
            out["prefix_caching"] = flag == "--enable-prefix-caching"
        elif flag in _VLLM_FLAGS:
            value = inline if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            if not eq:
                i += 1
            try:
                out[_VLLM_FLAGS[flag]] = int(value)
            except ValueError:
                raise ConfigError(f"vLLM flag {flag} {value!r}: expected an integer") from None
        elif flag.startswith("-"):
            ignored.append(flag)
            if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                i += 1  # its value
        i += 1
    blocks = out.pop("num_gpu_blocks", None)
    if kv is not None:
        out["kv_capacity_tokens"] = int(kv.group(1).replace(",", ""))
    elif blocks is not None:
        out["kv_capacity_tokens"] = blocks * out.get("block_size", EngineSettings.block_size)
    out["ignored"] = ignored
    return out


def engine_settings(values: dict[str, Any], source: str) -> tuple[EngineSettings, list[str]]:
    """Make EngineSettings from a mapping (a YAML file's, or `parse_vllm_flags`'), checking each
    value; also return the keys it does not model (a caller shows them: a typo shows up there)."""
    known = set(EngineSettings.__dataclass_fields__) - {"source"}
    values = dict(values)
    if "enable_prefix_caching" in values:  # vLLM's own name
        values.setdefault("prefix_caching", values.pop("enable_prefix_caching"))
    ignored = sorted(set(values) - known - {"ignored", "num_gpu_blocks", "source"}) + list(
        values.get("ignored") or [])
    vals = {k: v for k, v in values.items() if k in known}
    if "num_gpu_blocks" in values and "kv_capacity_tokens" not in vals:
        vals["kv_capacity_tokens"] = int(values["num_gpu_blocks"]) * int(vals.get("block_size", 16))
    for key in ("max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size", "block_size",
                "kv_capacity_tokens", "max_model_len"):
        v = vals.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise ConfigError(f"{source}: {key}={v!r} must be a positive integer")
    if "prefix_caching" in vals and not isinstance(vals["prefix_caching"], bool):
        raise ConfigError(f"{source}: prefix_caching={vals['prefix_caching']!r} must be true or false")
    return EngineSettings(**vals, source=source), ignored


# --------------------------------------------------------------------------- measured runs


@dataclass
class MeasuredRun:
    """One measured run: its requests in arrival order, and the engine that served them."""

    name: str
    path: Path
    requests: pd.DataFrame  # REQUIRED columns, `stage`; arrival_s from the run's first request
    settings: EngineSettings = field(default_factory=EngineSettings)

    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


def _vllm_bench_json(path: Path) -> pd.DataFrame:
    """Per-request rows from `vllm bench serve --save-result --save-detailed` JSON."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(path, [f"cannot be read as JSON ({exc})"]) from None
    need = ("input_lens", "output_lens", "ttfts", "itls", "start_times")
    missing = [k for k in need if not isinstance(doc, dict) or k not in doc]
    if missing:
        raise FormatError(path, [f"no per-request field(s) {missing}: save it with `vllm bench serve "
                                 "--save-result --save-detailed` (start_times needs a vLLM recent "
                                 "enough to record send times), or write a CSV with columns "
                                 f"{list(REQUIRED)}"])
    n = len(doc["ttfts"])
    if any(len(doc[k]) != n for k in need):
        raise FormatError(path, [f"per-request lists differ in length: "
                                 f"{ {k: len(doc[k]) for k in need} }"])
    errors = doc.get("errors") or [""] * n
    start = np.asarray(doc["start_times"], dtype=np.float64)
    ttft = np.asarray(doc["ttfts"], dtype=np.float64)
    e2e = ttft + np.asarray([float(np.sum(x)) if x else 0.0 for x in doc["itls"]])
    df = pd.DataFrame({"arrival_s": start - start.min(), "prompt_tokens": doc["input_lens"],
                       "output_tokens": doc["output_lens"], "ttft_ms": ttft * 1e3, "e2e_ms": e2e * 1e3,
                       "has_error": [int(bool(e)) for e in errors]})
    return df.sort_values("arrival_s", kind="stable").reset_index(drop=True)


def load_run(path: Path, settings: EngineSettings | None = None) -> MeasuredRun:
    """Read a measured run: a CSV (REQUIRED columns; optional `stage`, `has_error`, PREFIX_COLUMNS) or a vLLM
    bench JSON; check every row, naming the file and the row of the first bad value."""
    path = Path(path)
    settings = settings or EngineSettings()
    if path.suffix == ".json":
        df = _vllm_bench_json(path)
    else:
        try:
            df = pd.read_csv(path)
        except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            raise FormatError(path, [f"cannot be read as CSV ({exc})"]) from None
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise FormatError(path, [f"missing column(s) {missing} (has {list(df.columns)})"])
    if df.empty:
        raise FormatError(path, ["no rows"])
    problems: list[str] = []
    for col, low in (("arrival_s", 0.0), ("prompt_tokens", 1), ("output_tokens", 0),
                     ("ttft_ms", 0.0), ("e2e_ms", 0.0)):
        vals = pd.to_numeric(df[col], errors="coerce").to_numpy(np.float64)
        bad = ~np.isfinite(vals) | (vals < low)
        if bad.any():
            row = int(np.argmax(bad))
            problems.append(f"row {row + 1}: {col}={df[col].iloc[row]!r} (must be a number >= {low:g})")
        df[col] = vals
    if not problems:
        late = df["ttft_ms"] > df["e2e_ms"] + 1e-6
        if late.any():
            row = int(np.argmax(late.to_numpy()))
            problems.append(f"row {row + 1}: ttft_ms={df['ttft_ms'].iloc[row]:g} > e2e_ms="
                            f"{df['e2e_ms'].iloc[row]:g} (the first token cannot come after the last)")
        back = np.diff(df["arrival_s"].to_numpy()) < 0
        if back.any():
            problems.append(f"row {int(np.argmax(back)) + 2}: arrival_s goes back in time "
                            "(rows must be in arrival order)")
        if settings.max_model_len is not None:
            long = (df["prompt_tokens"] + df["output_tokens"]) > settings.max_model_len
            if long.any():
                row = int(np.argmax(long.to_numpy()))
                problems.append(
                    f"row {row + 1}: prompt {int(df['prompt_tokens'].iloc[row])} + output "
                    f"{int(df['output_tokens'].iloc[row])} tokens exceed the engine's max_model_len="
                    f"{settings.max_model_len} ({settings.source or 'engine settings'}): the settings "
                    "contradict the run")
    if "has_error" in df.columns and not problems:
        errored = int(pd.to_numeric(df["has_error"], errors="coerce").fillna(1).astype(bool).sum())
        if errored:
            problems.append(f"{errored} request(s) have has_error set: their latencies are not "
                            "measurements; drop them, or the run")
    if problems:
        raise FormatError(path, problems)
    df = df.reset_index(drop=True)
    if "stage" not in df.columns:
        df["stage"] = 0
    # A request the client counted no output tokens for still ran (its E2E says so, seconds
    # long): it is replayed with its stage's mean output and left out of the comparison.
    df["counted"] = df["output_tokens"] >= 1
    if not df["counted"].any():
        raise FormatError(path, ["no request has output_tokens >= 1"])
    mean_out = df[df["counted"]].groupby("stage")["output_tokens"].mean().round()
    fill = df["stage"].map(mean_out).fillna(round(float(df.loc[df["counted"], "output_tokens"].mean())))
    df["output_tokens"] = np.where(df["counted"], df["output_tokens"], fill).astype(np.int64)
    df["prompt_tokens"] = df["prompt_tokens"].astype(np.int64)
    name = path.name.removesuffix(".gz").removesuffix(".csv").removesuffix(".json")
    return MeasuredRun(name, path, df, settings)


# --------------------------------------------------------------------------- prediction


def replay_columns(run: MeasuredRun) -> list[str]:
    """The columns of a run a replay reads: lengths, and its shared prefixes where the engine cached them."""
    cols = ["arrival_s", "prompt_tokens", "output_tokens"]
    if run.settings.prefix_caching and set(PREFIX_COLUMNS) <= set(run.requests.columns):
        cols += list(PREFIX_COLUMNS)
    return cols


def replay_scenario(run: MeasuredRun, profile: Path, arrivals_csv: Path,
                    horizon_s: float | None = None) -> dict[str, Any]:
    """The scenario that replays `run` on `profile` with the run's engine settings (plain
    decoding), until `horizon_s` (default: long after the last arrival, for the queue to drain)."""
    st = run.settings
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


# --------------------------------------------------------------------------- the fit


def binned_residuals(run: MeasuredRun, pred: pd.DataFrame, request_overhead_ms: float = 0.0,
                     bins: int = BINS) -> np.ndarray:
    """log(predicted / measured) of mean latencies, per stage and per length quantile: E2E by
    output length (its slope is the decode step, its intercept the fixed costs) and TTFT by
    prompt length (the prefill's cost per token against the fixed costs). Stage means alone
    cannot tell a per-request overhead from a slower prefill; these bins can."""
    real = run.requests
    keep = real["counted"].to_numpy()
    out: list[float] = []
    for stage in sorted(real.loc[keep, "stage"].unique()):
        rows = keep & (real["stage"] == stage).to_numpy()
        for length, latency, weight in (("output_tokens", "e2e_ms", 1.0), ("prompt_tokens", "ttft_ms", TTFT_WEIGHT)):
            rank = real.loc[rows, length].rank(method="first").to_numpy()
            group = np.minimum((rank - 1) * bins // len(rank), bins - 1).astype(int)
            m = pd.Series(real.loc[rows, latency].to_numpy()).groupby(group).mean().to_numpy()
            p = pd.Series(pred.loc[rows, latency].to_numpy() + request_overhead_ms).groupby(group).mean().to_numpy()
            out.extend(weight * np.log(p / m))
    return np.asarray(out)


@dataclass
class Calibration:
    """A fit's outcome: the values, which sit on a bound, and the stages it was fitted to."""

    values: dict[str, float]  # every PARAMETERS entry fitted (the rest keep the base's)
    defaults: dict[str, float]
    at_bound: dict[str, str]  # name -> "lower" | "upper"
    stages: pd.DataFrame  # stage_table rows of the fitted runs at the fitted values
    evaluations: int  # replays of every run the fit spent
    runs: list[str]

    def card(self) -> dict[str, Any]:
        return {
            "fitted": {k: {"value": float(f"{v:.4g}"), "default": self.defaults[k],
                           "bounds": [PARAMETERS[k].lo, PARAMETERS[k].hi],
                           **({"at_bound": self.at_bound[k]} if k in self.at_bound else {}),
                           "what": PARAMETERS[k].what}
                       for k, v in self.values.items()},
            "evaluations": self.evaluations,
            "residuals": stage_errors(self.stages),
        }


class Calibrator:
    """Fits PARAMETERS of an analytic base profile to measured runs (one replay per run per evaluation)."""

    def __init__(self, base: Path, runs: Sequence[MeasuredRun], fit: Sequence[str] = DEFAULT_FIT,
                 *, work: Path | None = None, progress: Callable[[str], None] | None = None) -> None:
        self.base = load_profile(base)
        if self.base.source != "analytic":
            raise ConfigError(f"{base}: calibration remakes an analytic profile with fitted "
                              f"parameters; this one is {self.base.source!r}")
        unknown = [n for n in fit if n not in PARAMETERS]
        if unknown:
            drafter = [n for n in unknown if n.startswith("draft")]
            if drafter:
                raise ConfigError(f"--fit {drafter}: the drafter's terms cannot be fitted from runs "
                                  "without speculative decoding; they keep their analytic shape")
            raise ConfigError(f"--fit {unknown}: not a calibration parameter (one of {list(PARAMETERS)})")
        if not runs:
            raise ConfigError("calibration needs at least one measured run")
        self.options = options_from_command(str(self.base.card["command"]))
        params = self.base.card.get("parameters") or {}
        self.defaults = {n: (0.0 if n == "request_overhead_ms" else float(params[n]["value"]))
                         for n in fit}
        for n, v in self.defaults.items():
            p = PARAMETERS[n]
            if not p.lo <= v <= p.hi:
                raise ConfigError(f"{base}: {n}={v} lies outside calibration's bounds [{p.lo}, {p.hi}]")
        self.fit_names = list(fit)
        self.runs = list(runs)
        self.work = work or Path(tempfile.mkdtemp(prefix="sparksim-calibrate-"))
        self.progress = progress
        self.evaluations = 0

    # parameters <-> the optimiser's unknowns
    def _to_x(self, values: dict[str, float]) -> np.ndarray:
        return np.asarray([math.log(values[n]) if PARAMETERS[n].log else values[n] / PARAMETERS[n].prior_scale
                           for n in self.fit_names])

    def _from_x(self, x: np.ndarray) -> dict[str, float]:
        return {n: float(math.exp(v) if PARAMETERS[n].log else v * PARAMETERS[n].prior_scale)
                for n, v in zip(self.fit_names, x, strict=True)}

    def _bounds(self) -> tuple[np.ndarray, np.ndarray]:
        lo = [math.log(PARAMETERS[n].lo) if PARAMETERS[n].log else PARAMETERS[n].lo / PARAMETERS[n].prior_scale
              for n in self.fit_names]
        hi = [math.log(PARAMETERS[n].hi) if PARAMETERS[n].log else PARAMETERS[n].hi / PARAMETERS[n].prior_scale
              for n in self.fit_names]
        return np.asarray(lo), np.asarray(hi)

    def tables_with(self, values: dict[str, float]
                    ) -> tuple[pd.DataFrame, dict[str, pd.DataFrame], dict[str, Any]]:
        """The base profile remade with `values` (the engine-side ones): verify, other tables, card."""
        opts = dict(self.options)
        opts.update({k: float(f"{v:.4g}") for k, v in values.items() if k in HW_OPTIONS})  # as the card says
        verify, extra, card, _ = build_analytic(opts)
        return verify, extra, card

    def profile_with(self, values: dict[str, float], out: Path) -> Path:
        """Write the base profile remade with `values` to `out`."""
        verify, extra, card = self.tables_with(values)
        return write_profile(out, verify, card, extra=extra)

    def predictions(self, values: dict[str, float], runs: Sequence[MeasuredRun] | None = None
                    ) -> list[tuple[MeasuredRun, pd.DataFrame]]:
        """Replay `runs` (default: the fitted ones) on the base remade with `values`."""
        self.evaluations += 1
        prof = self.profile_with(values, self.work / f"profile-{self.evaluations}")
        return [(r, predict(r, prof, self.work)) for r in (self.runs if runs is None else runs)]

    def stages(self, values: dict[str, float], runs: Sequence[MeasuredRun] | None = None) -> pd.DataFrame:
        """stage_table of `runs` (default: the fitted ones) on the base remade with `values`."""
        extra = values.get("request_overhead_ms", 0.0)
        return pd.concat([stage_table(r, p, extra) for r, p in self.predictions(values, runs)],
                         ignore_index=True)

    def residuals(self, x: np.ndarray) -> np.ndarray:
        values = self._from_x(x)
        extra = values.get("request_overhead_ms", 0.0)
        parts = [binned_residuals(r, p, extra) for r, p in self.predictions(values)]
        prior = PRIOR_WEIGHT * (x - self._to_x(self.defaults)) / np.asarray(
            [PARAMETERS[n].prior_scale if PARAMETERS[n].log else 1.0 for n in self.fit_names])
        data = np.concatenate(parts)
        if self.progress is not None:
            shown = " ".join(f"{k}={v:.3g}" for k, v in values.items())
            self.progress(f"replay {self.evaluations}: {shown} -> rms log err {np.sqrt(np.mean(data ** 2)):.3f}")
        return np.concatenate([data, prior])

    def fit(self, max_steps: int = 20) -> Calibration:
        """Fit; `max_steps` caps the optimiser's steps (each also replays the runs once per
        fitted parameter for its derivatives)."""
        from scipy.optimize import least_squares

        lo, hi = self._bounds()
        x0 = np.clip(self._to_x(self.defaults), lo, hi)
        start = self.evaluations
        # a replay's latencies jitter at fine scale (event order changes as costs move), so
        # derivatives are taken over 10 % steps, which see the trend and not the jitter
        sol = least_squares(self.residuals, x0, bounds=(lo, hi), method="trf", diff_step=0.1,
                            x_scale="jac", max_nfev=max_steps, xtol=1e-4, ftol=1e-6, gtol=1e-8)
        # trf keeps its iterates strictly inside the bounds: a parameter near one is tried at
        # the bound itself, and is pinned there when that fits no worse (the runs pull it past)
        x, cost = sol.x.copy(), float(np.sum(sol.fun ** 2))
        at_bound: dict[str, str] = {}
        for i, n in enumerate(self.fit_names):
            near = NEAR_BOUND * (hi[i] - lo[i])
            for side, edge in (("lower", lo[i]), ("upper", hi[i])):
                if abs(x[i] - edge) <= near:
                    trial = x.copy()
                    trial[i] = edge
                    trial_cost = float(np.sum(self.residuals(trial) ** 2))
                    if trial_cost <= cost:
                        x, cost, at_bound[n] = trial, trial_cost, side
        values = self._from_x(x)
        table = self.stages(values)
        return Calibration(values, self.defaults, at_bound, table, self.evaluations - start,
                           [r.name for r in self.runs])


def held_out_errors(base: Path, runs: Sequence[MeasuredRun], fit: Sequence[str] = DEFAULT_FIT, *,
                    max_steps: int = 20, progress: Callable[[str], None] | None = None
                    ) -> pd.DataFrame:
    """Leave one run out: fit on the others, predict it. One stage_table row per held-out stage."""
    if len(runs) < 2:
        raise ConfigError("held-out errors need at least two measured runs (one to hold out)")
    tables = []
    for i, held in enumerate(runs):
        rest = [r for j, r in enumerate(runs) if j != i]
        cal = Calibrator(base, rest, fit, progress=progress)
        result = cal.fit(max_steps)
        table = cal.stages(result.values, [held])
        tables.append(table.assign(fitted_on=",".join(r.name for r in rest)))
    return pd.concat(tables, ignore_index=True)


def calibrated_card(card: dict[str, Any], result: Calibration, runs: Sequence[MeasuredRun],
                    held_out: pd.DataFrame | None, command: str) -> dict[str, Any]:
    """The calibrated profile's card: the base's, marked calibrated, with what it was fitted to."""
    out = dict(card)
    out["source"] = "calibrated"
    out["command"] = command
    params = {k: dict(v) for k, v in (card.get("parameters") or {}).items()}
    for k in result.values:
        if k in params:  # the value is the fitted one: say so where the value is listed
            params[k]["source"] = (f"calibrated: fitted to calibration.runs (default {result.defaults[k]:g}: "
                                   f"{params[k].get('source', '')})")
    out["parameters"] = params
    out["calibration"] = {
        "base_command": card["command"],
        "runs": [{"name": r.name, "file": str(r.path), "sha256": r.sha256(), "requests": len(r.requests),
                  "engine": r.settings.as_dict()} for r in runs],
        **result.card(),
        "request_overhead_ms": float(f"{result.values.get('request_overhead_ms', 0.0):.4g}"),
        "request_overhead": "not in the profile's tables: a latency outside the engine that the "
                            "measurements include; add it to predicted TTFT and E2E to compare",
        "kept": "the model's shape, CUDA-graph sizes, eager dispatch, collectives and every drafter "
                "and verification term keep their analytic form: runs without speculative decoding "
                "cannot see them",
        "method": "scipy.optimize.least_squares (trf, bounded) on log(predicted / measured) mean "
                  f"latencies per stage and length quartile (E2E by output length, TTFT x {TTFT_WEIGHT} "
                  "by prompt length), plus a prior pulling each parameter towards its "
                  f"sourced default (weight {PRIOR_WEIGHT}); each evaluation replays every run",
        **({"held_out": stage_errors(held_out)} if held_out is not None else {}),
    }
    return out
