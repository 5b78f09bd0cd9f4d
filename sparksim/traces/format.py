"""Trace sets: per-position drafter confidences and realised acceptances, replayable by any schedule.

A trace-set folder holds
- `requests.parquet`: `request_id, domain, prompt_tokens, output_tokens`, one row per request;
- `positions.parquet`: one row per (request_id, pos), pos = 0..output_tokens-1 in order, with
  `conf` (γ conditional confidences of the block drafted at that position), `accepted`
  (leading drafts the target accepted when all γ were verified, 0..γ) and optionally
  `conf_raw` (before calibration) and `p_accept` (exact 1 − TV per position);
- `card.yaml`: how the set was made.

Arrays are held flat: row i of `conf` belongs to request `row_request[i]`, and request k's
rows are `offsets[k]:offsets[k+1]`. The replay rule lives in `sparksim.step.acceptance`.
Loading reads the files into NumPy through their buffers (`sparksim.arrow_numpy`): a run
never needs pandas to read its traces. A run loads the positions only when something reads
them (`load_traceset(positions=False)`): plain decoding replays no confidence.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from numpy.typing import NDArray

from sparksim.arrow_numpy import to_numpy
from sparksim.atomic import atomic_dir
from sparksim.cost.profile import read_card
from sparksim.errors import ConfigError, FormatError

if TYPE_CHECKING:
    import pandas as pd

TRACE_SOURCES = ("recorded", "synthetic")
TRACE_CARD_REQUIRED = ("source", "target", "drafter", "gamma", "temperature", "date", "command")
REQUEST_COLUMNS = ("request_id", "domain", "prompt_tokens", "output_tokens")
POSITION_REQUIRED = ("request_id", "pos", "conf", "accepted")
POSITION_OPTIONAL = ("conf_raw", "p_accept")
MAX_POSITIONS = 50_000_000  # bound on what a file may make us allocate (50M rows x γ floats)
MAX_GAMMA = 64
_DEFERRED = ("conf", "accepted")  # what `load_traceset(positions=False)` leaves unread


@dataclass
class TraceSet:
    """A loaded, validated trace set."""

    name: str
    card: dict[str, Any]
    gamma: int
    # REQUEST_COLUMNS by name, in file order: int64 ids and lengths, domains as an object array of str
    request_columns: dict[str, NDArray[Any]]
    offsets: NDArray[np.int64]  # (n_requests + 1,) first row of each request in the flat arrays
    conf: NDArray[np.float32]  # (N, γ) calibrated conditional confidences
    accepted: NDArray[np.int8]  # (N,) leading drafts accepted when all γ were verified
    conf_raw: NDArray[np.float32] | None = None  # (N, γ)
    p_accept: NDArray[np.float32] | None = None  # (N, γ)
    path: Path | None = None
    # conf and accepted are not read yet: the first read of either loads and checks them
    # (`load_traceset(positions=False)`, `read_positions`)
    deferred: bool = dataclasses.field(default=False, repr=False, compare=False)

    def __getattr__(self, name: str) -> Any:
        # reached only for an attribute that is not set: a deferred set's positions
        if name in _DEFERRED and self.__dict__.get("deferred"):
            self.read_positions()
            return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __getstate__(self) -> dict[str, Any]:
        self.read_positions()  # a pickled set is whole: whoever unpickles it may not see the files
        return self.__dict__

    def read_positions(self) -> None:
        """Read and check positions.parquet of a set loaded with positions=False (else nothing).

        The same load and checks as `load_traceset(extras=False)`: a broken file raises
        FormatError here, at the first read (`runner.load_inputs` asks before simulating,
        for a policy that drafts).
        """
        if not self.__dict__.get("deferred"):
            return
        assert self.path is not None
        whole = load_traceset(self.path, extras=False)
        if whole.gamma != self.gamma or not np.array_equal(whole.offsets, self.offsets):
            raise FormatError(self.path, ["requests.parquet or card.yaml changed after the trace set was loaded"])
        self.conf, self.accepted = whole.conf, whole.accepted
        self.deferred = False

    @functools.cached_property
    def requests(self) -> pd.DataFrame:
        """REQUEST_COLUMNS as a frame, built at first use (the simulator reads `request_columns`)."""
        import pandas as pd

        return pd.DataFrame({c: self.request_columns[c] for c in REQUEST_COLUMNS})

    @property
    def num_requests(self) -> int:
        return len(self.request_columns["request_id"])

    @property
    def num_positions(self) -> int:
        return int(self.conf.shape[0])

    @property
    def domains(self) -> list[str]:
        return sorted(set(self.request_columns["domain"].tolist()))

    def requests_in(self, domain: str) -> NDArray[np.int64]:
        """Return the indices (not ids) of the requests of `domain`."""
        return np.flatnonzero(self.request_columns["domain"] == domain).astype(np.int64)

    @functools.cached_property
    def conf64(self) -> NDArray[np.float64]:
        """(N, γ) confidences as float64, converted once (the engine gathers rows every step)."""
        return self.conf.astype(np.float64)

    @functools.cached_property
    def accepted64(self) -> NDArray[np.int64]:
        """(N,) accepted counts as int64, converted once (the step kernels index them every step)."""
        return self.accepted.astype(np.int64)

    @functools.cached_property
    def survival(self) -> NDArray[np.float64]:
        """(N, γ) a_j = ∏_{i≤j} c_i for every row, computed once: a row's block is fixed."""
        return np.cumprod(self.conf64, axis=1, dtype=np.float64)

    def truncated(self, gamma: int) -> TraceSet:
        """Return the same traces for a drafter that drafts only the first `gamma` positions.

        Exact: a shorter block's confidences are the first ones, and its accepted count is
        min(accepted, gamma) (the first rejection, or the block's end). The card notes it.
        """
        if not 1 <= gamma <= self.gamma:
            raise ConfigError(f"trace_block={gamma} must be in 1..{self.gamma} (the trace set's γ)")
        if gamma == self.gamma:
            return self
        card = {**self.card, "gamma": gamma,
                "truncated_from_gamma": self.gamma}
        return dataclasses.replace(
            self, card=card, gamma=gamma, conf=np.ascontiguousarray(self.conf[:, :gamma]),
            accepted=np.minimum(self.accepted, gamma).astype(np.int8),
            conf_raw=None if self.conf_raw is None else np.ascontiguousarray(self.conf_raw[:, :gamma]),
            p_accept=None if self.p_accept is None else np.ascontiguousarray(self.p_accept[:, :gamma]),
        )

    def output_tokens(self) -> NDArray[np.int64]:
        return self.request_columns["output_tokens"]


