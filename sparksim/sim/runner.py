"""Run one scenario end to end: load inputs, check them, simulate, summarise, write results."""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from sparksim.arrow_numpy import read_parquet_columns
from sparksim.atomic import atomic_dir, owned_prefix, remove_orphans
from sparksim.config import (
    Scenario,
    apply_overrides,
    parse_scenario,
    read_scenario_file,
    resolve_path,
)
from sparksim.cost.profile import Profile, ProfileWarning, load_profile
from sparksim.errors import ConfigError, RangeError
from sparksim.policies import make_policy, parse_policy_spec, resolve
from sparksim.policies.base import drafted_positions
from sparksim.sim.cluster import Cluster
from sparksim.sim.engine import kv_capacity_tokens
from sparksim.sim.invariants import InvariantError, check_run
from sparksim.sim.metrics import SUMMARY_COLUMNS, summarize
from sparksim.sim.prefix_cache import prefix_cache_summary
from sparksim.sim.workload import load_arrivals
from sparksim.step.records import Columns, ParquetColumns
from sparksim.traces.format import TraceSet, load_traceset

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class RunResult:
    """What a run produced: its summary, and its two tables held in memory or streamed to files.

    `requests` and `steps` are DataFrames either way. A streamed table (`run.records.stream`)
    is a parquet file, read back whole at each access: a long run's steps need never fit in
    memory unless asked for. A held table stays in its columns until first read as a frame,
    so a run that only writes its files never imports pandas.
    """

    scenario: Scenario
    summary: dict[str, Any]
    requests_table: pd.DataFrame | Columns | Path
    steps_table: pd.DataFrame | Columns | Path | None  # None: run.records.steps is off
    violations: list[str]
    wall_s: float
    num_steps: int
    # the temporary folder a streamed run's files live in when it was given none: removed with the result
    records_tmp: tempfile.TemporaryDirectory[str] | None = None

    @property
    def requests(self) -> pd.DataFrame:
        """The per-request table, one row per finished request in finishing order."""
        if isinstance(self.requests_table, Columns):
            self.requests_table = self.requests_table.to_frame()
        return _frame(self.requests_table)

    @requests.setter
    def requests(self, table: pd.DataFrame) -> None:
        self.requests_table = table

    @property
    def steps(self) -> pd.DataFrame | None:
        """The per-step table, one row per engine step (None when run.records.steps is off)."""
        if isinstance(self.steps_table, Columns):
            self.steps_table = self.steps_table.to_frame()
        return None if self.steps_table is None else _frame(self.steps_table)

    @steps.setter
    def steps(self, table: pd.DataFrame | None) -> None:
        self.steps_table = table

    @property
    def streamed(self) -> bool:
        """Whether the tables were streamed to parquet files rather than held."""
        return isinstance(self.requests_table, Path)


def _frame(table: pd.DataFrame | Columns | Path) -> pd.DataFrame:
    if isinstance(table, Columns):
        return table.to_frame()
    if isinstance(table, Path):
        import pandas as pd

        return pd.read_parquet(table)
    return table


def load_scenario(
    path: Path | str | None = None,
    overrides: Iterable[str] = (),
    policy: str | None = None,
    *,
    presets: Iterable[str] = (),
) -> tuple[Scenario, Path | None]:
    """Read a scenario file (or the embedded default), apply --policy and --set overrides.

    `policy` takes the grammar every command takes (`policies.parse_policy_spec`): `name`,
    `name:param=value,...`, `path/to/file.py:Class` or `pkg.mod:Class`. Another policy than
    the file's replaces its parameters; the same one keeps them under the spec's.
    `presets` are `key=value` settings applied to the file first, as if it held them (a
    command's own settings, such as the live engine's prefill schedule); a key the file or a
    preset gives that an override makes unread is dropped (`config.unread_problems`).
    """
    data: dict[str, Any] = read_scenario_file(path) if path is not None else {}
    base = Path(path).resolve().parent if path is not None else None
    apply_overrides(data, presets)
    layer = copy.deepcopy(data)
    if policy is not None:
        name, params = parse_policy_spec(policy)
        pol = data.setdefault("policy", {})
        if not isinstance(pol, dict):
            raise ConfigError(f"policy={pol!r} must be a mapping")
        if pol.get("name") != name:
            data["policy"] = pol = {"name": name}
        pol.update(params)
    apply_overrides(data, overrides)
    return parse_scenario(data, layer), base


