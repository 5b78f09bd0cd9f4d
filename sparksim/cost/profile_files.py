"""A profile folder on disk: its tables read into arrays (checked, cleaned up), and written.

`read_tables` reads every file a profile holds (docs/profiles.md §1) and the card
(`sparksim.cost.card`), appending one problem per fault that names the file, the column,
the first bad row and the value; it forces every table non-decreasing in batch size (with
a `ProfileWarning`) and converts a legacy context grid to dense + attention tables
(`sparksim.cost.legacy_grid`, with a warning saying how). `write_profile` writes a folder
atomically and refuses one that would not read back. A table is read as NumPy columns:
pandas reads only a file that is not plain CSV (`sparksim.plain_csv`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import yaml
from numpy.typing import NDArray

from sparksim.atomic import atomic_dir
from sparksim.cost.card import CostCard, DrafterCard, parse_card, read_card
from sparksim.cost.legacy_grid import LEGACY_TOKENS_PER_REQUEST, convert
from sparksim.errors import FormatError
from sparksim.plain_csv import read_csv_columns, to_numeric

if TYPE_CHECKING:
    import pandas as pd

VERIFY_REQUIRED = ("tokens", "step_ms")
VERIFY_OPTIONAL = ("context", "p10_ms", "p90_ms", "min_ms", "max_ms")  # context: a legacy grid
DRAFT_REQUIRED = ("requests", "draft_ms")
DRAFT_OPTIONAL = ("positions", "min_ms", "max_ms")
ATTENTION_REQUIRED = ("kv_tokens", "attn_ms")
ATTENTION_OPTIONAL = ("requests", "min_ms", "max_ms")
PREFILL_REQUIRED = ("tokens", "prefill_ms")
PREFILL_OPTIONAL = ("min_ms", "max_ms")
MAX_PROFILE_ROWS = 1_000_000  # a profile is a small table; more rows than this is a broken file
POSITIVE = ("tokens", "requests", "step_ms", "positions")  # every other column may be 0

Columns = dict[str, NDArray[np.float64]]  # a table read: its known columns by name, in file order


class ProfileWarning(UserWarning):
    """A profile was cleaned up, converted or extrapolated; results may be less trustworthy."""


@dataclass
class DraftTable:
    """One drafter's time by request count and drafted positions per request.

    `ms` is a (P, D) grid: row p holds the cost of drafting `positions[p]` positions for
    every request count in `requests`. A table without a positions column (the older
    two-column `draft.csv`) has `positions` empty and one row: it always drafts its full
    block, whatever a policy verifies.
    """

    name: str
    requests: NDArray[np.float64]  # (D,) profiled request counts, increasing
    positions: NDArray[np.float64]  # (P,) profiled drafted positions, increasing; empty: full block
    ms: NDArray[np.float64]  # (P, D) drafting time in ms, or (1, D) for a full-block table
    kind: str = "block"  # mtp | block | autoregressive (as the card describes it)
    layers: int | None = None
    kv_ms_per_token: float = 0.0  # reading its KV cache, per context token (0: in the table)
    info: dict[str, Any] = field(default_factory=dict)  # the card's description, verbatim

    def kv_ms(self, positions: int, kv_tokens: float) -> float:
        """Return ms to read its KV cache over `kv_tokens` context tokens for one drafting step.

        A block drafter reads it once per step; a pass-based one (mtp, autoregressive) once
        per drafted position.
        """
        passes = 1 if self.kind == "block" else positions
        return self.kv_ms_per_token * kv_tokens * passes

    @property
    def by_positions(self) -> bool:
        return self.positions.size > 0

    @property
    def max_positions(self) -> int | None:
        return int(self.positions[-1]) if self.by_positions else None


class ProfileTables(NamedTuple):
    """Everything a profile folder holds, checked and cleaned up, as `Profile` takes it."""

    card: dict[str, Any]  # verbatim, provenance included
    spec: CostCard  # the keys sparksim reads, typed
    tokens: NDArray[np.float64]  # (T,) verify.csv's batch sizes, increasing
    step_ms: NDArray[np.float64]  # (T,) dense cost, non-decreasing
    drafters: dict[str, DraftTable]
    default_drafter: str | None
    attn_requests: NDArray[np.float64]  # (A,) or empty: one row for every request count
    attn_kv_tokens: NDArray[np.float64]  # (K,) or empty: no attention table
    attn_ms: NDArray[np.float64]  # (A or 1, K)
    prefill_tokens: NDArray[np.float64]  # (P,) or empty: no prefill table
    prefill_ms: NDArray[np.float64]  # (P,)
    kv_conversion: str | None  # how a legacy grid was converted (None: it was not one)


def check_profile(path: Path | str) -> list[str]:
    """Return every problem found in the profile folder at `path` (empty if it is valid)."""
    problems: list[str] = []
    read_tables(Path(path), problems)
    return problems


def read_tables(path: Path, problems: list[str]) -> ProfileTables | None:
    """Read the profile folder at `path`; append every problem found; None if any table is unusable."""
    if not path.is_dir():
        problems.append("not a directory")
        return None
    raw = read_card(path / "card.yaml", problems)
    spec = parse_card(raw, problems)
    card: dict[str, Any] = raw if isinstance(raw, dict) else {}
    verify = _read_csv(path / "verify.csv", VERIFY_REQUIRED, VERIFY_OPTIONAL, problems)
    drafters, default = _parse_drafters(path, card, spec, problems) if spec is not None else (None, None)
    attn = _parse_attention(path, problems)
    prefill = _parse_prefill(path, problems)
    if verify is None or spec is None or drafters is None or attn is None or prefill is None:
        return None
    grid = _grid(verify, problems, path.name)
    if grid is None:
        return None
    tokens, contexts, step_ms = grid
    note = None
    if contexts is not None:
        if attn[1].size:
            problems.append("verify.csv: a profile with attention.csv prices KV there; drop the "
                            "legacy 'context' column")
            return None
        conv = convert(tokens, contexts, step_ms, spec.tokens_per_request or LEGACY_TOKENS_PER_REQUEST)
        step_ms, attn, note = conv.dense_ms, (conv.attn_requests, conv.attn_kv_tokens, conv.attn_ms), conv.note
        warnings.warn(f"profile {path.name!r}: {note}", ProfileWarning, stacklevel=4)
    return ProfileTables(card, spec, tokens, step_ms, drafters, default, *attn, *prefill, note)


def _parse_drafters(
    path: Path, card: dict[str, Any], spec: CostCard, problems: list[str]
) -> tuple[dict[str, DraftTable] | None, str | None]:
    """Read every drafter table the card lists (`drafters:`), or the lone `draft.csv`."""
    listed: dict[str, tuple[DrafterCard, dict[str, Any]]]
    if spec.drafters is None:  # one drafter: draft.csv, described (if at all) by the card's `drafter`
        if not (path / "draft.csv").exists():
            return {}, None
        info = spec.drafter or DrafterCard()
        verbatim = card["drafter"] if isinstance(card.get("drafter"), dict) else {}
        default = info.name or "default"
        listed = {default: (info.model_copy(update={"file": "draft.csv"}), {**verbatim, "file": "draft.csv"})}
    else:
        listed = {name: (info, card["drafters"][name]) for name, info in spec.drafters.items()}
        default = spec.default_drafter or next(iter(listed))
    tables: dict[str, DraftTable] = {}
    for name, (info, verbatim) in listed.items():
        file = info.file or f"draft-{name}.csv"
        cols = _read_csv(path / file, DRAFT_REQUIRED, DRAFT_OPTIONAL, problems)
        table = None if cols is None else _draft_grid(cols, name, file, problems, path.name)
        if table is None:
            continue
        table.kind = info.kind
        table.layers = info.layers if info.layers is not None else info.num_layers
        table.kv_ms_per_token = info.kv_ms_per_token
        table.info = dict(verbatim)
        tables[name] = table
    return (tables, default) if len(tables) == len(listed) else (None, None)


def _grid(verify: Columns, problems: list[str], name: str
          ) -> tuple[NDArray[np.float64], NDArray[np.float64] | None, NDArray[np.float64]] | None:
    """Return verify.csv as (tokens (T,), None, cost (T,)), or a legacy grid's (tokens, contexts (C,), (C, T))."""
    if "context" not in verify:
        tokens = verify["tokens"]
        if _repeats(tokens):
            problems.append(f"verify.csv: duplicate token counts: {_repeated(tokens)}")
            return None
        order = np.argsort(tokens)
        ms = _monotone(verify["step_ms"][order][None, :], "verify.csv", name)[0]
        return tokens[order], None, ms
    wide = _pivot(verify["context"], verify["tokens"], verify["step_ms"])
    if wide is None:
        problems.append("verify.csv: duplicate (context, tokens) rows: "
                        f"{_repeated(verify['context'], verify['tokens'])}")
        return None
    contexts, tokens, grid = wide
    if np.isnan(grid).any():
        ctx, tok = np.argwhere(np.isnan(grid))[0]
        problems.append("verify.csv: every context must be profiled at the same token counts "
                        f"(context={contexts[ctx]:g} lacks tokens={tokens[tok]:g})")
        return None
    return tokens, contexts, _monotone(grid, "verify.csv", name)