# --------------------------------------------------------------------------- validation


def _check_card(card: Any, problems: list[str]) -> dict[str, Any]:
    if not isinstance(card, dict):
        if card is not None:
            problems.append("card.yaml: must be a mapping of fields")
        return {}
    for key in TRACE_CARD_REQUIRED:
        if key not in card or card[key] in (None, ""):
            problems.append(f"card.yaml: missing field {key!r}")
    src = card.get("source")
    if src is not None and src not in TRACE_SOURCES:
        problems.append(f"card.yaml: source={src!r} is not one of {list(TRACE_SOURCES)}")
    return card


def _read_parquet(path: Path, problems: list[str], only: tuple[str, ...] | None = None) -> pa.Table | None:
    """Read a parquet file whole, or only those of its columns named in `only` that it has."""
    if not path.is_file():
        problems.append(f"{path.name}: file is missing")
        return None
    try:
        file = pq.ParquetFile(path)  # not read_table: its dataset layer imports pandas
        if file.metadata.num_rows > MAX_POSITIONS:
            problems.append(f"{path.name}: claims {file.metadata.num_rows} rows (limit {MAX_POSITIONS})")
            return None
        if only is None:
            return file.read()
        return file.read(columns=[c for c in file.schema_arrow.names if c in only])
    except (pa.ArrowException, OSError) as exc:
        problems.append(f"{path.name}: corrupt or truncated parquet ({exc})")
        return None


def _first_bad(mask: NDArray[np.bool_]) -> int:
    return int(np.argmax(mask))


def _int_column(table: pa.Table, file: str, col: str, problems: list[str]) -> NDArray[np.int64] | None:
    arr = to_numpy(table.column(col))
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr) | (arr != np.round(arr))
        if bad.any():
            problems.append(f"{file}: column {col!r} row {_first_bad(bad)} is not an integer ({arr[_first_bad(bad)]!r})")
            return None
    elif arr.dtype.kind not in "iu":
        problems.append(f"{file}: column {col!r} must be integer (is {table.schema.field(col).type})")
        return None
    return arr.astype(np.int64)