def load_inputs(
    scenario: Scenario, base: Path | None = None, *, strict: bool = False
) -> tuple[Profile, TraceSet, Profile | None]:
    """Load the scenario's profile(s) and trace set, and check them against the scenario.

    Everything that can be known before simulating is checked here, so a bad scenario
    fails before anything is simulated or written.
    """
    resolve(scenario.policy.name)  # an unknown policy fails before any file is read
    profile = load_profile(resolve_path(scenario.profile, base), mode=scenario.lookup, strict=strict)
    # the positions are read below only for a policy that drafts (plain decoding replays none)
    traces = _bounded_by_drafter(scenario, profile, load_traceset(
        resolve_path(scenario.traces, base), extras=False, positions=False))
    pf = scenario.cluster.prefill
    prefill = (
        load_profile(resolve_path(pf.profile, base), mode=scenario.lookup, strict=strict)
        if pf.profile else None
    )
    if traces.num_requests == 0:
        raise ConfigError(f"traces={scenario.traces!r}: the trace set is empty")
    # a bad policy name or parameter (e.g. γ beyond the trace's block) fails here
    policy = make_policy(scenario.policy.name, traces.gamma, scenario.policy.params)
    if policy.drafts:
        traces.read_positions()  # a broken positions file fails here, before anything is simulated
    cl = scenario.cluster
    reserve = traces.gamma + 1 if policy.drafts else 1
    if reserve > cl.max_batch_tokens:
        raise ConfigError(
            f"cluster.max_batch_tokens={cl.max_batch_tokens} is smaller than one request's "
            f"verification ({reserve} tokens)"
        )
    need_tokens = min(cl.max_concurrency * reserve, cl.max_batch_tokens)
    if profile.max_tokens < need_tokens:
        msg = (
            f"profile={scenario.profile!r} reaches {profile.max_tokens} tokens but this run may "
            f"send batches of up to {need_tokens} (max_concurrency × (γ+1), capped by "
            "max_batch_tokens); larger batches will be extrapolated"
        )
        if strict:
            raise RangeError(msg + " (an error under --strict)")
        warnings.warn(msg, ProfileWarning, stacklevel=2)
    if policy.drafts:
        if not profile.drafters and scenario.policy.drafter is None:
            warnings.warn(
                f"profile={scenario.profile!r} has no draft table, so policy "
                f"{scenario.policy.name!r} drafts for free; add the drafter's table to the profile",
                ProfileWarning, stacklevel=2)
        elif scenario.policy.drafter is not None and scenario.policy.drafter not in profile.drafters:
            raise ConfigError(
                f"policy.drafter={scenario.policy.drafter!r} is not in profile={scenario.profile!r} "
                f"(its drafters: {sorted(profile.drafters) or 'none'})")
        table = profile.drafter(scenario.policy.drafter) if profile.drafters else None
        top = table.max_positions if table is not None else None
        if strict and table is not None and top is not None and policy.draft_positions > top:
            # without --strict the profile warns once, at the first step that extrapolates
            raise RangeError(
                f"policy {scenario.policy.name!r} drafts {policy.draft_positions} positions but "
                f"drafter {table.name!r} of profile={scenario.profile!r} is profiled up to {top} "
                "(extrapolating is an error under --strict)")
    if (cl.pipeline == "sync" and cl.decision_s == "profile" and policy.drafts
            and policy.name not in profile.decision_table):
        raise ConfigError(
            f"cluster.decision_s=profile: profile={scenario.profile!r} has no decision time for policy "
            f"{policy.name!r} (cost_model.decision_ms has {sorted(profile.decision_table) or 'none'})")
    kv_capacity = kv_capacity_tokens(scenario, profile)
    wl = scenario.workload
    if wl.kind == "closed" and wl.concurrency > cl.max_concurrency * cl.replicas:
        warnings.warn(
            f"workload.concurrency={wl.concurrency} is more than the cluster runs at once "
            f"(cluster.max_concurrency={cl.max_concurrency} x {cl.replicas} replica(s)); "
            "the rest queue (the summary records it)", ProfileWarning, stacklevel=2)
    _warn_if_nothing_cacheable(scenario, base, traces)
    if kv_capacity is not None:
        if wl.kind == "replay" and wl.arrivals_csv:
            arrivals = load_arrivals(resolve_path(wl.arrivals_csv, base), sorted(traces.domains))
            longest = int((arrivals["prompt_tokens"] + arrivals["output_tokens"]).max())
        elif wl.lengths.source == "traces":
            longest = int((traces.request_columns["prompt_tokens"] + traces.request_columns["output_tokens"]).max())
        else:
            longest = wl.lengths.prompt.max + wl.lengths.output.max
        if longest + reserve > kv_capacity:
            raise ConfigError(
                f"cluster.kv_capacity_tokens={cl.kv_capacity_tokens} ({kv_capacity} tokens) cannot "
                "hold the longest request "
                f"({longest} tokens + {reserve} reserved); it would wait forever"
            )
    return profile, traces, prefill


