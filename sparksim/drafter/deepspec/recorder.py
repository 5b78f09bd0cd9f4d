"""Recording a DeepSpec drafter on a HuggingFace target: responses, drafts, exact verification, STS, trace sets.

`record` and `calibrate` are what `sparksim record/calibrate --drafter-format deepspec` call;
`cli.run_record` drives many drafters and temperatures over DeepSpec's evaluation sets.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from sparksim.drafter.calibrate import sts_temperatures
from sparksim.drafter.config import load_json
from sparksim.drafter.deepspec.checkpoint import load_drafter
from sparksim.drafter.deepspec.config import DeepSpecConfig, check_target, config_dict, read_config
from sparksim.drafter.deepspec.eval_sets import EvalItem, load_prompt_file
from sparksim.drafter.deepspec.hf_target import (
    HFModel,
    generate_responses,
    load_hf_target,
    parse_dtype,
    read_target_shape,
    verify_logits,
)
from sparksim.drafter.deepspec.models import DeepSpecDrafter
from sparksim.drafter.model import to_probs
from sparksim.errors import ConfigError


@dataclass
class Responses:
    """Target responses to a list of items (token ids), and how long generating them took."""

    items: list[EvalItem]
    prompts: list[list[int]]
    responses: list[list[int]]
    generate_s: float = 0.0


def target_responses(target: HFModel, items: list[EvalItem], *, temperature: float, max_new_tokens: int,
                     seed: int, batch_size: int, cache_dir: Path | None, log: Any = print) -> Responses:
    """Return the target's responses to `items`, cached under `cache_dir` by a hash of target, prompts and
    settings: the device, dtype and batch size too (bf16 on a GPU generates other responses than fp32)."""
    from sparksim.atomic import write_text

    prompts = [target.encode_prompt(it.text, it.chat) for it in items]
    dtype = str(getattr(target.model, "dtype", ""))
    key = hashlib.sha256(json.dumps([str(target.path.resolve()), [it.key for it in items], prompts]).encode()
                         + f"{max_new_tokens}-{temperature}-{seed}-{target.device}-{dtype}-{batch_size}".encode()
                         ).hexdigest()[:16]
    cache = cache_dir / f"responses-{key}.json" if cache_dir else None
    if cache is not None and cache.is_file():
        blob = json.loads(cache.read_text())
        log(f"reusing {len(items)} cached responses ({cache})")
        return Responses(items, prompts, blob["responses"], float(blob.get("generate_s", 0.0)))
    t0 = time.monotonic()
    resp = generate_responses(target, prompts, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed,
                              batch_size=batch_size, log=log)
    out = Responses(items, prompts, resp, time.monotonic() - t0)
    if cache is not None:
        write_text(cache, json.dumps({"keys": [it.key for it in items], "responses": resp,
                                      "generate_s": out.generate_s}))
    return out


@dataclass
class Recorded:
    """Per-position arrays of one drafter on a list of responses (rows request by request, pos 0 first)."""

    conf_logits: NDArray[np.float32]  # (N, γ)
    p_accept: NDArray[np.float32]  # (N, γ) exact 1 − TV
    accepted: NDArray[np.int8]  # (N,)
    offsets: NDArray[np.int64] = field(default_factory=lambda: np.zeros(1, np.int64))
    record_s: float = 0.0


@torch.no_grad()
def record_responses(target: HFModel, drafter: DeepSpecDrafter, data: Responses, *, temperature: float,
                     seed: int, anchor_chunk: int = 256, log: Any = print) -> Recorded:
    """Draft and verify a γ-block at every output position of every response, one response at a time.

    Anchors a = P−1 .. S−2 (the last emitted token at each output position); a response's anchors go
    through the drafter and the target `anchor_chunk` at a time, so memory stays bounded on long outputs.
    Rejection sampling is `sparksim.drafter.record.verify` on the gathered probabilities (CPU generator).
    """
    from sparksim.drafter.record import verify

    dev = target.device
    gen_draft = torch.Generator(device=dev).manual_seed(seed)
    gen_verify = torch.Generator().manual_seed(seed + 1)
    conf_l, p_acc, acc = [], [], []
    t0 = time.monotonic()
    for n, (prompt, resp) in enumerate(zip(data.prompts, data.responses, strict=True)):
        ids = torch.tensor([prompt + resp], dtype=torch.long, device=dev)  # (1, S)
        out = target.model(input_ids=ids, output_hidden_states=True, use_cache=False)
        seq_logits, feats = out.logits, drafter.target_features(out.hidden_states)
        del out
        anchors_all = torch.arange(len(prompt) - 1, ids.shape[1] - 1, device=dev)
        for lo in range(0, anchors_all.numel(), anchor_chunk):
            anchors = anchors_all[lo: lo + anchor_chunk][None]  # (1, A)
            prop = drafter.propose(feats, ids, anchors, temperature, gen_draft)
            t_logits = verify_logits(target.model, ids, seq_logits, anchors, prop.tokens)
            p_t = to_probs(t_logits, temperature)  # (1, A, γ, V)
            pa = (1 - 0.5 * (prop.probs - p_t).abs().sum(-1)).clamp(0, 1)  # (1, A, γ)
            sel = prop.tokens[..., None]
            pt_sel, pd_sel = p_t.gather(-1, sel).cpu(), prop.probs.gather(-1, sel).cpu()  # (1, A, γ, 1)
            n_acc = verify(pt_sel, pd_sel, torch.zeros_like(prop.tokens, device="cpu"), gen_verify)
            conf_l.append(prop.conf_logits[0].float().cpu().numpy())
            p_acc.append(pa[0].float().cpu().numpy())
            acc.append(n_acc[0].numpy())
        if (n + 1) % 20 == 0 or n + 1 == len(data.responses):
            log(f"recorded {n + 1}/{len(data.responses)} responses ({time.monotonic() - t0:.0f}s)")
    g = drafter.cfg.gamma
    lens = np.array([len(r) for r in data.responses], dtype=np.int64)
    return Recorded(np.concatenate(conf_l).astype(np.float32).reshape(-1, g),
                    np.concatenate(p_acc).astype(np.float32).reshape(-1, g),
                    np.concatenate(acc).astype(np.int8), np.concatenate([[0], np.cumsum(lens)]),
                    time.monotonic() - t0)


def describe(cfg: DeepSpecConfig, path: Path) -> str:
    """Return the card's one-line drafter description."""
    heads = (f"markov={cfg.markov_head_type}(r={cfg.markov_rank}), confidence_head={cfg.confidence_head}"
             if cfg.kind != "eagle3" else "ttt, no confidence head")
    return (f"{cfg.kind} (DeepSpec {cfg.architecture}, {path.name}; L={cfg.num_layers}, γ={cfg.gamma}, {heads}, "
            f"target_layer_ids={list(cfg.target_layer_ids)})")