def _matrix_column(
    table: pa.Table, file: str, col: str, gamma: int | None, problems: list[str]
) -> NDArray[np.float32] | None:
    """Read a list-of-γ-floats column as an (N, γ) float32 array, checking length and range."""
    chunked = table.column(col)
    arr = chunked.combine_chunks() if chunked.num_chunks != 1 else chunked.chunk(0)
    if not (pa.types.is_list(arr.type) or pa.types.is_fixed_size_list(arr.type)
            or pa.types.is_large_list(arr.type)):
        problems.append(f"{file}: column {col!r} must hold a list of γ floats (is {arr.type})")
        return None
    if not pa.types.is_floating(arr.type.value_type):  # text or booleans would be cast to numbers
        problems.append(f"{file}: column {col!r} must hold a list of γ floats (is {arr.type})")
        return None
    if arr.null_count:
        row = _first_bad(arr.is_null().to_numpy(zero_copy_only=False))
        problems.append(f"{file}: column {col!r} row {row} is null")
        return None
    if pa.types.is_fixed_size_list(arr.type):
        lengths = np.full(len(arr), arr.type.list_size, dtype=np.int64)
    else:
        lengths = np.diff(to_numpy(arr.offsets)).astype(np.int64)
    g = gamma if gamma is not None else (int(lengths[0]) if lengths.size else 0)
    if lengths.size and (lengths != g).any():
        row = _first_bad(lengths != g)
        problems.append(f"{file}: column {col!r} row {row} has {lengths[row]} values; the set's γ is {g}")
        return None
    flat = to_numpy(_flat_values(arr)).astype(np.float32)
    if flat.size != len(arr) * g:
        problems.append(f"{file}: column {col!r} holds nulls inside its lists")
        return None
    mat = flat.reshape(len(arr), g)
    bad = np.asarray(~np.isfinite(mat).all(axis=1) | (mat < 0).any(axis=1) | (mat > 1).any(axis=1), dtype=bool)
    if bad.any():
        row = _first_bad(bad)
        problems.append(f"{file}: column {col!r} row {row} is NaN or outside [0, 1] ({mat[row].tolist()})")
        return None
    return mat


def _flat_values(lists: pa.Array) -> pa.Array:
    """Return the values of a list array without nulls, as `flatten` (which loads pyarrow.compute) does."""
    if pa.types.is_fixed_size_list(lists.type):
        size = lists.type.list_size
        return lists.values.slice(lists.offset * size, len(lists) * size)
    offsets = to_numpy(lists.offsets)
    return lists.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))


def _missing(values: NDArray[Any]) -> NDArray[np.bool_]:
    """Where a column read by `to_numpy` is missing (None or NaN), as pandas' `isna` finds it."""
    if values.dtype.kind == "f":
        return np.isnan(values)
    if values.dtype == object:
        return np.array([v is None or v != v for v in values.tolist()], dtype=bool)
    return np.zeros(len(values), dtype=bool)


