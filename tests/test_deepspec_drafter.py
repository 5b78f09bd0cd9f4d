"""DeepSpec drafter checkpoints (DSpark, DFlash, Eagle3) run in sparksim's own modules and record trace sets.

The fixtures under tests/data/deepspec/ are tiny random-weight checkpoints in DeepSpec's layout and the
drafts sparksim's code made from them (`python -m tests.test_deepspec_drafter` rewrites them). They were
checked against DeepSpec's own modeling code once, outside the tests (docs/drafter.md gives the figures);
here they pin the forward pass so that a change to it, or to the tensor mapping, fails.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from sparksim.drafter.deepspec.checkpoint import load_drafter, save_drafter, tensor_names  # noqa: E402
from sparksim.drafter.deepspec.cli import main  # noqa: E402
from sparksim.drafter.deepspec.config import DSPARK_ARCH, EAGLE3_ARCH, DeepSpecConfig  # noqa: E402
from sparksim.drafter.deepspec.eval_sets import in_calibration_split, load_eval_items, parse_task  # noqa: E402
from sparksim.drafter.deepspec.hf_target import load_hf_target, verify_logits  # noqa: E402
from sparksim.drafter.deepspec.models import DeepSpecDrafter, DSparkDrafter, build_drafter  # noqa: E402
from sparksim.drafter.deepspec.recorder import calibrate, record  # noqa: E402
from sparksim.errors import ConfigError  # noqa: E402
from sparksim.traces.format import check_traceset, load_traceset  # noqa: E402

FIXTURES = Path(__file__).parent / "data" / "deepspec"
REPO = Path(__file__).resolve().parents[1]
TARGET = (6, 32, 112)  # the fixtures' target: decoder layers, hidden size, vocabulary


def random_drafter(cfg: DeepSpecConfig, seed: int) -> DeepSpecDrafter:
    """Return a drafter with random weights large enough that a wrong tensor mapping changes its outputs."""
    model = build_drafter(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.dim() == 1 and "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / max(1.0, p.shape[-1] ** 0.5))
    return model.eval().requires_grad_(False)


TINY = {"hidden_size": 32, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16, "intermediate_size": 48,
        "vocab_size": 112, "rms_norm_eps": 1e-6, "rope_theta": 1e6, "attention_bias": False,
        "num_target_layers": 6}
CONFIGS = {
    "dspark": DeepSpecConfig(architecture=DSPARK_ARCH, kind="dspark", gamma=4, num_layers=2,
                                target_layer_ids=(-1, 2, 4), mask_token_id=111, markov_rank=8,
                                markov_head_type="vanilla", confidence_head=True, confidence_with_markov=True,
                                **TINY),
    "dflash": DeepSpecConfig(architecture=DSPARK_ARCH, kind="dflash", gamma=4, num_layers=2,
                                target_layer_ids=(1, 3), mask_token_id=111, **TINY),
    "eagle3": DeepSpecConfig(architecture=EAGLE3_ARCH, kind="eagle3", gamma=4, num_layers=1,
                                target_layer_ids=(0, 1, 2, 3, 4), **TINY),
}
ANCHORS = [1, 4, 9, 13, 18]  # of a 20-token sequence; Eagle3 needs at least one token before the anchor


@pytest.fixture(autouse=True)
def one_thread() -> object:
    """Tiny matmuls gain nothing from threads, and the machine is shared."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _inputs(cfg: DeepSpecConfig, seed: int = 7) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 100, (1, 20), generator=gen)
    feats = torch.randn(1, 20, len(cfg.target_layer_ids) * cfg.hidden_size, generator=gen)
    return ids, feats, torch.tensor([ANCHORS])


