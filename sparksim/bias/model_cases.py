"""Builds exact-bias cases from a real target and DSpark drafter, at prefixes of the target's responses.

Torch and the drafter package are imported inside the functions: the rest of the exact lab
stays NumPy, and its toy tests call it with plain arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from sparksim.bias.first_token import GAMMA, StepCase, normalise
from sparksim.errors import ConfigError

Log = Callable[[str], None]


def model_cases(target_dir: Path, drafter_dir: Path, prompts: Path, n: int, *, temperature: float = 1.0,
                seed: int = 0, max_new_tokens: int = 128, cuts_per_response: int = 4, batch_size: int = 16,
                log: Log = print) -> list[StepCase]:
    """Return `n` cases from a real target and drafter, at prefixes of the target's own responses.

    The target answers ⌈n / cuts_per_response⌉ prompts drawn from `prompts` (seeded; prompts
    too long for the target's positions with `max_new_tokens` more are skipped), sampling at
    `temperature` with a fixed seed; each context is a prompt plus a seeded prefix of its
    response, `cuts_per_response` distinct cuts per response (fewer if it is shorter; more
    when there are too few prompts). Per context: p_t, the target's
    next-token law at `temperature`; the drafter's block at that anchor (its full γ, as in
    drafting) truncated to two positions: q_1, c_1, and for every x_1 the Markov-biased
    c_2(x_1) (q_2 is not kept: no first-token question reads it); confidences calibrated
    with the drafter's `calibration.json` STS temperatures when present.
    """
    from sparksim.drafter.calibrate import read_sts
    from sparksim.drafter.data import read_prompts
    from sparksim.drafter.target import load_target
    from sparksim.drafter.tokenizer import get_tokenizer
    from sparksim.drafter.train import load_drafter, regenerate

    if n < 1:
        raise ConfigError(f"--contexts {n} must be >= 1")
    if temperature < 0:
        raise ConfigError(f"--temperature {temperature} must be >= 0")
    target = load_target(target_dir)
    drafter = load_drafter(drafter_dir, target)
    g = drafter.cfg.gamma
    if g < GAMMA:
        raise ConfigError(f"{drafter_dir}: drafter gamma={g}; the exact lab needs at least {GAMMA} positions")
    _, temps = read_sts(drafter_dir / "calibration.json", g, temperature)
    tok = get_tokenizer(target.tokenizer_name)
    limit = _max_positions(target)
    items = read_prompts(prompts)
    fits = [it for it in items if limit is None or len(tok.encode(it.prompt)) + max_new_tokens <= limit]
    if not fits:
        raise ConfigError(f"{prompts}: no prompt fits the target's {limit} positions with "
                          f"--max-new-tokens {max_new_tokens}")
    if len(fits) < len(items):
        log(f"{len(items) - len(fits)} of {len(items)} prompts skipped: longer than the target's {limit} "
            f"positions with {max_new_tokens} new tokens")
    rng = np.random.default_rng(seed)
    n_prompts = min(-(-n // max(cuts_per_response, 1)), len(fits))
    chosen = [fits[int(k)] for k in rng.permutation(len(fits))[:n_prompts]]
    seqs = regenerate(target, chosen, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                      log=log)
    per_seq = np.bincount(np.arange(n) % len(seqs), minlength=len(seqs))
    picks: list[tuple[int, int]] = []  # (sequence, response tokens kept in the context)
    for j, (s, k) in enumerate(zip(seqs, per_seq, strict=True)):
        cuts = rng.choice(len(s.response), size=min(int(k), len(s.response)), replace=False)
        picks.extend((j, int(t)) for t in np.sort(cuts))
    contexts = [seqs[j].prompt + seqs[j].response[:t] for j, t in picks]
    names = [f"{seqs[j].domain}:{seqs[j].key}@{t}" for j, t in picks]
    cases = drafter_cases(target, drafter, contexts, temperature=temperature, temps=temps, names=names,
                          batch_size=batch_size, pad_id=tok.pad_id)
    log(f"built {len(cases)} contexts from {len(seqs)} responses")
    return cases


def _max_positions(target: Any) -> int | None:
    """Return the longest sequence the target's positions allow, if it says."""
    model = getattr(target, "model", None)
    cfg = getattr(model, "cfg", None) or getattr(model, "config", None)
    for key in ("max_seq_len", "max_position_embeddings"):
        value = getattr(cfg, key, None)
        if isinstance(value, int):
            return value
    return None


