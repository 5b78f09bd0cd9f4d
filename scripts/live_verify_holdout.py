"""How well a live profile's verify model predicts decode points it was not fitted to.

    python scripts/live_verify_holdout.py [PROFILE]

PROFILE is a live profile folder (`sparksim profile live`; default the shipped one). For each
held-out group (every point at one context, then every point at one interior request count)
the profile is refitted without them (`sparksim.live.fits.refit_verify` on a copy, nothing
measured again) and the held-out points are priced by the simulator's own step pricing
(`StepCost.for_decode(...).price(...)`, the profile's lookups), against their measured
verify_ms. Beside it, the same held-out test for the single line the verify fit used before
(c0 + c1·T + c2·R + c3·K + c4·T·K/R + [p ≥ 1]·(c5 + c6·R), docs/fidelity.md §7), fitted here.
Errors are (priced − measured) / measured over the held-out points, mean and max of |error|.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from sparksim.cost.pricing import StepCost
from sparksim.cost.profile import ProfileWarning, load_profile
from sparksim.live.fits import fit_linear, refit_verify

DEFAULT = Path(__file__).resolve().parents[1] / "profiles" / "cpu-tinylm-d128-live-measured"


def priced_ms(profile_dir: Path, points: pd.DataFrame) -> np.ndarray:
    """The verify time the simulator charges each decode point (its drafting priced apart, not counted)."""
    prof = load_profile(profile_dir)
    out = []
    for r, c, p in zip(points["requests"], points["context"], points["positions"], strict=True):
        cost = StepCost.for_decode(prof, int(r), float(r * (c + 1)), int(p), None, kv_longest=float(c + 1))
        price = cost.price(np.full(int(r), int(p), dtype=np.int64), int(r * p))
        out.append(price.verify_s * 1e3)
    return np.asarray(out)


def line_fit_ms(train: pd.DataFrame, test: pd.DataFrame) -> np.ndarray:
    """The earlier single-line verify model, fitted on `train`, evaluated on `test`."""
    def cols(d: pd.DataFrame) -> dict[str, np.ndarray]:
        t, r, k = (d[c].to_numpy(np.float64) for c in ("tokens", "requests", "kv_tokens"))
        s = (d["positions"].to_numpy() > 0).astype(np.float64)
        return {"c0": np.ones_like(t), "c1": t, "c2": r, "c3": k, "c4": t * k / r, "c5": s, "c6": s * r}
    fit = fit_linear(cols(train), train["verify_ms"].to_numpy(np.float64))
    return np.stack(list(cols(test).values()), axis=1) @ np.asarray(fit.coef)


def main(profile_dir: Path) -> None:
    warnings.simplefilter("ignore", ProfileWarning)
    points = pd.read_csv(profile_dir / "points.csv")
    contexts = sorted(points["context"].unique())
    requests = sorted(points["requests"].unique())
    groups = [("context", c) for c in contexts[1:-1]] + [("requests", r) for r in requests[1:-1]]
    cell, line = [], []
    own = priced_ms(profile_dir, points) / points["verify_ms"].to_numpy(np.float64) - 1
    print(f"in sample (the profile as it is, {len(points)} points): mean {abs(own).mean():.1%}, "
          f"max {abs(own).max():.1%}")
    print(f"{'held out':<16} {'points':>6} {'cells: mean / max':>20} {'line: mean / max':>20}")
    with tempfile.TemporaryDirectory() as tmp:
        for col, value in groups:
            held = points[col] == value
            work = Path(tmp) / f"{col}-{value}"
            shutil.copytree(profile_dir, work)
            points[~held].to_csv(work / "points.csv", index=False)
            refit_verify(work, "held-out test")
            want = points.loc[held, "verify_ms"].to_numpy(np.float64)
            e_cell = priced_ms(work, points[held]) / want - 1
            e_line = line_fit_ms(points[~held], points[held]) / want - 1
            cell.append(e_cell)
            line.append(e_line)
            print(f"{col + ' ' + str(value):<16} {held.sum():>6} "
                  f"{abs(e_cell).mean():>11.1%} / {abs(e_cell).max():>5.1%} "
                  f"{abs(e_line).mean():>11.1%} / {abs(e_line).max():>5.1%}")
    c, ln = np.concatenate(cell), np.concatenate(line)
    print(f"{'all held out':<16} {c.size:>6} {abs(c).mean():>11.1%} / {abs(c).max():>5.1%} "
          f"{abs(ln).mean():>11.1%} / {abs(ln).max():>5.1%}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
