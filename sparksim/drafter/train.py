"""Training loops for the target LM and the drafter, with atomic checkpoints and resume.

A run directory holds `checkpoint/` (weights, optimiser, step, RNG; replaced atomically every
`ckpt_every` steps), `log.jsonl` (one line per logged step) and, when the run completes, the
final model files. Re-running the same command resumes from `checkpoint/`.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from sparksim.atomic import atomic_dir, write_text
from sparksim.drafter.config import DrafterConfig, TargetConfig, TrainConfig, load_json
from sparksim.drafter.data import DOMAINS, Item, read_prompts
from sparksim.drafter.model import Drafter, drafter_loss
from sparksim.drafter.target import TargetAdapter, TinyLM, load_target, save_builtin
from sparksim.drafter.tokenizer import get_tokenizer
from sparksim.errors import ConfigError

Log = Callable[[str], None]


def _lr(step: int, cfg: TrainConfig, elapsed_s: float = 0.0) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak.

    Progress is the larger of the step fraction and the wall-clock fraction, so a run stopped by
    `max_minutes` still ends on a decayed learning rate.
    """
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = max((step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps),
               elapsed_s / (cfg.max_minutes * 60))
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def _autocast(cfg: TrainConfig) -> Any:
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16)


def _save_checkpoint(run_dir: Path, step: int, module_state: dict[str, Tensor], opt: torch.optim.Optimizer,
                     extra: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    with atomic_dir(run_dir / "checkpoint") as tmp:
        save_file({k: v.contiguous() for k, v in module_state.items()}, str(tmp / "weights.safetensors"))
        torch.save({"optimizer": opt.state_dict(), "torch_rng": torch.get_rng_state()}, tmp / "optim.pt")
        (tmp / "state.json").write_text(json.dumps({"step": step, **extra}, indent=2))


def _load_checkpoint(run_dir: Path, module: nn.Module, opt: torch.optim.Optimizer,
                     strict: bool = True) -> dict[str, Any] | None:
    from safetensors.torch import load_file

    ck = run_dir / "checkpoint"
    if not (ck / "state.json").is_file():
        return None
    module.load_state_dict(load_file(str(ck / "weights.safetensors")), strict=strict)
    blob = torch.load(ck / "optim.pt", weights_only=True)
    opt.load_state_dict(blob["optimizer"])
    torch.set_rng_state(blob["torch_rng"])
    return load_json(ck / "state.json")


def _resume(run_dir: Path, module: nn.Module, opt: torch.optim.Optimizer, cfg: TrainConfig,
            what: str, log: Callable[[str], None], *, strict: bool = True
            ) -> tuple[int, float, random.Random, float]:
    """Load the latest checkpoint if any; return (step, elapsed_s, data rng, clock start).

    The data generator is seeded by (seed, step) so a resumed run draws fresh batches, and
    the clock start is moved back by the time already spent, so the wall-clock cap holds.
    """
    state = _load_checkpoint(run_dir, module, opt, strict=strict)
    step = int(state["step"]) if state else 0
    elapsed_s = float(state["elapsed_s"]) if state else 0.0
    if state:
        log(f"resuming {what} training at step {step}")
    return step, elapsed_s, random.Random(f"{cfg.seed}-{step}"), time.monotonic() - elapsed_s


def _append_log(run_dir: Path, rec: dict[str, Any]) -> None:
    with (run_dir / "log.jsonl").open("a") as fh:
        fh.write(json.dumps(rec) + "\n")


# --------------------------------------------------------------------------- target


def _domain_streams(items: list[Item], tok_name: str) -> dict[str, Tensor]:
    tok = get_tokenizer(tok_name)
    streams: dict[str, list[int]] = {d: [] for d in DOMAINS}
    for it in items:
        streams.setdefault(it.domain, []).extend([*tok.encode(it.document()), tok.eos_id])
    return {d: torch.tensor(s, dtype=torch.int16) for d, s in streams.items() if s}


def train_target(run_dir: Path, corpus: Path, model_cfg: TargetConfig, cfg: TrainConfig,
                 log: Log = print) -> Path:
    """Pre-train the built-in target on `corpus` (a prompt file; domains mixed equally); return run_dir.

    Each row of a batch is a random window of one domain's concatenated documents.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    streams = _domain_streams(read_prompts(corpus), model_cfg.tokenizer)
    domains = sorted(streams)
    model = TinyLM(model_cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    step, elapsed_s, rng, start = _resume(run_dir, model, opt, cfg, "target", log, strict=False)
    model.train()
    while step < cfg.steps:
        rows = []
        for _ in range(cfg.batch_size):
            s = streams[domains[rng.randrange(len(domains))]]
            off = rng.randrange(0, len(s) - cfg.seq_len - 1)
            rows.append(s[off: off + cfg.seq_len + 1].long())
        batch = torch.stack(rows)  # (B, S+1)
        for group in opt.param_groups:
            group["lr"] = _lr(step, cfg, elapsed_s)
        with _autocast(cfg):
            logits, _, _ = model(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        loss = loss.detach()
        nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        elapsed_s = time.monotonic() - start
        out_of_time = elapsed_s > cfg.max_minutes * 60
        if step % 10 == 0 or step == cfg.steps:
            _append_log(run_dir, {"step": step, "loss": round(float(loss), 4), "lr": _lr(step, cfg, elapsed_s),
                                  "elapsed_s": round(elapsed_s, 1)})
        if step % 50 == 0:
            log(f"target step {step}/{cfg.steps} loss {float(loss):.3f} ({elapsed_s:.0f}s)")
        if step % cfg.ckpt_every == 0 or step == cfg.steps or out_of_time:
            weights = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied
            _save_checkpoint(run_dir, step, weights, opt,
                             {"elapsed_s": elapsed_s, "loss": float(loss)})
        if out_of_time:
            log(f"target: wall-clock cap of {cfg.max_minutes} min reached at step {step}")
            break
    with atomic_dir(run_dir / "model") as tmp:
        save_builtin(model, tmp)
        (tmp / "train.json").write_text(json.dumps(
            {"train": asdict(cfg), "steps_done": step, "elapsed_s": round(elapsed_s, 1),
             "final_loss": float(loss) if step else None, "corpus": str(corpus)}, indent=2))
    return run_dir / "model"


# --------------------------------------------------------------------------- regenerated data


@dataclass
class Sequence:
    """A prompt and the target's own response, as token ids."""

    key: str
    domain: str
    prompt: list[int]
    response: list[int]

    @property
    def ids(self) -> list[int]:
        return self.prompt + self.response


def regenerate(target: TargetAdapter, items: list[Item], *, max_new_tokens: int, temperature: float,
               seed: int, batch_size: int = 64, cache_dir: Path | None = None, log: Log = print) -> list[Sequence]:
    """Return the target's responses to `items` (DeepSpec regenerates training answers with the target).

    Results are cached in `cache_dir` under a hash of the prompts and settings.
    """
    tok = get_tokenizer(target.tokenizer_name)
    key = hashlib.sha256(json.dumps([[it.key, it.prompt] for it in items]).encode()
                         + f"{max_new_tokens}-{temperature}-{seed}".encode()).hexdigest()[:16]
    cache = cache_dir / f"regenerated-{key}.jsonl" if cache_dir else None
    if cache is not None and cache.is_file():
        return [Sequence(**json.loads(line)) for line in cache.read_text().splitlines()]
    gen = torch.Generator().manual_seed(seed)
    # Sorting by prompt length keeps left-padding short; order is restored afterwards.
    order = sorted(range(len(items)), key=lambda i: len(items[i].prompt))
    out: dict[int, Sequence] = {}
    t0 = time.monotonic()
    for lo in range(0, len(order), batch_size):
        idx = order[lo: lo + batch_size]
        prompts = [tok.encode(items[i].prompt) for i in idx]
        with torch.no_grad():
            responses = target.generate(prompts, max_new_tokens, temperature, gen, tok.eos_id, tok.pad_id)
        for i, p, r in zip(idx, prompts, responses, strict=True):
            out[i] = Sequence(items[i].key, items[i].domain, p, r)
        log(f"regenerated {min(lo + batch_size, len(order))}/{len(order)} ({time.monotonic() - t0:.0f}s)")
    seqs = [out[i] for i in range(len(items))]
    if cache is not None:
        write_text(cache, "\n".join(json.dumps(asdict(s)) for s in seqs) + "\n")
    return seqs


def pad_batch(seqs: list[list[int]], pad_id: int) -> Tensor:
    """Right-pad token lists into (B, S) long."""
    S = max(len(s) for s in seqs)
    out = torch.full((len(seqs), S), pad_id, dtype=torch.long)
    for b, s in enumerate(seqs):
        out[b, : len(s)] = torch.tensor(s)
    return out


def causal_positions(ids: Tensor) -> Tensor:
    """Return positions 0..S−1 for every row of ids (B, S)."""
    B, S = ids.shape
    return torch.arange(S).expand(B, S)


# --------------------------------------------------------------------------- drafter


def check_pair(target: TargetAdapter, cfg: DrafterConfig) -> None:
    """Raise ConfigError if `cfg` cannot run on `target` (tokenizer, width, layers, vocabulary)."""
    if cfg.tokenizer != target.tokenizer_name:
        raise ConfigError(f"tokenizer mismatch: drafter uses {cfg.tokenizer!r}, target uses {target.tokenizer_name!r}")
    if cfg.vocab_size != target.vocab_size:
        raise ConfigError(f"vocab mismatch: drafter vocab_size={cfg.vocab_size}, target {target.vocab_size}")
    if cfg.d_model != target.d_model:
        raise ConfigError(f"width mismatch: drafter d_model={cfg.d_model}, target {target.d_model}")
    bad = [i for i in cfg.target_layer_ids if not 0 <= i < target.n_layers - 1]
    if bad:
        raise ConfigError(f"drafter target_layer_ids {bad} outside 0..{target.n_layers - 2} "
                          "(the last layer is post-norm and not injected)")


def uniform_layer_ids(n_layers: int, m: int) -> list[int]:
    """Return m target layers spaced uniformly from 1 to L−3 (DFlash's build_target_layer_ids)."""
    if m == 1:
        return [n_layers // 2]
    return sorted({round(1 + i * (n_layers - 4) / (m - 1)) for i in range(m)})


@dataclass
class Features:
    """Cached target outputs for one regenerated sequence."""

    ids: Tensor  # (S,) long
    prompt_len: int
    feats: Tensor  # (S, m·d) bf16 injected-layer hidden states
    logits: Tensor  # (S, V) bf16 target logits


def target_features(target: TargetAdapter, drafter: Drafter, seqs: list[Sequence], pad_id: int,
                    batch_size: int = 16) -> list[Features]:
    """Run the target once over every sequence and keep what drafter training needs."""
    out: list[Features] = []
    for lo in range(0, len(seqs), batch_size):
        chunk = seqs[lo: lo + batch_size]
        ids = pad_batch([s.ids for s in chunk], pad_id)
        with torch.no_grad():
            logits, hidden = target.forward_masked(ids, causal_positions(ids), None)
            feats = drafter.target_features(hidden)
        for b, s in enumerate(chunk):
            n = len(s.ids)
            out.append(Features(ids[b, :n].clone(), len(s.prompt), feats[b, :n].to(torch.bfloat16).clone(),
                                logits[b, :n].to(torch.bfloat16).clone()))
    return out


def sample_anchors(prompt_len: int, seq_len: int, n: int, rng: random.Random) -> list[int]:
    """Return n anchor positions in the response region [prompt_len−1, seq_len−2] (with replacement if short)."""
    lo, hi = prompt_len - 1, seq_len - 2
    span = list(range(lo, hi + 1))
    return sorted(rng.sample(span, n)) if len(span) >= n else sorted(rng.choice(span) for _ in range(n))


def drafter_batch(feats: list[Features], anchors_per_seq: int, gamma: int, pad_id: int,
                  rng: random.Random) -> dict[str, Tensor]:
    """Assemble a padded batch with anchors, teacher-forced previous tokens, labels and target logits."""
    B, S = len(feats), max(f.ids.shape[0] for f in feats)
    m_d, V = feats[0].feats.shape[1], feats[0].logits.shape[1]
    ids = torch.full((B, S + gamma), pad_id, dtype=torch.long)  # room for labels past the end
    ctx = torch.zeros(B, S, m_d, dtype=torch.bfloat16)
    tlog = torch.zeros(B, S, V, dtype=torch.bfloat16)
    lens = torch.zeros(B, dtype=torch.long)
    anchors = torch.zeros(B, anchors_per_seq, dtype=torch.long)
    for b, f in enumerate(feats):
        n = f.ids.shape[0]
        ids[b, :n], ctx[b, :n], tlog[b, :n], lens[b] = f.ids, f.feats, f.logits, n
        anchors[b] = torch.tensor(sample_anchors(f.prompt_len, n, anchors_per_seq, rng))
    offs = torch.arange(gamma)
    tgt_pos = anchors[..., None] + offs  # (B, A, γ) positions whose next token is predicted
    labels = ids.gather(1, (tgt_pos + 1).reshape(B, -1)).reshape(tgt_pos.shape)  # (B, A, γ)
    prev = ids.gather(1, tgt_pos.reshape(B, -1)).reshape(tgt_pos.shape)  # [anchor, y_1..y_{γ−1}]
    valid = (tgt_pos + 1) < lens[:, None, None]  # (B, A, γ)
    safe = tgt_pos.clamp(max=S - 1)
    target_logits = tlog.gather(1, safe.reshape(B, -1, 1).expand(-1, -1, V)).reshape(B, *tgt_pos.shape[1:], V)
    return {"ids": ids[:, :S], "ctx": ctx, "anchors": anchors, "prev": prev, "labels": labels,
            "valid": valid, "target_logits": target_logits}


def load_drafter(path: Path | str, target: TargetAdapter) -> Drafter:
    """Load a trained drafter from `path` onto `target`, checking they belong together."""
    from safetensors.torch import load_file

    from sparksim.drafter.config import config_from_dict

    path = Path(path)
    raw = load_json(path / "config.json")
    cfg = config_from_dict(DrafterConfig, raw, str(path / "config.json"))
    check_pair(target, cfg)
    model = Drafter(cfg, target.embed_tokens, target.lm_head)
    weights = path / "drafter.safetensors"
    if not weights.is_file():
        raise ConfigError(f"{weights}: file is missing")
    model.load_state_dict(load_file(str(weights)))
    return model.eval().requires_grad_(False)


def train_drafter(run_dir: Path, target_dir: Path, prompts: Path, dcfg: DrafterConfig, cfg: TrainConfig,
                  *, max_new_tokens: int = 256, temperature: float = 1.0, log: Log = print) -> Path:
    """Train a drafter on the target's regenerated responses to `prompts`; return the drafter dir."""
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    target = load_target(target_dir)
    check_pair(target, dcfg)
    tok = get_tokenizer(dcfg.tokenizer)
    seqs = regenerate(target, read_prompts(prompts), max_new_tokens=max_new_tokens, temperature=temperature,
                      seed=cfg.seed, cache_dir=target_dir, log=log)
    seqs = [s for s in seqs if len(s.ids) <= cfg.seq_len and len(s.response) >= 2]
    max_len = getattr(getattr(target, "model", None), "cfg", TargetConfig()).max_seq_len
    model = Drafter(dcfg, target.embed_tokens, target.lm_head, max_seq_len=max_len)
    t0 = time.monotonic()
    feats = target_features(target, model, seqs, tok.pad_id)
    log(f"cached target features for {len(feats)} sequences ({time.monotonic() - t0:.0f}s)")
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    step, elapsed_s, rng, start = _resume(run_dir, model, opt, cfg, "drafter", log)
    model.train()
    while step < cfg.steps:
        batch = drafter_batch(rng.sample(feats, min(cfg.batch_size, len(feats))), cfg.anchors_per_seq,
                              dcfg.gamma, tok.pad_id, rng)
        for group in opt.param_groups:
            group["lr"] = _lr(step, cfg, elapsed_s)
        with _autocast(cfg):
            out = model.backbone(model.context(batch["ctx"]), batch["ids"], batch["anchors"])
            logits, conf = model.heads(out, batch["prev"])
        parts = drafter_loss(dcfg, logits, conf, batch["target_logits"], batch["labels"], batch["valid"])
        opt.zero_grad(set_to_none=True)
        parts.loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        elapsed_s = time.monotonic() - start
        out_of_time = elapsed_s > cfg.max_minutes * 60
        if step % 10 == 0 or step == cfg.steps:
            _append_log(run_dir, {"step": step, "loss": round(float(parts.loss.detach()), 4), "ce": round(parts.ce, 4),
                                  "l1": round(parts.l1, 4), "bce": round(parts.bce, 4),
                                  "accept": [round(a, 3) for a in parts.accept],
                                  "elapsed_s": round(elapsed_s, 1)})
        if step % 50 == 0:
            log(f"drafter step {step}/{cfg.steps} loss {float(parts.loss.detach()):.3f} "
                f"1-TV@1 {parts.accept[0]:.3f} ({elapsed_s:.0f}s)")
        if step % cfg.ckpt_every == 0 or step == cfg.steps or out_of_time:
            _save_checkpoint(run_dir, step, model.trainable_state(), opt, {"elapsed_s": elapsed_s})
        if out_of_time:
            log(f"drafter: wall-clock cap of {cfg.max_minutes} min reached at step {step}")
            break
    from safetensors.torch import save_file

    with atomic_dir(run_dir / "drafter") as tmp:
        save_file({k: v.contiguous() for k, v in model.trainable_state().items()}, str(tmp / "drafter.safetensors"))
        (tmp / "config.json").write_text(json.dumps(asdict(dcfg), indent=2) + "\n")
        (tmp / "train.json").write_text(json.dumps(
            {"train": asdict(cfg), "steps_done": step, "elapsed_s": round(elapsed_s, 1),
             "target": str(target_dir), "prompts": str(prompts), "sequences": len(seqs),
             "final_loss": float(parts.loss.detach()) if step else None}, indent=2))
    return run_dir / "drafter"


def default_drafter_config(target: TargetAdapter, kind: str, gamma: int, n_layers: int = 2,
                           markov_rank: int = 64, m: int = 3) -> DrafterConfig:
    """Return the DSpark (or DFlash baseline) config for `target`; DFlash is CE-only, as in DeepSpec."""
    tok = get_tokenizer(target.tokenizer_name)
    common: dict[str, Any] = {
        "gamma": gamma, "n_layers": n_layers, "d_model": target.d_model,
        "n_heads": max(1, target.d_model // 64), "d_ff": 3 * target.d_model,
        "target_layer_ids": uniform_layer_ids(target.n_layers, m), "vocab_size": target.vocab_size,
        "mask_token_id": tok.mask_id, "tokenizer": target.tokenizer_name, "kind": kind,
    }
    if kind == "dspark":
        return DrafterConfig(markov_rank=markov_rank, confidence_head=True, **common)
    if kind == "dflash":
        return DrafterConfig(markov_rank=0, confidence_head=False, ce_alpha=1.0, l1_alpha=0.0,
                             conf_alpha=0.0, **common)
    raise ConfigError(f"drafter kind={kind!r} is not one of ['dspark', 'dflash']")


__all__ = ["check_pair", "default_drafter_config", "load_drafter", "regenerate",
           "train_drafter", "train_target"]
