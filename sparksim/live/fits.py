"""The live profile's fits and card edits, torch-free: what `sparksim profile live` fits to its points.

The measuring half (`sparksim.live.profile`) needs torch; fitting measured points, refitting
a profile from its own points.csv and writing a measured loop into a card do not, so they
live here and run (and are tested) without it. The models are in `sparksim.live.profile`'s
docstring: verify_ms = a(R, C) + c1·T + c4·T·K/R + [p ≥ 1]·(c5 + c6·R), one term a(R, C) per
measured (requests, context) cell, and draft_ms = d0 + d1·R + d2·R·p + d3·p + d4·K.
"""

from __future__ import annotations

import itertools
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


def cell_name(requests: int, context: int) -> str:
    """The verify fit's term for the points of R requests at C context tokens each."""
    return f"a_R{requests}_C{context}"


def fit_decode(points: pd.DataFrame) -> tuple[LeastSquaresFit, LeastSquaresFit | None]:
    """Fit the verify and draft models of the module docstring to the measured decode points.

    The verify fit gives each measured (R, C) cell its own term a(R, C) (what a plain step
    costs there, less c1·R and the attention FLOPs): the points showed KV reads that are not
    one line in R and K (a line priced 8-24 requests at 640 tokens 9-12 % high and 32 requests
    8.7 % low, the sign of the live runs' errors at 8 and 32 users). The shared terms (c1 per
    token, c4 per query × KV token, c5 + c6·R once drafts are verified) come from the points
    within each cell, which differ only in the positions drafted.
    """
    t = points["tokens"].to_numpy(np.float64)
    r = points["requests"].to_numpy(np.float64)
    k = points["kv_tokens"].to_numpy(np.float64)
    s = (points["positions"].to_numpy() > 0).astype(np.float64)  # the step verifies drafts
    req, ctx = points["requests"].to_numpy(), points["context"].to_numpy()
    cells = sorted({(int(a), int(b)) for a, b in zip(req, ctx, strict=True)})
    # each request count's terms rise with its context (a KV read does not get cheaper with
    # more KV, and the loader holds attention.csv to that): the shortest context's term, then
    # non-negative steps, as non-negative least squares keeps them
    steps = {cell_name(a, b): ((req == a) & (ctx >= b)).astype(np.float64) for a, b in cells}
    shared = {"c1_per_token": t, "c4_per_query_kv_token": t * k / r,
              "c5_with_drafts": s, "c6_per_request_with_drafts": s * r}
    raw = fit_linear(steps | shared, points["verify_ms"].to_numpy(np.float64))
    coef = dict(zip(raw.names, raw.coef, strict=True))
    for a in sorted({a for a, _ in cells}):  # the steps summed into each cell's term
        row = [cell_name(a, b) for a2, b in cells if a2 == a]  # ascending context
        for before, name in itertools.pairwise(row):
            coef[name] += coef[before]
    verify = LeastSquaresFit(raw.names, tuple(coef[n] for n in raw.names), raw.rel_residuals)
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


