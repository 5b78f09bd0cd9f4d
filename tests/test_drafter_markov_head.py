"""The Markov head makes position k depend on the sampled x_{k−1}; confidences are probabilities."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from sparksim.drafter.model import draft  # noqa: E402

from ._drafter_fixtures import tiny_drafter, tiny_target  # noqa: E402


def _block(seed: int = 0):  # type: ignore[no-untyped-def]
    target = tiny_target(seed)
    drafter = tiny_drafter(target)
    torch.nn.init.normal_(drafter.markov.w2.weight, std=0.5)  # type: ignore[union-attr]
    ids = torch.randint(0, 256, (1, 12))
    _, hidden = target.forward_masked(ids, torch.arange(12)[None], None)
    out = drafter.backbone(drafter.context(drafter.target_features(hidden)), ids, torch.tensor([[6]]))
    return drafter, out, ids


def test_position_k_logits_change_with_the_previous_token_only_through_the_markov_head() -> None:
    """Suffix decay is what the Markov head fixes: position k must see x_{k−1}, and the backbone must not."""
    drafter, out, _ = _block()
    prev_a = torch.tensor([[[10, 20, 30, 40]]])
    prev_b = prev_a.clone()
    prev_b[0, 0, 2] = 99  # change x_{k−1} for k = 3 only
    la, _ = drafter.heads(out, prev_a)
    lb, _ = drafter.heads(out, prev_b)
    assert not torch.allclose(la[0, 0, 2], lb[0, 0, 2])
    assert torch.allclose(la[0, 0, [0, 1, 3]], lb[0, 0, [0, 1, 3]])
    dflash = tiny_drafter(tiny_target(), markov_rank=0, confidence_head=False)
    ld, conf = dflash.heads(out, prev_a)
    assert conf is None and torch.equal(ld, out.logits)


def test_confidences_lie_strictly_between_zero_and_one() -> None:
    """Survival products need conditional probabilities, never exactly 0 or 1 from the head."""
    drafter, out, ids = _block()
    d = draft(drafter, out, ids[:, [6]], 1.0, torch.Generator().manual_seed(0))
    c = torch.sigmoid(d.conf_logits)
    assert ((c > 0) & (c < 1)).all()
    assert d.tokens.shape == (1, 1, 4)
    assert torch.allclose(d.probs.sum(-1), torch.ones(1, 1, 4))


def test_a_headless_drafters_confidence_at_temperature_0_is_its_top_probability() -> None:
    """DFlash has no head: its confidence is the top draft probability, of softmax(logits) at T = 0
    (docs/drafter.md); the one-hot sampling distribution had made it 1 everywhere."""
    target = tiny_target()
    dflash = tiny_drafter(target, markov_rank=0, confidence_head=False).eval()
    ids = torch.randint(0, 256, (1, 30), generator=torch.Generator().manual_seed(0))
    _, hidden = target.forward_masked(ids, torch.arange(30)[None], None)
    anchors = torch.tensor([[5, 12, 20]])
    with torch.no_grad():
        out = dflash.backbone(dflash.context(dflash.target_features(hidden)), ids, anchors)
        greedy = draft(dflash, out, ids.gather(1, anchors), 0.0, torch.Generator().manual_seed(1))
    top = torch.softmax(out.logits.float(), dim=-1).max(-1).values.clamp(1e-6, 1 - 1e-6)
    torch.testing.assert_close(torch.sigmoid(greedy.conf_logits), top)
    assert top.max() < 0.99  # an untrained drafter is far from sure


def test_the_builtin_target_asked_for_no_tokens_answers_none() -> None:
    # max_new_tokens = 0 had raised a NameError from inside the sampling loop.
    assert tiny_target().generate([[1, 2, 3], [4]], 0, 1.0, None, eos_id=257, pad_id=258) == [[], []]
