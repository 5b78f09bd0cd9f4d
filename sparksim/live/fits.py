"""The live profile's fits and card edits, torch-free: what `sparksim profile live` fits to its points.

The measuring half (`sparksim.live.profile`) needs torch; fitting measured points, refitting
a profile from its own points.csv and writing a measured loop into a card do not, so they
live here and run (and are tested) without it. The models are in `sparksim.live.profile`'s
docstring: verify_ms = c0 + c1·T + c2·R + c3·K + c4·T·K/R + [p ≥ 1]·(c5 + c6·R), draft_ms =
d0 + d1·R + d2·R·p + d3·p + d4·K.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class LeastSquaresFit:
    """Least squares y ≈ X·coef over named columns, with its residuals."""

    names: tuple[str, ...]
    coef: tuple[float, ...]
    rel_residuals: tuple[float, ...]  # (fit − measured) / measured per point

    def summary(self) -> dict[str, Any]:
        rel = np.abs(np.asarray(self.rel_residuals))
        return {"coefficients_ms": {n: sig5(c) for n, c in zip(self.names, self.coef, strict=True)},
                "points": len(rel), "mean_abs_rel_residual": sig5(float(rel.mean())),
                "max_abs_rel_residual": sig5(float(rel.max()))}


def fit_linear(columns: dict[str, np.ndarray[Any, Any]], y: np.ndarray[Any, Any]) -> LeastSquaresFit:
    """Fit non-negative coefficients (scipy's NNLS: a cost term cannot be negative), rows weighted by 1/y."""
    from scipy.optimize import nnls

    names = tuple(columns)
    x = np.stack([np.asarray(columns[n], np.float64) for n in names], axis=1)
    w = 1.0 / np.asarray(y, np.float64)  # relative error: small steps count as much as large ones
    coef, _ = nnls(x * w[:, None], y * w)
    fit = x @ coef
    return LeastSquaresFit(names, tuple(float(c) for c in coef), tuple(((fit - y) / y).tolist()))


def fit_decode(points: pd.DataFrame) -> tuple[LeastSquaresFit, LeastSquaresFit | None]:
    """Fit the verify and draft models of the module docstring to the measured decode points."""
    t = points["tokens"].to_numpy(np.float64)
    r = points["requests"].to_numpy(np.float64)
    k = points["kv_tokens"].to_numpy(np.float64)
    s = (points["positions"].to_numpy() > 0).astype(np.float64)  # the step verifies drafts
    verify = fit_linear({"c0": np.ones_like(t), "c1_per_token": t, "c2_per_request": r,
                         "c3_per_kv_token": k, "c4_per_query_kv_token": t * k / r,
                         "c5_with_drafts": s, "c6_per_request_with_drafts": s * r},
                        points["verify_ms"].to_numpy(np.float64))
    d = points[points["positions"] > 0]
    if d.empty:
        return verify, None
    r, p, k = (d[c].to_numpy(np.float64) for c in ("requests", "positions", "kv_tokens"))
    draft = fit_linear({"d0": np.ones_like(r), "d1_per_request": r, "d2_per_request_position": r * p,
                        "d3_per_position": p, "d4_per_kv_token": k}, d["draft_ms"].to_numpy(np.float64))
    return verify, draft


def add_loop(profile_dir: Path, loop: dict[str, Any], command: str) -> Path:
    """Write `loop` (from `measure_loop`) into the profile's card as `cost_model.loop_ms`, validated."""
    import yaml

    from sparksim.atomic import write_text
    from sparksim.cost.profile import check_profile
    from sparksim.errors import FormatError

    card_path = profile_dir / "card.yaml"
    old = card_path.read_text()
    card = yaml.safe_load(old)
    card.setdefault("cost_model", {})["loop_ms"] = loop
    card["cost_model"]["loop_note"] = (
        "the live engine's loop outside its step functions (finishing requests, the next ones, forming the "
        "batch, bookkeeping), fitted as a + b*R from the idle gaps between steps of short live sessions; "
        f"the simulator waits this long before each step. Measured by: {command}")
    write_text(card_path, yaml.safe_dump(card, sort_keys=False, width=100))
    problems = check_profile(profile_dir)
    if problems:
        write_text(card_path, old)
        raise FormatError(profile_dir, problems)
    return profile_dir


def verify_tables(verify: LeastSquaresFit, points: pd.DataFrame, requests: list[int]
                   ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """verify.csv (c0 + c1·T) and attention.csv (c2·R + c3·K by request count) of a verify fit."""
    c0, c1, c2, c3 = verify.coef[:4]
    top_t = max(int(points["tokens"].max()), 512)
    tokens = sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, top_t})
    verify_csv = pd.DataFrame({"tokens": tokens, "step_ms": [c0 + c1 * x for x in tokens]})
    # rows far past any batch a run can hold: the loader holds the last row's cost past it, so
    # the c2·R term would stop growing there (it did past 256 requests)
    req_rows = sorted({1, *requests, 2 * max(requests), 256, 1024, 4096, 16384})
    k_top = int(points["kv_tokens"].max()) * 4
    attention = pd.DataFrame([{"requests": rr, "kv_tokens": kk, "attn_ms": c2 * rr + c3 * kk}
                              for rr in req_rows for kk in (0, k_top)])
    return verify_csv, attention


def refit_verify(out: Path, command: str) -> Path:
    """Redo the verify fit of a live profile from its own points.csv; no point is measured again.

    verify.csv, attention.csv and the card's verify terms (attention FLOPs, the drafts overhead,
    the fit's summary) are rewritten; every other file and card entry (the draft and prefill
    fits, decision and loop times, how the points were measured) stays as it was, and the card
    says when and how it was refitted.
    """
    import yaml

    from sparksim.cost.profile import write_profile

    card = yaml.safe_load((out / "card.yaml").read_text())
    points = pd.read_csv(out / "points.csv")
    verify, _ = fit_decode(points)
    c4, c5, c6 = verify.coef[4:]
    verify_csv, attention = verify_tables(verify, points, [int(r) for r in card["grid"]["requests"]])
    cm = card["cost_model"]
    cm["attention_ms_per_query_kv_token"] = c4
    cm["verify_drafts_ms"] = {"a_ms": c5, "b_ms_per_request": c6}
    cm["verify_drafts_note"] = ("what a step adds once it verifies any draft (exact rejection sampling with "
                                "the residual, the drafts scattered into the target's input): c5 + c6*R of "
                                "the verify fit, the jump between plain-decoding and drafting points")
    cm["verify_fit"] = {"model": "verify_ms = c0 + c1*T + c2*R + c3*K + c4*T*K/R + (c5 + c6*R) if the step "
                                 "verifies drafts (non-negative least squares, relative error)", **verify.summary()}
    card["refit"] = {"date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "command": command,
                     "what": "the verify fit redone from points.csv (no point measured again)"}
    extra = {f.name: pd.read_csv(f) for f in sorted(out.glob("*.csv")) if f.name != "verify.csv"}
    extra["attention.csv"] = attention
    return write_profile(out, verify_csv, card, extra=extra)


def sig5(x: float) -> float:
    """Round to 5 significant figures (what a card keeps of a fitted or measured figure)."""
    return float(f"{x:.5g}") if math.isfinite(x) else x
