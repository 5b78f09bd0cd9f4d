"""Synthetic trace sets: calibration to Table 1, per-position shapes, miscalibration, determinism."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from sparksim.errors import ConfigError
from sparksim.traces import check_traceset, load_traceset
from sparksim.traces.stats import (
    accepted_length,
    conditional_acceptance,
    domain_stats,
    round_tokens,
    walk_rows,
    walk_totals,
)
from sparksim.traces.synth import SynthSet, synthesize
from sparksim.traces.synth_card import write_synth
from sparksim.traces.synth_lengths import (
    LENGTH_STATS,
    clipped_lognormal_mean,
    fit_clipped_lognormal,
    load_length_stats,
)
from sparksim.traces.synth_params import DomainParams, SynthModel, load_params, with_overrides
from sparksim.traces.synth_presets import preset

# Table 1 of the DSpark paper, Qwen3-8B, γ = 7, domain means (math / code / chat), bonus included.
TABLE1_QWEN3_8B = {
    "dspark-qwen3-8b": {"math": 5.65, "code": 5.28, "chat": 3.50},
    "dflash-qwen3-8b": {"math": 4.77, "code": 4.46, "chat": 2.97},
    "eagle3-qwen3-8b": {"math": 4.66, "code": 4.15, "chat": 2.58},
}
# 1,000 requests per domain puts the sampling sd of a domain's accepted length at 0.3-0.6 %
# (measured over 10 seeds; the level fit adds < 1 % of bias), so a ±3 % miss would be a
# real calibration error, not bad luck.
FRESH_REQUESTS = 1000
FRESH_SEED = 2026

_cache: dict[str, SynthSet] = {}


def fresh(name: str) -> SynthSet:
    """Return a freshly generated set of preset `name` (generated once per test session)."""
    if name not in _cache:
        _cache[name] = synthesize(preset(name), requests_per_domain=FRESH_REQUESTS, seed=FRESH_SEED)
    return _cache[name]


def constant_model(level: float) -> SynthModel:
    """Return a one-domain model with no noise: every conditional confidence is σ(level)."""
    d = DomainParams(target_accept_len=None, level=level, slope=0.0, difficulty_sd=0.0,
                     drift_sd=0.0, token_sd=0.0, output_median=200.0, output_sigma=0.0)
    return SynthModel(name="constant", drafter="none", target="none", domains={"only": d})


@pytest.mark.parametrize("name", sorted(TABLE1_QWEN3_8B))
def test_true_walk_accepted_length_reproduces_table1_within_3_percent(name: str) -> None:
    """The presets stand in for real drafters only if they hit the paper's means as decoding does:
    every response's last round cut at its end, so a domain's rounds yield exactly its tokens."""
    synth = fresh(name)
    requests = synth.trace.requests
    for domain, target in TABLE1_QWEN3_8B[name].items():
        st = synth.stats[domain]
        tokens = int(requests.loc[requests["domain"] == domain, "output_tokens"].sum())
        assert st.accepted_length == pytest.approx(tokens / st.num_rounds, rel=1e-12)
        assert abs(st.accepted_length / target - 1.0) < 0.03, (name, domain, st.accepted_length, target)


def test_true_walk_cuts_each_last_round_at_the_response_end() -> None:
    """A round that would run past the end yields only the tokens left, as real decoding stops."""
    offsets = np.array([0, 5, 8])
    accepted = np.array([1, 0, 3, 0, 0, 2, 0, 0])
    rows = walk_rows(offsets, accepted)  # request 0: pos 0, 2; request 1: pos 0 (rows 0, 2, 5)
    # pos 2 of request 0 accepts 3 (+1 = 4 tokens) but only 3 are left; request 1's 3 are left too
    np.testing.assert_array_equal(round_tokens(offsets, accepted, rows), [2, 3, 3])
    assert walk_totals(offsets, accepted) == (3, 8)


@pytest.mark.parametrize(("domain", "part"), [(d, p) for d in LENGTH_STATS for p in ("prompt", "output")])
def test_drawn_lengths_match_their_cited_mean_and_median(domain: str, part: str) -> None:
    """Run lengths set KV use and steps per request, so they must be the figures the card cites.

    Tolerance: 5 % on the mean and the median of 1,000 stratified draws (their sampling error
    is under 1 %; rounding to whole tokens and the clip move them by less)."""
    cited = LENGTH_STATS[domain][part]
    drawn = fresh("dspark-qwen3-8b").trace.requests
    values = drawn.loc[drawn["domain"] == domain, f"{part}_tokens"].to_numpy(np.float64)
    assert values.min() >= cited.min and values.max() <= cited.max
    assert abs(values.mean() / cited.mean - 1.0) < 0.05, (values.mean(), cited.mean)
    assert abs(np.median(values) / cited.median - 1.0) < 0.05, (np.median(values), cited.median)


def test_every_length_figure_names_its_source() -> None:
    """A figure without a source cannot be checked; an assumption must say it is one."""
    for domain, parts in LENGTH_STATS.items():
        for part, st in parts.items():
            assert len(st.source) > 40, (domain, part)
            assert "assumption" in st.source or "http" in st.source, (domain, part)


def test_clipped_lognormal_fit_reproduces_the_mean_it_was_given() -> None:
    """The closed-form clipped mean must agree with sampling, or the fit aims at the wrong mean."""
    median, sigma = fit_clipped_lognormal(600.0, 400.0, 16, 2048)
    assert median == 400.0
    assert clipped_lognormal_mean(np.log(median), sigma, 16, 2048) == pytest.approx(600.0, rel=1e-9)
    x = np.clip(np.random.default_rng(0).lognormal(np.log(median), sigma, 400_000), 16, 2048)
    assert x.mean() == pytest.approx(600.0, rel=0.01)
    with pytest.raises(ConfigError, match="mean exceeds its median"):
        fit_clipped_lognormal(300.0, 400.0, 16, 2048)


def test_length_file_without_a_source_is_an_error_naming_the_key(tmp_path: Path) -> None:
    """Validate at the boundary: an unsourced figure must not slip into a preset."""
    path = tmp_path / "lengths.yaml"
    path.write_text("domains:\n  chat:\n    prompt: {mean: 200, median: 150, min: 4, max: 1024, source: ''}\n"
                    "    output: {mean: 200, median: 150, min: 4, max: 2048, source: x}\n")
    with pytest.raises(ConfigError, match=r"domains\.chat\.prompt\.source"):
        load_length_stats(path)


def test_dflash_conditional_acceptance_decays_on_code_and_chat() -> None:
    """DFlash's parallel drafts lose accuracy deeper into the block (paper Fig. 2)."""
    stats = fresh("dflash-qwen3-8b").stats
    for domain in ("code", "chat"):
        cond = stats[domain].conditional
        assert cond[-1] < cond[0] - 0.04, (domain, cond)
        assert np.all(np.diff(cond) < 0.02), (domain, cond)  # no position climbs back up


