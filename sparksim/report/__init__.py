"""HTML reports: one self-contained page per results folder (a sweep, a capacity search or a run).

`write_report(folder)` writes `folder/report.html`: interactive figures (plotly, its
library embedded, so the file opens without a network), sortable tables of every point or
run, the scenario, the cards of its inputs and every warning the runs gave. plotly (the
`plot` extra) is imported only while a report is written.
"""

from __future__ import annotations

from pathlib import Path

from sparksim.atomic import atomic_file
from sparksim.errors import ConfigError, MissingExtraError
from sparksim.plotting import PLOT_INSTALL

REPORT_FILE = "report.html"
# what marks each kind of folder, in the order they are looked for
KINDS = (("sweep", ("sweep.parquet", "sweep.csv")), ("capacity", ("capacity.json",)), ("run", ("summary.json",)))


def folder_kind(folder: Path) -> str:
    """Return what `folder` holds: "sweep", "capacity" or "run"; raise ConfigError naming what was looked for."""
    if not folder.is_dir():
        raise ConfigError(f"{folder}: not a folder (give a sweep, capacity or run folder)")
    for kind, marks in KINDS:
        if any((folder / mark).is_file() for mark in marks):
            return kind
    looked = ", ".join(mark for _, marks in KINDS for mark in marks)
    raise ConfigError(f"{folder}: not a sweep, capacity or run folder (it has none of {looked})")


def build_report(folder: Path) -> str:
    """Return the HTML of `folder`'s report; raise MissingExtraError, saying how to install it, without plotly."""
    try:
        import plotly  # noqa: F401  (the `plot` extra)
    except ImportError:
        raise MissingExtraError(f"plotly is not installed; install the plot extra: {PLOT_INSTALL}") from None
    from sparksim.report.capacity_page import capacity_sections
    from sparksim.report.page import render_page
    from sparksim.report.run_page import run_sections
    from sparksim.report.sweep_page import sweep_sections

    sections = {"sweep": sweep_sections, "capacity": capacity_sections, "run": run_sections}[folder_kind(folder)]
    return render_page(*sections(folder))


def write_report(folder: Path | str, out: Path | str | None = None) -> Path:
    """Write `folder`'s report to `out` (default `folder/report.html`) atomically; return its path."""
    folder = Path(folder)
    target = Path(out) if out is not None else folder / REPORT_FILE
    page = build_report(folder)
    with atomic_file(target) as tmp:
        tmp.write_text(page, encoding="utf-8")  # the page says it is UTF-8, whatever the locale
    return target


__all__ = ["REPORT_FILE", "build_report", "folder_kind", "write_report"]
