"""`sparksim record` and the drafter training commands (they need the torch extra).

torch is imported inside each command, so the rest of the CLI works without it.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer

from sparksim.cli.common import console, friendly_errors, need_torch
from sparksim.errors import ConfigError


def _check_format(drafter_format: str, device: str, dtype: str) -> None:
    """Raise ConfigError for an unknown drafter format, or device/dtype the built-in recorder ignores."""
    if drafter_format not in ("sparksim", "deepspec"):
        raise ConfigError(f"--drafter-format {drafter_format!r} is not one of ['sparksim', 'deepspec']")
    if drafter_format == "sparksim" and (device != "cpu" or dtype != "fp32"):
        raise ConfigError("--device/--dtype apply to --drafter-format deepspec; the built-in recorder runs fp32 on CPU")


def _command_line() -> str:
    return "sparksim " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def build_prompts(
    out: Path = typer.Option(..., "--out", help="Directory for train/val/test/corpus .jsonl prompt files."),
    seed: int = typer.Option(0, help="Seed for generated math items and shuffling."),
    train_per_domain: int = typer.Option(400, help="Prompts per domain in train.jsonl (drafter training)."),
    val_per_domain: int = typer.Option(40, help="Prompts per domain in val.jsonl (STS calibration)."),
    test_per_domain: int = typer.Option(100, help="Prompts per domain in test.jsonl (recording)."),
) -> None:
    """Build math/code/chat prompt files from this machine's text (no downloads)."""
    from sparksim.drafter.data import build_prompt_files

    paths = build_prompt_files(out, seed, {"train": train_per_domain, "val": val_per_domain,
                                           "test": test_per_domain})
    for name, path in paths.items():
        console.print(f"{name}: {path}")


def train_target(
    corpus: Path = typer.Option(..., "--corpus", help="Prompt file whose documents pre-train the target."),
    out: Path = typer.Option(..., "--out", help="Run directory; the model lands in OUT/model."),
    d_model: int = typer.Option(128, help="Residual width."),
    layers: int = typer.Option(6, help="Decoder layers."),
    heads: int = typer.Option(2, help="Attention heads."),
    d_ff: int = typer.Option(384, help="SwiGLU hidden width."),
    steps: int = typer.Option(1200, help="Optimiser steps (the wall-clock cap may stop earlier)."),
    batch_size: int = typer.Option(12, help="Sequences per step."),
    seq_len: int = typer.Option(384, help="Tokens per training window."),
    lr: float = typer.Option(2e-3, help="Peak learning rate."),
    max_minutes: float = typer.Option(45.0, help="Wall-clock cap in minutes."),
    seed: int = typer.Option(0, help="Seed for init and data order."),
    threads: int = typer.Option(0, help="torch threads (0 = default)."),
    bf16: bool = typer.Option(True, help="bf16 autocast on CPU."),
) -> None:
    """Pre-train the small built-in target LM (resumes from OUT/checkpoint if present)."""
    need_torch()
    from sparksim.drafter.config import TargetConfig, TrainConfig
    from sparksim.drafter.train import train_target as run

    model_cfg = TargetConfig(d_model=d_model, n_layers=layers, n_heads=heads, d_ff=d_ff)
    cfg = TrainConfig(steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr, warmup_steps=50,
                      max_minutes=max_minutes, seed=seed, threads=threads, bf16=bf16, ckpt_every=50)
    path = run(out, corpus, model_cfg, cfg, log=console.print)
    console.print(f"target written to {path}")


