"""`python -m sparksim.drafter.deepspec`: check drafters against a target, record drafters × temperatures."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from sparksim.drafter.deepspec.checkpoint import load_drafter
from sparksim.drafter.deepspec.config import DeepSpecConfig, check_target, read_config
from sparksim.drafter.deepspec.eval_sets import (
    PAPER_SELECTION_SEED,
    PAPER_TASKS,
    in_calibration_split,
    load_eval_items,
    parse_task,
)
from sparksim.drafter.deepspec.hf_target import DTYPES, parse_dtype, read_target_shape
from sparksim.drafter.deepspec.recorder import (
    RecordSettings,
    calibrate_drafter,
    describe,
    load_pair,
    record_drafter,
)
from sparksim.errors import ConfigError


def load_drafters(specs: Sequence[str], target_dir: Path) -> list[tuple[str, Path, DeepSpecConfig]]:
    """Parse NAME=DIR specs and check every drafter against the target's config (no weights loaded)."""
    shape = read_target_shape(target_dir)
    parsed = []
    for spec in specs:
        name, sep, folder = spec.partition("=")
        if not sep or not name or not folder:
            raise ConfigError(f"--drafter {spec!r}: use NAME=DIR (e.g. dspark=/models/dspark_qwen3_8b_block7)")
        cfg = read_config(folder)
        check_target(cfg, n_layers=shape[0], hidden_size=shape[1], vocab_size=shape[2],
                     where=f"{folder} vs target {target_dir}")
        parsed.append((name, Path(folder), cfg))
    if len({p[0] for p in parsed}) != len(parsed):
        raise ConfigError(f"--drafter names must differ: {[p[0] for p in parsed]}")
    return parsed


def run_record(args: argparse.Namespace, command: str, log: Any = print) -> list[Path]:
    """Record every drafter × temperature on the evaluation prompts; return the trace-set folders written.

    Per temperature the target answers each prompt once (cached in OUT/responses/, shared by the
    drafters and reused on a rerun); STS is fitted per drafter and temperature on the held-out split.
    """
    target_dir, out_dir = Path(args.target), Path(args.out_dir)
    if not (target_dir / "config.json").is_file():
        raise ConfigError(f"{target_dir}: target folder (config.json) is missing")
    drafters = load_drafters(args.drafter, target_dir)
    for name, path, cfg in drafters:
        if cfg.gamma != args.gamma:
            raise ConfigError(f"{path}: drafter {name!r} has γ={cfg.gamma} but --gamma {args.gamma} was asked for")
    tasks = [parse_task(t) for t in args.tasks] if args.tasks else list(PAPER_TASKS)
    items = load_eval_items(Path(args.eval_dir), tasks)
    cal_items = [it for it in items if in_calibration_split(it, args.calibration_fraction)]
    rec_items = [it for it in items if not in_calibration_split(it, args.calibration_fraction)]
    if not rec_items:
        raise ConfigError("no prompts left to record after the calibration split")
    target = loaded = None
    written = []
    for temperature in args.temperature:
        how = RecordSettings(temperature, args.max_new_tokens, args.seed, args.generate_batch, args.anchor_chunk,
                             out_dir / "responses")
        for name, path, _ in drafters:
            if target is None:  # load after every check has passed
                target, first = load_pair(target_dir, path, gamma=args.gamma, device=args.device, dtype=args.dtype)
                loaded = {drafters[0][0]: first} | {
                    n: load_drafter(p, device=args.device, dtype=parse_dtype(args.dtype)) for n, p, _ in drafters[1:]}
            assert loaded is not None
            tag = f"{args.name or target_dir.name.lower()}-{name}-t{temperature:g}"
            cal = None
            if cal_items:
                log(f"[{tag}] fitting STS on {len(cal_items)} held-out prompts")
                cal = calibrate_drafter(target, loaded[name], cal_items, out_dir / "calibration" / f"{tag}.json",
                                        replace(how, seed=args.seed + 10),
                                        fitted_on=f"{args.eval_dir}: {args.calibration_fraction:g} of each set held out",
                                        log=log)
            log(f"[{tag}] recording {len(rec_items)} prompts")
            extra = {"command": command, "device": args.device, "dtype": args.dtype,
                     "eval_sets": {"eval_dir": str(args.eval_dir), "tasks": [list(t) for t in tasks],
                                   "selection_seed": PAPER_SELECTION_SEED,
                                   "calibration_fraction": args.calibration_fraction,
                                   "calibration_responses": len(cal_items)}}
            written.append(record_drafter(target, loaded[name], path, rec_items, out_dir / tag, how, cal=cal,
                                          extra_card=extra, log=log))
    return written


