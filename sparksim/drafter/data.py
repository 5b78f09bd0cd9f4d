"""Three training domains built at run time from this machine: math, code and chat.

- math: arithmetic and word problems generated from a seed, with worked solutions;
- code: functions and classes from the installed Python standard library's source;
- chat: English prose from the standard library's docstrings and pydoc's topic texts.

Every item is a (prompt, reference) pair in one chat layout, `User: …\\nAssistant: …`.
Items are split train/val/test by a stable hash of their key, so the splits never overlap
and do not depend on the order files are found in.
"""

from __future__ import annotations

import ast
import json
import random
import sysconfig
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparksim.atomic import write_text
from sparksim.errors import ConfigError

DOMAINS = ("math", "code", "chat")
SPLITS = ("train", "val", "test")
MAX_REFERENCE_CHARS = 1200  # long enough for a 256-token response; keeps documents short


@dataclass(frozen=True)
class Item:
    """One prompt and its reference response in one domain."""

    key: str
    domain: str
    prompt: str
    reference: str

    def document(self) -> str:
        """Return the full training text: prompt followed by the reference response."""
        return self.prompt + self.reference


def chat_prompt(user: str) -> str:
    """Return the chat layout's prompt for a user turn; the response follows it directly."""
    return f"User: {user}\nAssistant: "


def split_of(key: str) -> str:
    """Return the split of an item key: 80 % train, 10 % val, 10 % test, by CRC32."""
    h = zlib.crc32(key.encode()) % 10
    return "train" if h < 8 else ("val" if h == 8 else "test")


# --------------------------------------------------------------------------- math

