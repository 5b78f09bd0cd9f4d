"""The `sparksim` command line: one Typer app, one module per command group.

Start-up is part of the interface (`sparksim --help` within 0.3 s, benchmarks/bench_startup.py).
The commands whose modules import NumPy, pandas, SciPy or the simulator at module level
(their option help names presets held in those modules, and tests patch names there) are
registered by name and short help only, and their module is imported when the command runs.
Every other command module imports its heavy dependencies inside the command function.
"""

from __future__ import annotations

import gc
import importlib
from typing import TYPE_CHECKING

import typer
from typer.core import TyperGroup

from sparksim.cli import live, plot, policies, record, report, validate

if TYPE_CHECKING:
    from typer._click import Command, Context  # Typer's vendored click

# name → (module, short help shown by `sparksim --help`, True if the module holds a group
# `app` rather than a `register(app)`). tests/test_cli_startup.py checks each short help
# against the command the module builds, so the two cannot drift.
LAZY_COMMANDS: dict[str, tuple[str, str, bool]] = {
    "run": ("sparksim.cli.run", "Simulate a scenario, print its summary and write results/<run>/.", False),
    "sweep": ("sparksim.cli.sweep", "Sweep load (or any keys) for several policies; write sweep.parquet/csv, "
              "pareto.png and report.html.", False),
    "capacity": ("sparksim.cli.capacity", "Find each policy's capacity under latency SLOs by bisection; write "
                 "capacity.csv/json.", False),
    "profile": ("sparksim.cli.profile", "Measure an SPS(B) profile (verify.csv, attention.csv, a draft table, "
                "card.yaml) on this machine, or write an analytic one (`profile analytic`).", True),
    "traces": ("sparksim.cli.traces", "Generate synthetic trace sets, import per-round logs and summarise trace sets.", True),
}


def load_command(name: str) -> Command:
    """Import the module of lazy command `name` and build its click command, as if registered eagerly."""
    module_name, _, is_group = LAZY_COMMANDS[name]
    module = importlib.import_module(module_name)
    holder = typer.Typer(add_completion=False)
    if is_group:
        holder.add_typer(module.app, name=name)
    else:
        module.register(holder)
    return typer.main.get_group(holder).commands[name]


class LazyCommands(TyperGroup):
    """The top-level group: a lazy command is a stand-in until it is resolved to run."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.loaded: set[str] = set()

    def resolve_command(self, ctx: Context, args: list[str]) -> tuple[str | None, Command | None, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if name in LAZY_COMMANDS and name not in self.loaded:
            command = self.commands[name] = load_command(name)
            self.loaded.add(name)
        return name, command, rest


def _stand_in() -> None:
    """Placeholder callback of a lazy command; never runs (resolve_command replaces it)."""


app = typer.Typer(
    name="sparksim",
    help="Serving simulator and scheduler testbed for confidence-scheduled speculative decoding.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=LazyCommands,
)
for _name in ("run", "sweep", "capacity"):
    app.command(_name, help=LAZY_COMMANDS[_name][1])(_stand_in)
policies.register(app)
validate.register(app)
for _name in ("profile", "traces"):
    app.command(_name, help=LAZY_COMMANDS[_name][1])(_stand_in)
app.add_typer(plot.app, name="plot")
report.register(app)
record.register(app)
live.register(app)


def main() -> None:
    """Entry point of the `sparksim` console script.

    At exit the interpreter's last collection finds what a run leaves in reference cycles
    (the cluster, its engines and SimPy events, their requests) and frees it object by
    object: 40–70 ms of a 1.3 s DistServe benchmark process (measured; its one full
    collection alone 15 ms). Frozen first (`gc.freeze`), the heap is left to the operating
    system as the process ends; atexit handlers, closing files and joining threads run
    as before.
    """
    try:
        app()
    finally:
        gc.freeze()
