"""How far the analytic roofline is from a measured profile, per decade of batch size B.

Users who only have an analytic profile for their hardware need to know how much to
trust it; a measured profile answers that for the hardware it was measured on.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from sparksim.cost.models import ModelSpec
from sparksim.hardware import HardwareSpec


def analytic_error_by_decade(
    measured: pd.DataFrame,
    hw: HardwareSpec,
    model: ModelSpec,
    *,
    dtype_bytes: int,
    tokens_per_request: int,
) -> list[dict[str, Any]]:
    """Compare the roofline to `measured` (columns tokens, context, step_ms) per decade of B.

    Returns one entry per decade [10^k, 10^(k+1)) that holds measured points: the median
    of |analytic / measured − 1|, the median ratio analytic / measured (below 1: the
    roofline is optimistic), the worst ratio and the number of points.
    """
    from sparksim.cost.roofline import roofline_verify_ms

    tokens = measured["tokens"].to_numpy(np.float64)
    context = measured["context"].to_numpy(np.float64)
    ratio = roofline_verify_ms(
        hw, model, tokens, context, dtype_bytes=dtype_bytes, tokens_per_request=tokens_per_request
    ) / measured["step_ms"].to_numpy(np.float64)
    decade = np.floor(np.log10(tokens)).astype(int)
    out = []
    for k in sorted(set(decade.tolist())):
        r = ratio[decade == k]
        worst = r[np.argmax(np.abs(r - 1.0))]
        out.append({
            "tokens_from": 10**k,
            "tokens_to": 10 ** (k + 1),
            "points": int(r.size),
            "median_abs_error": _round(float(np.median(np.abs(r - 1.0)))),
            "median_ratio": _round(float(np.median(r))),
            "worst_ratio": _round(float(worst)),
        })
    return out


def _round(x: float) -> float:
    return float(f"{x:.3g}") if math.isfinite(x) else x
