"""`sparksim plot profile`: the landmarks it marks and the figure it writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from sparksim.cli import app
from sparksim.cost.profile import write_profile
from sparksim.plotting.profile_plot import find_cliffs, find_knee, load_curves, lower_envelope

runner = CliRunner()
CAPTURED = [1, 2, 4, 8, 16, 32, 64]


def staircase_ms(tokens: np.ndarray) -> np.ndarray:
    """A CUDA-graph-like cost: flat to 16 tokens, then linear, padded to captured sizes, +60 % past 64."""
    sizes = np.array(CAPTURED, dtype=float)
    padded = np.where(tokens <= 64, sizes[np.minimum(np.searchsorted(sizes, tokens), sizes.size - 1)], tokens)
    cost = 10.0 + np.maximum(padded - 16, 0) * 0.5
    return np.where(tokens > 64, cost * 1.6, cost)


def make_profile(path: Path, scale: float = 1.0, contexts: tuple[int, ...] = (1024, 4096)) -> Path:
    tokens = np.array([1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 128, 256], dtype=float)
    rows = [
        {"context": c, "tokens": t, "step_ms": m * scale * (1 + c / 8192), "min_ms": m * 0.9,
         "max_ms": m * scale * 2}
        for c in contexts for t, m in zip(tokens, staircase_ms(tokens), strict=True)
    ]
    card = {"source": "synthetic", "hardware": "test", "model": "test", "dtype": "bf16",
            "date": "2026-01-01", "command": "test", "graph_capture_sizes": CAPTURED}
    return write_profile(path, pd.DataFrame(rows), card)


def test_knee_is_where_the_flat_memory_bound_region_ends() -> None:
    # The knee tells a scheduler how many tokens ride free; it must not move with a noise spike.
    tokens = np.array([1, 2, 4, 8, 16, 32, 64, 128], dtype=float)
    cost = np.array([10, 10, 10.5, 10.2, 11, 14, 20, 35], dtype=float)
    assert find_knee(tokens, cost) == 32
    spiky = cost.copy()
    spiky[1] = 30.0  # another job stole the CPU during B = 2
    assert find_knee(tokens, spiky) == 32
    assert find_knee(tokens, np.full(8, 5.0)) is None


def test_cliff_is_a_jump_out_of_proportion_to_the_batch() -> None:
    # Leaving the captured range costs far more than the few extra tokens; doubling B in the
    # compute-bound region costs double and is no cliff.
    tokens = np.array([1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 128, 256], dtype=float)
    cliffs = find_cliffs(tokens, staircase_ms(tokens))
    assert cliffs.tolist() == [80]
    assert find_cliffs(tokens, tokens * 2.0).size == 0


def test_lower_envelope_removes_spikes_but_keeps_real_steps() -> None:
    # A larger batch cannot be cheaper, so a point above a later one is noise.
    cost = np.array([5.0, 9.0, 5.5, 8.0, 8.0, 12.0])
    assert lower_envelope(cost).tolist() == [5.0, 5.5, 5.5, 8.0, 8.0, 12.0]


def test_plot_overlays_several_profiles_into_one_png(tmp_path: Path) -> None:
    # Comparing hardware or models means several curves on one figure.
    pytest.importorskip("matplotlib")
    a = make_profile(tmp_path / "a")
    b = make_profile(tmp_path / "b", scale=0.5, contexts=(2048,))
    out = tmp_path / "fig" / "sps.png"
    result = runner.invoke(app, ["plot", "profile", str(a), str(b), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(load_curves([a, b])) == 3  # two contexts of a, one of b
    nearest = load_curves([a, b], context=4000)
    assert [c.label for c in nearest] == ["a (synthetic, ctx 4096)", "b (synthetic, ctx 2048)"]
    assert nearest[0].captured == tuple(CAPTURED)


def test_context_on_a_profile_without_a_context_grid_is_refused(tmp_path: Path) -> None:
    # --context had drawn the same figure whatever it said on every current profile.
    pytest.importorskip("matplotlib")
    result = runner.invoke(app, ["plot", "profile", "profiles/h100-qwen3-8b-analytic", "--context", "4096",
                                 "--out", str(tmp_path / "x.png")])
    assert result.exit_code == 1, result.output
    assert "--context 4096: h100-qwen3-8b-analytic's verify.csv has one curve" in " ".join(result.output.split())
    assert not (tmp_path / "x.png").exists()


def test_plot_of_a_broken_profile_names_the_problem(tmp_path: Path) -> None:
    # A bad input must say what is wrong with it rather than draw nothing.
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "verify.csv").write_text("tokens,step_ms\n1,abc\n")
    result = runner.invoke(app, ["plot", "profile", str(bad), "--out", str(tmp_path / "x.png")])
    assert result.exit_code == 1
    said = " ".join(result.output.split())
    assert "step_ms" in said and "card.yaml" in said
    assert not (tmp_path / "x.png").exists()


def test_plot_profile_writes_under_results_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Figures belong with the other outputs, not scattered in whatever folder the user is in.
    pytest.importorskip("matplotlib")
    prof = make_profile(tmp_path / "a")
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["plot", "profile", str(prof)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "results" / "sps-profile.png").read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / "sps-profile.png").exists()


def test_overlaid_profiles_keep_their_knee_labels_apart_and_name_the_capture_line_once(tmp_path: Path) -> None:
    # Profiles of one GPU share a knee: labels drawn at one spot cover each other, and a
    # legend entry per profile for the same dashed line reads as several different lines.
    pytest.importorskip("matplotlib")
    from sparksim.plotting import pyplot
    from sparksim.plotting.profile_plot import profile_figure

    paths = [make_profile(tmp_path / "a"), make_profile(tmp_path / "b", scale=1.02)]
    fig = profile_figure(paths)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = [t for ax in fig.axes for t in ax.texts]
    boxes = [t.get_window_extent(renderer) for t in texts]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    entries = [t.get_text() for legend in [*fig.legends, *(ax.get_legend() for ax in fig.axes)] if legend
               for t in legend.get_texts()]
    assert sum("largest captured graph" in e for e in entries) == 1
    assert sum("knee B=24" in e for e in entries) == 4  # every curve's knee is named, once
    for legend in fig.legends:
        for ax in fig.axes:
            assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))
    pyplot().close(fig)