def _warn_if_nothing_cacheable(scenario: Scenario, base: Path | None, traces: TraceSet) -> None:
    """Warn when prefix caching is on but no prompt declares a full block of shared prefix."""
    pc, wl = scenario.cluster.prefix_cache, scenario.workload
    if not pc.enabled:
        return
    if wl.kind == "replay":
        if wl.arrivals_csv and "prefix_group" not in load_arrivals(
                resolve_path(wl.arrivals_csv, base), sorted(traces.domains)):
            warnings.warn(f"cluster.prefix_cache.enabled=true but workload.arrivals_csv={wl.arrivals_csv!r} "
                          "has no prefix_group / prefix_tokens columns: no prompt shares a prefix",
                          ProfileWarning, stacklevel=3)
    elif wl.prefix.tokens < pc.block_tokens:
        warnings.warn(f"cluster.prefix_cache.enabled=true but workload.prefix.tokens={wl.prefix.tokens} is "
                      f"shorter than a block (cluster.prefix_cache.block_tokens={pc.block_tokens}): "
                      "only full blocks are cached, so nothing is", ProfileWarning, stacklevel=3)


def simulate(
    scenario: Scenario,
    base: Path | None = None,
    *,
    strict: bool = False,
    check: bool = False,
    progress: Callable[[float], None] | None = None,
    inputs: tuple[Profile, TraceSet, Profile | None] | None = None,
    records_dir: Path | None = None,
) -> RunResult:
    """Simulate `scenario` and return its records and summary.

    The tables are held in memory, or streamed as the run goes to `requests.parquet` and
    `steps.parquet` in `records_dir`, a row group at a time (`records.ParquetColumns`), as
    `run.records.stream` says: `auto` streams when given `records_dir` (a run that writes a
    results folder), `true` always (into a temporary folder the result keeps, when given
    none), `false` never. Either way the tables, the files `write_results` writes and the
    summary are the same, byte for byte. Nothing else is written.
    """
    profile, traces, prefill = inputs or load_inputs(scenario, base, strict=strict)
    stream = scenario.run.records.stream
    tmp = None
    if stream is False:
        records_dir = None
    elif stream is True and records_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="sparksim-records-")
        records_dir = Path(tmp.name)
    cluster = Cluster(scenario, profile, traces, prefill, base_dir=base, records_dir=records_dir)
    if check:
        for eng in cluster.engines:
            eng.check = True
    t0 = time.perf_counter()
    cluster.run(progress)
    wall_s = time.perf_counter() - t0
    if cluster.ended_at is not None and cluster.ended_at < cluster.stats.window_start:
        warnings.warn(
            f"the run ended at {cluster.ended_at:.4g} s, when its last request finished, before its "
            f"warm-up did (run.warmup_s: {cluster.stats.window_start:.4g} s; 10 % of run.duration_s unless "
            "set): the steady window is empty, so its throughputs and latencies are NaN; set "
            "run.warmup_s=0 and run.cooldown_s=0 to measure over the whole busy period", stacklevel=2)
    requests_table = _table(cluster.request_records)
    steps_table = None if cluster.step_records is None else _table(cluster.step_records)
    # what the summary reads: a streamed table is read back only in the columns it needs
    requests = (requests_table.arrays(SUMMARY_COLUMNS) if isinstance(requests_table, Columns)
                else read_parquet_columns(requests_table, SUMMARY_COLUMNS))
    census = cluster.census()
    census["arrived_in_window"] = cluster.arrived_in_window
    census["waiting_in_window"] = cluster.waiting_in_window()
    policy = cluster.policies[0]
    num_steps = sum(e.step_index for e in cluster.engines)
    violations = check_run(
        _frame(requests_table), None if steps_table is None else _frame(steps_table), census,
        gamma=traces.gamma, max_tokens=scenario.cluster.max_batch_tokens, plain_decoding=not policy.drafts,
    ) if check else []
    extra = {
        **run_inputs_summary(scenario, policy, profile, traces),
        "engine_steps": num_steps,
        "prefill_mode": scenario.cluster.prefill.mode,
        "prefill_schedule": (scenario.cluster.prefill.schedule
                             if scenario.cluster.prefill.mode == "colocated" else "pool"),
        "cost": _cost_summary(scenario, profile, policy, requests),
        "ended": (
            {"at_s": cluster.ended_at, "why": "the last request finished before the horizon; "
             "throughput is over the busy period up to it"}
            if cluster.ended_at is not None else
            {"at_s": scenario.run.duration_s, "why": "the horizon; throughput is over the window"}
        ),
        "continuation_note": (
            "requests longer than their trace request continue on another trace request of the "
            "same domain (trace_switches counts them)"
        ),
    }
    if scenario.cluster.prefix_cache.enabled:
        caches = cluster.pool_caches or [e.cache for e in cluster.engines if e.cache is not None]
        extra["prefix_cache"] = {"where": "prefill pool" if cluster.pool_caches else "replicas",
                                 **prefix_cache_summary(caches)}
    summary = summarize(scenario, requests, cluster.stats, census, cluster.sampler.domains, extra,
                        gpus_per_replica=scenario.cluster.gpus_per_replica or profile.gpus_per_replica)
    return RunResult(scenario, summary, requests_table, steps_table, violations, wall_s, num_steps, tmp)


