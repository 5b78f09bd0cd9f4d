"""Writes a synthetic set's card: provenance, every parameter, and what the draw achieved.

`build_card` records the model and its fitted levels, the cited lengths against those
drawn, and the accepted lengths measured against the Table 1 targets; `write_synth` writes
the set with its card as a trace-set folder; `synth_command` is the command that remakes it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from sparksim.traces.format import write_traceset
from sparksim.traces.synth import CONF_GRID, SynthSet
from sparksim.traces.synth_lengths import LENGTH_STATS, preset_lengths
from sparksim.traces.synth_params import CALIBRATION_GAMMA, TABLE1_SOURCE

SYNTHETIC_NOTE = (
    "These traces are synthetic: drawn from a parametric model whose per-domain level is "
    "calibrated to published mean accepted lengths; no drafter or target model was run and "
    "nothing here was recorded."
)


def _rounded(values: NDArray[np.float64], digits: int = 4) -> list[float | None]:
    return [None if not np.isfinite(v) else round(float(v), digits) for v in values]


def build_card(synth: SynthSet, command: str, date: str | None = None) -> dict[str, Any]:
    """Return the card.yaml fields of a generated set: provenance, every parameter, the results."""
    m = synth.model
    stats = {name: synth.stats[name] for name in m.domains if name in synth.stats}  # model order
    table: dict[str, Any] = {}
    for name, st in stats.items():
        target = m.domains[name].target_accept_len
        row: dict[str, Any] = {
            "target": target, "achieved": round(st.accepted_length, 4),
            "uncut": round(st.uncut_accepted_length, 4),
            "rounds": st.num_rounds, "requests": st.num_requests,
        }
        if target is not None:
            row["error_pct"] = round(100.0 * (st.accepted_length / target - 1.0), 2)
        table[name] = row
    return {
        "source": "synthetic",
        "target": f"{m.target} (synthetic stand-in)",
        "drafter": m.drafter,
        "gamma": synth.gamma,
        "temperature": m.temperature,
        "date": date or dt.date.today().isoformat(),
        "command": command,
        "note": SYNTHETIC_NOTE,
        "data": {
            "requests": synth.trace.num_requests,
            "positions": synth.trace.num_positions,
            "domains": list(m.domains),
        },
        "model": {
            "preset": m.name,
            "equation": "c_true[r,t,k] = sigmoid(level_d + slope_d*(k-1) + b_r + e_r[t+k-1] + w_r[t+k-1])",
            "sampling": (
                "b_r ~ N(0, difficulty_sd^2) and lognormal lengths are drawn stratified (one draw per "
                "equal-probability stratum, in random order); e_r is AR(1) from its stationary law; "
                f"stored probabilities are rounded to a 1/{CONF_GRID} grid and accepted is drawn from them"
            ),
            "seed": synth.seed,
            "miscalibration_temperature": synth.miscalibration,
            "raw_temperature": m.raw_temperature,
            "fit_requests": m.fit_requests,
            "fit_seed": m.fit_seed,
            "fitted_level": {k: round(v, 5) for k, v in synth.levels.items()},
            "domains": {k: v.model_dump() for k, v in m.domains.items()},
            "sources": list(m.sources),
            "lengths": _lengths_card(synth),
        },
        "columns": {
            "conf": (
                "calibrated conditional confidence = p_accept" if synth.miscalibration is None
                else f"miscalibrated: sigmoid(logit(p_accept) / {synth.miscalibration})"
            ),
            "conf_raw": f"pre-calibration stand-in: sigmoid(logit(p_accept) / {m.raw_temperature})",
            "p_accept": "true conditional acceptance probability the accepted column was drawn from",
        },
        "calibration": {
            "measured_as": (
                "full-block walk per request (start at pos 0; a round at pos t yields accepted[t] + 1 "
                "tokens and moves to t + accepted[t] + 1), the last round cut at the response's end "
                "as real decoding cuts it; achieved = tokens / rounds of the domain (the level is "
                "fitted by this walk); uncut = mean of accepted + 1 over the same rounds"
            ),
            "target_gamma": CALIBRATION_GAMMA,
            "target_source": TABLE1_SOURCE,
            **({} if synth.gamma == CALIBRATION_GAMMA else {
                "caveat": f"targets hold at γ = {CALIBRATION_GAMMA}; this set has γ = {synth.gamma}, "
                          "so achieved lengths are not comparable to them",
            }),
            "accepted_length": table,
        },
        "conditional_acceptance": {
            "definition": "P(accepted >= k | accepted >= k-1) over the full-block rounds, k = 1..gamma",
            **{name: _rounded(st.conditional) for name, st in stats.items()},
        },
        "mean_conf_by_position": {
            "definition": "mean conf at position k over the rounds that reached k (compare with the above)",
            **{name: _rounded(st.predicted) for name, st in stats.items()},
        },
        "ece": {
            "definition": "per-position ECE (10 equal bins) over the rounds that reached k, mean over k",
            **{
                name: {
                    "conf": round(float(np.nanmean(st.ece)), 4),
                    "conf_raw": None if st.ece_raw is None else round(float(np.nanmean(st.ece_raw)), 4),
                }
                for name, st in stats.items()
            },
        },
    }


def _lengths_card(synth: SynthSet) -> dict[str, Any]:
    """Return, per domain, the lengths' cited statistics (with sources), the fit and the draw."""
    requests = synth.trace.requests
    out: dict[str, Any] = {}
    for name, d in synth.model.domains.items():
        mine = requests[requests["domain"] == name]
        entry: dict[str, Any] = {}
        for part in ("prompt", "output"):
            drawn = mine[f"{part}_tokens"].to_numpy(np.float64)
            used = (getattr(d, f"{part}_median"), getattr(d, f"{part}_sigma"),
                    getattr(d, f"{part}_min"), getattr(d, f"{part}_max"))
            cited = LENGTH_STATS.get(name, {}).get(part)
            # a params override of the lengths makes the cited figures no longer the source
            if cited is not None and used == preset_lengths(cited):
                entry[part] = {"cited": {"mean": cited.mean, "median": cited.median,
                                         "source": cited.source}}
            else:
                entry[part] = {"cited": "none: set by the model's parameters, not data/lengths.yaml"}
            entry[part] |= {
                "fit": {
                    "form": "lognormal clipped to [min, max], drawn stratified, rounded to tokens",
                    "median": round(float(used[0]), 4), "sigma": round(float(used[1]), 6),
                    "min": int(used[2]), "max": int(used[3]),
                },
                "drawn": ({"mean": round(float(drawn.mean()), 1),
                           "median": round(float(np.median(drawn)), 1)} if drawn.size else None),
            }
        out[name] = entry
    return out


def write_synth(path: Path | str, synth: SynthSet, command: str, date: str | None = None) -> Path:
    """Write `synth` as a trace-set folder with its card (atomically, checked on the way)."""
    t = synth.trace
    return write_traceset(
        path, t.requests, t.conf, t.accepted, build_card(synth, command, date),
        conf_raw=t.conf_raw, p_accept=t.p_accept,
    )


def synth_command(
    preset_name: str, *, requests_per_domain: int, gamma: int, seed: int,
    miscalibration: float | None, params: Path | None, out: Path,
) -> str:
    """Return the `sparksim traces synth` command line that remakes a set with these options."""
    parts: Sequence[str] = [
        "sparksim", "traces", "synth", "--preset", preset_name,
        "--requests-per-domain", str(requests_per_domain), "--gamma", str(gamma), "--seed", str(seed),
        *(["--miscalibration", repr(miscalibration)] if miscalibration is not None else []),
        *(["--params", str(params)] if params is not None else []),
        "--out", str(out),
    ]
    return " ".join(parts)
