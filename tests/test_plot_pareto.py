"""The Pareto figure of a sweep: what a reader sees must match the table and hide no data."""

from __future__ import annotations

import pandas as pd
import pytest

pytest.importorskip("matplotlib")

from sparksim.plotting import pyplot
from sparksim.plotting.pareto import pareto_figure, series_colors

STATIC, TWO_STEP = "static(gamma=1) · mtp-1", "two-step(delay=2)"


def sweep_table() -> pd.DataFrame:
    """Two policies over four loads; two-step's heaviest point left its queue growing."""
    rows = []
    for spec, label, scale in (("static:gamma=1,drafter=mtp-1", STATIC, 1.0), ("two-step", TWO_STEP, 1.6)):
        for conc, tput, inter, unfinished in ((1, 300, 270, 0), (8, 2100, 260, 0), (64, 14700, 230, 1),
                                               (256, 26000, 100, 0)):
            rows.append({"policy": spec, "label": label, "lossless": True, "workload.concurrency": conc,
                         "interactivity": inter * scale, "tput_per_gpu": tput * (0.8 if scale > 1 else 1.0),
                         "verify_budget_per_request": 2.0 * scale, "steady_requests": 100,
                         "steady_unfinished": 60 if (scale > 1 and conc == 256) else unfinished})
    table = pd.DataFrame(rows)
    table.loc[7, "tput_per_gpu"] = 11000.0  # below two-step's 64-user point: dominated
    return table


META = {"title": "default sweep", "profile": "profiles/h100-qwen3-8b-analytic",
        "traces": "traces/synth-dspark-qwen3-8b", "workload": {"kind": "closed", "lengths": {"source": "traces"}}}


@pytest.fixture
def figure():  # type: ignore[no-untyped-def]
    plt = pyplot()
    fig = pareto_figure(sweep_table(), meta=META, baseline="two-step")
    fig.canvas.draw()
    yield fig
    plt.close(fig)


def data_axes(fig):  # type: ignore[no-untyped-def]
    return [ax for ax in fig.axes if ax.axison]


def test_the_legend_and_the_notes_cover_no_data_axes(figure) -> None:  # type: ignore[no-untyped-def]
    # A legend drawn inside the axes hides points a reader is comparing.
    renderer = figure.canvas.get_renderer()
    legends = [ax.get_legend() for ax in figure.axes if ax.get_legend() is not None] + list(figure.legends)
    texts = [t for ax in figure.axes if not ax.axison for t in ax.texts]
    assert legends and texts
    for artist in [*legends, *texts]:
        box = artist.get_window_extent(renderer)
        for ax in data_axes(figure):
            assert not box.overlaps(ax.get_window_extent(renderer)), artist


def test_speedups_are_against_the_baseline_asked_for_and_leave_out_growing_queues(figure) -> None:  # type: ignore[no-untyped-def]
    # The terminal table quotes --baseline; the figure must quote the same comparison.
    notes = " ".join(t.get_text() for ax in figure.axes for t in ax.texts)
    assert f"{STATIC} vs {TWO_STEP}" in notes and f"{TWO_STEP} vs" not in notes
    assert "1 point(s) marked × are left out" in notes and "unfinished at the horizon" in notes


def test_a_growing_queue_is_marked_in_both_panels(figure) -> None:  # type: ignore[no-untyped-def]
    # Two-step's 256-user point left its queue growing: its budget is not a load it carried.
    table = sweep_table()
    hot = table.iloc[7]  # the fixture's growing queue
    for ax in data_axes(figure):
        crosses = [c for c in ax.collections if len(c.get_paths()[0].vertices) == 4]  # the × marker
        points = {tuple(xy) for c in crosses for xy in c.get_offsets().tolist()}
        want = ((hot["interactivity"], hot["tput_per_gpu"]) if ax.get_title().startswith("throughput")
                else (hot["workload.concurrency"], hot["verify_budget_per_request"]))
        assert points == {want}, (ax.get_title(), points)


def test_a_speedup_from_one_matched_throughput_says_so() -> None:
    # A "range" of one value reads as a robust finding; it is a single interpolation.
    plt = pyplot()
    table = sweep_table()
    static, two_step = table["label"] == STATIC, table["label"] == TWO_STEP
    table = table[(static & (table["workload.concurrency"] >= 8)) | (two_step & (table["workload.concurrency"] <= 8))]
    table.loc[table["label"] == TWO_STEP, "tput_per_gpu"] = [300.0, 2100.0]  # meets static at 2,100 only
    fig = pareto_figure(table.reset_index(drop=True), meta=META, baseline="two-step")
    notes = " ".join(t.get_text() for ax in fig.axes for t in ax.texts)
    plt.close(fig)
    assert "at a single matched throughput" in " ".join(notes.split())


