# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation: {extension: .py, format_name: percent}
# ---

# %% [markdown]
# # Do the recorded traces separate DSpark from DFlash? (issue 15, part 3)
#
# The two recorded sets (`traces/tinylm-d128-l6-{dspark,dflash}-recorded`) come from the same
# target, the same held-out prompts and the same recording seed, so the target wrote the same
# responses for both: the comparison is paired response by response. Per domain:
#
# - accepted length by the true static-γ walk (each response replayed at γ = 7, its last round
#   cut at its end, as `acceptance_summary` computes it), DSpark − DFlash with a 95 % paired
#   bootstrap CI over responses (scipy.stats.bootstrap, BCa, 2,000 resamples, seed 0);
# - the conditional acceptance by position (the paper's Fig. 2: P(accept k | accepted k − 1));
# - the all-rows mean 1 − TV at each position (free of the survivor effect: every output
#   position counts, not only those reached after k − 1 acceptances).
#
# `python analyses/separation.py --write` also stores the per-domain difference and its CI
# in both cards (`separation:`), which is how `make recorded-traces` leaves them.

# %%
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml
from scipy import stats

from sparksim.config import REPO_ROOT
from sparksim.traces.format import TraceSet, load_traceset

SETS = {k: Path(os.environ.get(f"SPARKSIM_SEPARATION_{k.upper()}",
                               REPO_ROOT / "traces" / f"tinylm-d128-l6-{k}-recorded"))
        for k in ("dspark", "dflash")}


def walk(accepted: np.ndarray[Any, Any], gamma: int) -> tuple[int, int]:
    """(tokens, rounds) of one response replayed at static γ, its last round cut at its end."""
    t = rounds = tokens = 0
    n = len(accepted)
    while t < n:
        step = min(int(accepted[t]), gamma) + 1
        rounds, tokens, t = rounds + 1, tokens + min(step, n - t), t + step
    return tokens, rounds


def per_response(ts: TraceSet) -> pd.DataFrame:
    """One row per response: its domain, walk tokens and rounds."""
    rows = []
    dom = ts.requests["domain"].to_numpy()
    for k in range(ts.num_requests):
        tok, rnd = walk(ts.accepted[ts.offsets[k]: ts.offsets[k + 1]], ts.gamma)
        rows.append({"domain": dom[k], "tokens": tok, "rounds": rnd})
    return pd.DataFrame(rows)


sets = {k: load_traceset(p) for k, p in SETS.items()}
a, b = (per_response(sets[k]) for k in ("dspark", "dflash"))
if not (a["tokens"].equals(b["tokens"]) and a["domain"].equals(b["domain"])):
    raise SystemExit("the two sets are not recorded on the same responses; the paired comparison needs them")

rows, separation = [], {}
for dom in sorted(a["domain"].unique()):
    sel = (a["domain"] == dom).to_numpy()
    tok = a["tokens"].to_numpy()[sel].astype(float)
    ra, rb = a["rounds"].to_numpy()[sel].astype(float), b["rounds"].to_numpy()[sel].astype(float)

    def diff(i: np.ndarray[Any, Any], tok: np.ndarray[Any, Any] = tok, ra: np.ndarray[Any, Any] = ra,
             rb: np.ndarray[Any, Any] = rb) -> float:
        i = i.astype(int)
        return float(tok[i].sum() / ra[i].sum() - tok[i].sum() / rb[i].sum())

    idx = np.arange(sel.sum())
    ci = stats.bootstrap((idx,), diff, n_resamples=2000, method="BCa", random_state=0, vectorized=False)
    la, lb = float(tok.sum() / ra.sum()), float(tok.sum() / rb.sum())
    lo, hi = float(ci.confidence_interval.low), float(ci.confidence_interval.high)
    rows.append({"domain": dom, "responses": int(sel.sum()), "dspark": la, "dflash": lb, "diff": la - lb,
                 "ci_low": lo, "ci_high": hi, "rel": la / lb - 1})
    separation[str(dom)] = {"accept_length_dspark": round(la, 3), "accept_length_dflash": round(lb, 3),
                            "difference": round(la - lb, 3), "ci95": [round(lo, 3), round(hi, 3)],
                            "relative": round(la / lb - 1, 4), "responses": int(sel.sum())}
table = pd.DataFrame(rows)
print("accepted length by the static-γ walk (γ = 7), DSpark − DFlash, 95 % paired bootstrap CI")
print(table.to_string(index=False, formatters={
    "dspark": "{:.3f}".format, "dflash": "{:.3f}".format, "diff": "{:+.3f}".format,
    "ci_low": "{:+.3f}".format, "ci_high": "{:+.3f}".format, "rel": "{:+.1%}".format}))

# %% [markdown]
# ## Per position: conditional acceptance (Fig. 2) and all-rows mean 1 − TV

# %%
for k in ("dspark", "dflash"):
    acc = sets[k].card["acceptance"]
    for dom in sorted(acc):
        cond = " ".join(f"{x:.3f}" for x in acc[dom]["conditional_acceptance"])
        tv = " ".join(f"{x:.3f}" for x in acc[dom]["mean_p_accept"])
        print(f"{k:>6} {dom:>4}  conditional {cond}")
        print(f"{'':>6} {'':>4}  mean 1-TV   {tv}")

if "--write" in sys.argv:
    for path in SETS.values():
        card = yaml.safe_load((path / "card.yaml").read_text())
        card["separation"] = {
            "what": "accepted length (static-γ walk, γ = 7) DSpark − DFlash on the same responses; 95 % "
                    "paired BCa bootstrap CI over responses (analyses/separation.py)",
            "by_domain": separation}
        (path / "card.yaml").write_text(yaml.safe_dump(card, sort_keys=False, width=100, allow_unicode=True))
    print("wrote separation into both cards", file=sys.stderr)
