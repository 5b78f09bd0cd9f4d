"""Import layers: a lower layer of sparksim never imports a higher one.

Why: the design reads bottom-up (errors and units; scenario I/O; the cost model, traces and
kernels; policies; the simulator core; studies, bias, live engine, profiler, reports; the
CLI on top). A policy that imported the engine, or the cost model that imported a sweep,
would tie the pieces a test calls on their own (a policy on a hand-made batch, a price on
a profile) to everything above them. Function-level imports count too: they are imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "sparksim"

# lowest first; a module's layer is its first component under sparksim (a subpackage as a
# whole): the layout is the layering, so a subpackage never straddles two layers
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "hardware", "metric_names", "data"),
    ("config", "config_sections", "atomic", "plain_csv", "arrow_numpy"),
    ("cost", "step", "traces"),
    ("policies",),
    ("sim",),
    # decoder (torch) sits with its users, the torch side, so nothing below them can import it
    ("studies", "bias", "plotting", "report", "live", "profiling", "drafter", "decoder"),
    ("cli",),
)
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return RANK.get(parts[1]) if len(parts) > 1 and parts[0] == "sparksim" else None


def _imports(source: str) -> list[str]:
    """Every sparksim module a source imports, at any depth (`from sparksim import x` as sparksim.x)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
            if node.module == "sparksim":
                out += [f"sparksim.{a.name}" for a in node.names]
    return [m for m in out if m.startswith("sparksim.")]


def upward_imports(sources: dict[str, str]) -> list[str]:
    """Return 'importer -> imported' for every import from a lower layer into a higher one."""
    bad = []
    for module, source in sources.items():
        mine = _layer(module)
        if mine is None:
            continue
        for imported in _imports(source):
            theirs = _layer(imported)
            if theirs is not None and theirs > mine:
                bad.append(f"{module} (layer {mine}) -> {imported} (layer {theirs})")
    return bad


def _package_sources() -> dict[str, str]:
    sources = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        sources[module] = path.read_text()
    return sources


def test_every_module_has_a_layer() -> None:
    # a new top-level module must be placed, or this test cannot see what it imports
    sources = _package_sources()
    unplaced = sorted({m.split(".")[1] for m in sources if m.count(".") >= 1} - set(RANK))
    assert unplaced == []


def test_no_lower_layer_imports_a_higher_one() -> None:
    assert upward_imports(_package_sources()) == []


def test_the_check_fires_on_an_upward_import() -> None:
    # a check that cannot fail checks nothing: a cost module importing the engine, even
    # inside a function, and a policy importing a sweep via `from sparksim import`
    bad = upward_imports({
        "sparksim.cost.pricing": "def f():\n    from sparksim.sim.engine import Engine\n",
        "sparksim.policies.mine": "from sparksim import studies\n",
        "sparksim.sim.engine": "from sparksim.cost.pricing import StepCost\n",  # downward: fine
    })
    assert bad == ["sparksim.cost.pricing (layer 2) -> sparksim.sim.engine (layer 4)",
                   "sparksim.policies.mine (layer 3) -> sparksim.studies (layer 5)"]
