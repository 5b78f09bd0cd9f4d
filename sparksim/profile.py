"""SPS profiles: how long one engine step takes for a given batch of tokens, requests and context.

A profile folder holds `verify.csv` (target forward cost by token count, optionally per
context length), `draft.csv` (drafter cost by request count) and `card.yaml` (how it was
made). The lookup follows what a CUDA-graph engine does: in `step` mode a batch pads up
to the next profiled size (a batch of 121 tokens runs the 128-token graph), in `linear`
mode it interpolates; past the last profiled size both extrapolate the last slope, once
with a warning, or raise under `strict`.
"""

from __future__ import annotations

import bisect
import functools
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import yaml
from numpy.typing import ArrayLike, NDArray

from sparksim.atomic import atomic_dir
from sparksim.errors import FormatError, RangeError

LookupMode = Literal["step", "linear"]
SOURCES = ("measured", "analytic", "published", "synthetic")
CARD_REQUIRED = ("source", "hardware", "model", "dtype", "date", "command")
VERIFY_REQUIRED = ("tokens", "step_ms")
VERIFY_OPTIONAL = ("context", "p10_ms", "p90_ms", "min_ms", "max_ms")
DRAFT_REQUIRED = ("requests", "draft_ms")
MAX_PROFILE_ROWS = 1_000_000  # a profile is a small table; more rows than this is a broken file


class ProfileWarning(UserWarning):
    """A profile was cleaned up or extrapolated; results may be less trustworthy."""


