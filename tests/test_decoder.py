"""The one decoder (`sparksim.decoder`): every torch model is built from it, and its RoPE is the textbook rotation.

Why: the target, the drafters, the DeepSpec loader and the profiler once carried their own
attention, MLP and RoPE, and a fix to one never reached the others. These tests hold the users
to the one module and pin the rotation by hand, so a sign or pairing slip fails here by name
rather than as a drift in some downstream logit.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from sparksim.decoder import MLP, Attention, Block, RMSNorm, apply_rope, rope_angles  # noqa: E402

# --------------------------------------------------------------------------- one module


def _assert_built_from_the_decoder(layer: torch.nn.Module) -> None:
    assert isinstance(layer.attn, Attention) and isinstance(layer.mlp, MLP)
    assert all(isinstance(n, RMSNorm) for name, n in layer.named_children() if name.endswith("norm"))


def test_target_drafters_deepspec_and_profiler_share_one_decoder_block() -> None:
    # Each user differs only in its BlockConfig; none keeps a layer class of its own but
    # Eagle3's, whose two input norms and 2d-wide attention input are a different layer.
    from sparksim.cost.models import ModelSpec
    from sparksim.cost.roofline import DrafterShape
    from sparksim.drafter.deepspec.config import DSPARK_ARCH, EAGLE3_ARCH, DeepSpecConfig
    from sparksim.drafter.deepspec.models import Eagle3Layer, build_drafter
    from sparksim.profiling.draft_model import DSparkDrafter
    from sparksim.profiling.model import DecoderModel

    from ._drafter_fixtures import tiny_drafter, tiny_target

    target = tiny_target()
    spec = ModelSpec("tiny", num_layers=1, hidden=32, num_heads=4, num_kv_heads=2, head_dim=8,
                     intermediate=48, vocab=64, max_position=128)
    common = {"hidden_size": 32, "num_heads": 4, "num_kv_heads": 2, "head_dim": 8, "intermediate_size": 48,
              "vocab_size": 64, "rms_norm_eps": 1e-6, "rope_theta": 1e6, "attention_bias": False,
              "num_target_layers": 4, "num_layers": 1, "gamma": 3}
    dspark = DeepSpecConfig(architecture=DSPARK_ARCH, kind="dflash", target_layer_ids=(1,), mask_token_id=63,
                            **common)
    eagle = DeepSpecConfig(architecture=EAGLE3_ARCH, kind="eagle3", target_layer_ids=(0, 1),
                           **common)
    users = {
        "target": target.model.layers,
        "drafter": tiny_drafter(target).layers,
        "deepspec dspark": build_drafter(dspark).layers,
        "profiler target": DecoderModel(spec).layers,
        "profiler drafter": DSparkDrafter(spec, DrafterShape(num_layers=1, gamma=3)).layers,
    }
    for name, layers in users.items():
        assert len(layers) > 0 and all(type(layer) is Block for layer in layers), name
        for layer in layers:
            _assert_built_from_the_decoder(layer)
    eagle_layers = build_drafter(eagle).layers
    assert all(type(layer) is Eagle3Layer for layer in eagle_layers)
    for layer in eagle_layers:
        _assert_built_from_the_decoder(layer)


def test_each_user_keeps_its_checkpoint_layout_through_the_config() -> None:
    # The shipped checkpoints' tensor names are the contract: a fused qkv for the target,
    # q plus a fused kv for the drafter, three matrices for HF-style models.
    from ._drafter_fixtures import tiny_drafter, tiny_target

    target = tiny_target()
    assert {k.split("layers.0.")[1] for k in target.model.state_dict() if k.startswith("layers.0.")} == {
        "attn_norm.weight", "attn.qkv.weight", "attn.out.weight", "attn.q_norm.weight", "attn.k_norm.weight",
        "mlp_norm.weight", "mlp.gate.weight", "mlp.up.weight", "mlp.down.weight"}
    drafter = tiny_drafter(target)
    attn = {k.split("layers.0.attn.")[1] for k in drafter.trainable_state() if k.startswith("layers.0.attn.")}
    assert attn == {"q.weight", "kv.weight", "out.weight", "q_norm.weight", "k_norm.weight"}


# --------------------------------------------------------------------------- RoPE


def test_rope_rotates_each_pair_by_position_times_its_frequency() -> None:
    # Dh = 4, θ = 100: frequencies θ^(−0/4) = 1 and θ^(−2/4) = 1/10. At position 3 the
    # first pair turns by 3 rad, the second by 0.3 rad; x = (1, 2, 3, 4).
    c, s = rope_angles(torch.tensor(3), 4, 100.0)
    assert c.shape == (2,)
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    a, b = 3.0, 0.3
    # interleaved pairs (x0, x1), (x2, x3)
    want = [1 * math.cos(a) - 2 * math.sin(a), 1 * math.sin(a) + 2 * math.cos(a),
            3 * math.cos(b) - 4 * math.sin(b), 3 * math.sin(b) + 4 * math.cos(b)]
    torch.testing.assert_close(apply_rope(x, c, s, interleaved=True), torch.tensor(want), rtol=0, atol=1e-6)
    # halves: pairs (x0, x2), (x1, x3)
    want = [1 * math.cos(a) - 3 * math.sin(a), 2 * math.cos(b) - 4 * math.sin(b),
            1 * math.sin(a) + 3 * math.cos(a), 2 * math.sin(b) + 4 * math.cos(b)]
    torch.testing.assert_close(apply_rope(x, c, s, interleaved=False), torch.tensor(want), rtol=0, atol=1e-6)
    c0, s0 = rope_angles(torch.tensor(0), 4, 100.0)
    torch.testing.assert_close(apply_rope(x, c0, s0, interleaved=False), x)  # position 0: identity


def test_the_two_pairings_are_one_rotation_with_the_lanes_permuted() -> None:
    # What export_hf relies on: permuting interleaved lanes into half order commutes with RoPE.
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, 16, generator=gen)  # (tokens, heads, Dh)
    cos, sin = rope_angles(torch.tensor([0, 4, 9, 17, 31]), 16, 10000.0)  # (tokens, Dh/2)
    c, s = cos[:, None], sin[:, None]
    perm = torch.cat([torch.arange(0, 16, 2), torch.arange(1, 16, 2)])
    torch.testing.assert_close(apply_rope(x, c, s, interleaved=True)[..., perm],
                               apply_rope(x[..., perm], c, s, interleaved=False))


def test_attention_scores_depend_on_relative_position_only() -> None:
    # The property RoPE exists for: q(m)·k(n) is a function of m − n.
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(8, generator=gen), torch.randn(8, generator=gen)
    cos, sin = rope_angles(torch.arange(64), 8, 10000.0)  # a table: row p holds position p
    for interleaved in (True, False):
        def score(m: int, n: int, il: bool = interleaved) -> float:
            return float(apply_rope(q, cos[m], sin[m], il) @ apply_rope(k, cos[n], sin[n], il))
        assert score(10, 3) == pytest.approx(score(40, 33), abs=1e-5)
        assert score(10, 3) != pytest.approx(score(10, 4), abs=1e-3)


# --------------------------------------------------------------------------- attention


def test_a_cached_forward_equals_the_full_causal_forward_with_gqa() -> None:
    # KV cache, GQA and the causal flag are one code path for every user; feeding a
    # sequence in two calls must give the one-call result.
    from sparksim.decoder import BlockConfig

    cfg = BlockConfig(d_model=32, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48, rope_theta=1e4)
    torch.manual_seed(0)
    block = Block(cfg).eval()
    x = torch.randn(2, 9, 32)
    cos, sin = rope_angles(torch.arange(16), 8, 1e4)
    pos = torch.arange(9).expand(2, 9)
    with torch.no_grad():
        full, (k, v) = block(x, cos[pos], sin[pos])
        first, past = block(x[:, :5], cos[pos[:, :5]], sin[pos[:, :5]])
        rest, _ = block(x[:, 5:], cos[pos[:, 5:]], sin[pos[:, 5:]],
                        torch.ones(2, 1, 4, 9, dtype=torch.bool).tril(5), past)
    assert k.shape == (2, 2, 9, 8) and v.shape == (2, 2, 9, 8)
    torch.testing.assert_close(torch.cat([first, rest], dim=1), full, rtol=1e-5, atol=1e-5)
    # no mask with a past is causal too, as the docstring says (it had let the new tokens see
    # each other both ways)
    with torch.no_grad():
        unmasked, _ = block(x[:, 5:], cos[pos[:, 5:]], sin[pos[:, 5:]], None, past)
    torch.testing.assert_close(unmasked, rest, rtol=1e-5, atol=1e-5)