def _table(cols: Columns) -> Columns | Path:
    """Return a finished run's table: its columns, or the file it was streamed to (now complete)."""
    return cols.close() if isinstance(cols, ParquetColumns) else cols


@contextlib.contextmanager
def records_folder(out: Path) -> Iterator[Path]:
    """Yield a temporary folder beside the results folder `out` for a run to stream its tables
    into (`simulate`'s `records_dir`), removed on leaving; `write_results` links the files from it.

    One a killed run left beside `out` (its process gone) is removed first.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_orphans(out.parent, f".{out.name}.records-")
    with tempfile.TemporaryDirectory(prefix=owned_prefix(f".{out.name}.records-"), dir=out.parent) as name:
        yield Path(name)


def _bounded_by_drafter(scenario: Scenario, profile: Profile, traces: TraceSet) -> TraceSet:
    """Cut the traces to the positions the scenario's drafter drafts: a policy never verifies
    a position that was never drafted.

    `trace_block` defaults to the drafter's block (its card's `gamma`: a DSpark block, or γ
    for an MTP module; else its table's most positions); an explicit `trace_block` above it
    is an error naming both. A plain-decoding policy, or a profile without draft tables, keeps the traces' γ.
    """
    known = scenario.policy.drafter is None or scenario.policy.drafter in profile.drafters
    table = profile.drafter(scenario.policy.drafter) if profile.drafters and known else None
    name = table.name if table is not None else ""
    # the drafter's block as its card states it (a table may be profiled short of it, and
    # extrapolates with a warning), else the most positions its table holds
    block = ((profile.card.get("drafters") or {}).get(name) or {}).get("gamma") if table else None
    top = int(block) if block is not None else (table.max_positions if table is not None else None)
    plain = scenario.policy.name == "static" and scenario.policy.params.get("gamma") == 0
    if scenario.trace_block is not None:
        if top is not None and not plain and scenario.trace_block > top:
            raise ConfigError(
                f"trace_block={scenario.trace_block} is more than drafter {name!r} of "
                f"profile={scenario.profile!r} drafts ({top} positions): a policy cannot verify "
                f"a position that was never drafted; use trace_block <= {top}")
        return traces.truncated(scenario.trace_block)
    if top is not None and not plain and traces.gamma > top:
        return traces.truncated(top)  # the card records truncated_from_gamma
    return traces


def run_inputs_summary(scenario: Scenario, policy: Any, profile: Profile, traces: TraceSet) -> dict[str, Any]:
    """The summary's account of what was compared: the policy (with its drafter), the profile, the traces.

    Shared by simulated and live runs (`sparksim.live.run`), so both summaries read alike.
    """
    table = profile.drafter(scenario.policy.drafter) if policy.drafts and profile.drafters else None
    paid = table.name if table is not None else None
    # the drafter is part of what was compared: static γ = 1 is MTP-1 only on an MTP module,
    # so a static policy's label always names the drafter it paid for
    drafter = scenario.policy.drafter or (paid if policy.name == "static" else None)
    return {
        "policy_label": policy.label() + (f" · {drafter}" if drafter else ""),
        "lossless": bool(policy.lossless and not policy.upper_bound),
        "upper_bound": bool(policy.upper_bound),
        "policy_params": policy.params,
        "gamma": traces.gamma,
        "profile": {"name": profile.name, "source": profile.source, "lookup": profile.mode},
        "traces": {"name": traces.name, "source": str(traces.card.get("source", "unknown")),
                   **({"truncated_from_gamma": int(traces.card["truncated_from_gamma"])}
                      if "truncated_from_gamma" in traces.card else {})},
    }


def _cost_summary(scenario: Scenario, profile: Profile, policy: Any, requests: dict[str, NDArray[Any]]
                  ) -> dict[str, Any]:
    """What the run's steps paid for: the drafter, the KV model, the KV cache and its pressure."""
    table = profile.drafter(scenario.policy.drafter) if policy.drafts and profile.drafters else None
    capacity = kv_capacity_tokens(scenario, profile)
    cl, wl = scenario.cluster, scenario.workload
    asked = wl.concurrency if wl.kind == "closed" else None
    return {
        "drafter": None if table is None else {
            "name": table.name, "kind": table.kind, "layers": table.layers,
            "positions_drafted": drafted_positions(policy, profile, scenario.policy.drafter, policy.block),
        },
        "kv_model": profile.kv_model,
        "kv_capacity_tokens": capacity,
        "kv_capacity_source": (
            "card memory figures" if cl.kv_capacity_tokens == "auto" and capacity is not None
            else "unlimited (the card has no memory figures)" if cl.kv_capacity_tokens == "auto"
            else "scenario"),
        "preemptions": int(requests["preemptions"].sum()),
        "concurrency_asked": asked,
        "concurrency_capped": bool(asked is not None and asked > cl.max_concurrency * cl.replicas),
    }


