"""Figures drawn from sparksim's files; matplotlib is imported only inside the plotting functions."""

from __future__ import annotations

from types import ModuleType

from sparksim.errors import MissingExtraError

PLOT_INSTALL = 'pip install -e ".[plot]"'  # the `plot` extra: matplotlib, and plotly for report.html


def pyplot() -> ModuleType:
    """Return `matplotlib.pyplot` on the file-only Agg backend.

    Raises MissingExtraError, saying how to install the `plot` extra, when matplotlib is not
    installed: it is optional, so a user without it gets that one line, not a traceback.
    """
    try:
        import matplotlib
    except ImportError:
        raise MissingExtraError(f"matplotlib is not installed; install the plot extra: {PLOT_INSTALL}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
