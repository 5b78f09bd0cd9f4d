"""Reads a user's measured runs: per-request latencies, and the engine settings they were served with.

A run is a CSV (arrival, lengths, measured TTFT and E2E per request) or the JSON `vllm bench
serve --save-result --save-detailed` writes; every row is checked, and a problem names the
file and the row. The engine's settings come from a YAML mapping or a `vllm serve` command
line (`parse_vllm_flags`), so a replay batches and caches as the real engine did.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sparksim.errors import ConfigError, FormatError

REQUIRED = ("arrival_s", "prompt_tokens", "output_tokens", "ttft_ms", "e2e_ms")
PREFIX_COLUMNS = ("prefix_group", "prefix_tokens")  # optional: a request's shared prefix (replayed when cached)


# --------------------------------------------------------------------------- engine settings


# vLLM V1's OpenAI API server, when `--max-num-seqs` / `--max-num-batched-tokens` are not
# given (vllm/engine/arg_utils.py, `get_batch_defaults`, v0.8 through v0.27): a GPU with at
# least 70 GiB whose name does not say A100 gets 1024 sequences and 8192 tokens a step, any
# other 256 and 2048. (v0.28 adds a tier at 160 GiB: 16384 tokens; give the flags for it.)
VLLM_LARGE_GPU_BYTES = 70 * 2**30
VLLM_DEFAULT_LIMITS = {"large": (1024, 8192), "other": (256, 2048)}


def vllm_default_limits(gpu_name: str, gpu_memory_bytes: float) -> tuple[int, int]:
    """vLLM V1's API-server (max_num_seqs, max_num_batched_tokens) on a GPU of this name and memory
    (an unset max_num_seqs is then capped at the batched tokens: `EngineSettings.resolved`)."""
    large = gpu_memory_bytes >= VLLM_LARGE_GPU_BYTES and "a100" not in gpu_name.lower()
    return VLLM_DEFAULT_LIMITS["large" if large else "other"]


@dataclass(frozen=True)
class EngineSettings:
    """What the real engine ran with, as sparksim needs it to replay a run.

    A limit left None is vLLM V1's default for the GPU the run is replayed on (`resolved`);
    prefix caching is on unless said otherwise, as in vLLM V1.
    """

    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    tensor_parallel_size: int = 1
    block_size: int = 16
    kv_capacity_tokens: int | None = None  # None: the profile's own estimate
    max_model_len: int | None = None
    prefix_caching: bool = True
    source: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    def resolved(self, gpu_name: str, gpu_memory_bytes: float | None) -> EngineSettings:
        """These settings with an unset limit filled by vLLM V1's default on this GPU
        (`vllm_default_limits`); `source` says which were filled and why."""
        if self.max_num_seqs is not None and self.max_num_batched_tokens is not None:
            return self
        if not gpu_memory_bytes:
            raise ConfigError(
                f"{self.source or 'the engine settings'}: max_num_seqs and max_num_batched_tokens "
                f"must be given: vLLM's defaults depend on the GPU's memory, and the profile "
                f"({gpu_name}) records none (--vllm-flags '--max-num-seqs N --max-num-batched-tokens M')")
        seqs, tokens = vllm_default_limits(gpu_name, gpu_memory_bytes)
        tokens = self.max_num_batched_tokens or tokens
        seqs = min(seqs, tokens)  # vLLM's `_set_default_args`: no more sequences than batched tokens
        filled = [(k, v) for k, v in (("max_num_seqs", seqs), ("max_num_batched_tokens", tokens))
                  if getattr(self, k) is None]
        note = (f"{', '.join(f'{k}={v}' for k, v in filled)}: vLLM V1's API-server default "
                f"on {gpu_name} ({gpu_memory_bytes / 2**30:.0f} GiB)")
        return replace(self, max_num_seqs=self.max_num_seqs or seqs,
                       max_num_batched_tokens=self.max_num_batched_tokens or tokens,
                       source=f"{self.source}; {note}" if self.source else note)


# vLLM's flags this reads, to EngineSettings fields (short forms as vLLM spells them)
_VLLM_FLAGS = {
    "--max-num-seqs": "max_num_seqs", "--max-num-batched-tokens": "max_num_batched_tokens",
    "--tensor-parallel-size": "tensor_parallel_size", "-tp": "tensor_parallel_size",
    "--block-size": "block_size", "--max-model-len": "max_model_len",
    "--num-gpu-blocks-override": "num_gpu_blocks",
}
_KV_LOG = re.compile(r"GPU KV cache size:\s*([\d,]+)\s*tokens")


def parse_vllm_flags(text: str) -> dict[str, Any]:
    """Read the engine settings from a `vllm serve` command line (and, if pasted with it, the
    start-up log line `GPU KV cache size: N tokens`). Flags sparksim does not model are ignored;
    `ignored` lists them."""
    out: dict[str, Any] = {}
    kv = _KV_LOG.search(text)
    command = _KV_LOG.sub("", text)
    argv = shlex.split(command, comments=False)
    ignored: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        flag, eq, inline = arg.partition("=")
        if flag in ("--enable-prefix-caching", "--no-enable-prefix-caching"):
            out["prefix_caching"] = flag == "--enable-prefix-caching"
        elif flag in _VLLM_FLAGS:
            value = inline if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            if not eq:
                i += 1
            try:
                out[_VLLM_FLAGS[flag]] = int(value)
            except ValueError:
                raise ConfigError(f"vLLM flag {flag} {value!r}: expected an integer") from None
        elif flag.startswith("-"):
            ignored.append(flag)
            if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                i += 1  # its value
        i += 1
    blocks = out.pop("num_gpu_blocks", None)
    if kv is not None:
        out["kv_capacity_tokens"] = int(kv.group(1).replace(",", ""))
    elif blocks is not None:
        out["kv_capacity_tokens"] = blocks * out.get("block_size", EngineSettings.block_size)
    out["ignored"] = ignored
    return out


def engine_settings(values: dict[str, Any], source: str) -> tuple[EngineSettings, list[str]]:
    """Make EngineSettings from a mapping (a YAML file's, or `parse_vllm_flags`'), checking each
    value; also return the keys it does not model (a caller shows them: a typo shows up there)."""
    known = set(EngineSettings.__dataclass_fields__) - {"source"}
    values = dict(values)
    if "enable_prefix_caching" in values:  # vLLM's own name
        values.setdefault("prefix_caching", values.pop("enable_prefix_caching"))
    ignored = sorted(set(values) - known - {"ignored", "num_gpu_blocks", "source"}) + list(
        values.get("ignored") or [])
    vals = {k: v for k, v in values.items() if k in known}
    if "num_gpu_blocks" in values and "kv_capacity_tokens" not in vals:
        vals["kv_capacity_tokens"] = int(values["num_gpu_blocks"]) * int(vals.get("block_size", 16))
    for key in ("max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size", "block_size",
                "kv_capacity_tokens", "max_model_len"):
        v = vals.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise ConfigError(f"{source}: {key}={v!r} must be a positive integer")
    if "prefix_caching" in vals and not isinstance(vals["prefix_caching"], bool):
        raise ConfigError(f"{source}: prefix_caching={vals['prefix_caching']!r} must be true or false")
    return EngineSettings(**vals, source=source), ignored


# --------------------------------------------------------------------------- measured runs


@dataclass
class MeasuredRun:
    """One measured run: its requests in arrival order, and the engine that served them."""

    name: str
    path: Path
    requests: pd.DataFrame  # REQUIRED columns, `stage`; arrival_s from the run's first request
    settings: EngineSettings = field(default_factory=EngineSettings)

    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


def _vllm_bench_json(path: Path) -> pd.DataFrame:
    """Per-request rows from `vllm bench serve --save-result --save-detailed` JSON."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(path, [f"cannot be read as JSON ({exc})"]) from None
    need = ("input_lens", "output_lens", "ttfts", "itls", "start_times")
    missing = [k for k in need if not isinstance(doc, dict) or k not in doc]
    if missing:
        raise FormatError(path, [f"no per-request field(s) {missing}: save it with `vllm bench serve "
                                 "--save-result --save-detailed` (start_times needs a vLLM recent "
                                 "enough to record send times), or write a CSV with columns "
                                 f"{list(REQUIRED)}"])
    n = len(doc["ttfts"])
    if any(len(doc[k]) != n for k in need):
        raise FormatError(path, [f"per-request lists differ in length: "
                                 f"{ {k: len(doc[k]) for k in need} }"])
    errors = doc.get("errors") or [""] * n
    start = np.asarray(doc["start_times"], dtype=np.float64)
    ttft = np.asarray(doc["ttfts"], dtype=np.float64)
    e2e = ttft + np.asarray([float(np.sum(x)) if x else 0.0 for x in doc["itls"]])
    df = pd.DataFrame({"arrival_s": start - start.min(), "prompt_tokens": doc["input_lens"],
                       "output_tokens": doc["output_lens"], "ttft_ms": ttft * 1e3, "e2e_ms": e2e * 1e3,
                       "has_error": [int(bool(e)) for e in errors]})
    return df.sort_values("arrival_s", kind="stable").reset_index(drop=True)