def make_fixtures(out: Path = FIXTURES) -> None:
    """Write the three checkpoints and the T=0 drafts sparksim's code makes from them (run by hand)."""
    from safetensors.torch import save_file

    for seed, (name, cfg) in enumerate(CONFIGS.items()):
        model = random_drafter(cfg, seed=100 + seed)
        save_drafter(model, out / name)
        model = load_drafter(out / name, target=TARGET)
        ids, feats, anchors = _inputs(cfg)
        prop = model.propose(feats, ids, anchors, 0.0, None)
        save_file({"ids": ids, "feats": feats, "anchors": anchors, "tokens": prop.tokens,
                   "logits": prop.logits.contiguous(), "conf_logits": prop.conf_logits.contiguous()},
                  str(out / f"reference-{name}.safetensors"))


def _reference(name: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return dict(load_file(str(FIXTURES / f"reference-{name}.safetensors")))


def _copy(name: str, tmp: Path) -> Path:
    import shutil

    return Path(shutil.copytree(FIXTURES / name, tmp / name))


# --------------------------------------------------------------------------- equivalence


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fixture_checkpoints_reproduce_their_recorded_drafts(name: str) -> None:
    """The γ draft logits, tokens and confidences of each architecture are pinned (checked against DeepSpec once)."""
    ref = _reference(name)
    model = load_drafter(FIXTURES / name, target=TARGET)
    prop = model.propose(ref["feats"], ref["ids"], ref["anchors"], 0.0, None)
    assert torch.equal(prop.tokens, ref["tokens"])
    assert (prop.logits - ref["logits"]).abs().max() < 1e-4
    assert (prop.conf_logits - ref["conf_logits"]).abs().max() < 1e-4
    assert prop.conf_from_head == (name == "dspark")
    assert torch.equal(prop.probs.argmax(-1), prop.tokens) and torch.all(prop.probs.sum(-1) == 1)


def test_fixture_layout_is_the_one_deepspec_saves() -> None:
    """Tensor names and config keys as DeepSpec's `save_pretrained` writes them (what released checkpoints hold)."""
    from safetensors import safe_open

    with safe_open(str(FIXTURES / "dspark" / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    per_layer = ["input_layernorm.weight", "post_attention_layernorm.weight", "mlp.down_proj.weight",
                 "mlp.gate_proj.weight", "mlp.up_proj.weight", "self_attn.k_norm.weight", "self_attn.k_proj.weight",
                 "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.q_proj.weight",
                 "self_attn.v_proj.weight"]
    expected = {f"layers.{i}.{n}" for i in range(2) for n in per_layer} | {
        "confidence_head.proj.bias", "confidence_head.proj.weight", "embed_tokens.weight", "fc.weight",
        "hidden_norm.weight", "lm_head.weight", "markov_head.markov_w1.weight", "markov_head.markov_w2.weight",
        "norm.weight"}
    assert names == expected
    raw = json.loads((FIXTURES / "dspark" / "config.json").read_text())
    assert raw["architectures"] == ["Qwen3DSparkModel"] and raw["block_size"] == 4
    assert raw["rope_parameters"] == {"rope_theta": 1e6, "rope_type": "default"}
    eagle = json.loads((FIXTURES / "eagle3" / "config.json").read_text())
    assert eagle["architectures"] == ["Qwen3Eagle3Model"] and eagle["ttt_length"] == 4


def test_a_block_never_reads_the_target_at_or_after_its_anchor() -> None:
    """Drafts at anchor a may use target states < a and tokens ≤ a only; anything later is the future."""
    for name, cfg in CONFIGS.items():
        model = load_drafter(FIXTURES / name)
        ids, feats, _ = _inputs(cfg)
        a = 9
        base = model.propose(feats, ids, torch.tensor([[a]]), 0.0, None)
        ids2, feats2 = ids.clone(), feats.clone()
        ids2[:, a + 1:] = (ids2[:, a + 1:] + 5) % 100
        feats2[:, a:] = torch.randn_like(feats2[:, a:])
        other = model.propose(feats2, ids2, torch.tensor([[a]]), 0.0, None)
        assert torch.equal(base.tokens, other.tokens), name
        assert (base.logits - other.logits).abs().max() < 1e-5, name
        ids3 = ids.clone()
        ids3[:, a] = (ids3[:, a] + 5) % 100  # the anchor token itself is read
        assert (model.propose(feats, ids3, torch.tensor([[a]]), 0.0, None).logits - base.logits).abs().max() > 1e-3


def test_drafting_anchors_together_equals_drafting_them_one_by_one() -> None:
    """The recorder batches anchors (block mask, Eagle3 chains); each block must come out as if alone."""
    for name, cfg in CONFIGS.items():
        model = load_drafter(FIXTURES / name)
        ids, feats, anchors = _inputs(cfg)
        together = model.propose(feats, ids, anchors, 0.0, None)
        for i, a in enumerate(ANCHORS):
            alone = model.propose(feats, ids, torch.tensor([[a]]), 0.0, None)
            assert torch.equal(alone.tokens[0, 0], together.tokens[0, i]), (name, a)
            assert (alone.logits[0, 0] - together.logits[0, i]).abs().max() < 1e-4, (name, a)
            assert (alone.conf_logits[0, 0] - together.conf_logits[0, i]).abs().max() < 1e-4, (name, a)


def test_markov_head_adds_the_bigram_bias_of_the_sampled_previous_token() -> None:
    """At T=1 each position's logits are U_k + W2·W1[x_{k−1}] with x_{k−1} the token just sampled."""
    model = load_drafter(FIXTURES / "dspark")
    assert isinstance(model, DSparkDrafter) and model.markov is not None
    ids, feats, anchors = _inputs(model.cfg)
    prop = model.propose(feats, ids, anchors, 1.0, torch.Generator().manual_seed(0))
    base, _ = model.backbone(model.context(feats[:, :18]), ids, anchors)
    prev = torch.cat([ids.gather(1, anchors)[..., None], prop.tokens[:, :, :-1]], dim=-1)
    want = base + model.markov.w2(model.markov.w1(prev))
    assert (prop.logits - want).abs().max() < 1e-5
    assert torch.allclose(prop.probs.sum(-1), torch.ones(1, 5, 4))
    assert (prop.probs.gather(-1, prop.tokens[..., None]) > 0).all()


@pytest.mark.parametrize("kind", ["gated", "rnn"])
def test_other_markov_heads_round_trip_through_the_deepspec_layout(kind: str, tmp_path: Path) -> None:
    """Gated and RNN heads (DeepSpec's options) save and load under their own tensor names."""
    cfg = dataclasses.replace(CONFIGS["dspark"], markov_head_type=kind)
    model = random_drafter(cfg, seed=3)
    save_drafter(model, tmp_path / kind)
    again = load_drafter(tmp_path / kind, target=TARGET)
    ids, feats, anchors = _inputs(cfg)
    a, b = model.propose(feats, ids, anchors, 0.0, None), again.propose(feats, ids, anchors, 0.0, None)
    assert torch.equal(a.logits, b.logits)
    extra = "markov_head.gate_proj.weight" if kind == "gated" else "markov_head.joint_proj.weight"
    assert extra in tensor_names(model)


def test_dtype_is_a_parameter_and_bf16_stays_close_to_fp32() -> None:
    """The recorder runs bf16 on GPUs; nothing in the drafter may assume fp32 or the CPU."""
    ref = _reference("dspark")
    model = load_drafter(FIXTURES / "dspark", dtype=torch.bfloat16)
    assert model.param_dtype() == torch.bfloat16
    prop = model.propose(ref["feats"].bfloat16(), ref["ids"], ref["anchors"], 0.0, None)
    assert prop.logits.dtype == torch.float32
    assert (prop.logits - ref["logits"]).abs().max() < 0.5
    assert (prop.conf_logits - ref["conf_logits"]).abs().max() < 0.5


# --------------------------------------------------------------------------- errors


def _edit_config(path: Path, **changes: object) -> None:
    raw = json.loads((path / "config.json").read_text())
    raw.update(changes)
    (path / "config.json").write_text(json.dumps(raw))


@pytest.mark.parametrize(("arch", "match"), [("Gemma4DSparkModel", "not supported"),
                                             ("LlamaForCausalLM", "not a DeepSpec drafter")])
def test_unknown_architectures_are_refused_by_name(arch: str, match: str, tmp_path: Path) -> None:
    """A checkpoint this code cannot run must say so, not load into the wrong module."""
    path = _copy("dspark", tmp_path)
    _edit_config(path, architectures=[arch])
    with pytest.raises(ConfigError, match=match):
        load_drafter(path)


def test_missing_unexpected_and_misshapen_tensors_are_refused(tmp_path: Path) -> None:
    """A truncated download or a config that does not describe the weights fails with the tensor's name."""
    from safetensors.torch import load_file, save_file

    path = _copy("dspark", tmp_path)
    state = load_file(str(path / "model.safetensors"))
    save_file({k: v for k, v in state.items() if k != "markov_head.markov_w2.weight"}, str(path / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"missing tensors markov_head\.markov_w2\.weight"):
        load_drafter(path)
    save_file({**state, "extra.weight": torch.zeros(2)}, str(path / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"unexpected tensors extra\.weight"):
        load_drafter(path)
    save_file(state, str(path / "model.safetensors"))
    _edit_config(path, markov_rank=16)
    with pytest.raises(ConfigError, match=r"markov_head\.markov_w1\.weight"):
        load_drafter(path)
    _edit_config(path, markov_rank=8, block_size=None)
    with pytest.raises(ConfigError, match="missing key 'block_size'"):
        load_drafter(path)


@pytest.mark.parametrize(("shape", "match"), [((6, 64, 112), "hidden_size=32 but the target's is 64"),
                                              ((8, 32, 112), "6-layer target"),
                                              ((6, 32, 100), "vocab_size=112")])
def test_a_target_of_another_shape_is_refused(shape: tuple[int, int, int], match: str) -> None:
    """Hidden states of a different target (width, depth, vocabulary) would be silently wrong features."""
    with pytest.raises(ConfigError, match=match):
        load_drafter(FIXTURES / "dspark", target=shape)


def test_injecting_the_final_post_norm_layer_is_refused(tmp_path: Path) -> None:
    """HF's last hidden state is after the final norm; DeepSpec's caches hold the raw layer output."""
    path = _copy("dflash", tmp_path)
    _edit_config(path, target_layer_ids=[1, 5])
    with pytest.raises(ConfigError, match="target_layer_ids"):
        load_drafter(path, target=TARGET)


# --------------------------------------------------------------------------- HF target and the recorder


def _tiny_hf_target(path: Path) -> Path:
    """Save a random 6-layer width-32 Qwen3 with a 100-symbol character tokenizer and a chat template."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    specials = ["<unk>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    vocab = {t: i for i, t in enumerate([*specials, "\n", *[chr(c) for c in range(32, 127)]])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.add_special_tokens(specials)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<|im_end|>",
                                                pad_token="<|endoftext|>")
    fast.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(vocab_size=112, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                   max_position_embeddings=512, tie_word_embeddings=False,
                                   eos_token_id=2, pad_token_id=3, bos_token_id=1)
    transformers.Qwen3ForCausalLM(cfg).save_pretrained(path)
    fast.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny_hf_target(tmp_path_factory.mktemp("qwen3"))


def test_verification_over_many_blocks_equals_each_prefix_run_alone(hf_dir: Path) -> None:
    """One masked target pass must give, for every draft, the logits of context + earlier drafts."""
    target = load_hf_target(hf_dir, device="cpu", dtype=torch.float32)
    ids = torch.randint(0, 100, (1, 14), generator=torch.Generator().manual_seed(1))
    seq_logits = target.model(input_ids=ids).logits
    anchors, tokens = torch.tensor([[3, 8, 12]]), torch.randint(0, 100, (1, 3, 4))
    got = verify_logits(target.model, ids, seq_logits, anchors, tokens)  # (1, 3, 4, V)
    for i, a in enumerate(anchors[0].tolist()):
        for k in range(4):
            seq = torch.cat([ids[0, : a + 1], tokens[0, i, :k]])[None]
            assert torch.allclose(target.model(input_ids=seq).logits[0, -1], got[0, i, k], atol=1e-4)


def _eval_dir(path: Path) -> Path:
    path.mkdir()
    for name, stem in (("gsm8k", "What is 3 + "), ("mt-bench", "Write a line about ")):
        rows = [json.dumps({"turns": [f"{stem}{i}?", "second turn is ignored"]}) for i in range(6)]
        (path / f"{name}.jsonl").write_text("\n".join(rows) + "\n")
    return path


def test_record_entry_point_writes_valid_trace_sets_for_every_drafter_and_temperature(
        hf_dir: Path, tmp_path: Path) -> None:
    """`python -m sparksim.drafter.deepspec record` end to end on tiny random models, as the Qwen3-8B script runs it."""
    eval_dir, out = _eval_dir(tmp_path / "eval"), tmp_path / "out"
    items = load_eval_items(eval_dir, [parse_task("gsm8k"), parse_task("mt-bench")])
    n_cal = sum(in_calibration_split(it, 0.3) for it in items)
    assert 0 < n_cal < len(items)
    logs: list[str] = []
    status = main(["record", "--target", str(hf_dir), "--eval-dir", str(eval_dir), "--out-dir", str(out),
                      *[a for n in CONFIGS for a in ("--drafter", f"{n}={FIXTURES / n}")],
                      "--tasks", "gsm8k", "mt-bench", "--gamma", "4", "--temperature", "0", "--temperature", "1",
                      "--max-new-tokens", "6", "--calibration-fraction", "0.3", "--device", "cpu",
                      "--dtype", "fp32", "--anchor-chunk", "4", "--name", "tiny"], log=logs.append)
    assert status == 0
    for name in CONFIGS:
        for t in ("0", "1"):
            path = out / f"tiny-{name}-t{t}"
            assert check_traceset(path) == [], path
            ts = load_traceset(path)
            assert ts.gamma == 4 and ts.domains == ["chat", "math"] and ts.num_requests == len(items) - n_cal
            assert ts.card["temperature"] == float(t) and ts.card["calibration"]["method"] == "sts"
            assert set(ts.card["acceptance_by_dataset"]) == {"gsm8k", "mt-bench"}
            assert (out / "calibration" / f"tiny-{name}-t{t}.json").is_file()
            assert ts.p_accept is not None
            if t == "0":  # greedy on both sides: 1 − TV is 0 or 1 and accepted is its leading run of ones
                assert set(np.unique(ts.p_accept)) <= {0.0, 1.0}
                lead = np.cumprod(ts.p_accept == 1.0, axis=1).sum(1)
                assert np.array_equal(lead, ts.accepted)
    # one generation per temperature and split, shared by the three drafters
    assert sum(line.startswith("generated") for line in logs) == 4


def test_single_set_record_applies_the_calibration_that_calibrate_fitted(hf_dir: Path, tmp_path: Path) -> None:
    """The front doors `sparksim record/calibrate --drafter-format deepspec` would call, on a prompt file."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps(r) for r in [
        {"turns": ["Add 2 and 2."], "dataset": "gsm8k"}, {"prompt": "User: hi\nAssistant: ", "domain": "chat"},
        {"turns": ["Write a loop."], "domain": "code"}]) + "\n")
    drafter = _copy("dspark", tmp_path)
    cal = calibrate(hf_dir, drafter, prompts, max_new_tokens=5, log=lambda _: None)
    assert (drafter / "calibration.json").is_file() and len(cal["temperatures"]) == 4
    out = record(hf_dir, drafter, prompts, tmp_path / "set", gamma=4, max_new_tokens=5, command="test",
                    log=lambda _: None)
    ts = load_traceset(out)
    assert ts.card["calibration"]["temperatures"] == cal["temperatures"] and ts.domains == ["chat", "code", "math"]
    assert ts.conf_raw is not None
    temps = np.asarray(cal["temperatures"])
    want = 1 / (1 + np.exp(-np.log(ts.conf_raw / (1 - ts.conf_raw)) / temps))
    assert np.allclose(ts.conf, want, atol=1e-4)
    with pytest.raises(ConfigError, match="γ=4 but --gamma 7"):
        record(hf_dir, drafter, prompts, tmp_path / "other", gamma=7, log=lambda _: None)
    # STS fitted at T = 1 calibrates to acceptance at T = 1: a T = 0 recording cannot use it
    with pytest.raises(ConfigError, match="fitted at sampling temperature 1, but this run samples at 0"):
        record(hf_dir, drafter, prompts, tmp_path / "greedy", gamma=4, temperature=0.0, log=lambda _: None)


def test_check_entry_point_refuses_a_drafter_for_another_target(hf_dir: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The script runs `check` first, so a wrong pairing fails in seconds, not after loading 16 GB."""
    path = _copy("dspark", tmp_path)
    _edit_config(path, num_target_layers=36)
    assert main(["check", "--target", str(hf_dir), "--drafter", f"dspark={path}"], log=lambda _: None) == 2
    assert "36-layer target" in capsys.readouterr().err
    assert main(["check", "--target", str(hf_dir), "--drafter", f"dflash={FIXTURES / 'dflash'}"],
                   log=lambda _: None) == 0


def test_the_qwen3_8b_script_stops_with_a_clear_message_when_a_folder_is_missing(tmp_path: Path) -> None:
    """Users run it on a rented GPU: a typo in a path must fail at once and say which path."""
    target = tmp_path / "qwen3"
    env = {**os.environ, "EVAL_DIR": str(tmp_path / "eval"), "PYTHON": "false"}

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(REPO / "scripts" / "record_qwen3_8b.sh"), str(target),
                               str(FIXTURES / "dspark"), str(tmp_path / "no-dflash"), str(tmp_path / "out")],
                              capture_output=True, text=True, env=env, timeout=30)

    res = run()
    assert res.returncode == 1 and f"'{target}' does not exist" in res.stderr
    target.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (target / name).write_text("{}")
    res = run()
    assert res.returncode == 1 and "DFlash drafter folder" in res.stderr and "no-dflash" in res.stderr
    assert not (tmp_path / "out").exists()


if __name__ == "__main__":
    make_fixtures()
    print(f"wrote {sorted(p.name for p in FIXTURES.iterdir())}")


def test_cached_responses_are_reused_only_for_the_same_dtype_and_batch_size(hf_dir: Path, tmp_path: Path) -> None:
    """bf16 on a GPU generates other responses than fp32: a cache hit must not cross them."""
    from sparksim.drafter.deepspec.recorder import target_responses

    items = load_eval_items(_eval_dir(tmp_path / "eval"), [parse_task("gsm8k")])[:2]
    logs: list[str] = []

    def responses(dtype: torch.dtype, batch_size: int) -> None:
        target = load_hf_target(hf_dir, device="cpu", dtype=dtype)
        target_responses(target, items, temperature=0.0, max_new_tokens=3, seed=0, batch_size=batch_size,
                         cache_dir=tmp_path / "cache", log=logs.append)

    responses(torch.float32, 2)
    responses(torch.float32, 2)
    responses(torch.bfloat16, 2)
    responses(torch.float32, 1)
    kinds = [line.split()[0] for line in logs if line.startswith(("reusing", "generated 2/2"))]  # one a call
    assert kinds == ["generated", "reusing", "generated", "generated"], logs
