"""Plot SPS(B) profiles: steps/s and tokens/s against batch size, with their landmarks marked.

The landmarks are what a scheduler reacts to: the captured CUDA-graph sizes (the steps of
the staircase), the knee where the step stops being memory-bound (extra tokens stop riding
free) and the cliffs where cost jumps out of proportion to the batch (typically leaving
the captured range). Finding them is plain NumPy; matplotlib is imported only to draw.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from sparksim.atomic import atomic_file
from sparksim.cost.profile import ProfileWarning, load_profile
from sparksim.errors import ConfigError
from sparksim.plotting import pyplot

if TYPE_CHECKING:
    from matplotlib.figure import Figure

KNEE_RISE = 1.2  # the knee is where step cost first exceeds this multiple of the smallest batch's
CLIFF_MIN_JUMP = 0.25  # a cliff raises cost by at least this fraction ...
CLIFF_VS_TOKENS = 2.0  # ... and by more than this many times the batch's own relative growth


def lower_envelope(step_ms: NDArray[np.float64]) -> NDArray[np.float64]:
    """Return, at each B, the lowest cost measured at that B or any larger one.

    A larger batch cannot truly be cheaper, so a point above a later one is noise (another
    job on the machine); landmarks are found on this envelope, not on the spikes.
    """
    return np.minimum.accumulate(step_ms[::-1])[::-1]


def find_knee(tokens: NDArray[np.float64], step_ms: NDArray[np.float64], rise: float = KNEE_RISE
              ) -> float | None:
    """Return the first B whose cost exceeds `rise` × the smallest B's cost (on the envelope).

    Below it the step is memory-bound: reading the weights dominates and extra tokens are
    nearly free; past it compute takes over and cost grows with B.
    """
    floor = lower_envelope(step_ms)
    above = np.flatnonzero(floor > rise * floor[0])
    return float(tokens[above[0]]) if above.size else None


def find_cliffs(
    tokens: NDArray[np.float64], step_ms: NDArray[np.float64], *,
    min_jump: float = CLIFF_MIN_JUMP, vs_tokens: float = CLIFF_VS_TOKENS,
) -> NDArray[np.float64]:
    """Return the B values where cost (on the envelope) jumps by > `min_jump` and > `vs_tokens` × B's growth.

    Doubling B in the compute-bound region doubles the cost and is no cliff; a 3 % larger
    batch that costs 40 % more (leaving the CUDA-graph range) is.
    """
    floor = lower_envelope(step_ms)
    cost_jump = floor[1:] / floor[:-1] - 1.0
    token_jump = tokens[1:] / tokens[:-1] - 1.0
    hit = (cost_jump > min_jump) & (cost_jump > vs_tokens * token_jump)
    return tokens[1:][hit]


@dataclass
class Curve:
    """One line to draw: a profile at one context."""

    label: str
    tokens: NDArray[np.float64]  # (T,)
    step_ms: NDArray[np.float64]  # (T,) as measured (not forced monotone)
    low_ms: NDArray[np.float64] | None  # (T,) fastest replay, if the profile kept it
    high_ms: NDArray[np.float64] | None  # (T,) slowest replay
    captured: tuple[int, ...]


def load_curves(paths: Sequence[Path], context: float | None = None) -> list[Curve]:
    """Read each profile (validated) into curves: one per context, or the nearest to `context`."""
    curves = []
    for path in paths:
        with warnings.catch_warnings():
            # The plot shows the raw measurements, so the loader's monotone clean-up is moot.
            warnings.simplefilter("ignore", ProfileWarning)
            prof = load_profile(path)  # validates; raises FormatError naming every problem
        raw = pd.read_csv(Path(path) / "verify.csv")
        gridded = "context" in raw.columns  # a legacy grid: one curve per context, as measured
        if not gridded:
            raw["context"] = np.nan
        contexts = sorted(raw["context"].unique())
        if context is not None and not gridded:
            raise ConfigError(
                f"--context {context:g}: {Path(path).name}'s verify.csv has one curve, the dense "
                "step at every batch size (attention is priced apart, from attention.csv); "
                "--context picks among a legacy grid's contexts, so leave it out")
        if context is not None:
            contexts = [min(contexts, key=lambda c: abs(c - context))]
        source = prof.source
        for c in contexts:
            rows = raw[raw["context"] == c] if gridded else raw
            rows = rows.sort_values("tokens")
            ctx = f", ctx {int(c)}" if gridded else ""
            curves.append(Curve(
                label=f"{prof.name} ({source}{ctx})",
                tokens=rows["tokens"].to_numpy(np.float64),
                step_ms=rows["step_ms"].to_numpy(np.float64),
                low_ms=rows["min_ms"].to_numpy(np.float64) if "min_ms" in rows else None,
                high_ms=rows["max_ms"].to_numpy(np.float64) if "max_ms" in rows else None,
                captured=prof.captured_sizes,
            ))
    return curves


def profile_figure(paths: Sequence[Path], *, context: float | None = None) -> Figure:
    """Draw SPS(B) and tokens/s against B (log x) for every profile in `paths`; return the figure.

    Raises MissingExtraError without matplotlib (the `plot` extra) and FormatError for a bad profile.
    """
    plt = pyplot()  # first, so a missing matplotlib fails before the profiles are read

    curves = load_curves(paths, context)
    fig, (ax_sps, ax_tps) = plt.subplots(1, 2, figsize=(13, 5), layout="constrained")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, cur in enumerate(curves):
        color = colors[i % len(colors)]
        sps = 1e3 / cur.step_ms
        knee = find_knee(cur.tokens, cur.step_ms)
        # The knee is named in the legend, not beside its marker: profiles of one GPU share
        # knees, and labels drawn at one spot would cover each other.
        label = cur.label + (f" · knee B={knee:g}" if knee is not None else " · no knee")
        ax_sps.plot(cur.tokens, sps, "-o", ms=3, color=color, label=label)
        ax_tps.plot(cur.tokens, cur.tokens * sps, "-o", ms=3, color=color)
        if cur.low_ms is not None and cur.high_ms is not None:
            # Slowest replay → lowest SPS: the band shows how noisy the measurement was.
            ax_sps.fill_between(cur.tokens, 1e3 / cur.high_ms, 1e3 / cur.low_ms, color=color,
                                alpha=0.15, lw=0)
        if knee is not None:
            k = int(np.flatnonzero(cur.tokens == knee)[0])
            ax_sps.plot([knee], [sps[k]], "D", ms=8, mfc="none", color=color)
        for cliff in find_cliffs(cur.tokens, cur.step_ms):
            k = int(np.flatnonzero(cur.tokens == cliff)[0])
            for ax, y in ((ax_sps, sps[k]), (ax_tps, cur.tokens[k] * sps[k])):
                ax.plot([cliff], [y], "v", ms=9, color="crimson")
        for ax in (ax_sps, ax_tps):
            for size in cur.captured:
                ax.axvline(size, color=color, alpha=0.08, lw=0.8)
            if cur.captured:
                ax.axvline(max(cur.captured), color=color, ls="--", lw=1)
    ax_sps.set(xscale="log", yscale="log", xlabel="batch B (tokens per step)",
               ylabel="SPS(B) (steps/s)", title="steps per second")
    ax_tps.set(xscale="log", yscale="log", xlabel="batch B (tokens per step)",
               ylabel="tokens/s through the target", title="token throughput B·SPS(B)")
    largest = sorted({max(c.captured) for c in curves if c.captured})
    if largest:  # one entry however many profiles: the line takes each profile's colour
        ax_sps.plot([], [], ls="--", lw=1, color="gray",
                    label=f"largest captured graph (B = {', '.join(map(str, largest))}; faint: the others)")
    ax_sps.plot([], [], "v", ls="", color="crimson", label="cliff")
    ax_sps.plot([], [], "D", ls="", mfc="none", color="gray", label=f"knee (cost > {KNEE_RISE}× smallest B)")
    for ax in (ax_sps, ax_tps):
        ax.grid(True, which="both", alpha=0.3)
    # Below both panels, where it covers no curve; one legend serves both (same colours).
    fig.legend(*ax_sps.get_legend_handles_labels(), loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    return fig


def plot_profiles(paths: Sequence[Path], out: Path, *, context: float | None = None) -> Path:
    """Write `profile_figure(paths, context=context)` as a PNG, atomically (with its folder).

    Raises MissingExtraError without matplotlib (the `plot` extra) and FormatError for a bad profile.
    """
    plt = pyplot()
    fig = profile_figure(paths, context=context)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(out) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
    return out