def test_dspark_conditional_acceptance_holds_across_the_block() -> None:
    """DSpark's sequential head keeps later drafts as good as early ones (paper Fig. 2)."""
    for domain, st in fresh("dspark-qwen3-8b").stats.items():
        assert np.ptp(st.conditional) < 0.03, (domain, st.conditional)


def test_eagle3_conditional_acceptance_rises_on_chat_from_about_half() -> None:
    """Eagle3 starts low on chat and its survivors get easier (paper Fig. 2: from 0.53)."""
    cond = fresh("eagle3-qwen3-8b").stats["chat"].conditional
    assert 0.50 <= cond[0] <= 0.62, cond
    assert cond[-1] > cond[0] + 0.10, cond


def test_constant_confidence_gives_the_closed_form_accepted_length() -> None:
    """With c fixed, acceptance is geometric: E[1 + accepted] = (1 − c^{γ+1}) / (1 − c)."""
    level = 1.2
    c = 1.0 / (1.0 + np.exp(-level))
    synth = synthesize(constant_model(level), requests_per_domain=600, gamma=7, seed=3)
    st = synth.stats["only"]
    expected = (1 - c**8) / (1 - c)
    assert abs(st.accepted_length / expected - 1.0) < 0.015, (st.accepted_length, expected)
    np.testing.assert_allclose(st.conditional, c, atol=0.02)
    np.testing.assert_allclose(synth.trace.p_accept, c, atol=1 / 4096)


def test_accepted_is_drawn_from_the_true_conditional_probabilities() -> None:
    """A scheduler reading calibrated conf must see acceptance happen at the stated rates."""
    synth = fresh("dflash-qwen3-8b")
    for domain, st in synth.stats.items():
        np.testing.assert_allclose(st.predicted, st.conditional, atol=0.02, err_msg=domain)


