"""Workloads: when requests arrive, how long they are, and which trace requests they replay.

Pure functions over seeded NumPy generators; the SimPy processes that call them live in
`sparksim.sim.cluster`. Inter-arrival times follow vLLM `bench serve`'s conventions: Poisson
(exponential gaps) or Gamma with a coefficient of variation (`cv`; vLLM's `burstiness` is
the Gamma shape, so cv = 1/sqrt(burstiness)).
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from sparksim.config import MAX_RUN_REQUESTS
from sparksim.config_sections import LengthDist, PrefixConfig, WorkloadConfig
from sparksim.errors import ConfigError, FormatError
from sparksim.plain_csv import read_csv_columns, to_numeric
from sparksim.traces.format import TraceSet

MAX_REPLAY_ROWS = MAX_RUN_REQUESTS


@dataclass(slots=True)
class RequestSpec:
    """What a client sends: lengths, domain and the trace request to replay."""

    request_id: int
    arrival_at: float
    prompt_tokens: int
    output_tokens: int
    domain: int  # index into the run's domain list
    trace_request: int  # index of the trace request whose positions are replayed first
    user: int = -1
    prefix_group: int = -1  # the shared prefix its prompt opens with (-1: none)
    prefix_tokens: int = 0  # how many of its prompt tokens that prefix covers


class DomainSampler:
    """Draws a domain by the mix weights, then a trace request of that domain uniformly."""

    def __init__(self, traces: TraceSet, mix: dict[str, float]) -> None:
        present = set(traces.domains)
        weights = {d: w for d, w in mix.items() if w > 0}
        for dom in weights:
            if dom not in present:
                raise ConfigError(
                    f"workload.mix.{dom}={mix[dom]}: trace set {traces.name!r} has no requests "
                    f"of domain {dom!r} (it has {sorted(present)})"
                )
        self.domains: list[str] = sorted(present)
        self.by_domain: list[NDArray[np.int64]] = [traces.requests_in(d) for d in self.domains]
        p = np.array([weights.get(d, 0.0) for d in self.domains], dtype=np.float64)
        self.p = p / p.sum()
        self.cum_p = np.cumsum(self.p)
        self._cum_p = self.cum_p.tolist()  # the same floats, for a bisect per request

    def draw(self, rng: np.random.Generator) -> tuple[int, int]:
        """Return (domain index, trace request index)."""
        cum_p = self._cum_p
        dom = min(bisect.bisect_right(cum_p, rng.random() * cum_p[-1]), len(cum_p) - 1)
        pool = self.by_domain[dom]
        return dom, int(pool[rng.integers(pool.size)])

    def next_in_domain(self, rng: np.random.Generator, dom: int, current: int) -> int:
        """Return another trace request of `dom` than `current` (a continuation, never a loop)."""
        pool = self.by_domain[dom]
        if pool.size < 2:
            raise ConfigError(
                f"domain {self.domains[dom]!r} has a single trace request, so an output longer than "
                "it cannot continue on another one (a request is never looped); add trace requests "
                "or use workload.lengths.source=traces"
            )
        pick = int(pool[rng.integers(pool.size - 1)])
        return pick if pick != current else int(pool[-1])


class Streams(NamedTuple):
    """A run's random streams, one per subsystem, from its one seed (same seed, same streams)."""

    workload: np.random.Generator  # open-loop arrivals, lengths and domains
    traces: np.random.Generator  # which trace request a long request continues on
    users: list[np.random.Generator]  # closed loop: one per user, so runs of any policy are paired
    prefix: np.random.Generator  # open loop: which prefix group each request joins
    prefix_users: list[np.random.Generator]  # closed loop: the same, one per user


def seed_streams(seed: int, workload: WorkloadConfig) -> Streams:
    """Spawn a run's streams from its seed, as both engines do (`Cluster` and the live engine).

    `SeedSequence(seed).spawn(5)`: the workload's, one once meant for routing (both routers
    are deterministic; kept so that the other streams, and every run's results, stay as
    they were), the traces', the closed loop's users' (one child each), so user u's k-th
    request is the same whatever the policy, not drawn in the order requests finish, and
    the prefix groups' (one child per user in a closed loop), apart from the others so that
    declaring shared prefixes changes no request's lengths or domain (the first four
    children are the same whatever the count spawned).
    """
    seeds = np.random.SeedSequence(seed).spawn(5)
    users = workload.concurrency if workload.kind == "closed" else 0
    prefix_users = users if workload.prefix.tokens else 0
    return Streams(np.random.default_rng(seeds[0]), np.random.default_rng(seeds[2]),
                   [np.random.default_rng(s) for s in seeds[3].spawn(users)],
                   np.random.default_rng(seeds[4]),
                   [np.random.default_rng(s) for s in seeds[4].spawn(prefix_users)])


def prefix_of(rng: np.random.Generator, prefix: PrefixConfig, prompt_tokens: int) -> tuple[int, int]:
    """Draw a request's prefix group uniformly; return (group, shared tokens of its prompt)."""
    if not prefix.tokens:
        return -1, 0
    return int(rng.integers(prefix.groups)), min(prefix.tokens, prompt_tokens)