def _clean(obj: Any) -> Any:
    """Make a summary JSON-safe: NaN and infinities become null; NumPy scalars become Python."""
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def summary_json(summary: dict[str, Any]) -> str:
    return json.dumps(_clean(summary), indent=2, sort_keys=False) + "\n"


def write_results(result: RunResult, out: Path, given: Sequence[str] | None = None) -> Path:
    """Write a results folder atomically: scenario.yaml, requests/steps parquet, summary.json,
    and `given` (the run's warnings, `run_warnings`) as warnings.json when it is passed."""
    with atomic_dir(out) as tmp:
        (tmp / "scenario.yaml").write_text(result.scenario.to_yaml())
        _write_table(result.requests_table, tmp / "requests.parquet")
        if result.steps_table is not None:
            _write_table(result.steps_table, tmp / "steps.parquet")
        (tmp / "summary.json").write_text(summary_json(result.summary))
        if given is not None:  # for `sparksim report`: what the terminal showed may be long gone
            (tmp / "warnings.json").write_text(json.dumps(list(given), indent=1) + "\n")
    return out


def _write_table(table: pd.DataFrame | Columns | Path, path: Path) -> None:
    """Write a table held in memory; link (else copy) one already streamed to a file."""
    if isinstance(table, Columns):
        table.write_parquet(path)  # the bytes `to_parquet` writes of its frame
        return
    if not isinstance(table, Path):
        table.to_parquet(path, index=False)
        return
    try:
        os.link(table, path)  # the same bytes: no need to write a long run's steps twice
    except OSError:
        shutil.copyfile(table, path)


