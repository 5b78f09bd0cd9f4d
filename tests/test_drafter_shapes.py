"""Tensor shapes and the block attention mask of the DSpark drafter."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from sparksim.drafter.model import block_mask  # noqa: E402

from ._drafter_fixtures import tiny_drafter, tiny_target  # noqa: E402


def test_backbone_and_heads_return_one_row_per_anchor_and_block_position() -> None:
    """γ inputs per anchor must give γ logits, γ hidden states and γ confidences."""
    target = tiny_target()
    drafter = tiny_drafter(target)
    ids = torch.randint(0, 256, (2, 20))
    anchors = torch.tensor([[3, 7, 11], [5, 6, 15]])
    _, hidden = target.forward_masked(ids, torch.arange(20).expand(2, 20), None)
    feats = drafter.target_features(hidden)
    assert feats.shape == (2, 20, 2 * 32)
    out = drafter.backbone(drafter.context(feats), ids, anchors)
    assert out.logits.shape == (2, 3, 4, 260)
    assert out.hidden.shape == (2, 3, 4, 32)
    logits, conf = drafter.heads(out, torch.randint(0, 256, (2, 3, 4)))
    assert logits.shape == (2, 3, 4, 260)
    assert conf is not None and conf.shape == (2, 3, 4)


def test_block_mask_sees_context_before_the_anchor_and_its_whole_block_only() -> None:
    """KV injection must not leak the anchor's own target state or any later token into a block."""
    mask = block_mask(torch.tensor([[2, 4]]), seq_len=6, gamma=3)[0, 0]  # (6, 6 + 6)
    assert mask.shape == (6, 12)
    assert mask[0, :6].tolist() == [True, True, False, False, False, False]
    assert mask[3, :6].tolist() == [True, True, True, True, False, False]
    assert mask[1, 6:].tolist() == [True, True, True, False, False, False]  # bidirectional in-block
    assert mask[5, 6:].tolist() == [False, False, False, True, True, True]


def test_changing_a_later_context_token_does_not_change_an_earlier_block() -> None:
    """A block anchored at a may only read target states of positions < a."""
    target = tiny_target()
    drafter = tiny_drafter(target)
    ids = torch.randint(0, 256, (1, 16))
    anchors = torch.tensor([[5]])
    outs = []
    for tail in (1, 2):
        x = ids.clone()
        x[0, 9:] = tail
        _, hidden = target.forward_masked(x, torch.arange(16)[None], None)
        outs.append(drafter.backbone(drafter.context(drafter.target_features(hidden)), x, anchors).logits)
    assert torch.allclose(outs[0], outs[1], atol=1e-5)


def test_builtin_block_verification_matches_running_each_prefix_on_its_own() -> None:
    """The recorder's one-pass verification must equal a forward over context + drafted prefix."""
    from sparksim.drafter.record import block_logits

    target = tiny_target()
    ids = torch.randint(0, 256, (1, 10))
    seq_logits, _ = target.forward_masked(ids, torch.arange(10)[None], None)
    anchors = torch.tensor([[2, 6]])
    drafts = torch.randint(0, 256, (1, 2, 3))
    got = block_logits(target, ids, seq_logits, anchors, drafts)
    for i in range(2):
        a = int(anchors[0, i])
        for k in range(3):
            seq = torch.cat([ids[0, : a + 1], drafts[0, i, :k]])[None]
            ref, _ = target.forward_masked(seq, torch.arange(seq.shape[1])[None], None)
            assert torch.allclose(ref[0, -1], got[0, i, k], atol=1e-4)


def test_builtin_generation_with_left_padding_matches_unpadded_generation() -> None:
    """Batched generation must not let padding change a prompt's continuation (greedy check)."""
    target = tiny_target()
    prompts = [[256, 1, 2, 3, 4, 5], [256, 9]]
    batched = target.generate(prompts, 5, 0.0, None, 257, 258)
    alone = [target.generate([p], 5, 0.0, None, 257, 258)[0] for p in prompts]
    assert batched == alone