def verify_tables(verify: LeastSquaresFit, points: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """verify.csv (c1·T) and attention.csv (the cells' terms a(R, C) at K = R·(C + 1)) of a verify fit.

    Each measured request count is a row, linear in K between its cells (the loader's rule),
    held at its shortest context's term below it and on its last slope (not falling) past its
    longest. The loader holds the last row past it, so rows far past any batch a run can
    hold extend the last two measured rows' slope in R (not falling): a row stopping at the
    largest measured R would freeze the cost of more requests there.
    """
    coef = dict(zip(verify.names, verify.coef, strict=True))
    c1 = coef["c1_per_token"]
    top_t = max(int(points["tokens"].max()), 512)
    tokens = sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, top_t})
    # a profile's costs must be positive: a fit that found no per-token cost keeps a microsecond's
    verify_csv = pd.DataFrame({"tokens": tokens, "step_ms": [max(c1 * x, 1e-6) for x in tokens]})
    cells: dict[int, list[tuple[float, float]]] = {}
    for name, value in coef.items():
        if name.startswith("a_R"):
            rr, cc = (int(v) for v in name[3:].split("_C"))
            cells.setdefault(rr, []).append((float(rr * (cc + 1)), value))
    k_top = float(points["kv_tokens"].max()) * 4
    kv = np.asarray(sorted({0.0, k_top, *(k for row in cells.values() for k, _ in row)}))

    def row_at(pts: list[tuple[float, float]]) -> np.ndarray[Any, np.dtype[np.float64]]:
        ks, vs = zip(*sorted(pts), strict=True)
        out = np.interp(kv, ks, vs)  # held at the ends
        if len(ks) > 1:
            slope = max((vs[-1] - vs[-2]) / (ks[-1] - ks[-2]), 0.0)
            past = kv > ks[-1]
            out[past] = vs[-1] + slope * (kv[past] - ks[-1])
        return out

    rows = {rr: row_at(pts) for rr, pts in sorted(cells.items())}
    measured = sorted(rows)
    if len(measured) > 1:
        lo, hi = measured[-2], measured[-1]
        per_request = np.maximum((rows[hi] - rows[lo]) / (hi - lo), 0.0)
        for rr in sorted({2 * hi, 256, 1024, 4096, 16384} - set(measured)):
            if rr > hi:  # not falling in K either (the loader's rule for attention.csv)
                rows[rr] = np.maximum.accumulate(rows[hi] + per_request * (rr - hi))
    attention = pd.DataFrame([{"requests": rr, "kv_tokens": float(kk), "attn_ms": float(v)}
                              for rr, row in sorted(rows.items()) for kk, v in zip(kv, row, strict=True)])
    return verify_csv, attention


VERIFY_MODEL = ("verify_ms = a(R, C) + c1*T + c4*T*K/R + (c5 + c6*R) if the step verifies drafts: one term "
                "a(R, C) per measured cell of R requests at C context tokens (K = R*(C + 1)), non-negative "
                "least squares, relative error")
FILES = {"verify.csv": "c1*T of the verify fit (the fixed cost is in the cells' terms)",
         "attention.csv": "the verify fit's cell terms a(R, C) at K = R*(C + 1), by request count: linear in K "
                          "between a row's cells, held below its shortest context, its last slope past its "
                          "longest; rows past the largest measured R extend the last two rows' slope"}


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
    coef = dict(zip(verify.names, verify.coef, strict=True))
    verify_csv, attention = verify_tables(verify, points)
    cm = card["cost_model"]
    cm["attention_ms_per_query_kv_token"] = coef["c4_per_query_kv_token"]
    cm["verify_drafts_ms"] = {"a_ms": coef["c5_with_drafts"], "b_ms_per_request": coef["c6_per_request_with_drafts"]}
    cm["verify_drafts_note"] = ("what a step adds once it verifies any draft (exact rejection sampling with "
                                "the residual, the drafts scattered into the target's input): c5 + c6*R of "
                                "the verify fit, the jump between plain-decoding and drafting points")
    cm["verify_fit"] = {"model": VERIFY_MODEL, **verify.summary()}
    card.setdefault("files", {}).update(FILES)
    card["graph_capture_sizes"] = []  # the live engine runs eagerly: no batch pads up
    card["refit"] = {"date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "command": command,
                     "what": "the verify fit redone from points.csv (no point measured again)"}
    extra = {f.name: pd.read_csv(f) for f in sorted(out.glob("*.csv")) if f.name != "verify.csv"}
    extra["attention.csv"] = attention
    return write_profile(out, verify_csv, card, extra=extra)


def sig5(x: float) -> float:
    """Round to 5 significant figures (what a card keeps of a fitted or measured figure)."""
    return float(f"{x:.5g}") if math.isfinite(x) else x