def write_recording(out: Path, data: Responses, rec: Recorded, cal: dict[str, Any] | None, *,
                    target: HFModel, drafter: DeepSpecDrafter, drafter_dir: Path, temperature: float,
                    extra_card: dict[str, Any]) -> Path:
    """Write one trace set: STS-calibrated `conf`, raw `conf_raw`, `p_accept`, `accepted`, and its card."""
    import pandas as pd

    from sparksim.drafter.calibrate import apply_sts, reliability, sigmoid
    from sparksim.drafter.record import Recording, acceptance_summary
    from sparksim.traces.format import write_traceset

    cfg = drafter.cfg
    temps = sts_temperatures(cal, cfg.gamma, temperature)
    domains = np.array([it.domain for it in data.items])
    datasets = np.array([it.dataset for it in data.items])
    requests = pd.DataFrame({
        "request_id": np.arange(len(data.items), dtype=np.int64), "domain": domains,
        "prompt_tokens": [len(p) for p in data.prompts], "output_tokens": [len(r) for r in data.responses],
    })
    summary_rec = Recording([], rec.conf_logits, rec.p_accept, rec.accepted, rec.offsets)
    card: dict[str, Any] = {
        "source": "recorded",
        "name": out.name,
        "target": str(target.path),
        "drafter": describe(cfg, drafter_dir),
        "drafter_dir": str(drafter_dir),
        "gamma": cfg.gamma,
        "temperature": temperature,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": "",
        "conf_meaning": ("calibrated conditional confidence σ(logit_k / T_k) of the confidence head"
                         if cfg.confidence_head else
                         "no confidence head: top draft probability max_v p_d,k(v) (softmax at T=1 when T=0), "
                         "STS-calibrated"),
        "calibration": ({"method": "sts", "temperatures": cal["temperatures"], "fitted_on": cal.get("prompts"),
                         "validation": cal.get("validation")} if cal else {"method": "none"}),
        "calibration_on_this_set": reliability(rec.conf_logits, rec.accepted, temps),
        "acceptance": acceptance_summary(summary_rec, domains, cfg.gamma),
        "acceptance_by_dataset": acceptance_summary(summary_rec, datasets, cfg.gamma),
        "request_ids_by_dataset": {str(d): [int(ix[0]), int(ix[-1])] for d in dict.fromkeys(datasets.tolist())
                                   for ix in [np.flatnonzero(datasets == d)]},  # first, last: contiguous
        "timing_s": {"generate": round(data.generate_s, 1), "record": round(rec.record_s, 1)},
        **extra_card,
    }
    return write_traceset(out, requests, apply_sts(rec.conf_logits, temps).astype(np.float32), rec.accepted, card,
                          conf_raw=sigmoid(rec.conf_logits).astype(np.float32), p_accept=rec.p_accept)


