"""The trace recorder: draft a γ-block at every output position of target responses and verify it.

For each response the target generated, and for every output position t (anchor a = P − 1 + t,
the last emitted token), the recorder
1. drafts the block through the Markov head (sampling at the recording temperature),
2. keeps the raw confidence logits (calibrated by the drafter's STS temperatures, if fitted),
3. runs the target over the drafted block with the context's KV cache, giving p_t at every draft,
4. records p_accept_k = 1 − ½‖p_d,k − p_t,k‖₁ (exact conditional acceptance) and the accepted
   count under exact rejection sampling (accept x_k with probability min(1, p_t/p_d), stop at
   the first rejection).
All positions of a batch of responses are handled in one drafter pass and one verify pass.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from numpy.typing import NDArray
from torch import Tensor

from sparksim.drafter.calibrate import apply_sts, fit_sts, read_sts, reliability, sigmoid
from sparksim.drafter.config import load_json
from sparksim.drafter.model import Drafter, draft, to_probs
from sparksim.drafter.target import TargetAdapter
from sparksim.drafter.train import Sequence, pad_batch
from sparksim.errors import ConfigError

Log = Callable[[str], None]


# --------------------------------------------------------------------------- verification


def verify(p_t: Tensor, p_d: Tensor, tokens: Tensor, gen: torch.Generator | None) -> Tensor:
    """Return the accepted count (…,) of blocks under exact rejection sampling.

    p_t, p_d (…, γ, V) target/draft distributions at each draft; tokens (…, γ) the drafts.
    Draft k is accepted with probability min(1, p_t(x_k)/p_d(x_k)); counting stops at the first
    rejection. (On rejection the target resamples from norm(max(0, p_t − p_d)): see `resample`.)
    """
    pt = p_t.gather(-1, tokens[..., None]).squeeze(-1)  # (…, γ)
    pd_ = p_d.gather(-1, tokens[..., None]).squeeze(-1)
    ratio = torch.where(pd_ > 0, pt / pd_.clamp(min=1e-30), torch.zeros_like(pt)).clamp(max=1.0)
    u = torch.rand(ratio.shape, generator=gen)
    ok = (u < ratio).long()
    return ok.cumprod(-1).sum(-1)


def resample(p_t: Tensor, p_d: Tensor, gen: torch.Generator | None) -> Tensor:
    """Return a correction token sampled from norm(max(0, p_t − p_d)) (…, V) → (…,)."""
    resid = (p_t - p_d).clamp(min=0)
    total = resid.sum(-1, keepdim=True)
    resid = torch.where(total > 0, resid / total.clamp(min=1e-30), p_t)
    flat = resid.reshape(-1, resid.shape[-1])
    return torch.multinomial(flat, 1, generator=gen).reshape(resid.shape[:-1])


def block_logits(target: TargetAdapter, ids: Tensor, seq_logits: Tensor, anchors: Tensor,
                 tokens: Tensor) -> Tensor:
    """Return target logits (B, A, γ, V) at each draft: row k scores x_k given context and x_<k.

    Row 0 comes from the context pass (the anchor's logits); rows 1..γ−1 from one forward over
    all drafted blocks, each attending to its context prefix (keys ≤ anchor) and causally to itself.
    """
    B, S = ids.shape
    A, g = tokens.shape[1], tokens.shape[2]
    first = seq_logits.gather(1, anchors[..., None].expand(-1, -1, seq_logits.shape[-1]))  # (B, A, V)
    if g == 1:
        return first[:, :, None]
    drafts = tokens[:, :, : g - 1].reshape(B, A * (g - 1))  # x_1..x_{γ−1} (x_γ's successor is unused)
    d_pos = (anchors[..., None] + torch.arange(1, g)).reshape(B, -1)  # (B, A·(γ−1))
    blk = torch.arange(A * (g - 1)) // (g - 1)
    within = torch.arange(A * (g - 1)) % (g - 1)
    ctx_ok = torch.arange(S)[None, None, :] <= anchors.repeat_interleave(g - 1, dim=1)[..., None]  # (B, Q, S)
    own = (blk[:, None] == blk[None, :]) & (within[None, :] <= within[:, None])  # (Q, Q)
    seq_ok = torch.ones(S, S, dtype=torch.bool).tril()
    top = torch.cat([seq_ok, torch.zeros(S, A * (g - 1), dtype=torch.bool)], dim=1).expand(B, -1, -1)
    bottom = torch.cat([ctx_ok, own.expand(B, -1, -1)], dim=2)
    mask = torch.cat([top, bottom], dim=1).unsqueeze(1)  # (B, 1, S+Q, S+Q)
    all_ids = torch.cat([ids, drafts], dim=1)
    all_pos = torch.cat([torch.arange(S).expand(B, S), d_pos], dim=1)
    logits, _ = target.forward_masked(all_ids, all_pos, mask)
    rest = logits[:, S:].reshape(B, A, g - 1, -1)  # (B, A, γ−1, V)
    return torch.cat([first[:, :, None], rest], dim=2)


# --------------------------------------------------------------------------- recording


@dataclass
class Recording:
    """Per-position arrays for a list of sequences, flat in sequence order (rows = output positions)."""

    seqs: list[Sequence]
    conf_logits: NDArray[np.float32]  # (N, γ) raw confidence logits
    p_accept: NDArray[np.float32]  # (N, γ) exact 1 − TV
    accepted: NDArray[np.int8]  # (N,) realised accepted count
    offsets: NDArray[np.int64] = field(default_factory=lambda: np.zeros(1, np.int64))


def record_sequences(target: TargetAdapter, drafter: Drafter, seqs: list[Sequence], temperature: float,
                     gen: torch.Generator, batch_size: int = 4, pad_id: int = 258,
                     log: Log = print) -> Recording:
    """Draft and verify a block at every output position of every sequence."""
    g = drafter.cfg.gamma
    conf_l, p_acc, acc = [], [], []
    t0 = time.monotonic()
    for lo in range(0, len(seqs), batch_size):
        chunk = seqs[lo: lo + batch_size]
        ids = pad_batch([s.ids for s in chunk], pad_id)  # (B, S)
        B, S = ids.shape
        n_out = [len(s.response) for s in chunk]
        A = max(n_out)
        anchors = torch.zeros(B, A, dtype=torch.long)
        for b, s in enumerate(chunk):
            anchors[b, : n_out[b]] = len(s.prompt) - 1 + torch.arange(n_out[b])
        with torch.no_grad():
            seq_logits, hidden = target.forward_masked(ids, torch.arange(S).expand(B, S), None)
            out = drafter.backbone(drafter.context(drafter.target_features(hidden)), ids, anchors)
            d = draft(drafter, out, ids.gather(1, anchors), temperature, gen)
            t_logits = block_logits(target, ids, seq_logits, anchors, d.tokens)
            p_t = to_probs(t_logits, temperature)  # (B, A, γ, V)
            pa = (1 - 0.5 * (d.probs - p_t).abs().sum(-1)).clamp(0, 1)  # (B, A, γ)
            n_acc = verify(p_t, d.probs, d.tokens, gen)  # (B, A)
        for b in range(B):
            conf_l.append(d.conf_logits[b, : n_out[b]].numpy())
            p_acc.append(pa[b, : n_out[b]].numpy())
            acc.append(n_acc[b, : n_out[b]].numpy())
        done = min(lo + batch_size, len(seqs))
        if done % (batch_size * 10) == 0 or done == len(seqs):
            log(f"recorded {done}/{len(seqs)} responses ({time.monotonic() - t0:.0f}s)")
    lens = np.array([len(s.response) for s in seqs], dtype=np.int64)
    return Recording(seqs, np.concatenate(conf_l).astype(np.float32).reshape(-1, g),
                     np.concatenate(p_acc).astype(np.float32).reshape(-1, g),
                     np.concatenate(acc).astype(np.int8), np.concatenate([[0], np.cumsum(lens)]))


# --------------------------------------------------------------------------- summaries


def walk_accept_length(accepted: NDArray[Any], offsets: NDArray[np.int64], gamma: int) -> float:
    """Return the mean accepted length per round (bonus included) replaying each response at static γ."""
    rounds, tokens = 0, 0
    for k in range(len(offsets) - 1):
        acc = accepted[offsets[k]: offsets[k + 1]]
        t = 0
        while t < len(acc):
            step = min(int(acc[t]), gamma) + 1
            rounds, tokens, t = rounds + 1, tokens + min(step, len(acc) - t), t + step
    return tokens / max(rounds, 1)


def acceptance_summary(rec: Recording, domains: NDArray[Any], gamma: int) -> dict[str, Any]:
    """Return per-domain accepted length, survival and conditional acceptance by position."""
    out: dict[str, Any] = {}
    row_dom = np.repeat(domains, np.diff(rec.offsets))
    for dom in sorted(set(domains.tolist())):
        rows = row_dom == dom
        acc = rec.accepted[rows].astype(np.int64)
        surv = [(acc >= k).mean() for k in range(1, gamma + 1)]
        cond = [surv[0]] + [surv[k] / surv[k - 1] if surv[k - 1] > 0 else float("nan") for k in range(1, gamma)]
        seq_idx = np.flatnonzero(domains == dom)
        sub_off = np.concatenate([[0], np.cumsum(np.diff(rec.offsets)[seq_idx])])
        sub_acc = np.concatenate([rec.accepted[rec.offsets[i]: rec.offsets[i + 1]] for i in seq_idx])
        out[dom] = {
            "responses": len(seq_idx),
            "positions": int(rows.sum()),
            "accept_length_static_walk": round(walk_accept_length(sub_acc, sub_off, gamma), 3),
            "accept_length_per_position": round(float(acc.mean() + 1), 3),
            "survival": [round(float(s), 4) for s in surv],
            "conditional_acceptance": [round(float(c), 4) for c in cond],
            "mean_p_accept": [round(float(v), 4) for v in rec.p_accept[rows].mean(0)],
        }
    return out


# --------------------------------------------------------------------------- front doors


def check_inputs(target: TargetAdapter, drafter_dir: Path, gamma: int) -> None:
    """Raise ConfigError before long work if the drafter's γ or tokenizer do not match."""
    from sparksim.drafter.train import check_pair

    raw = load_json(drafter_dir / "config.json")
    if raw.get("gamma") != gamma:
        raise ConfigError(f"{drafter_dir}/config.json: drafter gamma={raw.get('gamma')!r} but the recorder "
                          f"was asked for --gamma {gamma}")
    from sparksim.drafter.config import DrafterConfig, config_from_dict

    check_pair(target, config_from_dict(DrafterConfig, raw, str(drafter_dir / "config.json")))


def calibrate(target_dir: Path, drafter_dir: Path, prompts: Path, *, temperature: float = 1.0,
              max_new_tokens: int = 256, seed: int = 1, log: Log = print) -> dict[str, Any]:
    """Fit STS temperatures on held-out prompts and write `<drafter>/calibration.json`; return it."""
    from sparksim.atomic import write_text
    from sparksim.drafter.data import read_prompts
    from sparksim.drafter.target import load_target
    from sparksim.drafter.train import load_drafter, regenerate

    target = load_target(target_dir)
    raw = load_json(drafter_dir / "config.json")
    check_inputs(target, drafter_dir, int(raw.get("gamma", 0)))
    drafter = load_drafter(drafter_dir, target)
    seqs = regenerate(target, read_prompts(prompts), max_new_tokens=max_new_tokens, temperature=temperature,
                      seed=seed, cache_dir=target_dir, log=log)
    rec = record_sequences(target, drafter, seqs, temperature, torch.Generator().manual_seed(seed + 1), log=log)
    temps = fit_sts(rec.conf_logits, rec.accepted)
    result = {"method": "sts", "temperatures": [float(t) for t in temps], "prompts": str(prompts),
              "positions": int(rec.accepted.shape[0]), "seed": seed, "temperature": temperature,
              "validation": reliability(rec.conf_logits, rec.accepted, temps)}
    write_text(drafter_dir / "calibration.json", json.dumps(result, indent=2) + "\n")
    return result


def record(target_dir: Path, drafter_dir: Path, prompts: Path, out: Path, *, gamma: int,
           temperature: float = 1.0, max_new_tokens: int = 256, seed: int = 2,
           batch_size: int = 4, command: str = "", name: str | None = None,
           extra_card: dict[str, Any] | None = None, log: Log = print) -> Path:
    """Record a trace set at `out` for the target's responses to `prompts`; return `out`."""
    from sparksim.drafter.data import read_prompts
    from sparksim.drafter.target import load_target
    from sparksim.drafter.tokenizer import get_tokenizer
    from sparksim.drafter.train import load_drafter, regenerate
    from sparksim.traces.format import write_traceset

    if temperature < 0:
        raise ConfigError(f"--temperature {temperature} must be >= 0")
    items = read_prompts(prompts)
    target = load_target(target_dir)
    check_inputs(target, drafter_dir, gamma)
    drafter = load_drafter(drafter_dir, target)
    cal, temps = read_sts(drafter_dir / "calibration.json", gamma, temperature)
    t0 = time.monotonic()
    seqs = regenerate(target, items, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                      cache_dir=target_dir, log=log)
    gen_s = time.monotonic() - t0
    tok = get_tokenizer(target.tokenizer_name)
    rec = record_sequences(target, drafter, seqs, temperature, torch.Generator().manual_seed(seed + 1),
                           batch_size=batch_size, pad_id=tok.pad_id, log=log)
    record_s = time.monotonic() - t0 - gen_s
    conf = apply_sts(rec.conf_logits, temps)
    domains = np.array([s.domain for s in seqs])
    requests = pd.DataFrame({
        "request_id": np.arange(len(seqs), dtype=np.int64), "domain": domains,
        "prompt_tokens": [len(s.prompt) for s in seqs], "output_tokens": [len(s.response) for s in seqs],
    })
    train_info = load_json(drafter_dir / "train.json") if (drafter_dir / "train.json").is_file() else {}
    target_info = load_json(target_dir / "train.json") if (target_dir / "train.json").is_file() else {}
    dcfg = load_json(drafter_dir / "config.json")
    card: dict[str, Any] = {
        "source": "recorded",
        "name": name or out.name,
        "target": str(target_dir),
        "drafter": f"{dcfg.get('kind')} (L={dcfg.get('n_layers')}, markov_rank={dcfg.get('markov_rank')}, "
                   f"confidence_head={dcfg.get('confidence_head')}, target_layer_ids={dcfg.get('target_layer_ids')})",
        "drafter_dir": str(drafter_dir),
        "gamma": gamma,
        "temperature": temperature,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": command,
        "data": {"prompts": str(prompts), "responses": len(seqs), "max_new_tokens": max_new_tokens,
                 "domains": {d: int((domains == d).sum()) for d in sorted(set(domains.tolist()))},
                 "seed": seed},
        "conf_meaning": ("calibrated conditional confidence σ(logit_k / T_k) of the confidence head"
                         if dcfg.get("confidence_head") else
                         "no confidence head (DFlash): top draft probability max_v p_d,k(v), STS-calibrated"),
        "calibration": ({"method": "sts", "temperatures": cal["temperatures"], "fitted_on": cal.get("prompts"),
                         "validation": cal.get("validation")} if cal else {"method": "none"}),
        "calibration_on_this_set": reliability(rec.conf_logits, rec.accepted, temps),
        "acceptance": acceptance_summary(rec, domains, gamma),
        "drafter_training": train_info,
        "target_training": target_info,
        "rebuild": ("make recorded-traces (repo-root Makefile: build-prompts -> train-target -> "
                    "train-drafter -> calibrate -> record; checkpoints under checkpoints/, git-ignored; "
                    "seeds: build-prompts 0, train-target 0, train-drafter 0, calibrate 1, record 2)"),
        "timing_s": {"regenerate": round(gen_s, 1), "record": round(record_s, 1)},
    }
    if extra_card:
        card.update(extra_card)
    write_traceset(out, requests, conf.astype(np.float32), rec.accepted, card,
                   conf_raw=sigmoid(rec.conf_logits).astype(np.float32), p_accept=rec.p_accept)
    log(f"wrote {out} ({len(seqs)} responses, {rec.accepted.shape[0]} positions)")
    return out
