"""Engine cost table files: each engine's JSON read into its table and written back.

`read_table` refuses, with file, key, row and value, what is not a cost curve; `write_table`
writes the engine's own layout, with an optional card beside it (`sidecar_path`). The
formats and the commits they follow are in `sparksim.cost.engine_tables`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml

from sparksim.atomic import write_text
from sparksim.cost.engine_tables import (
    EngineTable,
    SglangAdditiveTable,
    SglangSpsTable,
    TrtllmSpsTable,
    VllmCostTables,
)
from sparksim.errors import ConfigError, FormatError

# --------------------------------------------------------------------------- files

FORMATS = ("sglang", "trtllm", "vllm")  # engines with a table file (ATOM has none)



def check_format(fmt: str) -> str:
    """Return `fmt` if it names an engine table file format; else ConfigError listing them."""
    if fmt not in FORMATS:
        raise ConfigError(f"format {fmt!r} is not one of {', '.join(FORMATS)} "
                          "(ATOM keeps its table in memory: it has no file format)")
    return fmt


def sidecar_path(path: Path | str) -> Path:
    """The card written beside an exported table: `<file>.card.yaml`."""
    path = Path(path)
    return path.with_name(path.name + ".card.yaml")


class _Keys:
    """Typed reads of a JSON object's keys: each missing or mistyped key is a problem and goes in `bad`."""

    def __init__(self, doc: dict[str, Any], out: list[str]) -> None:
        self.doc, self.out = doc, out
        self.bad: set[str] = set()

    def _get(self, key: str, default: Any) -> Any:
        if key in self.doc:
            return self.doc[key]
        if default is None:
            self.out.append(f"missing key {key!r}")
            self.bad.add(key)
        return default

    def _items(self, key: str, default: Any, want: str) -> tuple[Any, ...]:
        raw = self._get(key, default)
        if key in self.bad:
            return ()
        if not isinstance(raw, list | tuple):
            self.out.append(f"{key}={raw!r} must be a list of {want}s")
            self.bad.add(key)
            return ()
        for i, v in enumerate(raw):
            if not _is_json(v, want):
                self.out.append(f"{key}[{i}]={v!r} is not a JSON {want}")
                self.bad.add(key)
        return tuple(raw) if key not in self.bad else ()

    def ints(self, key: str, default: tuple[int, ...] | None = None) -> tuple[int, ...]:
        return self._items(key, default, "integer")

    def floats(self, key: str, default: tuple[float, ...] | None = None) -> tuple[float, ...]:
        return tuple(float(v) for v in self._items(key, default, "number"))

    def one(self, key: str, want: str, default: float | None = None) -> Any:
        raw = self._get(key, default)
        if key in self.bad:
            return math.nan if want == "number" else 0
        if not _is_json(raw, want):
            self.out.append(f"{key}={raw!r} is not a JSON {want}")
            self.bad.add(key)
            return math.nan if want == "number" else 0
        return float(raw) if want == "number" else int(raw)


def _is_json(value: Any, want: str) -> bool:
    """Whether `value` decoded from JSON is an `integer` (not a bool, not 8.0) or a `number`."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) if want == "integer" else isinstance(value, int | float)


def _read_sglang(doc: dict[str, Any], text: str, out: list[str]) -> EngineTable:
    """SGLang's two tables, told apart as `load_sps_table_from_path` does: the text names `bias_seconds`."""
    k = _Keys(doc, out)
    table: SglangSpsTable | SglangAdditiveTable
    if '"bias_seconds"' in text:
        table = SglangAdditiveTable(k.one("bias_seconds", "number"), k.ints("bs_probes"),
                                    k.floats("alpha_seconds"), k.ints("m_probes"), k.floats("theta_seconds"))
    else:
        table = SglangSpsTable(k.ints("sample_batch_tokens"), k.floats("sample_steps_per_sec"),
                               k.one("max_batch_tokens", "integer"))
    out.extend(table.problems(k.bad))
    return table


TRT_V2_KEYS = ("cost_tables", "engine_fingerprint", "engine_fingerprint_sha256", "measurements", "schema_version")


def _read_trtllm(doc: dict[str, Any], text: str, out: list[str]) -> EngineTable:
    """TensorRT-LLM's decomposed table; the schema-v2 exact (G, V) table (PR #18392) is refused."""
    v2 = [key for key in TRT_V2_KEYS if key in doc]
    if v2:
        out.append(f"keys {v2} mark TensorRT-LLM's schema-v2 exact (G, V) table (PR #18392), which "
                   "sparksim does not read; give the decomposed table (token_counts, step_time_ms)")
    meta = doc.get("_meta", {})
    if not isinstance(meta, dict):
        out.append(f"_meta={meta!r} must be an object")
        meta = {}
    if meta.get("encoding", "decomposed") != "decomposed":
        out.append(f"_meta.encoding={meta['encoding']!r}: only the decomposed encoding "
                   "(step_time_ms = θ(M), plus fixed and batch overheads) is read")
    if meta.get("lookup", "interp") != "interp":
        out.append(f"_meta.lookup={meta['lookup']!r}: TensorRT-LLM interpolates whatever this says (its "
                   "loader only warns); sparksim refuses a table made for another lookup")
    k = _Keys(doc, out)
    table = TrtllmSpsTable(k.ints("token_counts"), k.floats("step_time_ms"),
                           k.one("fixed_overhead_ms", "number", 0.0), k.ints("batch_sizes", ()),
                           k.floats("batch_overhead_ms", ()), k.one("minimum_predicted_gain", "number", 0.01))
    out.extend(table.problems(k.bad))
    return table