def test_miscalibration_moves_conf_but_not_accepted() -> None:
    """The miscalibration what-if must change what the scheduler sees, not what happens."""
    model = preset("dspark-qwen3-8b")
    calibrated = synthesize(model, requests_per_domain=40, seed=5)
    over = synthesize(model, requests_per_domain=40, seed=5, miscalibration=0.5)
    under = synthesize(model, requests_per_domain=40, seed=5, miscalibration=2.0)
    np.testing.assert_array_equal(over.trace.accepted, calibrated.trace.accepted)
    np.testing.assert_array_equal(under.trace.accepted, calibrated.trace.accepted)
    np.testing.assert_array_equal(over.trace.p_accept, calibrated.trace.p_accept)
    np.testing.assert_array_equal(calibrated.trace.conf, calibrated.trace.p_accept)
    p = calibrated.trace.p_accept.astype(np.float64)
    distance = np.abs(p - 0.5)
    assert np.mean(np.abs(over.trace.conf - 0.5) - distance) > 0.02  # pushed toward 0 / 1
    assert np.mean(distance - np.abs(under.trace.conf - 0.5)) > 0.02  # pulled toward 0.5
    for domain, st in over.stats.items():
        assert np.nanmean(st.predicted - st.conditional) > 0.03, domain  # over-confident


def test_same_seed_gives_identical_arrays_and_files(tmp_path: Path) -> None:
    """INV-5 starts here: a run is reproducible only if its traces are."""
    model = preset("eagle3-qwen3-8b")
    a = synthesize(model, requests_per_domain=20, seed=11)
    b = synthesize(model, requests_per_domain=20, seed=11)
    c = synthesize(model, requests_per_domain=20, seed=12)
    for field in ("conf", "accepted", "conf_raw", "p_accept"):
        np.testing.assert_array_equal(getattr(a.trace, field), getattr(b.trace, field))
    assert not np.array_equal(a.trace.conf[:100], c.trace.conf[:100])
    write_synth(tmp_path / "a", a, "cmd", date="2026-01-01")
    write_synth(tmp_path / "b", b, "cmd", date="2026-01-01")
    for file in ("requests.parquet", "positions.parquet", "card.yaml"):
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes(), file


def test_written_set_passes_check_and_its_card_carries_the_calibration(tmp_path: Path) -> None:
    """A set is only usable downstream if it validates and says how it was made."""
    synth = synthesize(preset("dflash-qwen3-8b"), requests_per_domain=30, seed=1)
    path = write_synth(tmp_path / "set", synth, "sparksim traces synth --preset dflash-qwen3-8b")
    assert check_traceset(path) == []
    ts = load_traceset(path)
    np.testing.assert_array_equal(ts.accepted, synth.trace.accepted)
    assert ts.conf_raw is not None and ts.p_accept is not None
    card = yaml.safe_load((path / "card.yaml").read_text())
    assert card["source"] == "synthetic" and card["temperature"] == 1.0 and card["gamma"] == 7
    assert "synthetic" in card["note"] and "recorded" in card["note"]
    table = card["calibration"]["accepted_length"]
    assert set(table) == {"math", "code", "chat"}
    for domain, row in table.items():
        assert row["target"] == TABLE1_QWEN3_8B["dflash-qwen3-8b"][domain]
        assert row["achieved"] == pytest.approx(domain_stats(ts)[domain].accepted_length, abs=1e-4)
        assert len(card["conditional_acceptance"][domain]) == 7
    assert set(card["model"]["fitted_level"]) == {"math", "code", "chat"}


def test_other_block_sizes_keep_the_per_position_model(tmp_path: Path) -> None:
    """γ ≠ 7 reuses the γ = 7 fit: positions 1..γ keep their conditional acceptance."""
    synth = synthesize(preset("dspark-qwen3-8b"), requests_per_domain=60, gamma=4, seed=2)
    assert synth.trace.conf.shape[1] == 4
    assert int(synth.trace.accepted.max()) <= 4
    card_path = write_synth(tmp_path / "g4", synth, "cmd")
    assert "caveat" in yaml.safe_load((card_path / "card.yaml").read_text())["calibration"]


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"gamma": 0}, "gamma=0"),
        ({"requests_per_domain": 0}, "requests_per_domain=0"),
        ({"miscalibration": -1.0}, "miscalibration=-1.0"),
        ({"seed": -3}, "seed=-3"),
    ],
)
def test_bad_generation_arguments_raise_errors_naming_them(kwargs: dict[str, object], needle: str) -> None:
    """A typo in a sweep must fail loudly with the offending name and value."""
    with pytest.raises(ConfigError, match=needle):
        synthesize(preset("dspark-qwen3-8b"), **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"domains": {"chat": {"drift_rho": 1.0}}}, "domains.chat.drift_rho=1.0"),
        ({"domains": {"math": {"target_accept_len": 9.0}}}, "domains.math.target_accept_len=9.0"),
        ({"domains": {"code": {"token_sd": -0.1}}}, "domains.code.token_sd=-0.1"),
        ({"domains": {"code": {"slopes": 0.1}}}, "unknown key 'slopes'"),
        ({"raw_temperature": 0}, "raw_temperature=0"),
        ({"gamma": 7}, "unknown key 'gamma'"),
        ({"domains": {"summarise": {"slope": 0.1}}}, "give target_accept_len or level"),
    ],
)
def test_bad_model_parameters_raise_errors_naming_them(overrides: dict[str, object], needle: str) -> None:
    """Params YAML errors must point at the key and value to fix."""
    with pytest.raises(ConfigError, match=needle):
        with_overrides(preset("dflash-qwen3-8b"), overrides, where="p.yaml")