# --------------------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sparksim.drafter.deepspec",
                                description="Run DeepSpec drafter checkpoints (DSpark, DFlash, Eagle3) with sparksim.")
    sub = p.add_subparsers(dest="cmd", required=True)
    chk = sub.add_parser("check", help="Check drafters against a target's config (no weights loaded).")
    chk.add_argument("--target", required=True, help="HF target folder (config.json, weights, tokenizer).")
    chk.add_argument("--drafter", action="append", required=True, help="NAME=DIR of a DeepSpec checkpoint; repeat.")
    rec = sub.add_parser("record", help="Record trace sets for drafters × temperatures on DeepSpec's eval sets.")
    rec.add_argument("--target", required=True, help="HF target folder (config.json, weights, tokenizer).")
    rec.add_argument("--drafter", action="append", required=True, help="NAME=DIR of a DeepSpec checkpoint; repeat.")
    rec.add_argument("--eval-dir", required=True, help="DeepSpec's eval_datasets/ folder (<name>.jsonl with 'turns').")
    rec.add_argument("--tasks", nargs="*", default=None,
                     help="NAME[:CAP[:DOMAIN]] sets to record (default: the paper's nine with eval.py's caps).")
    rec.add_argument("--out-dir", required=True, help="Folder for <name>-<drafter>-t<T>/ trace sets and calibration/.")
    rec.add_argument("--name", default=None, help="Trace-set name prefix (default: the target folder's name).")
    rec.add_argument("--gamma", type=int, default=7, help="Block size γ; must equal each drafter's.")
    rec.add_argument("--temperature", type=float, action="append", default=None,
                     help="Sampling temperature (0 = greedy, exact replay); repeat for several. Default 1.")
    rec.add_argument("--max-new-tokens", type=int, default=2048, help="Longest response (DeepSpec eval: 2048).")
    rec.add_argument("--calibration-fraction", type=float, default=0.2,
                     help="Share of each set held out to fit STS (0 = no calibration, conf = raw σ(logit)).")
    rec.add_argument("--seed", type=int, default=2, help="Seed for responses, drafts and rejection sampling.")
    rec.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cuda, cuda:1 or cpu.")
    rec.add_argument("--dtype", default="bf16", choices=sorted(DTYPES), help="Weights and activations dtype.")
    rec.add_argument("--generate-batch", type=int, default=32, help="Prompts per HF generate call.")
    rec.add_argument("--anchor-chunk", type=int, default=256, help="Anchors per drafter/verify pass (memory bound).")
    return p


def main(argv: Sequence[str] | None = None, log: Any = print) -> int:
    """Entry point of `python -m sparksim.drafter.deepspec`; return the exit status (2 on a ConfigError)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "check":
            target = Path(args.target)
            if not (target / "config.json").is_file():
                raise ConfigError(f"{target}: target folder (config.json) is missing")
            shape = read_target_shape(target)
            for name, path, cfg in load_drafters(args.drafter, target):
                log(f"{name}: {describe(cfg, path)} matches target {target} "
                    f"({shape[0]} layers, d={shape[1]}, V={shape[2]})")
            return 0
        if args.temperature is None:
            args.temperature = [1.0]
        if not 0 <= args.calibration_fraction < 1:
            raise ConfigError(f"--calibration-fraction {args.calibration_fraction} must be in [0, 1)")
        if any(t < 0 for t in args.temperature):
            raise ConfigError(f"--temperature {args.temperature} must be >= 0")
        run_record(args, "python -m sparksim.drafter.deepspec " + shlex.join(argv), log=log)
        return 0
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