def _parse(path: Path, problems: list[str], with_extras: bool = True, positions: bool = True) -> TraceSet | None:
    if not path.is_dir():
        problems.append("not a directory")
        return None
    card = _check_card(read_card(path / "card.yaml", problems), problems)
    req_t = _read_parquet(path / "requests.parquet", problems)
    pos_t = (_read_parquet(path / "positions.parquet", problems, None if with_extras else POSITION_REQUIRED)
             if positions else None)
    if req_t is None or (positions and pos_t is None):
        return None
    ok = True
    files = [("requests.parquet", req_t, REQUEST_COLUMNS)]
    if pos_t is not None:
        files.append(("positions.parquet", pos_t, POSITION_REQUIRED))
    for file, table, cols in files:
        for col in cols:
            if col not in table.column_names:
                problems.append(f"{file}: missing column {col!r} (has {table.column_names})")
                ok = False
    if not ok:
        return None
    if req_t.num_rows == 0:
        problems.append("requests.parquet: no requests")
        return None

    # requests.parquet
    req: dict[str, NDArray[Any]] = {}
    for col in ("request_id", "prompt_tokens", "output_tokens"):
        vals = _int_column(req_t, "requests.parquet", col, problems)
        if vals is None:
            return None
        low = 1 if col == "output_tokens" else 0
        bad = vals < low
        if bad.any():
            problems.append(f"requests.parquet: column {col!r} row {_first_bad(bad)} is {vals[_first_bad(bad)]} (< {low})")
            return None
        req[col] = vals
    dom_type = req_t.schema.field("domain").type
    if pa.types.is_dictionary(dom_type):  # a categorical column: names stored once
        dom_type = dom_type.value_type
    if not (pa.types.is_string(dom_type) or pa.types.is_large_string(dom_type)):
        problems.append(f"requests.parquet: column 'domain' must hold names, as text (is {dom_type})")
        return None
    domain = to_numpy(req_t.column("domain"))
    if _missing(domain).any():
        problems.append(f"requests.parquet: column 'domain' row {_first_bad(_missing(domain))} is null")
        return None
    req["domain"] = domain.astype(str).astype(object)
    ids = req["request_id"]
    first = np.unique(ids, return_index=True)[1]
    if first.size < ids.size:
        repeated = np.ones(ids.size, dtype=bool)
        repeated[first] = False
        row = _first_bad(repeated)
        problems.append(f"requests.parquet: column 'request_id' row {row} repeats id {ids[row]}")
        return None
    out_tok = req["output_tokens"]
    total = int(out_tok.sum())
    if total > MAX_POSITIONS:
        problems.append(f"requests.parquet: output_tokens sum to {total} (limit {MAX_POSITIONS})")
        return None

    if pos_t is None:
        return _deferred(path, card, req, total, problems)

    # positions.parquet
    card_gamma = card.get("gamma")
    # γ comes from the data (its first row), so a card that disagrees is named as the culprit below
    conf = _matrix_column(pos_t, "positions.parquet", "conf", None, problems)
    if conf is None:
        return None
    gamma = conf.shape[1]
    if not 1 <= gamma <= MAX_GAMMA:
        problems.append(f"positions.parquet: γ={gamma} outside 1..{MAX_GAMMA}")
        return None
    if card_gamma is not None and card_gamma != gamma:
        problems.append(f"card.yaml: gamma={card_gamma!r} but the data has γ={gamma}")
    rid = _int_column(pos_t, "positions.parquet", "request_id", problems)
    pos = _int_column(pos_t, "positions.parquet", "pos", problems)
    acc = _int_column(pos_t, "positions.parquet", "accepted", problems)
    if rid is None or pos is None or acc is None:
        return None
    bad = (acc < 0) | (acc > gamma)
    if bad.any():
        row = _first_bad(bad)
        problems.append(f"positions.parquet: column 'accepted' row {row} is {acc[row]} (outside 0..{gamma})")
    if len(rid) != total:
        problems.append(
            f"positions.parquet: has {len(rid)} rows but requests.parquet's output_tokens sum to {total}"
        )
        return None
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(out_tok, out=offsets[1:])
    want_rid = np.repeat(ids, out_tok)
    want_pos = np.arange(total, dtype=np.int64) - np.repeat(offsets[:-1], out_tok)
    for col, got, want in (("request_id", rid, want_rid), ("pos", pos, want_pos)):
        bad = got != want
        if bad.any():
            row = _first_bad(bad)
            problems.append(
                f"positions.parquet: column {col!r} row {row} is {got[row]}, expected {want[row]} "
                "(rows must run pos = 0..output_tokens-1 for each request, in requests.parquet order)"
            )
    extras: dict[str, NDArray[np.float32] | None] = {}
    for col in POSITION_OPTIONAL:
        extras[col] = (
            _matrix_column(pos_t, "positions.parquet", col, gamma, problems)
            if col in pos_t.column_names else None
        )
    if problems:
        return None
    return TraceSet(
        name=path.name, card=card, gamma=gamma, request_columns=req, offsets=offsets, conf=conf,
        accepted=acc.astype(np.int8), conf_raw=extras["conf_raw"], p_accept=extras["p_accept"],
        path=path,
    )