def _pivot(rows: NDArray[np.float64], cols: NDArray[np.float64], values: NDArray[np.float64]
           ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]] | None:
    """Return (row keys, column keys, grid) of a long table, keys sorted, NaN where a pair is
    absent (`DataFrame.pivot`, sorted both ways); None if a (row, column) pair repeats."""
    row_keys, r = np.unique(rows, return_inverse=True)
    col_keys, c = np.unique(cols, return_inverse=True)
    if _repeats(r * col_keys.size + c):
        return None
    grid = np.full((row_keys.size, col_keys.size), np.nan)
    grid[r, c] = values
    return row_keys, col_keys, grid


def _repeats(values: NDArray[Any]) -> bool:
    return bool(np.unique(values).size < values.size)


def _repeated(*keys: NDArray[Any]) -> str:
    """Name the first row whose keys an earlier row already has, as a person counts rows (from 1)."""
    seen: dict[tuple[float, ...], int] = {}
    for row, key in enumerate(zip(*(k.tolist() for k in keys), strict=True)):
        if key in seen:
            return f"row {row + 1} repeats row {seen[key] + 1} ({', '.join(f'{v:g}' for v in key)})"
        seen[key] = row
    return ""


def _read_csv(path: Path, required: tuple[str, ...], optional: tuple[str, ...], problems: list[str]
              ) -> Columns | None:
    if not path.is_file():
        problems.append(f"{path.name}: file is missing")
        return None
    try:
        raw = read_csv_columns(path, MAX_PROFILE_ROWS)
    except ValueError as exc:  # pandas' ParserError, EmptyDataError, UnicodeDecodeError
        problems.append(f"{path.name}: cannot be parsed as CSV ({exc})")
        return None
    rows = len(next(iter(raw.values()), []))
    if rows > MAX_PROFILE_ROWS:
        problems.append(f"{path.name}: more than {MAX_PROFILE_ROWS} rows")
        return None
    ok = True
    for col in required:
        if col not in raw:
            problems.append(f"{path.name}: missing column {col!r} (has {list(raw)})")
            ok = False
    for col in raw:
        if col not in required and col not in optional:
            problems.append(f"{path.name}: unknown column {col!r}")
    if not ok:
        return None
    if not rows:
        problems.append(f"{path.name}: no rows")
        return None

    def plain(value: Any) -> str:
        # a number as a person writes it (8, -0.25, nan), not np.float64(8.0); text quoted, and a
        # cell pandas read as a boolean as it stands in the file (True)
        if isinstance(value, bool | np.bool_):
            return str(bool(value))
        if isinstance(value, int | float | np.integer | np.floating):
            num = float(value)
            return str(int(num)) if num.is_integer() else repr(num)
        return repr(value)

    # rows count from 1 as a person reads the file: the first data row under the header is row 1
    out: Columns = {}
    for col in raw:
        if col not in required and col not in optional:
            continue
        vals = to_numeric(raw[col])
        bad = ~np.isfinite(vals)
        if bad.any():
            row = int(np.argmax(bad))
            problems.append(
                f"{path.name}: column {col!r} row {row + 1} is not a finite number ({plain(raw[col][row])})"
            )
            ok = False
            continue
        neg = vals <= 0 if col in POSITIVE else vals < 0
        if neg.any():
            row = int(np.argmax(neg))
            problems.append(f"{path.name}: column {col!r} row {row + 1} out of range ({plain(vals[row])})")
            ok = False
        out[col] = vals
    return out if ok else None


