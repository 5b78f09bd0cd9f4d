"""DeepSpec's evaluation prompts: its nine sets with eval.py's caps, prompt files, and the calibration split."""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparksim.drafter.data import json_lines
from sparksim.errors import ConfigError

PAPER_TASKS = (("gsm8k", 500, "math"), ("math500", 500, "math"), ("aime25", 30, "math"),
               ("humaneval", 164, "code"), ("mbpp", 256, "code"), ("livecodebench", 500, "code"),
               ("mt-bench", 80, "chat"), ("alpaca", 500, "chat"), ("arena-hard-v2", 500, "chat"))
DOMAIN_OF = {"gsm8k": "math", "math500": "math", "aime24": "math", "aime25": "math", "humaneval": "code",
             "mbpp": "code", "livecodebench": "code", "lbpp": "code", "swe-bench": "code",
             "mt-bench": "chat", "alpaca": "chat", "arena-hard-v2": "chat"}
PAPER_SELECTION_SEED = 980406  # DeepSpec eval.py's seed: which prompts a capped set keeps


@dataclass(frozen=True)
class EvalItem:
    """One prompt: its dataset, domain, line number and text."""

    dataset: str
    domain: str
    line: int
    text: str
    chat: bool = True  # a user turn for the chat template (DeepSpec `turns`); False: already formatted text

    @property
    def key(self) -> str:
        return f"{self.dataset}/{self.line}"


def _first_turn(row: dict[str, Any], where: str) -> str:
    turns = row.get("turns")
    if not (isinstance(turns, list) and turns and isinstance(turns[0], str)):
        raise ConfigError(f"{where}: needs a non-empty string list 'turns'")
    return turns[0]


def parse_task(spec: str) -> tuple[str, int | None, str]:
    """Parse NAME[:CAP[:DOMAIN]] (CAP 0 or empty = all rows); the domain defaults to DeepSpec's grouping."""
    parts = spec.split(":")
    name = parts[0]
    try:
        cap = int(parts[1]) if len(parts) > 1 and parts[1] else None
    except ValueError:
        raise ConfigError(f"--tasks {spec!r}: CAP {parts[1]!r} is not an integer") from None
    domain = parts[2] if len(parts) > 2 else DOMAIN_OF.get(name)
    if not name or domain is None or len(parts) > 3:
        raise ConfigError(f"--tasks {spec!r}: use NAME[:CAP[:DOMAIN]] (domain needed for unknown set {name!r})")
    return name, cap or None, domain


def load_eval_items(eval_dir: Path, tasks: Sequence[tuple[str, int | None, str]],
                    selection_seed: int = PAPER_SELECTION_SEED) -> list[EvalItem]:
    """Read DeepSpec's `eval_datasets/<name>.jsonl` rows ({"turns": [...]}, first turn only), capped as its eval.py.

    A set longer than its cap keeps the first CAP rows after a shuffle by random.Random(selection_seed):
    the prompts DeepSpec's evaluation uses.
    """
    items: list[EvalItem] = []
    for name, cap, domain in tasks:
        file = eval_dir / f"{name}.jsonl"
        rows = [EvalItem(name, domain, n, _first_turn(row, f"{file}:{n}")) for n, row in json_lines(file)]
        if cap is not None and len(rows) > cap:
            random.Random(selection_seed).shuffle(rows)
            rows = rows[:cap]
        items.extend(rows)
    return items


def load_prompt_file(path: Path) -> list[EvalItem]:
    """Read a prompt file: rows with `turns` (chat, as DeepSpec's sets) or `prompt` (formatted text, as sparksim's).

    The domain is the row's `domain`, else DeepSpec's grouping of the row's `dataset` (default: the file name).
    """
    items = []
    for n, row in json_lines(path):
        dataset = str(row.get("dataset") or path.stem)
        domain = row.get("domain") or DOMAIN_OF.get(dataset)
        if not domain:
            raise ConfigError(f"{path}:{n}: no 'domain' (and {dataset!r} is not one of DeepSpec's sets)")
        if "turns" in row:
            items.append(EvalItem(dataset, str(domain), n, _first_turn(row, f"{path}:{n}")))
        elif isinstance(row.get("prompt"), str):
            items.append(EvalItem(dataset, str(domain), n, row["prompt"], chat=False))
        else:
            raise ConfigError(f"{path}:{n}: needs 'turns' (a chat turn list) or 'prompt' (a string)")
    if not items:
        raise ConfigError(f"{path}: no prompts")
    return items


def in_calibration_split(item: EvalItem, fraction: float) -> bool:
    """Return True for the held-out share `fraction` of items STS is fitted on (stable hash of the key)."""
    return zlib.crc32(item.key.encode()) % 10_000 < round(fraction * 10_000)