@dataclass
class RecordSettings:
    """How responses are generated and recorded (shared by calibration and recording)."""

    temperature: float = 1.0  # sampling temperature of the target and the drafter (0 = greedy)
    max_new_tokens: int = 256  # longest response
    seed: int = 2  # responses, drafts and rejection sampling
    generate_batch: int = 32  # prompts per HF generate call
    anchor_chunk: int = 256  # anchors per drafter/verify pass
    cache_dir: Path | None = None  # where responses are cached (None: not cached)


def calibrate_drafter(target: HFModel, drafter: DeepSpecDrafter, items: list[EvalItem], out_file: Path,
                      how: RecordSettings, *, fitted_on: str, log: Any = print) -> dict[str, Any]:
    """Record `items`, fit STS temperatures on the recording, write them to `out_file` and return them."""
    from sparksim.atomic import write_text
    from sparksim.drafter.calibrate import fit_sts, reliability

    data = target_responses(target, items, temperature=how.temperature, max_new_tokens=how.max_new_tokens,
                            seed=how.seed, batch_size=how.generate_batch, cache_dir=how.cache_dir, log=log)
    rec = record_responses(target, drafter, data, temperature=how.temperature, seed=how.seed,
                           anchor_chunk=how.anchor_chunk, log=log)
    temps = fit_sts(rec.conf_logits, rec.accepted)
    cal = {"method": "sts", "temperatures": [float(t) for t in temps], "prompts": fitted_on,
           "positions": int(rec.accepted.shape[0]), "seed": how.seed, "temperature": how.temperature,
           "validation": reliability(rec.conf_logits, rec.accepted, temps)}
    write_text(out_file, json.dumps(cal, indent=2) + "\n")
    return cal


def record_drafter(target: HFModel, drafter: DeepSpecDrafter, drafter_dir: Path, items: list[EvalItem], out: Path,
                   how: RecordSettings, *, cal: dict[str, Any] | None, extra_card: dict[str, Any],
                   log: Any = print) -> Path:
    """Generate (or reuse) the target's responses to `items`, record them and write the trace set `out`."""
    data = target_responses(target, items, temperature=how.temperature, max_new_tokens=how.max_new_tokens,
                            seed=how.seed, batch_size=how.generate_batch, cache_dir=how.cache_dir, log=log)
    rec = record_responses(target, drafter, data, temperature=how.temperature, seed=how.seed,
                           anchor_chunk=how.anchor_chunk, log=log)
    extra = {"data": {"responses": len(items), "max_new_tokens": how.max_new_tokens, "seed": how.seed,
                      "domains": {d: sum(it.domain == d for it in items) for d in sorted({it.domain for it in items})},
                      "prompt_format": "chat template, one user turn, thinking off ('turns'); raw text ('prompt')"},
             "deepspec_config": config_dict(drafter.cfg), **extra_card}
    path = write_recording(out, data, rec, cal, target=target, drafter=drafter, drafter_dir=drafter_dir,
                           temperature=how.temperature, extra_card=extra)
    log(f"wrote {out} ({len(items)} responses, {rec.accepted.shape[0]} positions)")
    return path