@dataclass
class Profile:
    """An SPS(B) cost table: verify cost by (context, tokens) and draft cost by request count.

    `step_ms` is a (C, T) grid: row c holds the cost at `contexts[c]` for every `tokens[t]`.
    Profiles without a context column have C = 1 and ignore the context argument.
    """

    name: str
    card: dict[str, Any]
    tokens: NDArray[np.float64]  # (T,) profiled batch sizes in tokens, increasing
    contexts: NDArray[np.float64]  # (C,) profiled context lengths, increasing; [nan] if none
    step_ms: NDArray[np.float64]  # (C, T) verify cost, monotone in tokens after clean-up
    draft_requests: NDArray[np.float64]  # (D,) profiled request counts; empty if no draft.csv
    draft_ms: NDArray[np.float64]  # (D,)
    mode: LookupMode = "step"
    strict: bool = False
    path: Path | None = None
    _warned: set[str] = field(default_factory=set, repr=False)
    _draft_cache: dict[int, float] = field(default_factory=dict, repr=False)
    _scalar: tuple[list[list[float]], list[float], list[float], float] | None = field(
        default=None, repr=False
    )

    @property
    def source(self) -> str:
        return str(self.card.get("source", "unknown"))

    @property
    def has_context(self) -> bool:
        return not bool(np.isnan(self.contexts[0]))

    @property
    def max_tokens(self) -> int:
        """The largest profiled batch, in tokens."""
        return int(self.tokens[-1])

    @functools.cached_property
    def step_limit(self) -> float:
        """Largest batch that pads up in `step` mode: the largest CUDA-graph size if the card
        lists them (beyond it the engine runs eagerly and cost interpolates), else no limit."""
        sizes = self.captured_sizes
        return float(sizes[-1]) if sizes else float("inf")

    @functools.cached_property
    def captured_sizes(self) -> tuple[int, ...]:
        """CUDA-graph capture sizes from the card, if it lists them."""
        sizes = self.card.get("graph_capture_sizes") or ()
        return tuple(sorted(int(s) for s in sizes))

    def verify_s(self, tokens: ArrayLike, context: ArrayLike | None = None) -> NDArray[np.float64]:
        """Return the target forward time in seconds for each batch size in `tokens`.

        `context` (tokens of KV cache per request) broadcasts against `tokens`; it is
        interpolated linearly between profiled contexts and ignored by profiles without one.
        """
        t = np.asarray(tokens, dtype=np.float64)
        if context is not None and self.has_context:
            # one batch size at many contexts is a valid question too: broadcast both ways
            t = np.broadcast_arrays(t, np.asarray(context, np.float64))[0]
        rows = self._lookup_tokens(t.ravel())  # (C, N)
        if not self.has_context or rows.shape[0] == 1:
            out = rows[0]
        else:
            c = np.broadcast_to(
                np.asarray(self._default_context() if context is None else context, np.float64),
                t.shape,
            ).ravel()
            out = self._interp_context(rows, c)
        return (out / 1e3).reshape(t.shape)

    def step_s(self, tokens: ArrayLike, context: ArrayLike | None = None) -> NDArray[np.float64]:
        """Alias of `verify_s`: the target's step time at `tokens` batch tokens."""
        return self.verify_s(tokens, context)

    def draft_s(self, requests: ArrayLike) -> NDArray[np.float64]:
        """Return the drafter's time in seconds for a step with `requests` requests (0 if absent)."""
        r = np.asarray(requests, dtype=np.float64)
        if self.draft_requests.size == 0:
            return np.zeros_like(r)
        grid = self.draft_ms[None, :]
        out = _lookup_1d(self.draft_requests, grid, r.ravel(), self.mode)[0]
        if r.size and float(r.max()) > self.draft_requests[-1]:
            self._extrapolated("draft", float(r.max()), float(self.draft_requests[-1]))
        out = np.where(r.ravel() <= 0, 0.0, out)
        return (out / 1e3).reshape(r.shape)

    def verify_s_scalar(self, tokens: float, context: float = 0.0) -> float:
        """Return `verify_s` for one batch size: the engine's per-step fast path (no arrays)."""
        rows, cols, ctx, limit = self._scalar_tables()
        if tokens > cols[-1] or (ctx and context > ctx[-1]):
            return float(self.verify_s(tokens, context))  # extrapolates, and warns once
        if tokens <= limit:
            j = bisect.bisect_left(cols, tokens)
            vals = [row[j] for row in rows]
        elif len(cols) == 1:
            vals = [row[0] for row in rows]
        else:
            j = min(max(bisect.bisect_left(cols, tokens), 1), len(cols) - 1)
            w = min(max((tokens - cols[j - 1]) / (cols[j] - cols[j - 1]), 0.0), 1.0)
            vals = [(1.0 - w) * row[j - 1] + w * row[j] for row in rows]
        if len(vals) == 1:
            return vals[0] / 1e3
        k = min(max(bisect.bisect_right(ctx, context) - 1, 0), len(ctx) - 2)
        w = max((context - ctx[k]) / (ctx[k + 1] - ctx[k]), 0.0)
        return ((1.0 - w) * vals[k] + w * vals[k + 1]) / 1e3

    def draft_s_scalar(self, requests: int) -> float:
        """Return `draft_s` for one request count (the engine's per-step fast path)."""
        if requests <= 0 or self.draft_requests.size == 0:
            return 0.0
        key = int(requests)
        cached = self._draft_cache.get(key)
        if cached is None:
            cached = float(self.draft_s(key))
            self._draft_cache[key] = cached
        return cached

    def _scalar_tables(self) -> tuple[list[list[float]], list[float], list[float], float]:
        """Python-list copies of the grid for scalar lookups: (rows, tokens, contexts, step limit).

        `contexts` is empty for a profile without a context column; the step limit is
        +inf in `linear` mode so a single comparison picks the branch.
        """
        if self._scalar is None:
            limit = self.step_limit if self.mode == "step" else -math.inf
            ctx = self.contexts.tolist() if self.has_context and self.contexts.size > 1 else []
            self._scalar = (self.step_ms.tolist(), self.tokens.tolist(), ctx, limit)
        return self._scalar

    def sps(self, tokens: ArrayLike, context: ArrayLike | None = None) -> NDArray[np.float64]:
        """Return steps per second of the target alone at `tokens` batch tokens."""
        return 1.0 / self.verify_s(tokens, context)

    def _default_context(self) -> float:
        return float(self.contexts[0])

    def _lookup_tokens(self, t: NDArray[np.float64]) -> NDArray[np.float64]:
        if t.size and float(t.max()) > self.tokens[-1]:
            self._extrapolated("tokens", float(t.max()), float(self.tokens[-1]))
        return _lookup_1d(self.tokens, self.step_ms, t, self.mode, self.step_limit)

    def _interp_context(
        self, rows: NDArray[np.float64], c: NDArray[np.float64]
    ) -> NDArray[np.float64]:
        ctx = self.contexts
        if c.size and float(c.max()) > ctx[-1]:
            self._extrapolated("context", float(c.max()), float(ctx[-1]))
        lo = np.clip(np.searchsorted(ctx, c, side="right") - 1, 0, ctx.size - 2)
        w = np.maximum((c - ctx[lo]) / (ctx[lo + 1] - ctx[lo]), 0.0)  # > 1 extrapolates
        n = np.arange(c.size)
        return (1.0 - w) * rows[lo, n] + w * rows[lo + 1, n]

    def _extrapolated(self, what: str, value: float, last: float) -> None:
        msg = (
            f"profile {self.name!r}: {what}={value:g} is past the last profiled {what} "
            f"({last:g}); extrapolating the last slope linearly"
        )
        if self.strict:
            raise RangeError(msg + " (an error under --strict)")
        if what not in self._warned:
            self._warned.add(what)
            warnings.warn(msg, ProfileWarning, stacklevel=3)