def _deferred(path: Path, card: dict[str, Any], req: dict[str, NDArray[Any]], total: int,
              problems: list[str]) -> TraceSet | None:
    """The set without its positions (read at first use): γ from the card, rows from the lengths."""
    gamma = card.get("gamma")
    if isinstance(gamma, bool) or not isinstance(gamma, int) or not 1 <= gamma <= MAX_GAMMA:
        problems.append(f"card.yaml: gamma={gamma!r} must be an integer in 1..{MAX_GAMMA}")
        return None
    if problems:
        return None
    offsets = np.zeros(len(req["request_id"]) + 1, dtype=np.int64)
    np.cumsum(req["output_tokens"], out=offsets[1:])
    assert offsets[-1] == total
    empty_conf, empty_acc = np.empty((0, gamma), dtype=np.float32), np.empty(0, dtype=np.int8)
    ts = TraceSet(name=path.name, card=card, gamma=gamma, request_columns=req, offsets=offsets,
                  conf=empty_conf, accepted=empty_acc, path=path, deferred=True)
    del ts.conf, ts.accepted  # so that reading either reaches `__getattr__`, which loads them
    return ts


def check_traceset(path: Path | str) -> list[str]:
    """Return every problem found in the trace-set folder at `path` (empty if valid)."""
    problems: list[str] = []
    _parse(Path(path), problems)
    return problems


def load_traceset(path: Path | str, *, extras: bool = True, positions: bool = True) -> TraceSet:
    """Load and validate the trace-set folder at `path`; raise FormatError listing every problem.

    extras=False reads (and checks) only the columns a simulation replays: `conf_raw` and
    `p_accept` are left unread (None), which at the default set's 195,577 rows is about
    0.1 s of a run's start. positions=False (with extras=False) also leaves positions.parquet
    unread until `conf` or `accepted` is first read (`TraceSet.read_positions`): γ is the
    card's, and a plain-decoding run, which replays neither, skips the 20–110 ms the default
    set's file takes. `check_traceset` and the trace commands read everything.
    """
    if not positions and extras:
        raise ValueError("load_traceset: positions=False reads no extras; pass extras=False")
    path = Path(path)
    problems: list[str] = []
    ts = _parse(path, problems, extras, positions)
    if problems or ts is None:
        raise FormatError(path, problems or ["unreadable trace set"])
    return ts


# --------------------------------------------------------------------------- writing


def _list_array(mat: NDArray[np.floating[Any]]) -> pa.FixedSizeListArray:
    flat = pa.array(np.ascontiguousarray(mat, dtype=np.float32).ravel())
    return pa.FixedSizeListArray.from_arrays(flat, int(mat.shape[1]))


def write_traceset(
    path: Path | str,
    requests: pd.DataFrame,
    conf: NDArray[np.floating[Any]],
    accepted: NDArray[np.integer[Any]],
    card: Mapping[str, Any],
    *,
    conf_raw: NDArray[np.floating[Any]] | None = None,
    p_accept: NDArray[np.floating[Any]] | None = None,
) -> Path:
    """Write a trace set atomically and check that it loads; return its path.

    Rows of `conf`/`accepted` must run request by request in `requests` order, pos 0 first.
    """
    path = Path(path)
    req = requests.loc[:, list(REQUEST_COLUMNS)].reset_index(drop=True)
    out_tok = req["output_tokens"].to_numpy(np.int64)
    offsets = np.concatenate([[0], np.cumsum(out_tok)])
    cols: dict[str, pa.Array] = {
        "request_id": pa.array(np.repeat(req["request_id"].to_numpy(np.int64), out_tok)),
        "pos": pa.array((np.arange(offsets[-1]) - np.repeat(offsets[:-1], out_tok)).astype(np.int32)),
        "conf": _list_array(conf),
        "accepted": pa.array(np.asarray(accepted, dtype=np.int8)),
    }
    if conf_raw is not None:
        cols["conf_raw"] = _list_array(conf_raw)
    if p_accept is not None:
        cols["p_accept"] = _list_array(p_accept)
    with atomic_dir(path) as tmp:
        req_table = pa.Table.from_pandas(req.astype({"domain": str}), preserve_index=False)
        pq.write_table(req_table, tmp / "requests.parquet", compression="zstd")
        pq.write_table(pa.table(cols), tmp / "positions.parquet", compression="zstd",
                       compression_level=9, use_dictionary=False)
        (tmp / "card.yaml").write_text(yaml.safe_dump(dict(card), sort_keys=False, width=100))
        problems = check_traceset(tmp)
        if problems:
            raise FormatError(path, problems)
    return path