def test_the_title_names_profile_traces_and_workload(figure) -> None:  # type: ignore[no-untyped-def]
    title = figure._suptitle.get_text()
    assert "profiles/h100-qwen3-8b-analytic" in title and "traces/synth-dspark-qwen3-8b" in title
    assert "closed loop" in title


def test_points_are_labelled_with_their_swept_value(figure) -> None:  # type: ignore[no-untyped-def]
    pareto = data_axes(figure)[0]
    labels = sorted(t.get_text() for t in pareto.texts)
    assert labels == sorted(["1", "8", "64", "256"] * 2)


def test_both_panels_are_explained_by_the_legend_with_full_policy_labels(figure) -> None:  # type: ignore[no-untyped-def]
    # Labels carry the drafter: two rows of one policy name with two drafters are two series.
    legend = next(ax.get_legend() for ax in figure.axes if ax.get_legend() is not None)
    entries = [t.get_text() for t in legend.get_texts()]
    assert STATIC in entries and TWO_STEP in entries
    assert any("dominated" in e for e in entries)  # two-step's 256 point lies under its 64 point
    budget = data_axes(figure)[1]
    assert {line.get_label() for line in budget.get_lines()} <= set(entries)


def test_a_policy_keeps_its_colour_across_figures() -> None:
    # Figures of one study are compared side by side: a colour must mean one policy.
    plt = pyplot()
    colours = []
    for table in (sweep_table(), sweep_table().iloc[::-1], sweep_table()[sweep_table()["label"] == TWO_STEP]):
        fig = pareto_figure(table.reset_index(drop=True), meta=META)
        pareto = data_axes(fig)[0]
        colours.append({line.get_label(): line.get_color() for line in pareto.get_lines()})
        plt.close(fig)
    assert colours[0] == colours[1]
    assert colours[2][TWO_STEP] == colours[0][TWO_STEP]
    assert series_colors([STATIC, TWO_STEP]) == series_colors([TWO_STEP, STATIC])
    assert len(set(series_colors([f"p{i}" for i in range(10)]).values())) == 10  # no clash in one figure


def crowded_table() -> pd.DataFrame:
    """Three policies whose low-load points crowd together and whose saturated points coincide."""
    rows = []
    for spec, scale in (("static:gamma=1", 1.0), ("two-step", 1.03), ("greedy", 1.06)):
        for conc, tput, inter in ((1, 300, 270), (2, 590, 268), (4, 1150, 266), (8, 2100, 260), (16, 3900, 250),
                                  (32, 7000, 240), (64, 12000, 200), (128, 14000, 120), (256, 14000, 120)):
            rows.append({"policy": spec, "label": spec, "lossless": True, "workload.concurrency": conc,
                         "interactivity": inter * scale, "tput_per_gpu": tput * scale,
                         "verify_budget_per_request": 2.0 * scale, "steady_requests": 100, "steady_unfinished": 0})
    return pd.DataFrame(rows)


def test_point_labels_never_cover_each_other() -> None:
    # Why: "1" printed on top of "16" reads as neither. A label moves aside; a policy's points that
    # coincide share one label ("128, 256"); none is drawn over another.
    plt = pyplot()
    fig = pareto_figure(crowded_table(), meta=META)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    pareto = data_axes(fig)[0]
    boxes = [t.get_window_extent(renderer) for t in pareto.texts]
    texts = [t.get_text() for t in pareto.texts]
    plt.close(fig)
    for i, a in enumerate(boxes):
        for j in range(i):
            assert not a.overlaps(boxes[j]), (texts[i], texts[j])
    assert texts.count("128, 256") == 3  # one per policy: its two saturated points coincide
    assert len(texts) >= 3 * 7  # at most a few labels left out, and only where no free place was left


def test_a_point_without_figures_is_said_to_be_left_out_not_dominated() -> None:
    # A NaN point (no request finished in its window) had counted as dominated: the legend
    # explained hollow points that were not drawn, and nothing said one was missing.
    table = sweep_table()
    table.loc[7, "tput_per_gpu"] = 26000.0 * 0.8  # two-step's last point back on its frontier
    table.loc[3, "interactivity"] = float("nan")
    fig = pareto_figure(table, meta=META, baseline="two-step")
    legend = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    legend += [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    notes = " ".join(t.get_text() for ax in fig.axes if not ax.axison for t in ax.texts)
    assert not any(text.startswith("dominated") for text in legend), legend
    assert "1 point(s) not drawn" in " ".join(notes.split())
    pyplot().close(fig)
