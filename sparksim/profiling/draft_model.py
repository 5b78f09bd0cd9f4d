"""A DSpark-shaped drafter with random weights, for timing one drafting step by request count.

Shape as in DeepSpec's Qwen3DSparkModel: hidden states from m target layers are
concatenated, projected (fc: m·d → d) and normed into context features whose keys and
values every draft layer writes into its cache (KV injection); then a block of p tokens
(anchor + p − 1 masks) runs bidirectionally through the draft layers over that cache,
the LM head gives p base logits per request, and a Markov head (rank-256 bigram) samples
the block left to right with a confidence head beside it. A drafter trained for a block
of γ drafts p ≤ γ positions by running a block of p, so its cost goes by request count
and drafted positions.
"""

from __future__ import annotations

import torch
from torch import nn

from sparksim.cost.models import ModelSpec
from sparksim.cost.roofline import (
    DrafterShape,  # the one shape: the roofline prices it, the profiler builds it
)
from sparksim.decoder import Block, RMSNorm
from sparksim.profiling.model import (
    KVCache,
    StepLayout,
    block_config,
    layer_step,
    materialise,
    write_kv,
)


class DSparkDrafter(nn.Module):
    """Draft layers with KV injection, LM head, Markov head and confidence head."""

    def __init__(self, spec: ModelSpec, shape: DrafterShape) -> None:
        super().__init__()
        self.spec, self.shape = spec, shape
        d = spec.hidden
        self.embed = nn.Embedding(spec.vocab, d)
        self.fc = nn.Linear(shape.num_target_features * d, d, bias=False)
        self.hidden_norm = RMSNorm(d)
        self.layers: list[Block] = nn.ModuleList(  # type: ignore[assignment]
            Block(block_config(spec)) for _ in range(shape.num_layers))
        self.norm = RMSNorm(d)
        self.lm_head = nn.Linear(d, spec.vocab, bias=False)
        self.markov_w1 = nn.Embedding(spec.vocab, shape.markov_rank)
        self.markov_w2 = nn.Linear(shape.markov_rank, spec.vocab, bias=False)
        self.conf_head = nn.Linear(d + shape.markov_rank, 1)

    def forward(
        self, target_hidden: torch.Tensor, block_ids: torch.Tensor, ctx_layout: StepLayout,
        block_layout: StepLayout, cache: KVCache,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft one block per request; return (draft tokens (R, p), confidences (R, p)).

        `target_hidden` (R·(1+γ), m·d) holds the verified step's target features, injected
        at the positions `ctx_layout` names; `block_ids` (R·p,) are the anchor and p − 1
        masks of each request, p ≤ γ the positions drafted.
        """
        R, positions = block_layout.requests, block_layout.new_max  # p
        ctx = self.hidden_norm(self.fc(target_hidden))  # (R·(1+γ), d)
        x = self.embed(block_ids)  # (R·p, d)
        for i, layer in enumerate(self.layers):  # KV injection: the context through each layer's k/v
            keys, values = layer.attn.project_kv(ctx, ctx_layout.cos, ctx_layout.sin)  # (R·(1+γ), kv, D)
            write_kv(keys, values, ctx_layout, cache.k[i], cache.v[i])
            x = layer_step(layer, x, block_layout, cache.k[i], cache.v[i])
        h = self.norm(x)  # (R·p, d)
        base = self.lm_head(h).view(R, positions, -1)  # (R, p, V)
        h = h.view(R, positions, -1)
        prev = block_ids.view(R, positions)[:, 0]  # the anchor
        drafts, confs = [], []
        for k in range(positions):  # the sequential stage: each draft conditions on the last
            bias = self.markov_w2(self.markov_w1(prev))  # (R, V)
            conf = torch.sigmoid(self.conf_head(torch.cat((h[:, k], self.markov_w1(prev)), -1)))
            prev = (base[:, k] + bias).argmax(-1)  # (R,)
            drafts.append(prev)
            confs.append(conf[:, 0])
        return torch.stack(drafts, 1), torch.stack(confs, 1)


def build_drafter(
    spec: ModelSpec, shape: DrafterShape, device: torch.device, dtype: torch.dtype, seed: int = 1
) -> DSparkDrafter:
    """Build the drafter for target `spec` with random weights, on `device` in `dtype`."""
    with torch.device("meta"):
        drafter = DSparkDrafter(spec, shape)
    materialise(drafter, device, dtype, seed)
    return drafter.eval()