def _draft_grid(cols: Columns, name: str, file: str, problems: list[str], pname: str
                ) -> DraftTable | None:
    if "positions" not in cols:
        requests = cols["requests"]
        if _repeats(requests):
            problems.append(f"{file}: duplicate request counts: {_repeated(requests)}")
            return None
        order = np.argsort(requests)
        ms = _monotone(cols["draft_ms"][order][None, :], file, pname)
        return DraftTable(name, requests[order], np.empty(0), ms)
    wide = _pivot(cols["positions"], cols["requests"], cols["draft_ms"])
    if wide is None:
        problems.append(f"{file}: duplicate (positions, requests) rows: "
                        f"{_repeated(cols['positions'], cols['requests'])}")
        return None
    if (cols["positions"] <= 0).any():
        problems.append(f"{file}: positions must be >= 1 (0 positions cost nothing by definition)")
        return None
    positions, requests, grid = wide
    if np.isnan(grid).any():
        p, r = np.argwhere(np.isnan(grid))[0]
        problems.append(f"{file}: every positions row needs the same request counts "
                        f"(positions={positions[p]:g} lacks requests={requests[r]:g})")
        return None
    return DraftTable(name, requests, positions, _monotone(grid, file, pname))


def _parse_attention(
    path: Path, problems: list[str]
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]] | None:
    """Read attention.csv: (requests rows or empty, kv_tokens columns, (A, K) ms grid)."""
    empty = (np.empty(0), np.empty(0), np.empty((0, 0)))
    file = path / "attention.csv"
    if not file.exists():
        return empty
    cols = _read_csv(file, ATTENTION_REQUIRED, ATTENTION_OPTIONAL, problems)
    if cols is None:
        return None
    single = "requests" not in cols
    if not single and (cols["requests"] <= 0).any():
        problems.append("attention.csv: requests must be >= 1")
        return None
    wide = _pivot(np.ones_like(cols["kv_tokens"]) if single else cols["requests"], cols["kv_tokens"],
                  cols["attn_ms"])
    if wide is None:
        problems.append("attention.csv: duplicate (requests, kv_tokens) rows: "
                        f"{_repeated(np.ones_like(cols['kv_tokens']) if single else cols['requests'], cols['kv_tokens'])}")
        return None
    requests, kv_tokens, grid = wide
    if np.isnan(grid).any():
        req, kv = np.argwhere(np.isnan(grid))[0]
        problems.append("attention.csv: every requests row needs the same kv_tokens values "
                        f"(requests={requests[req]:g} lacks kv_tokens={kv_tokens[kv]:g})")
        return None
    if kv_tokens.size == 1 and kv_tokens[0] <= 0:
        # one column is read as a line through the origin (cost ∝ KV tokens): it needs a slope
        problems.append(f"attention.csv: a single kv_tokens value must be >= 1 (got {kv_tokens[0]:g}); "
                        "one column is scaled through 0 tokens at 0 ms, so give a positive KV size, "
                        "or two sizes")
        return None
    ms = _monotone(grid, "attention.csv", path.name)
    return (np.empty(0) if single or requests.size == 1 else requests), kv_tokens, ms


