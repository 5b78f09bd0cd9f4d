"""A hand-made sweep table for the speedup tests: two policies, each swept over two drafters."""

from __future__ import annotations

import pandas as pd


def two_drafter_sweep() -> pd.DataFrame:
    """static γ=1 and two-step, each with mtp-1 and dspark-5, at three loads.

    Every series' tok/s/user is a constant multiple of static·mtp-1's at the same throughput:
    ×1.5 for dspark-5, ×2 for two-step, so two-step·dspark-5 is ×3.
    """
    rows = []
    for policy, label, gain in (("static:gamma=1", "static(gamma=1)", 1.0), ("two-step", "two-step", 2.0)):
        for drafter, extra in (("mtp-1", 1.0), ("dspark-5", 1.5)):
            for load in (1.0, 2.0, 4.0):
                rows.append({"policy": policy, "label": f"{label}·{drafter}", "drafter": drafter,
                             "tput_per_gpu": 100.0 * load, "interactivity": 50.0 * gain * extra / load})
    return pd.DataFrame(rows)