def drafter_cases(target: Any, drafter: Any, contexts: Sequence[Sequence[int]], *, temperature: float = 1.0,
                  temps: ArrayLike | None = None, names: Sequence[str] | None = None, batch_size: int = 16,
                  pad_id: int = 258) -> list[StepCase]:
    """Return one case per token context: the drafter's block anchored at the context's last token.

    `target` a `TargetAdapter`, `drafter` a `Drafter` (torch); `temps` the STS temperatures
    (γ,) (default 1: raw confidences). The drafter runs its full block, as when drafting; the
    case keeps positions 1 and 2, through the same heads `drafter.model.draft` samples from:
    q_1 and c_1 after the anchor, and c_2(x_1) = σ(logit_2(x_1) / T_2) after every x_1 (the
    Markov embedding W1[x_1] enters position 2's confidence). Distributions in float64.
    """
    import torch

    from sparksim.drafter.calibrate import apply_sts
    from sparksim.drafter.model import BlockOutput
    from sparksim.drafter.train import pad_batch

    g, V = int(drafter.cfg.gamma), int(drafter.cfg.vocab_size)
    if g < GAMMA:
        raise ConfigError(f"drafter gamma={g}; the exact lab needs at least {GAMMA} positions")
    t_sts = np.ones(g) if temps is None else np.asarray(temps, np.float64)
    cases: list[StepCase] = []
    for lo in range(0, len(contexts), batch_size):
        ctx = [list(c) for c in contexts[lo: lo + batch_size]]
        if min(len(c) for c in ctx) < 1:
            raise ConfigError("an empty context has no anchor token")
        ids = pad_batch(ctx, pad_id)
        B, S = ids.shape
        last = torch.tensor([len(c) - 1 for c in ctx])
        with torch.no_grad():
            logits, hidden = target.forward_masked(ids, torch.arange(S).expand(B, S), None)
            out = drafter.backbone(drafter.context(drafter.target_features(hidden)), ids, last[:, None])
            # every x_1 as its own block row: prev = [anchor, x_1, ...] gives position 2's Markov
            # bias and confidence after x_1 (position 1's is the same on every row)
            wide = BlockOutput(out.logits.expand(B, V, g, V), out.hidden.expand(B, V, g, out.hidden.shape[-1]))
            prev = torch.zeros(B, V, g, dtype=torch.long)
            prev[:, :, 0] = ids.gather(1, last[:, None])
            prev[:, :, 1] = torch.arange(V)
            d_logits, conf = drafter.heads(wide, prev)  # (B, V, γ, V), (B, V, γ) or None
            d_logits = d_logits[:, :, :GAMMA].double()
            t_logits = logits[torch.arange(B), last].double()  # (B, V)
            if temperature == 0:
                p_t = torch.nn.functional.one_hot(t_logits.argmax(-1), V).double()
                q = torch.nn.functional.one_hot(d_logits.argmax(-1), V).double()
            else:
                p_t = torch.softmax(t_logits / temperature, dim=-1)
                q = torch.softmax(d_logits / temperature, dim=-1)  # (B, V, 2, V)
            if conf is None:  # DFlash: the top draft probability stands for the confidence (as `draft`)
                top = q.max(-1).values.clamp(1e-6, 1 - 1e-6)
                conf_l = (torch.log(top) - torch.log1p(-top)).numpy()
            else:
                conf_l = conf[:, :, :GAMMA].double().numpy()
        c = apply_sts(conf_l.reshape(-1, GAMMA), t_sts[:GAMMA]).reshape(B, V, GAMMA)
        for b in range(B):
            k = lo + b
            cases.append(StepCase(normalise(p_t[b].numpy()), normalise(q[b, 0, 0].numpy()), float(c[b, 0, 0]),
                                  c[b, :, 1].copy(), None, float(len(ctx[b]) - 1),
                                  names[k] if names is not None else f"context {k}"))
    return cases