_NAMES = ["Ann", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jill", "Kai", "Lena"]
_THINGS = ["apples", "books", "coins", "marbles", "pencils", "stamps", "cards", "shells"]


def _math_item(rng: random.Random, key: str) -> Item:
    kind = rng.randrange(5)
    name, thing = rng.choice(_NAMES), rng.choice(_THINGS)
    if kind == 0:
        a, b, c = rng.randint(10, 99), rng.randint(10, 99), rng.randint(2, 60)
        s = a + b
        q = f"Compute {a} + {b} - {c}."
        sol = f"First, {a} + {b} = {s}. Then {s} - {c} = {s - c}. The answer is {s - c}."
    elif kind == 1:
        a, b = rng.randint(11, 99), rng.randint(11, 99)
        t, u = (b // 10) * 10, b % 10
        q = f"What is {a} * {b}?"
        sol = (f"Split {b} into {t} + {u}. {a} * {t} = {a * t}. {a} * {u} = {a * u}. "
               f"{a * t} + {a * u} = {a * b}. The answer is {a * b}.")
    elif kind == 2:
        have, bags, per = rng.randint(2, 40), rng.randint(2, 9), rng.randint(2, 12)
        q = (f"{name} has {have} {thing}. {name} buys {bags} bags with {per} {thing} in each bag. "
             f"How many {thing} does {name} have now?")
        sol = (f"Each bag holds {per} {thing}, so {bags} bags hold {bags} * {per} = {bags * per} {thing}. "
               f"{name} now has {have} + {bags * per} = {have + bags * per} {thing}. "
               f"The answer is {have + bags * per}.")
    elif kind == 3:
        per, n = rng.randint(2, 12), rng.randint(2, 12)
        total = per * n
        q = f"{name} shares {total} {thing} equally among {n} friends. How many {thing} does each friend get?"
        sol = f"Each friend gets {total} / {n} = {per} {thing}. The answer is {per}."
    else:
        price, qty, paid = rng.randint(2, 20), rng.randint(2, 9), 0
        cost = price * qty
        paid = cost + rng.randint(1, 50)
        q = (f"{name} buys {qty} {thing} at {price} dollars each and pays with {paid} dollars. "
             "How much change does " + name + " get?")
        sol = (f"The {thing} cost {qty} * {price} = {cost} dollars. The change is "
               f"{paid} - {cost} = {paid - cost} dollars. The answer is {paid - cost}.")
    return Item(key, "math", chat_prompt(q), sol)


def math_items(split: str, n: int, seed: int) -> list[Item]:
    """Return `n` generated math items for `split`; each split draws from its own seed stream."""
    rng = random.Random(f"math-{split}-{seed}")
    return [_math_item(rng, f"math/{split}/{i}") for i in range(n)]


# --------------------------------------------------------------------------- code and chat

def stdlib_dir() -> Path:
    """Return the directory of the installed Python standard library's source."""
    return Path(sysconfig.get_paths()["stdlib"])


def _stdlib_files(limit: int | None) -> list[Path]:
    root = stdlib_dir()
    files = sorted(p for p in root.rglob("*.py")
                   if "site-packages" not in p.parts and "test" not in p.parts
                   and "tests" not in p.parts and "idlelib" not in p.parts)
    return files[:limit] if limit is not None else files


def _clean_doc(doc: str) -> str:
    return "\n".join(line.rstrip() for line in doc.strip().splitlines())[:MAX_REFERENCE_CHARS]


def source_items(limit_files: int | None = None) -> Iterator[Item]:
    """Yield code and chat items from the standard library's functions, classes and docstrings."""
    root = stdlib_dir()
    for path in _stdlib_files(limit_files):
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        lines = text.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.ClassDef):
                continue
            doc = ast.get_docstring(node)
            if doc and len(doc) >= 120:
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                yield Item(f"chat/{module}.{node.name}", "chat",
                           chat_prompt(f"What does the {kind} {node.name} in the Python module {module} do?"),
                           _clean_doc(doc))
            end = node.end_lineno or node.lineno
            if end - node.lineno < 4:
                continue
            src = "\n".join(lines[node.lineno - 1:end])
            head, _, body = src.partition("\n")
            if len(body) < 80:
                continue
            yield Item(f"code/{module}.{node.name}.{node.lineno}", "code",
                       chat_prompt(f"Complete this code from the Python module {module}.\n{head}"),
                       body[:MAX_REFERENCE_CHARS])


def topic_items() -> Iterator[Item]:
    """Yield chat items from pydoc's topic texts (the language reference, in English prose)."""
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions strip pydoc_data; the docstrings still suffice
        return
    for name, text in sorted(topics.items()):
        body = _clean_doc(text)
        if len(body) >= 200:
            yield Item(f"chat/topic/{name}", "chat",
                       chat_prompt(f"Explain the Python topic '{name}'."), body)


def build_items(seed: int, *, math_per_split: dict[str, int] | None = None,
                limit_files: int | None = None) -> dict[str, dict[str, list[Item]]]:
    """Return items by split and domain: {split: {domain: [Item, …]}}, deterministic for `seed`."""
    math_n = math_per_split or {"train": 20000, "val": 400, "test": 400}
    out: dict[str, dict[str, list[Item]]] = {s: {d: [] for d in DOMAINS} for s in SPLITS}
    for split in SPLITS:
        out[split]["math"] = math_items(split, math_n[split], seed)
    seen: set[str] = set()
    for item in [*source_items(limit_files), *topic_items()]:
        if item.key in seen:
            continue
        seen.add(item.key)
        out[split_of(item.key)][item.domain].append(item)
    for split in SPLITS:
        for domain in ("code", "chat"):
            random.Random(f"{domain}-{split}-{seed}").shuffle(out[split][domain])
    return out


# --------------------------------------------------------------------------- prompt files

def write_prompts(path: Path, items: list[Item]) -> None:
    """Write items as a prompt file: one JSON object per line with key, domain, prompt, reference."""
    lines = [json.dumps({"key": it.key, "domain": it.domain, "prompt": it.prompt,
                         "reference": it.reference}) for it in items]
    write_text(path, "\n".join(lines) + "\n")


def json_lines(path: Path, what: str = "prompt file") -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number from 1, object) for every non-blank line of a JSON Lines file.

    Errors name the file and the line. Bytes that are not UTF-8 are kept as surrogates, so a
    caller that encodes the text can name the line it cannot take.
    """
    if not path.is_file():
        raise ConfigError(f"{path}: {what} is missing")
    for no, line in enumerate(path.read_text(encoding="utf-8", errors="surrogateescape").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{no}: not valid JSON ({exc.msg})") from None
        if not isinstance(rec, dict):
            raise ConfigError(f"{path}:{no}: each line must be a JSON object")
        yield no, rec


def read_prompts(path: Path) -> list[Item]:
    """Read a prompt file, naming the line and key of the first malformed record."""
    items: list[Item] = []
    for no, rec in json_lines(path):
        for key in ("domain", "prompt"):
            if not isinstance(rec.get(key), str) or not rec[key]:
                raise ConfigError(f"{path}:{no}: key {key!r} is missing or not a non-empty string")
        items.append(Item(str(rec.get("key", f"line{no}")), rec["domain"], rec["prompt"],
                          str(rec.get("reference", ""))))
    if not items:
        raise ConfigError(f"{path}: holds no prompts")
    return items


def build_prompt_files(out_dir: Path, seed: int, per_domain: dict[str, int],
                       *, limit_files: int | None = None) -> dict[str, Path]:
    """Write `<split>.jsonl` prompt files with `per_domain[split]` items per domain; return their paths.

    `corpus.jsonl` (all train items) is also written: the target's pre-training documents.
    """
    items = build_items(seed, limit_files=limit_files)
    paths: dict[str, Path] = {}
    for split in SPLITS:
        chosen = [it for d in DOMAINS for it in items[split][d][: per_domain[split]]]
        paths[split] = out_dir / f"{split}.jsonl"
        write_prompts(paths[split], chosen)
    paths["corpus"] = out_dir / "corpus.jsonl"
    write_prompts(paths["corpus"], [it for d in DOMAINS for it in items["train"][d]])
    return paths
