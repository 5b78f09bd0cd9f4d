"""Prefix caching: shared prompt prefixes are prefilled once per replica and kept LRU.

Why: a serving comparison under a workload with shared system prompts is off by the whole
prefill of the shared part when the simulator recomputes it, and off the other way when it
keeps every prefix forever. These tests hold the cache to closed forms (every request after
the first skips the prefix), to an eviction order one can follow by hand, to the replay
columns' validation, and to leaving every run byte-identical while it is off.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from sparksim.config import parse_scenario, scenario_problems
from sparksim.errors import ConfigError, FormatError
from sparksim.sim.prefix_cache import PrefixCache
from sparksim.sim.runner import RunResult, load_scenario, simulate, summary_json, write_results
from sparksim.sim.workload import load_arrivals, seed_streams

BLOCK = 16


def _replay(tmp_path: Path, prompts: list[int], groups: list[int], shared: list[int],
            output: int = 4, gap_s: float = 1.0) -> Path:
    """Write an arrival CSV of requests `gap_s` apart (each finishes long before the next)."""
    path = tmp_path / "arrivals.csv"
    pd.DataFrame({"arrival_s": np.arange(len(prompts)) * gap_s, "prompt_tokens": prompts,
                  "output_tokens": output, "prefix_group": groups, "prefix_tokens": shared}
                 ).to_csv(path, index=False)
    return path


def _run(profile: Path, traces: Path, sets: list[str], policy: str = "static:gamma=0") -> RunResult:
    sc, base = load_scenario(None, [f"profile={profile}", f"traces={traces}", *sets], policy)
    return simulate(sc, base)


def _replay_sets(csv: Path, mode: str) -> list[str]:
    prefill = {"chunked": ["cluster.prefill.mode=colocated"],
               "prefill-first": ["cluster.prefill.mode=colocated", "cluster.prefill.schedule=prefill-first"],
               "pool": []}[mode]
    return ["workload.kind=replay", f"workload.arrivals_csv={csv}", "run.duration_s=100",
            "cluster.kv_capacity_tokens=unlimited", "cluster.prefix_cache.enabled=true", *prefill]


# --------------------------------------------------------------------------- (a) closed forms


@pytest.mark.parametrize("mode", ["chunked", "prefill-first", "pool"])
def test_every_request_after_the_first_skips_a_shared_block_aligned_prefix(
        tmp_path: Path, flat_profile: Path, traces_07: Path, mode: str) -> None:
    # One group, P = 256 tokens (16 full blocks), never evicted: the first prompt misses and
    # caches it, each later one finds all of it. The first prompt spans two 2048-token chunks.
    p = 256
    prompts = [3000, 300, 257, 1000, 512, 4000]
    csv = _replay(tmp_path, prompts, [0] * 6, [p] * 6)
    res = _run(flat_profile, traces_07, _replay_sets(csv, mode))
    pc = res.summary["prefix_cache"]
    n, total = len(prompts), sum(prompts)
    assert pc["prompt_tokens"] == total
    assert pc["cached_prompt_tokens"] == (n - 1) * p
    assert pc["hit_rate"] == (n - 1) * p / total
    assert pc["prefill_tokens_saved"] == (n - 1) * p and pc["evicted_blocks"] == 0
    assert pc["where"] == ("prefill pool" if mode == "pool" else "replicas")
    if mode != "pool":  # the engine's own record of what it prefilled
        assert res.steps is not None
        assert int(res.steps["prefill_tokens"].sum()) == total - (n - 1) * p


def test_attention_still_reads_the_cached_tokens_as_context(
        tmp_path: Path, flat_profile: Path, traces_07: Path) -> None:
    # Skipping the prefix's compute must not shrink any request's KV: every decode step holds
    # the same contexts with the cache on as off.
    csv = _replay(tmp_path, [300, 400, 500], [0, 0, 0], [256] * 3)
    on = _run(flat_profile, traces_07, _replay_sets(csv, "chunked"))
    off = _run(flat_profile, traces_07, [s for s in _replay_sets(csv, "chunked") if "prefix_cache" not in s])
    assert on.steps is not None and off.steps is not None
    decode = [sorted(r.steps.loc[r.steps["num_requests"] > 0, "kv_tokens"]) for r in (on, off)]
    assert decode[0] == decode[1]
    assert off.steps["prefill_tokens"].sum() - on.steps["prefill_tokens"].sum() == 2 * 256


def test_a_fully_cached_prompt_still_computes_its_last_block(
        tmp_path: Path, flat_profile: Path, traces_07: Path) -> None:
    # A prompt that is all prefix finds at most prompt - 1 tokens, in whole blocks (vLLM
    # recomputes the last block for the logits of the first token): 64 → 48 cached, 70 → 64.
    csv = _replay(tmp_path, [64, 64, 70], [0, 0, 0], [64, 64, 64])
    res = _run(flat_profile, traces_07, _replay_sets(csv, "chunked"))
    assert res.summary["prefix_cache"]["cached_prompt_tokens"] == 48 + 64


def test_a_prompt_shorter_than_its_groups_prefix_shares_its_own_full_blocks(
        tmp_path: Path, flat_profile: Path, traces_07: Path) -> None:
    # Generated prefixes cover min(tokens, prompt); only full blocks are cached.
    csv = _replay(tmp_path, [500, 100, 500], [0, 0, 0], [300, 100, 300])
    res = _run(flat_profile, traces_07, _replay_sets(csv, "chunked"))
    # 2nd: 99 usable → 6 blocks; 3rd: 300 → 18 blocks, cached by the 1st
    assert res.summary["prefix_cache"]["cached_prompt_tokens"] == 6 * BLOCK + 18 * BLOCK


def test_generated_groups_are_drawn_from_the_prefix_stream_and_hit_after_their_first_request(
        flat_profile: Path, traces_07: Path) -> None:
    # One user (strictly one request at a time), unlimited KV: a request misses only when its
    # group is new, so cached tokens = (requests - groups seen) · P; the groups come from the
    # seed's own prefix stream, apart from the user's lengths and domains.
    p, groups = 160, 5
    sets = ["workload.concurrency=1", "run.duration_s=30", "cluster.prefill.mode=colocated",
            "cluster.kv_capacity_tokens=unlimited", "workload.lengths.source=lognormal",
            "workload.lengths.prompt.min=200", "cluster.prefix_cache.enabled=true",
            f"workload.prefix.tokens={p}", f"workload.prefix.groups={groups}"]
    res = _run(flat_profile, traces_07, sets)
    arrived = res.summary["census"]["arrived"]
    sc = parse_scenario({"cluster": {"prefix_cache": {"enabled": True}},
                         "workload": {"concurrency": 1, "prefix": {"tokens": p}}})
    rng = seed_streams(sc.seed, sc.workload).prefix_users[0]
    seen = len({int(rng.integers(groups)) for _ in range(arrived)})
    assert 1 < seen <= groups
    assert res.summary["prefix_cache"]["cached_prompt_tokens"] == (arrived - seen) * p
    # declaring prefixes draws no request differently: the same lengths and domains as off
    off = _run(flat_profile, traces_07, [s for s in sets if "prefix" not in s])
    cols = ["request_id", "prompt_tokens", "output_tokens", "domain", "trace_request"]
    k = min(len(res.requests), len(off.requests))
    pd.testing.assert_frame_equal(res.requests[cols].sort_values("request_id").head(k).reset_index(drop=True),
                                  off.requests[cols].sort_values("request_id").head(k).reset_index(drop=True))


# --------------------------------------------------------------------------- (b) eviction


def test_groups_evict_each_other_least_recently_freed_first(
        tmp_path: Path, flat_profile: Path, traces_07: Path) -> None:
    # Prompts of 200 tokens with a 160-token (10-block) prefix, 4 outputs, plain decoding
    # (1 slot reserved), one at a time. Capacity 372: while a request holds its ≤ 204 tokens
    # the free space keeps 168 tokens, one other group's 10 blocks; idle, two groups fit.
    # A, B, A: B keeps A; A hits. C: A and B both cached, one must go: B was freed before A,
    # so B goes (insertion order would evict A). B misses; A goes (freed before C). C hits.
    groups = [0, 1, 0, 2, 1, 2]
    csv = _replay(tmp_path, [200] * 6, groups, [160] * 6)
    sets = [*_replay_sets(csv, "chunked"), "cluster.kv_capacity_tokens=372"]
    res = _run(flat_profile, traces_07, sets)
    assert res.steps is not None
    prefilled = res.steps.loc[res.steps["prefill_tokens"] > 0, "prefill_tokens"].tolist()
    assert prefilled == [200, 200, 40, 200, 200, 40]
    pc = res.summary["prefix_cache"]
    assert pc["cached_prompt_tokens"] == 2 * 160 and pc["evicted_blocks"] == 20
    assert res.summary["cost"]["preemptions"] == 0


def test_a_cache_without_room_for_another_group_keeps_only_the_last_one(
        tmp_path: Path, flat_profile: Path, traces_07: Path) -> None:
    # Capacity 210: a running request leaves under one block free, so a new group evicts the
    # whole cached one; a request of the group just served hits.
    groups = [0, 1, 0, 0, 1, 1]
    csv = _replay(tmp_path, [200] * 6, groups, [160] * 6)
    res = _run(flat_profile, traces_07, [*_replay_sets(csv, "chunked"), "cluster.kv_capacity_tokens=210"])
    assert res.steps is not None
    prefilled = res.steps.loc[res.steps["prefill_tokens"] > 0, "prefill_tokens"].tolist()
    assert prefilled == [200, 200, 200, 40, 200, 40]


def test_shared_blocks_are_counted_once_in_the_kv_cache(
        tmp_path: Path, flat_profile: Path, traces_07: Path) -> None:
    # Two requests at once, the second on the first's cached 160-token prefix, in 380 KV
    # slots: the first holds about 205 tokens when the second arrives; 205 + 200 + 2 reserved
    # does not fit, 205 + 40 + 2 does. Counted per request, the second would wait for the
    # first to finish.
    csv = _replay(tmp_path, [200, 200], [0, 0], [160, 160], output=20, gap_s=0.05)
    sets = [*_replay_sets(csv, "chunked"), "cluster.kv_capacity_tokens=380"]
    res = _run(flat_profile, traces_07, sets)
    req = res.requests.sort_values("request_id")
    first, second = req.iloc[0], req.iloc[1]
    assert second["first_token_at"] < first["finish_at"]  # ran alongside, not after
    assert res.summary["prefix_cache"]["cached_prompt_tokens"] == 160


def test_eviction_takes_the_oldest_tail_first_and_never_a_pinned_block() -> None:
    cache = PrefixCache(BLOCK)
    for group, blocks in ((0, 4), (1, 3)):
        cache.extend(group, 0, blocks)  # a request computes and caches them
    cache.acquire(2, 0)
    cache.extend(2, 0, 2)  # group 2 stays referenced
    assert cache.release(0, 4) == 4 and cache.release(1, 3) == 3  # 0 freed before 1
    assert cache.evict(5) == 5
    assert cache.cached == {1: 2, 2: 2}  # all of 0, then 1's tail
    assert cache.evict(10) == 2 and cache.cached == {2: 2}  # group 2 is pinned
    assert cache.lookup(2, 100, 1000) == 2 and cache.lookup(2, 100, 17) == 1


# --------------------------------------------------------------------------- (c) replay columns


def test_replay_prefix_columns_are_read_as_integers(tmp_path: Path) -> None:
    csv = _replay(tmp_path, [100, 200], [3, 0], [50, 0])
    df = load_arrivals(csv, ["chat", "code", "math"])
    assert df["prefix_group"].tolist() == [3, 0] and df["prefix_tokens"].dtype == np.int64


@pytest.mark.parametrize(("column", "values", "says"), [
    ("prefix_tokens", [10, 20, 301], "column 'prefix_tokens' row 3 is 301 (must be an integer in 0..prompt_tokens=300)"),
    ("prefix_tokens", [10, -1, 5], "column 'prefix_tokens' row 2 is -1"),
    ("prefix_group", [0, 1.5, 2], "column 'prefix_group' row 2 is 1.5 (must be an integer >= 0)"),
    ("prefix_group", [0, 1, "x"], "column 'prefix_group' row 3 is x"),
])
def test_a_bad_replay_prefix_names_the_file_column_and_row(
        tmp_path: Path, column: str, values: list[Any], says: str) -> None:
    path = tmp_path / "bad.csv"
    df = pd.DataFrame({"arrival_s": [0.0, 1.0, 2.0], "prompt_tokens": [100, 200, 300], "output_tokens": 5,
                       "prefix_group": [0, 0, 0], "prefix_tokens": [10, 10, 10]})
    df[column] = pd.Series(values, dtype=object)
    df.to_csv(path, index=False)
    with pytest.raises(FormatError) as err:
        load_arrivals(path, ["math"])
    assert str(path) in str(err.value) and says in str(err.value)


def test_a_replay_prefix_needs_both_columns(tmp_path: Path) -> None:
    path = tmp_path / "half.csv"
    pd.DataFrame({"arrival_s": [0.0], "prompt_tokens": [100], "output_tokens": [5],
                  "prefix_group": [1]}).to_csv(path, index=False)
    with pytest.raises(FormatError, match="'prefix_group' needs column 'prefix_tokens'"):
        load_arrivals(path, ["math"])


# --------------------------------------------------------------------------- (d) off by default


def test_off_by_default_and_an_explicitly_disabled_cache_changes_nothing(
        tmp_path: Path, flat_profile: Path, traces_07: Path) -> None:
    sets = ["run.duration_s=4", "cluster.prefill.mode=colocated", "workload.concurrency=16"]
    plain = _run(flat_profile, traces_07, sets, "two-step")
    off = _run(flat_profile, traces_07, [*sets, "cluster.prefix_cache.enabled=false"], "two-step")
    assert "prefix_cache" not in plain.summary
    assert summary_json(plain.summary) == summary_json(off.summary)
    assert plain.requests.equals(off.requests)
    write_results(plain, tmp_path / "a")
    write_results(off, tmp_path / "b")
    for name in ("scenario.yaml", "summary.json", "steps.parquet", "requests.parquet"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert "prefix_cache" not in (tmp_path / "a" / "scenario.yaml").read_text()
    on = json.loads(summary_json(_run(flat_profile, traces_07, [
        *sets, "cluster.prefix_cache.enabled=true", "workload.prefix.tokens=64"], "two-step").summary))
    assert on["prefix_cache"]["hit_rate"] > 0


def test_a_closed_loop_with_the_cache_on_and_no_prefix_declared_runs_and_caches_nothing(
        flat_profile: Path, traces_07: Path) -> None:
    # The runner only warns that nothing is cached (no prefix: workload.prefix.tokens = 0, the
    # default); the closed loop's users have no prefix streams then, and must not need one.
    sets = ["run.duration_s=4", "cluster.prefill.mode=colocated", "workload.concurrency=8"]
    off = _run(flat_profile, traces_07, sets, "two-step")
    with pytest.warns(UserWarning, match="nothing is"):
        on = _run(flat_profile, traces_07, [*sets, "cluster.prefix_cache.enabled=true"], "two-step")
    assert on.summary["prefix_cache"]["hit_rate"] == 0
    assert on.requests.equals(off.requests)


@pytest.mark.parametrize(("given", "reason"), [
    ({"workload": {"prefix": {"tokens": 512}}},
     "workload.prefix: cluster.prefix_cache.enabled=false does not read it "
     "(read when cluster.prefix_cache.enabled is true)"),
    ({"cluster": {"prefix_cache": {"block_tokens": 32}}}, "cluster.prefix_cache.block_tokens=32"),
    ({"cluster": {"prefix_cache": {"enabled": True}},
      "workload": {"kind": "replay", "arrivals_csv": "a.csv", "prefix": {"groups": 4}}},
     "workload.prefix: workload.kind=replay does not read it"),
])
def test_prefix_keys_a_run_would_not_read_are_errors(given: dict, reason: str) -> None:
    problems = scenario_problems(given)
    assert len(problems) == 1 and reason in problems[0], problems


def test_switching_the_cache_off_drops_the_files_own_prefix_keys(tmp_path: Path) -> None:
    # a sweep over cluster.prefix_cache.enabled on a file that declares prefixes
    f = tmp_path / "s.yaml"
    f.write_text("cluster: {prefix_cache: {enabled: true, block_tokens: 32}}\nworkload: {prefix: {tokens: 100}}\n")
    sc, _ = load_scenario(f, ["cluster.prefix_cache.enabled=false"])
    assert not sc.cluster.prefix_cache.enabled
    with pytest.raises(ConfigError, match=r"workload\.prefix"):
        load_scenario(None, ["workload.prefix.tokens=100"])
