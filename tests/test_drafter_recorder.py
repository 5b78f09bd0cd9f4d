"""The recorder writes a valid trace set, and refuses mismatched inputs before any long work."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from sparksim.drafter.data import Item, write_prompts  # noqa: E402
from sparksim.drafter.record import record  # noqa: E402
from sparksim.drafter.target import TargetAdapter, load_target  # noqa: E402
from sparksim.errors import ConfigError  # noqa: E402
from sparksim.traces.format import check_traceset, load_traceset  # noqa: E402

from ._drafter_fixtures import save_pair  # noqa: E402


def _prompts(path: Path) -> Path:
    write_prompts(path, [Item(f"{d}{i}", d, f"User: {d} question {i}\nAssistant: ", "")
                         for d in ("math", "code", "chat") for i in range(2)])
    return path


def test_recorder_output_passes_the_trace_validator(tmp_path: Path) -> None:
    """Recorded sets feed the simulator; they must load under the same checks as any other set."""
    target_dir, drafter_dir = save_pair(tmp_path)
    out = record(target_dir, drafter_dir, _prompts(tmp_path / "p.jsonl"), tmp_path / "traces" / "t",
                 gamma=4, max_new_tokens=12, command="test", log=lambda _: None)
    assert check_traceset(out) == []
    ts = load_traceset(out)
    assert ts.gamma == 4 and ts.domains == ["chat", "code", "math"]
    assert ts.p_accept is not None and ts.conf_raw is not None
    assert ((ts.p_accept >= 0) & (ts.p_accept <= 1)).all()
    assert set(ts.card["acceptance"]) == {"chat", "code", "math"}
    assert ts.card["source"] == "recorded"
    # without a calibration file, the calibrated confidences equal the raw ones
    assert np.allclose(ts.conf, ts.conf_raw)


def test_gamma_mismatch_between_drafter_and_recorder_is_refused(tmp_path: Path) -> None:
    """A γ=7 recording of a γ=4 drafter would silently record the wrong blocks."""
    target_dir, drafter_dir = save_pair(tmp_path)
    with pytest.raises(ConfigError, match="gamma=4"):
        record(target_dir, drafter_dir, _prompts(tmp_path / "p.jsonl"), tmp_path / "o", gamma=7,
               log=lambda _: None)
    assert not (tmp_path / "o").exists()


def test_tokenizer_mismatch_between_target_and_drafter_is_refused(tmp_path: Path) -> None:
    """Shared embeddings only make sense when both sides read the same token ids."""
    target_dir, drafter_dir = save_pair(tmp_path)
    cfg = json.loads((drafter_dir / "config.json").read_text())
    cfg["tokenizer"] = "bytes-v0"
    (drafter_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="tokenizer mismatch"):
        record(target_dir, drafter_dir, _prompts(tmp_path / "p.jsonl"), tmp_path / "o", gamma=4,
               log=lambda _: None)


def test_a_target_without_hidden_states_is_refused_before_any_work() -> None:
    """KV injection needs per-layer hidden states; a target that hides them must fail loudly."""

    class Opaque(TargetAdapter):
        n_layers, d_model, vocab_size, tokenizer_name = 4, 8, 260, "bytes-v1"

        def forward_masked(self, ids, positions, mask):  # type: ignore[no-untyped-def]
            return torch.zeros(*ids.shape, 260), None

        def generate(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            raise AssertionError("must not get this far")

    with pytest.raises(ConfigError, match="hidden states are not accessible"):
        Opaque().check_hidden_states()


def test_loading_a_target_directory_without_config_names_the_file(tmp_path: Path) -> None:
    """Bad paths must say which file is missing."""
    with pytest.raises(ConfigError, match=r"config\.json"):
        load_target(tmp_path)