def lognormal_length(rng: np.random.Generator, dist: LengthDist) -> int:
    """Draw one length from a clipped lognormal."""
    return int(np.clip(round(float(rng.lognormal(dist.mu, dist.sigma))), dist.min, dist.max))


def interarrival_s(rng: np.random.Generator, cfg: WorkloadConfig) -> float:
    """Draw one inter-arrival gap (seconds) for an open-loop workload."""
    if cfg.kind == "poisson":
        return float(rng.exponential(1.0 / cfg.rate))
    shape = cfg.burstiness if cfg.burstiness is not None else 1.0 / cfg.cv**2
    return float(rng.gamma(shape, 1.0 / (cfg.rate * shape)))


def load_arrivals(path: Path, domains: list[str]) -> dict[str, NDArray[Any]]:
    """Read and validate an arrival CSV (`arrival_s, prompt_tokens, output_tokens[, domain]`).

    Returns its columns by name: the three lengths and times as float64, the prefix
    columns as int64, any other as read. A file is read once per process while it is
    unchanged (size and modification time): the runner validates it and the cluster
    replays it from the same columns (treat them as read-only).
    """
    try:
        st = Path(path).stat()
    except OSError as exc:
        raise FormatError(path, [f"cannot be read as CSV ({exc})"]) from None
    return _load_arrivals(str(Path(path).resolve()), st.st_mtime_ns, st.st_size,
                          tuple(sorted(domains)))


@functools.lru_cache(maxsize=8)
def _load_arrivals(path_str: str, mtime_ns: int, size: int, domains_key: tuple[str, ...]
                   ) -> dict[str, NDArray[Any]]:
    del mtime_ns, size  # part of the cache key only: a rewritten file is read again
    path = Path(path_str)
    domains = list(domains_key)
    try:
        cols = read_csv_columns(path, MAX_REPLAY_ROWS, text=("domain",))
    except (OSError, ValueError) as exc:  # pandas' ParserError, EmptyDataError, UnicodeDecodeError
        raise FormatError(path, [f"cannot be read as CSV ({exc})"]) from None
    rows = len(next(iter(cols.values()), []))
    problems: list[str] = []
    if rows > MAX_REPLAY_ROWS:
        problems.append(f"more than {MAX_REPLAY_ROWS} rows")
    for col in ("arrival_s", "prompt_tokens", "output_tokens"):
        if col not in cols:
            problems.append(f"missing column {col!r} (has {list(cols)})")
    if problems:
        raise FormatError(path, problems)
    if not rows:
        raise FormatError(path, ["no rows"])
    for col, low in (("arrival_s", 0.0), ("prompt_tokens", 1), ("output_tokens", 1)):
        vals = to_numeric(cols[col])
        counts = col != "arrival_s"  # token counts are whole numbers (a replay would cut 2.5 to 2)
        bad = ~np.isfinite(vals) | (vals < low) | (counts & (vals != np.round(vals)))
        if bad.any():
            row = int(np.argmax(bad))  # rows count from 1, as a person reads the CSV
            need = f"a whole number >= {low:g}" if counts else f">= {low:g}"
            problems.append(f"column {col!r} row {row + 1} is {cols[col][row]} (must be {need})")
        cols[col] = vals
    if not problems and (np.diff(cols["arrival_s"]) < 0).any():
        row = int(np.argmax(np.diff(cols["arrival_s"]) < 0)) + 2
        problems.append(f"column 'arrival_s' row {row} goes back in time (arrivals must be sorted)")
    if "domain" in cols:
        bad_dom = ~np.isin(cols["domain"].astype(str), domains)
        if bad_dom.any():
            row = int(np.argmax(bad_dom))
            problems.append(f"column 'domain' row {row + 1} is {cols['domain'][row]!r} "
                            f"(trace set has {domains})")
    if not problems:
        problems += _prefix_problems(cols)
    if problems:
        raise FormatError(path, problems)
    return cols


PREFIX_COLUMNS = ("prefix_group", "prefix_tokens")


def _prefix_problems(cols: dict[str, NDArray[Any]]) -> list[str]:
    """Check the optional prefix columns (both or neither): integer groups >= 0 and shared
    tokens in 0..the row's prompt_tokens; convert them to int64 in place."""
    given = [c for c in PREFIX_COLUMNS if c in cols]
    if not given:
        return []
    if len(given) == 1:
        missing = next(c for c in PREFIX_COLUMNS if c not in given)
        return [f"column {given[0]!r} needs column {missing!r} too (a prefix is a group and a length)"]
    problems = []
    prompt = cols["prompt_tokens"]
    for col in PREFIX_COLUMNS:
        vals = to_numeric(cols[col])
        high = prompt if col == "prefix_tokens" else np.inf
        bad = ~np.isfinite(vals) | (vals < 0) | (vals != np.round(vals)) | (vals > high)
        if bad.any():
            row = int(np.argmax(bad))
            bound = (f"an integer in 0..prompt_tokens={prompt[row]:g}" if col == "prefix_tokens"
                     else "an integer >= 0")
            problems.append(f"column {col!r} row {row + 1} is {cols[col][row]} (must be {bound})")
        else:
            cols[col] = vals.astype(np.int64)
    return problems