def _parse_prefill(path: Path, problems: list[str]
                   ) -> tuple[NDArray[np.float64], NDArray[np.float64]] | None:
    file = path / "prefill.csv"
    if not file.exists():
        return np.empty(0), np.empty(0)
    cols = _read_csv(file, PREFILL_REQUIRED, PREFILL_OPTIONAL, problems)
    if cols is None:
        return None
    tokens = cols["tokens"]
    order = np.argsort(tokens)
    if _repeats(tokens):
        problems.append(f"prefill.csv: duplicate token counts: {_repeated(tokens)}")
        return None
    ms = _monotone(cols["prefill_ms"][order][None, :], "prefill.csv", path.name)[0]
    return tokens[order], ms


def _monotone(grid: NDArray[np.float64], file: str, name: str) -> NDArray[np.float64]:
    """Force cost non-decreasing in batch size, as vLLM does; warn where the data dipped."""
    clean = np.maximum.accumulate(grid, axis=1)
    dips = int((clean > grid).sum())
    if dips:
        warnings.warn(
            f"profile {name!r}: {file} cost falls with batch size at {dips} point(s); "
            "raised to the running maximum (measurement noise or a broken profile)",
            ProfileWarning,
            stacklevel=4,
        )
    return clean


def write_profile(
    path: Path | str,
    verify: pd.DataFrame,
    card: Mapping[str, Any],
    draft: pd.DataFrame | None = None,
    *,
    extra: Mapping[str, pd.DataFrame] | None = None,
) -> Path:
    """Write a profile folder atomically and check that it loads; return its path.

    `extra` maps further file names (attention.csv, prefill.csv, draft-NAME.csv) to tables.
    """
    path = Path(path)
    with atomic_dir(path) as tmp:
        _sizes_as_int(verify).to_csv(tmp / "verify.csv", index=False, float_format="%.9g")
        if draft is not None:
            _sizes_as_int(draft).to_csv(tmp / "draft.csv", index=False, float_format="%.9g")
        for fname, table in (extra or {}).items():
            _sizes_as_int(table).to_csv(tmp / fname, index=False, float_format="%.9g")
        (tmp / "card.yaml").write_text(yaml.safe_dump(dict(card), sort_keys=False, width=100))
        with warnings.catch_warnings():
            # the written copy's clean-up warnings would name the temporary folder; loading
            # the profile repeats them under its real name
            warnings.simplefilter("ignore", ProfileWarning)
            problems = check_profile(tmp)
        if problems:
            raise FormatError(path, problems)
    return path


def _sizes_as_int(df: pd.DataFrame) -> pd.DataFrame:
    """Return `df` with whole-number size columns as integers: "%.6g" would round 1048576 to 1.04858e+06."""
    import pandas as pd

    out = df.copy()
    for col in ("tokens", "context", "requests", "positions", "kv_tokens"):
        if col in out.columns and pd.api.types.is_float_dtype(out[col]):
            vals = out[col].to_numpy(np.float64)
            if np.all(np.isfinite(vals)) and np.all(vals == np.round(vals)):
                out[col] = vals.astype(np.int64)
    return out