def run_warnings(caught: Iterable[warnings.WarningMessage], summary: dict[str, Any]) -> list[str]:
    """Return what a run warned of, each message once, then the overload note when over
    UNFINISHED_SHARE of its steady window's arrivals were unfinished at the horizon."""
    from sparksim.sim.metrics import UNFINISHED_SHARE

    given = list(dict.fromkeys(str(w.message) for w in caught))
    arrived = summary["steady_requests"] + summary["steady_unfinished"]
    if arrived and summary["steady_unfinished"] > UNFINISHED_SHARE * arrived:
        given.append(
            f"{summary['steady_unfinished']} of {arrived} requests that arrived in the steady window were "
            "unfinished at the horizon (long requests, or an overloaded system); latency figures cover "
            "finished requests only and are optimistic: lengthen run.cooldown_s or run.duration_s, or "
            "lower the load")
    return given


def default_out_dir(scenario: Scenario) -> Path:
    """results/<scenario>-<policy>-seed<seed>/: one folder, whatever the policy's name holds (a
    plug-in `path/to/file.py:Class` is named by its class, `file.py` → `file-Class`)."""
    policy = scenario.policy.name
    if ":" in policy:
        where, _, cls = policy.rpartition(":")
        policy = f"{Path(where).stem if where.endswith('.py') else where.rsplit('.', 1)[-1]}-{cls}"
    name = re.sub(r"[^\w.+=-]+", "_", f"{scenario.name}-{policy}-seed{scenario.seed}")
    return Path("results") / name


def check_determinism(scenario: Scenario, base: Path | None, first: RunResult, strict: bool) -> list[str]:
    """INV-5: a second run of the same scenario gives byte-identical tables and summary."""
    second = simulate(scenario, base, strict=strict)
    out = []
    if summary_json(first.summary) != summary_json(second.summary):
        out.append("INV-5: summary.json differs between two runs of the same scenario and seed")
    if not first.requests.equals(second.requests):
        out.append("INV-5: requests table differs between two runs of the same scenario and seed")
    if first.steps is not None and second.steps is not None and not first.steps.equals(second.steps):
        out.append("INV-5: steps table differs between two runs of the same scenario and seed")
    return out


__all__ = [
    "InvariantError", "RunResult", "check_determinism", "default_out_dir", "load_inputs",
    "load_scenario", "records_folder", "simulate", "summary_json", "write_results",
]
