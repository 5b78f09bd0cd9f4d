"""Run a scenario on the live engine and summarise it exactly as the simulator summarises a run.

The scenario, profile and trace set are the simulator's: the profile prices the policies'
decisions (it should be this engine's own, measured with `sparksim live profile`), the trace
set supplies the request mix and its prompts (the file it was recorded on), its temperature
and its response cap. The result is a `RunResult`, so `write_results`, `sparksim plot` and the
comparisons read a live run as they read a simulated one.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from sparksim.config import Scenario, resolve_path
from sparksim.errors import ConfigError
from sparksim.live.engine import LiveEngine, LiveModels, Progress
from sparksim.policies import make_policy
from sparksim.sim.metrics import summarize
from sparksim.sim.runner import RunResult, load_inputs, run_inputs_summary
from sparksim.traces.format import TraceSet

LIVE_SCENARIO = {  # what the live engine implements; `sparksim live` sets these
    "cluster.prefill.mode": "colocated",
    "cluster.prefill.schedule": "prefill-first",
    "cluster.replicas": 1,
    "cluster.kv_capacity_tokens": "unlimited",
}


def read_prompt_ids(path: Path, tokenizer_name: str = "bytes-v1") -> list[list[int]]:
    """Encode every prompt of a .jsonl prompt file; an error names the line it cannot take."""
    from sparksim.drafter.data import json_lines
    from sparksim.drafter.tokenizer import get_tokenizer

    tok = get_tokenizer(tokenizer_name)
    out: list[list[int]] = []
    for no, rec in json_lines(path):
        prompt = rec.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise ConfigError(f"{path}:{no}: key 'prompt' is missing or not a non-empty string")
        try:
            out.append(tok.encode(prompt))
        except UnicodeEncodeError as exc:
            raise ConfigError(f"{path}:{no}: the prompt holds characters the {tokenizer_name} tokenizer "
                              f"cannot encode ({exc.reason} at character {exc.start})") from None
    if not out:
        raise ConfigError(f"{path}: holds no prompts")
    return out


def trace_prompts(traces: TraceSet, prompts: Path | None) -> tuple[list[list[int]], Path]:
    """The prompts the trace set was recorded on, checked against its requests' prompt lengths."""
    raw = (traces.card.get("data") or {}).get("prompts")
    if prompts is None and not raw:
        raise ConfigError(f"trace set {traces.name!r} names no prompt file (card data.prompts); pass --prompts")
    path = prompts or resolve_path(str(raw))  # a relative path: from here, else from the repository
    ids = read_prompt_ids(path)
    want = traces.requests["prompt_tokens"].tolist()
    if [len(p) for p in ids] != want:
        raise ConfigError(f"{path}: its {len(ids)} prompts are not the ones trace set {traces.name!r} was "
                          f"recorded on ({len(want)} requests; prompt lengths differ)")
    return ids, path


def live_simulate(scenario: Scenario, base: Path | None, *, target: Path, drafter: Path | None,
                  prompts: Path | None = None, temperature: float | None = None, threads: int = 1,
                  progress: Progress | None = None) -> RunResult:
    """Serve `scenario` on the live engine for its duration; return its records and summary."""
    profile, traces, _ = load_inputs(scenario, base)
    policy = make_policy(scenario.policy.name, traces.gamma, scenario.policy.params)
    ids, prompt_path = trace_prompts(traces, prompts)
    data = traces.card.get("data", {})
    temp = float(traces.card.get("temperature", 1.0)) if temperature is None else temperature
    max_new = int(data.get("max_new_tokens", 256))
    models = LiveModels.load(target, drafter if policy.drafts else None)
    if threads:
        torch.set_num_threads(threads)
    engine = LiveEngine(scenario, models, policy, profile, traces, ids, temperature=temp,
                        max_new_tokens=max_new, progress=progress)
    t0 = time.perf_counter()
    engine.run()
    wall_s = time.perf_counter() - t0
    requests = engine.request_records.to_frame()
    steps = engine.step_records.to_frame()
    census = engine.census()
    census["arrived_in_window"] = engine.arrived_in_window
    census["waiting_in_window"] = sum(engine.stats.in_window(r.arrival_at) for r in engine.waiting)
    extra: dict[str, Any] = {
        **run_inputs_summary(scenario, policy, profile, traces),
        "engine_steps": engine.step_index,
        "prefill_mode": "colocated",
        "prefill_schedule": "prefill-first",
        "engine": "live",
        "live": {**models.info, "prompts": str(prompt_path), "temperature": temp,
                 "max_new_tokens": max_new, "threads": torch.get_num_threads(),
                 "positions_drafted": engine.positions, "torch": torch.__version__},
        "ended": ({"at_s": engine.ended_at, "why": "the last request finished before the horizon"}
                  if engine.ended_at is not None else
                  {"at_s": scenario.run.duration_s, "why": "the horizon; throughput is over the window"}),
    }
    summary = summarize(scenario, requests, engine.stats, census, engine.sampler.domains, extra,
                        gpus_per_replica=1)
    return RunResult(scenario, summary, requests, pd.DataFrame(steps), [], wall_s, engine.step_index)