def _read_vllm(doc: dict[str, Any], text: str, out: list[str]) -> EngineTable:
    """vLLM-Ascend's `HardwareCostModel` file, as vLLM's in-memory tables (see `VllmCostTables`)."""
    if doc.get("schema_version", 1) != 1:
        out.append(f"schema_version={doc['schema_version']!r}: only version 1 is known")
    raw = doc.get("latency_ms")
    if not isinstance(raw, dict):
        out.append("missing key 'latency_ms' (an object of whole-step ms by token count; sparksim "
                   "reads neither `sps` nor `curves`)" if raw is None else
                   f"latency_ms={raw!r} must be an object of ms by token count")
        raw = {}
    points: dict[int, float] = {}
    for key, v in raw.items():
        if not (isinstance(key, str) and key.strip().isdigit()):
            out.append(f'latency_ms["{key}"]: the key is not a token count (a positive integer)')
        elif not _is_json(v, "number"):
            out.append(f'latency_ms["{key}"]={v!r} is not a JSON number')
        elif int(key) in points:
            out.append(f'latency_ms["{key}"] repeats token count {int(key)}')
        else:
            points[int(key)] = float(v)
    tokens = tuple(sorted(points))
    table = VllmCostTables(tokens, tuple(points[t] for t in tokens), (1,), (0.0,), tokens[-1] if tokens else 0)
    if raw or not out:
        out.extend(table.problems())
    return table


READERS = {"sglang": _read_sglang, "trtllm": _read_trtllm, "vllm": _read_vllm}


def read_table(path: Path | str, fmt: str) -> EngineTable:
    """Read an engine's table file of format `fmt`; FormatError lists every problem, with key, row and value."""
    check_format(fmt)
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise FormatError(path, [f"cannot be read ({exc.strerror})"]) from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FormatError(path, [f"not JSON ({exc})"]) from None
    if not isinstance(doc, dict):
        raise FormatError(path, [f"must be a JSON object of the {fmt} table's keys"])
    out: list[str] = []
    table = READERS[fmt](doc, text, out)
    if out:
        raise FormatError(path, out)
    return table


def _payload(table: SglangSpsTable | SglangAdditiveTable | TrtllmSpsTable | VllmCostTables) -> dict[str, Any]:
    """The engine's JSON object for `table`."""
    if isinstance(table, SglangSpsTable):
        return {"sample_batch_tokens": list(table.batch_tokens), "sample_steps_per_sec": list(table.steps_per_sec),
                "max_batch_tokens": table.max_batch_tokens}
    if isinstance(table, SglangAdditiveTable):
        return {"bias_seconds": table.bias_s, "bs_probes": list(table.bs_probes),
                "alpha_seconds": list(table.alpha_s), "m_probes": list(table.m_probes),
                "theta_seconds": list(table.theta_s)}
    if isinstance(table, TrtllmSpsTable):
        return {"token_counts": list(table.token_counts), "step_time_ms": list(table.step_time_ms),
                "fixed_overhead_ms": table.fixed_overhead_ms, "batch_sizes": list(table.batch_sizes),
                "batch_overhead_ms": list(table.batch_overhead_ms),
                "minimum_predicted_gain": table.minimum_predicted_gain,
                "_meta": {"encoding": "decomposed", "lookup": "interp",
                          "producer": "sparksim profile export (sparksim.cost.engine_tables)"}}
    return {"schema_version": 1, "profile_kind": "sparksim_export", "source": "sparksim profile export",
            "fingerprint": {},
            "latency_ms": {str(t): ms for t, ms in zip(table.verify_tokens, table.verify_ms, strict=True)}}


def write_table(table: EngineTable, path: Path | str, card: dict[str, Any] | None = None) -> Path:
    """Write `table` in its engine's file format (atomically), and `card` beside it as `<file>.card.yaml`.

    A table that `read_table` would refuse is not written: FormatError names each problem.
    """
    path = Path(path)
    if not isinstance(table, SglangSpsTable | SglangAdditiveTable | TrtllmSpsTable | VllmCostTables):
        raise ConfigError(f"a {table.engine} table has no file format (ATOM keeps its table in memory)")
    payload = _payload(table)
    problems = table.problems()
    if problems:
        raise FormatError(path, problems)
    write_text(path, json.dumps(payload, indent=1) + "\n")
    if card is not None:
        write_text(sidecar_path(path), yaml.safe_dump(card, sort_keys=False, width=100))
    return path