def _lookup_1d(
    x: NDArray[np.float64], grid: NDArray[np.float64], t: NDArray[np.float64], mode: LookupMode,
    step_limit: float = np.inf,
) -> NDArray[np.float64]:
    """Look up every row of `grid` (C, T) at points `t` (N,); return (C, N).

    `step` pads up to the next profiled point; `linear` interpolates; both extrapolate the
    last segment's slope past `x[-1]` and clamp to the first value below `x[0]`.
    """
    last = x.size - 1
    if last == 0:
        slope = grid[:, -1] / max(x[-1], 1.0)
    else:
        slope = (grid[:, -1] - grid[:, -2]) / (x[-1] - x[-2])
    beyond = grid[:, -1:] + (t[None, :] - x[-1]) * slope[:, None]
    if mode == "step" and np.all(t <= step_limit):
        idx = np.minimum(np.searchsorted(x, t, side="left"), last)
        inside = grid[:, idx]
    elif mode == "step":  # pad within the captured range, interpolate past it (as vLLM does)
        stepped = _lookup_1d(x, grid, np.minimum(t, step_limit), "step")
        interp = _lookup_1d(x, grid, t, "linear")
        inside = np.where(t[None, :] <= step_limit, stepped, interp)
    else:
        hi = np.clip(np.searchsorted(x, t, side="left"), 1, max(last, 1))
        lo = hi - 1
        if last == 0:
            inside = np.repeat(grid[:, :1], t.size, axis=1)
        else:
            w = np.clip((t - x[lo]) / (x[hi] - x[lo]), 0.0, 1.0)
            inside = (1.0 - w) * grid[:, lo] + w * grid[:, hi]
    return np.where(t[None, :] > x[-1], beyond, inside)


# --------------------------------------------------------------------------- loading


def _read_csv(path: Path, required: tuple[str, ...], optional: tuple[str, ...], problems: list[str]
              ) -> pd.DataFrame | None:
    if not path.is_file():
        problems.append(f"{path.name}: file is missing")
        return None
    try:
        df = pd.read_csv(path, nrows=MAX_PROFILE_ROWS + 1)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        problems.append(f"{path.name}: cannot be parsed as CSV ({exc})")
        return None
    if len(df) > MAX_PROFILE_ROWS:
        problems.append(f"{path.name}: more than {MAX_PROFILE_ROWS} rows")
        return None
    ok = True
    for col in required:
        if col not in df.columns:
            problems.append(f"{path.name}: missing column {col!r} (has {list(df.columns)})")
            ok = False
    for col in df.columns:
        if col not in required and col not in optional:
            problems.append(f"{path.name}: unknown column {col!r}")
    if not ok:
        return None
    if df.empty:
        problems.append(f"{path.name}: no rows")
        return None
    for col in df.columns:
        if col not in required and col not in optional:
            continue
        vals = pd.to_numeric(df[col], errors="coerce")
        bad = ~np.isfinite(vals.to_numpy(dtype=np.float64))
        if bad.any():
            row = int(np.argmax(bad))
            problems.append(
                f"{path.name}: column {col!r} row {row} is not a finite number ({df[col].iloc[row]!r})"
            )
            ok = False
            continue
        neg = vals.to_numpy() <= 0 if col in ("tokens", "requests", "step_ms") else vals.to_numpy() < 0
        if neg.any():
            row = int(np.argmax(neg))
            problems.append(f"{path.name}: column {col!r} row {row} out of range ({vals.iloc[row]!r})")
            ok = False
        df[col] = vals
    return df if ok else None


def check_card(card: Any, problems: list[str], *, kind: str = "profile") -> dict[str, Any]:
    """Append a problem for each missing or bad card field; return the card as a dict."""
    if not isinstance(card, dict):
        problems.append("card.yaml: must be a mapping of fields")
        return {}
    for key in CARD_REQUIRED if kind == "profile" else ():
        if key not in card or card[key] in (None, ""):
            problems.append(f"card.yaml: missing field {key!r}")
    src = card.get("source")
    if kind == "profile" and src is not None and src not in SOURCES:
        problems.append(f"card.yaml: source={src!r} is not one of {list(SOURCES)}")
    return card


