"""Calibrates an analytic profile to a user's own measured runs (`sparksim profile calibrate`).

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
seen. The runs are read by `sparksim.studies.measured_runs` and replayed by
`sparksim.studies.run_replay`.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sparksim.cost.analytic import HW_OPTIONS, build_analytic, options_from_command
from sparksim.cost.profile import load_profile, write_profile
from sparksim.errors import ConfigError
from sparksim.studies.measured_runs import MeasuredRun
from sparksim.studies.run_replay import predict, stage_errors, stage_table


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
        # each evaluation writes a profile and replays the runs here: a folder of its own,
        # removed on `close` (or leaving a `with` block), unless the caller gave `work`
        self._own = None if work is not None else tempfile.TemporaryDirectory(prefix="sparksim-calibrate-")
        self.work = work if work is not None else Path(self._own.name)  # type: ignore[union-attr]
        self.progress = progress
        self.evaluations = 0

    def close(self) -> None:
        """Remove the working folder the calibrator made (one given as `work` is the caller's)."""
        if self._own is not None:
            self._own.cleanup()

    def __enter__(self) -> Calibrator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        with Calibrator(base, rest, fit, progress=progress) as cal:
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