def load_run(path: Path, settings: EngineSettings | None = None) -> MeasuredRun:
    """Read a measured run: a CSV (REQUIRED columns; optional `stage`, `has_error`, PREFIX_COLUMNS) or a vLLM
    bench JSON; check every row, naming the file and the row of the first bad value."""
    path = Path(path)
    settings = settings or EngineSettings()
    if path.suffix == ".json":
        df = _vllm_bench_json(path)
    else:
        try:
            df = pd.read_csv(path)
        except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            raise FormatError(path, [f"cannot be read as CSV ({exc})"]) from None
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise FormatError(path, [f"missing column(s) {missing} (has {list(df.columns)})"])
    if df.empty:
        raise FormatError(path, ["no rows"])
    problems: list[str] = []
    for col, low in (("arrival_s", 0.0), ("prompt_tokens", 1), ("output_tokens", 0),
                     ("ttft_ms", 0.0), ("e2e_ms", 0.0)):
        vals = pd.to_numeric(df[col], errors="coerce").to_numpy(np.float64)
        bad = ~np.isfinite(vals) | (vals < low)
        if bad.any():
            row = int(np.argmax(bad))
            problems.append(f"row {row + 1}: {col}={df[col].iloc[row]!r} (must be a number >= {low:g})")
        df[col] = vals
    if not problems:
        late = df["ttft_ms"] > df["e2e_ms"] + 1e-6
        if late.any():
            row = int(np.argmax(late.to_numpy()))
            problems.append(f"row {row + 1}: ttft_ms={df['ttft_ms'].iloc[row]:g} > e2e_ms="
                            f"{df['e2e_ms'].iloc[row]:g} (the first token cannot come after the last)")
        back = np.diff(df["arrival_s"].to_numpy()) < 0
        if back.any():
            problems.append(f"row {int(np.argmax(back)) + 2}: arrival_s goes back in time "
                            "(rows must be in arrival order)")
        if settings.max_model_len is not None:
            long = (df["prompt_tokens"] + df["output_tokens"]) > settings.max_model_len
            if long.any():
                row = int(np.argmax(long.to_numpy()))
                problems.append(
                    f"row {row + 1}: prompt {int(df['prompt_tokens'].iloc[row])} + output "
                    f"{int(df['output_tokens'].iloc[row])} tokens exceed the engine's max_model_len="
                    f"{settings.max_model_len} ({settings.source or 'engine settings'}): the settings "
                    "contradict the run")
    if "stage" in df.columns:  # a whole number per load stage (stage tables and fits read it as one)
        stage = pd.to_numeric(df["stage"], errors="coerce").to_numpy(np.float64)
        bad = ~np.isfinite(stage) | (stage != np.round(stage))
        if bad.any():
            row = int(np.argmax(bad))
            problems.append(f"row {row + 1}: stage={df['stage'].iloc[row]!r} (must be a whole number)")
        else:
            df["stage"] = stage.astype(np.int64)
    if "has_error" in df.columns and not problems:
        errored = int(pd.to_numeric(df["has_error"], errors="coerce").fillna(1).astype(bool).sum())
        if errored:
            problems.append(f"{errored} request(s) have has_error set: their latencies are not "
                            "measurements; drop them, or the run")
    if problems:
        raise FormatError(path, problems)
    df = df.reset_index(drop=True)
    if "stage" not in df.columns:
        df["stage"] = 0
    # A request the client counted no output tokens for still ran (its E2E says so, seconds
    # long): it is replayed with its stage's mean output and left out of the comparison.
    df["counted"] = df["output_tokens"] >= 1
    if not df["counted"].any():
        raise FormatError(path, ["no request has output_tokens >= 1"])
    mean_out = df[df["counted"]].groupby("stage")["output_tokens"].mean().round()
    fill = df["stage"].map(mean_out).fillna(round(float(df.loc[df["counted"], "output_tokens"].mean())))
    df["output_tokens"] = np.where(df["counted"], df["output_tokens"], fill).astype(np.int64)
    df["prompt_tokens"] = df["prompt_tokens"].astype(np.int64)
    name = path.name.removesuffix(".gz").removesuffix(".csv").removesuffix(".json")
    return MeasuredRun(name, path, df, settings)