def read_card(path: Path, problems: list[str]) -> Any:
    """Read a card.yaml with the safe loader; append a problem if it is missing or not YAML."""
    if not path.is_file():
        problems.append("card.yaml: file is missing")
        return None
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        problems.append(f"card.yaml: not valid YAML ({exc})")
        return None


def check_profile(path: Path | str) -> list[str]:
    """Return every problem found in the profile folder at `path` (empty if it is valid)."""
    problems: list[str] = []
    _parse(Path(path), problems)
    return problems


def load_profile(path: Path | str, *, mode: LookupMode = "step", strict: bool = False) -> Profile:
    """Load and validate the profile folder at `path`; raise FormatError listing every problem."""
    path = Path(path)
    problems: list[str] = []
    prof = _parse(path, problems)
    if problems or prof is None:
        raise FormatError(path, problems or ["unreadable profile"])
    prof.mode = mode
    prof.strict = strict
    return prof


def _parse(path: Path, problems: list[str]) -> Profile | None:
    if not path.is_dir():
        problems.append("not a directory")
        return None
    card = check_card(read_card(path / "card.yaml", problems), problems)
    vdf = _read_csv(path / "verify.csv", VERIFY_REQUIRED, VERIFY_OPTIONAL, problems)
    draft_path = path / "draft.csv"
    ddf = (
        _read_csv(draft_path, DRAFT_REQUIRED, (), problems)
        if draft_path.exists()
        else pd.DataFrame({"requests": [], "draft_ms": []})
    )
    if vdf is None or ddf is None:
        return None
    name = path.name
    tokens, contexts, grid = _grid(vdf, problems, name)
    if grid is None:
        return None
    ddf = ddf.sort_values("requests")
    if ddf["requests"].duplicated().any():
        problems.append("draft.csv: duplicate request counts")
        return None
    d_req = ddf["requests"].to_numpy(np.float64)
    d_ms = _monotone(ddf["draft_ms"].to_numpy(np.float64)[None, :], "draft.csv", name)[0]
    return Profile(
        name=name, card=card, tokens=tokens, contexts=contexts, step_ms=grid,
        draft_requests=d_req, draft_ms=d_ms, path=path,
    )


def _grid(
    vdf: pd.DataFrame, problems: list[str], name: str
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64] | None]:
    empty = np.empty(0)
    if "context" in vdf.columns:
        if vdf.duplicated(["context", "tokens"]).any():
            problems.append("verify.csv: duplicate (context, tokens) rows")
            return empty, empty, None
        wide = vdf.pivot(index="context", columns="tokens", values="step_ms").sort_index()
        wide = wide.reindex(sorted(wide.columns), axis=1)
        if wide.isna().any().any():
            ctx, tok = np.argwhere(wide.isna().to_numpy())[0]
            problems.append(
                "verify.csv: every context must be profiled at the same token counts "
                f"(context={wide.index[ctx]:g} lacks tokens={wide.columns[tok]:g})"
            )
            return empty, empty, None
        contexts = wide.index.to_numpy(np.float64)
        tokens = wide.columns.to_numpy(np.float64)
        grid = wide.to_numpy(np.float64)
    else:
        if vdf["tokens"].duplicated().any():
            problems.append("verify.csv: duplicate token counts")
            return empty, empty, None
        vdf = vdf.sort_values("tokens")
        contexts = np.array([np.nan])
        tokens = vdf["tokens"].to_numpy(np.float64)
        grid = vdf["step_ms"].to_numpy(np.float64)[None, :]
    return tokens, contexts, _monotone(grid, "verify.csv", name)


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


# --------------------------------------------------------------------------- writing


def write_profile(
    path: Path | str,
    verify: pd.DataFrame,
    card: Mapping[str, Any],
    draft: pd.DataFrame | None = None,
) -> Path:
    """Write a profile folder atomically and check that it loads; return its path."""
    path = Path(path)
    with atomic_dir(path) as tmp:
        _sizes_as_int(verify).to_csv(tmp / "verify.csv", index=False, float_format="%.6g")
        if draft is not None:
            _sizes_as_int(draft).to_csv(tmp / "draft.csv", index=False, float_format="%.6g")
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
    out = df.copy()
    for col in ("tokens", "context", "requests"):
        if col in out.columns and pd.api.types.is_float_dtype(out[col]):
            vals = out[col].to_numpy(np.float64)
            if np.all(np.isfinite(vals)) and np.all(vals == np.round(vals)):
                out[col] = vals.astype(np.int64)
    return out