def test_unknown_preset_lists_the_known_ones() -> None:
    """The error for a misspelt preset must say what would have worked."""
    with pytest.raises(ConfigError, match=r"preset='dspark'.*dspark-qwen3-8b"):
        preset("dspark")


def test_params_yaml_overrides_one_field_and_keeps_the_rest(tmp_path: Path) -> None:
    """A user tweaking one knob must not silently reset the others."""
    path = tmp_path / "p.yaml"
    path.write_text("raw_temperature: 0.8\ndomains:\n  chat: {slope: 0.2}\n  extra: {level: 1.5}\n")
    base = preset("dspark-qwen3-8b")
    model = with_overrides(base, load_params(path), where=str(path))
    assert model.raw_temperature == 0.8
    assert model.domains["chat"].slope == 0.2
    assert model.domains["chat"].target_accept_len == base.domains["chat"].target_accept_len
    assert model.domains["extra"].level == 1.5
    assert list(model.domains) == ["math", "code", "chat", "extra"]


def test_full_block_walk_visits_the_rounds_deepspec_counts() -> None:
    """The accepted length is only comparable with the paper if rounds are walked its way."""
    offsets = np.array([0, 5, 8])
    accepted = np.array([1, 0, 3, 0, 0, 2, 0, 0])
    rows = walk_rows(offsets, accepted)
    # request 0: pos 0 (acc 1) -> pos 2 (acc 3) -> pos 6 ends; request 1: pos 0 (acc 2) -> pos 3 ends
    np.testing.assert_array_equal(rows, [0, 2, 5])
    assert accepted_length(accepted[rows]) == pytest.approx(3.0)
    np.testing.assert_allclose(conditional_acceptance(accepted[rows], 3), [1.0, 2 / 3, 1 / 2])


SHIPPED = Path(__file__).resolve().parents[1] / "traces"


@pytest.mark.skipif(not (SHIPPED / "synth-dspark-qwen3-8b").is_dir(), reason="shipped sets not present")
def test_shipped_sets_are_valid_small_and_calibrated() -> None:
    """What ships must be what the cards claim: valid, under 25 MB together, within ±3 %."""
    total_bytes = 0
    for name, targets in TABLE1_QWEN3_8B.items():
        path = SHIPPED / f"synth-{name}"
        total_bytes += sum(f.stat().st_size for f in path.iterdir())
        ts = load_traceset(path)
        assert ts.card["source"] == "synthetic"
        assert ts.card["command"].startswith(f"sparksim traces synth --preset {name}")
        for domain, st in domain_stats(ts).items():
            assert abs(st.accepted_length / targets[domain] - 1.0) < 0.03, (name, domain)
            assert ts.card["calibration"]["accepted_length"][domain]["achieved"] == pytest.approx(
                st.accepted_length, abs=1e-4
            )
    assert total_bytes < 25 * 1024 * 1024


def test_cli_synth_writes_a_valid_set_and_stats_reads_it_back(tmp_path: Path) -> None:
    """The two commands users run must work end to end and fail with a named bad value."""
    from typer.testing import CliRunner

    from sparksim.cli.traces import app

    runner = CliRunner()
    out = tmp_path / "cli-set"
    result = runner.invoke(app, ["synth", "--preset", "eagle3-qwen3-8b", "--requests-per-domain", "10",
                                 "--seed", "4", "--miscalibration", "0.8", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert check_traceset(out) == []
    card = yaml.safe_load((out / "card.yaml").read_text())
    assert card["command"] == (
        f"sparksim traces synth --preset eagle3-qwen3-8b --requests-per-domain 10 --gamma 7 "
        f"--seed 4 --miscalibration 0.8 --out {out}"
    )
    assert card["model"]["miscalibration_temperature"] == 0.8
    result = runner.invoke(app, ["stats", str(out)])
    assert result.exit_code == 0, result.output
    for domain in ("math", "code", "chat"):
        assert domain in result.output
    result = runner.invoke(app, ["synth", "--gamma", "0", "--out", str(tmp_path / "bad")])
    assert result.exit_code == 1
    assert "gamma=0" in result.output
    assert not (tmp_path / "bad").exists()