def export_target(
    target: Path = typer.Option(..., "--target", help="Built-in target model directory (OUT/model of train-target)."),
    out: Path = typer.Option(..., "--out", help="Directory for the HuggingFace Qwen3 checkpoint."),
) -> None:
    """Export the built-in target as a HuggingFace Qwen3ForCausalLM checkpoint (checked to match)."""
    need_torch()
    import torch

    from sparksim.atomic import atomic_dir
    from sparksim.drafter.target import BuiltinTarget, export_hf, load_target

    src = load_target(target)
    if not isinstance(src, BuiltinTarget):
        raise ConfigError(f"{target}: not a built-in sparksim target (model_type sparksim-tinylm)")
    with atomic_dir(out) as tmp:
        export_hf(src.model, tmp)
        hf = load_target(tmp)
        ids = torch.randint(0, 256, (1, 64), generator=torch.Generator().manual_seed(0))
        pos = torch.arange(64)[None]
        with torch.no_grad():
            gap = float((src.forward_masked(ids, pos, None)[0] - hf.forward_masked(ids, pos, None)[0]).abs().max())
        if gap > 1e-3:
            raise ConfigError(f"export check failed: HF logits differ by {gap:.2e}")
    console.print(f"HF checkpoint written to {out} (max logit difference {gap:.1e})")


def train_drafter(
    target: Path = typer.Option(..., "--target", help="Target model directory."),
    prompts: Path = typer.Option(..., "--prompts", help="Prompt file; the target regenerates the responses."),
    out: Path = typer.Option(..., "--out", help="Run directory; the drafter lands in OUT/drafter."),
    kind: str = typer.Option("dspark", help="dspark (Markov + confidence heads) or dflash (baseline)."),
    gamma: int = typer.Option(7, help="Block size γ."),
    layers: int = typer.Option(2, help="Backbone layers L."),
    markov_rank: int = typer.Option(64, help="Markov head rank r (dspark only)."),
    steps: int = typer.Option(600, help="Optimiser steps."),
    batch_size: int = typer.Option(8, help="Sequences per step."),
    anchors: int = typer.Option(32, help="Anchors per sequence and step."),
    lr: float = typer.Option(1e-3, help="Peak learning rate."),
    max_new_tokens: int = typer.Option(256, help="Longest regenerated response."),
    temperature: float = typer.Option(1.0, help="Sampling temperature of the regenerated responses."),
    max_minutes: float = typer.Option(20.0, help="Wall-clock cap in minutes."),
    seed: int = typer.Option(0, help="Seed."),
    threads: int = typer.Option(0, help="torch threads (0 = default)."),
    bf16: bool = typer.Option(True, help="bf16 autocast on CPU."),
) -> None:
    """Train a DSpark drafter (or the DFlash baseline) on the target's own responses."""
    need_torch()
    from sparksim.drafter.config import TrainConfig
    from sparksim.drafter.target import load_target
    from sparksim.drafter.train import default_drafter_config
    from sparksim.drafter.train import train_drafter as run

    dcfg = default_drafter_config(load_target(target), kind, gamma, n_layers=layers, markov_rank=markov_rank)
    cfg = TrainConfig(steps=steps, batch_size=batch_size, seq_len=1024, lr=lr, warmup_steps=30,
                      anchors_per_seq=anchors, max_minutes=max_minutes, seed=seed, threads=threads,
                      bf16=bf16, ckpt_every=50)
    path = run(out, target, prompts, dcfg, cfg, max_new_tokens=max_new_tokens, temperature=temperature,
               log=console.print)
    console.print(f"drafter written to {path}")


def calibrate(
    target: Path = typer.Option(..., "--target", help="Target model directory."),
    drafter: Path = typer.Option(..., "--drafter", help="Drafter directory; calibration.json is written there."),
    prompts: Path = typer.Option(..., "--prompts", help="Held-out prompt file (not the recording set)."),
    temperature: float = typer.Option(1.0, help="Sampling temperature (as for recording)."),
    max_new_tokens: int = typer.Option(256, help="Longest response."),
    seed: int = typer.Option(1, help="Seed for responses, drafts and rejection sampling."),
    threads: int = typer.Option(0, help="torch threads (0 = default)."),
    drafter_format: str = typer.Option("sparksim", "--drafter-format",
                                       help="sparksim (built-in drafter) or deepspec (a DeepSpec checkpoint on a HF target)."),
    device: str = typer.Option("cpu", help="deepspec format: cpu, cuda or cuda:N."),
    dtype: str = typer.Option("fp32", help="deepspec format: fp32, bf16 or fp16."),
) -> None:
    """Fit Sequential Temperature Scaling on held-out prompts; print ECE before/after per position."""
    need_torch()
    _check_format(drafter_format, device, dtype)
    if threads:
        import torch

        torch.set_num_threads(threads)
    if drafter_format == "deepspec":
        from sparksim.drafter.deepspec.recorder import calibrate as run_deepspec

        res = run_deepspec(target, drafter, prompts, temperature=temperature, max_new_tokens=max_new_tokens,
                           seed=seed, device=device, dtype=dtype, log=console.print)
    else:
        from sparksim.drafter.record import calibrate as run

        res = run(target, drafter, prompts, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed,
                  log=console.print)
    val = res["validation"]
    console.print(f"temperatures {res['temperatures']}")
    console.print(f"ECE before {val['ece_before']}\nECE after  {val['ece_after']}\nAUC        {val['auc']}")


