"""The report's account of what a folder was made from: its scenario, its inputs' cards, its warnings.

A profile's or a trace set's card says where its numbers come from (`source`: measured,
recorded, calibrated, published, analytic or synthetic) and the command that remade it; a
reader weighing a result needs both before the figures.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from sparksim.report.page import Section, esc, paragraph

# Card keys shown in the facts table, in this order (the whole card follows, folded).
CARD_FACTS = ("source", "command", "date", "hardware", "gpu", "model", "dtype", "target", "drafter", "gamma",
              "temperature", "engine", "note")
SOURCES = ("measured", "recorded", "calibrated", "published", "imported", "analytic", "synthetic")


def find_card(ref: str, recorded: str | None = None) -> Path | None:
    """Return the card.yaml of input folder `ref`: at the path recorded when the folder was made, else where a scenario would find it."""
    from sparksim.config import resolve_path

    for folder in ([Path(recorded)] if recorded else []) + [resolve_path(ref)]:
        if (folder / "card.yaml").is_file():
            return folder / "card.yaml"
    return None


def source_badge(source: object) -> str:
    """Return the card's `source` as a coloured badge (grey for a source sparksim does not know)."""
    text = str(source or "unknown")
    kind = next((s for s in SOURCES if text.startswith(s)), "unknown")
    return f'<span class="badge {kind}">{esc(text)}</span>'


def card_html(kind: str, ref: str, recorded: str | None = None) -> str:
    """Return one input's card: its source, its command and key facts, then the whole card, folded."""
    path = find_card(ref, recorded)
    if path is None:
        where = f"{recorded} or {ref}" if recorded and recorded != ref else ref
        return (f"<h3>{esc(kind)}: <code>{esc(ref)}</code></h3>"
                + paragraph(f"No card.yaml found at {where} (moved, or made on another machine).", "note"))
    try:
        card = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        return f"<h3>{esc(kind)}: <code>{esc(ref)}</code></h3>" + paragraph(f"{path}: unreadable ({exc})", "note")
    card = card if isinstance(card, dict) else {"card": card}
    rows = []
    for key in CARD_FACTS:
        value = card.get(key)
        if value is None or isinstance(value, dict | list):  # a block (a synthetic set's model) stays folded below
            continue
        shown = source_badge(value) if key == "source" else (
            f"<code>{esc(value)}</code>" if key == "command" else esc(value))
        rows.append(f"<tr><th>{esc(key)}</th><td>{shown}</td></tr>")
    whole = yaml.safe_dump(card, sort_keys=False, allow_unicode=True)
    return (f"<h3>{esc(kind)}: <code>{esc(ref)}</code> {source_badge(card.get('source'))}</h3>"
            f"<table>{''.join(rows)}</table>"
            f"<details><summary>the whole card ({esc(path)})</summary><pre>{esc(whole)}</pre></details>")


def inputs_section(how: Mapping[str, Any] | None, scenario: str | None,
                   inputs: Sequence[tuple[str, str, str | None]], scenario_note: str = "") -> Section:
    """Return the section on what the folder was made from.

    `how`: how the command was run (a sweep's sweep.yaml, a capacity search's meta);
    `inputs`: (kind, reference, path recorded when the folder was made) per input folder;
    `scenario`: the resolved scenario's YAML, with `scenario_note` saying what it is.
    """
    section = Section("Scenario and inputs", "inputs")
    if how:
        section.add("<h3>How it was run</h3>",
                    f"<pre>{esc(yaml.safe_dump(dict(how), sort_keys=False, allow_unicode=True))}</pre>")
    for kind, ref, recorded in inputs:
        section.add(card_html(kind, ref, recorded))
    if scenario:
        section.add("<h3>The scenario, resolved</h3>", paragraph(scenario_note, "note") if scenario_note else "",
                    f"<pre>{esc(scenario)}</pre>")
    return section


def read_warnings(path: Path) -> Any:
    """Return the JSON at `path`, or None when the folder has no such file (made before warnings were kept)."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def warnings_section(given: Sequence[tuple[str, Sequence[str]]] | None, missing: str) -> Section:
    """Return the section listing every warning: each message once, with the runs that gave it.

    `given` is (run, its messages) per run that warned; None when the folder does not record
    warnings, which `missing` then explains.
    """
    section = Section("Warnings", "warnings")
    if given is None:
        return section.add(paragraph(missing, "note"))
    by_message: dict[str, list[str]] = {}
    for run, messages in given:
        for message in messages:
            by_message.setdefault(message, []).append(run)
    if not by_message:
        return section.add(paragraph("No run gave a warning.", "note"))
    section.add(paragraph(f"{len(by_message)} distinct warning(s):"))
    for message, runs in by_message.items():
        section.add(f'<div class="warn">{esc(message)}<br><span class="note">from {len(runs)} run(s): '
                    f"{esc('; '.join(r for r in runs if r))}</span></div>")
    return section