def load_pair(target_dir: Path, drafter_dir: Path, *, gamma: int | None, device: str,
              dtype: str) -> tuple[HFModel, DeepSpecDrafter]:
    """Check the drafter against the target's config and γ, then load both onto `device` in `dtype`."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {device}: CUDA is not available on this machine")
    if not (Path(target_dir) / "config.json").is_file():
        raise ConfigError(f"{target_dir}: target folder (config.json) is missing")
    shape = read_target_shape(Path(target_dir))
    cfg = read_config(drafter_dir)
    check_target(cfg, n_layers=shape[0], hidden_size=shape[1], vocab_size=shape[2], where=str(drafter_dir))
    if gamma is not None and cfg.gamma != gamma:
        raise ConfigError(f"{drafter_dir}/config.json: drafter γ={cfg.gamma} but --gamma {gamma} was asked for")
    torch_dtype = parse_dtype(dtype)
    return (load_hf_target(target_dir, device=device, dtype=torch_dtype),
            load_drafter(drafter_dir, device=device, dtype=torch_dtype))


def record(target_dir: Path, drafter_dir: Path, prompts: Path, out: Path, *, gamma: int,
           temperature: float = 1.0, max_new_tokens: int = 256, seed: int = 2, device: str = "cpu",
           dtype: str = "fp32", batch_size: int = 32, anchor_chunk: int = 256, calibration: Path | None = None,
           command: str = "", extra_card: dict[str, Any] | None = None, log: Any = print) -> Path:
    """Record one trace set at `out` for a DeepSpec drafter on a HF target (what `sparksim record` calls).

    The prompt file holds `turns` or `prompt` rows (`load_prompt_file`). STS temperatures come from
    `calibration`, else `<drafter>/calibration.json` when present (as the built-in recorder), else none.
    """
    if temperature < 0:
        raise ConfigError(f"--temperature {temperature} must be >= 0")
    items = load_prompt_file(prompts)
    cal_path = calibration or drafter_dir / "calibration.json"
    if calibration is not None and not calibration.is_file():
        raise ConfigError(f"{calibration}: calibration file is missing")
    cal = load_json(cal_path) if cal_path.is_file() else None
    target, drafter = load_pair(target_dir, drafter_dir, gamma=gamma, device=device, dtype=dtype)
    sts_temperatures(cal, drafter.cfg.gamma, temperature, str(cal_path))  # before generating: refused early
    how = RecordSettings(temperature, max_new_tokens, seed, batch_size, anchor_chunk)
    extra = {"command": command, "device": device, "dtype": dtype, "prompts": str(prompts), **(extra_card or {})}
    return record_drafter(target, drafter, drafter_dir, items, out, how, cal=cal, extra_card=extra, log=log)


def calibrate(target_dir: Path, drafter_dir: Path, prompts: Path, *, temperature: float = 1.0,
              max_new_tokens: int = 256, seed: int = 1, device: str = "cpu", dtype: str = "fp32",
              batch_size: int = 32, anchor_chunk: int = 256, out: Path | None = None,
              log: Any = print) -> dict[str, Any]:
    """Fit STS on held-out prompts and write `out` (default `<drafter>/calibration.json`); return it."""
    target, drafter = load_pair(target_dir, drafter_dir, gamma=None, device=device, dtype=dtype)
    how = RecordSettings(temperature, max_new_tokens, seed, batch_size, anchor_chunk)
    return calibrate_drafter(target, drafter, load_prompt_file(prompts), out or drafter_dir / "calibration.json",
                             how, fitted_on=str(prompts), log=log)