def record(
    target: Path = typer.Option(..., "--target", help="Target model directory."),
    drafter: Path = typer.Option(..., "--drafter", help="Drafter directory (with calibration.json if fitted)."),
    prompts: Path = typer.Option(..., "--prompts", help="Prompt file (.jsonl with domain and prompt; deepspec: "
                                                         "or DeepSpec 'turns' rows, chat-templated)."),
    out: Path = typer.Option(..., "--out", help="Trace-set folder to write, e.g. traces/<name>/."),
    gamma: int = typer.Option(7, help="Block size γ; must equal the drafter's."),
    temperature: float = typer.Option(1.0, help="Sampling temperature (0 = greedy, exact replay)."),
    max_new_tokens: int = typer.Option(256, help="Longest response."),
    seed: int = typer.Option(2, help="Seed for responses, drafts and rejection sampling."),
    batch_size: int = typer.Option(4, help="Responses per drafter/verify pass."),
    threads: int = typer.Option(0, help="torch threads (0 = default)."),
    note: str = typer.Option("", help="Free text stored as the card's `note` (scale, caveats)."),
    drafter_format: str = typer.Option("sparksim", "--drafter-format",
                                       help="sparksim (built-in drafter) or deepspec (a DeepSpec checkpoint on a HF target)."),
    device: str = typer.Option("cpu", help="deepspec format: cpu, cuda or cuda:N."),
    dtype: str = typer.Option("fp32", help="deepspec format: fp32, bf16 or fp16."),
    calibration: Path | None = typer.Option(None, help="deepspec format: STS file (default DRAFTER/calibration.json)."),
) -> None:
    """Record a trace set: draft and verify a γ-block at every output position of target responses."""
    need_torch()
    _check_format(drafter_format, device, dtype)
    if calibration is not None and drafter_format != "deepspec":
        raise ConfigError("--calibration applies to --drafter-format deepspec (the built-in recorder reads "
                          "DRAFTER/calibration.json)")
    if threads:
        import torch

        torch.set_num_threads(threads)
    extra = {"note": note} if note else None
    if drafter_format == "deepspec":
        from sparksim.drafter.deepspec.recorder import record as run_deepspec

        path = run_deepspec(target, drafter, prompts, out, gamma=gamma, temperature=temperature,
                            max_new_tokens=max_new_tokens, seed=seed, device=device, dtype=dtype,
                            calibration=calibration, command=_command_line(), extra_card=extra, log=console.print)
    else:
        from sparksim.drafter.record import record as run

        path = run(target, drafter, prompts, out, gamma=gamma, temperature=temperature,
                   max_new_tokens=max_new_tokens, seed=seed, batch_size=batch_size, command=_command_line(),
                   extra_card=extra, log=console.print)
    console.print(f"trace set written to {path}")


def register(app: typer.Typer) -> None:
    """Add the drafter commands to `app`."""
    app.command("build-prompts")(friendly_errors(build_prompts))
    app.command("train-target")(friendly_errors(train_target))
    app.command("export-target")(friendly_errors(export_target))
    app.command("train-drafter")(friendly_errors(train_drafter))
    app.command("calibrate")(friendly_errors(calibrate))
    app.command("record")(friendly_errors(record))
