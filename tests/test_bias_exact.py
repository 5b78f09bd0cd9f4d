"""INV-8 exactly: the first emitted token's law under a policy, enumerated, against Monte Carlo.

(a) the exact law equals a sampled one within its bootstrap CI on a toy vocabulary;
(b) static, greedy, threshold and two-step with delay >= 1 leave p_t exactly (TV < 1e-12) on
    random toy drafters, alone and in a batch, while the same toys bias argmax;
(c) the paper's App. A case: argmax P(A) = 0.85 against the target's 0.7;
(d) the real-model path on tiny random models, end to end, agreeing with the drafter's own
    sampler, and showing argmax's bias once the step's cost puts c_2 at the decision boundary.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sparksim.bias.bias_exact import (
    appendix_a_case,
    exact_table,
    neighbours,
    realised_rows,
    summarise,
)
from sparksim.bias.biaslab import P_DRAFT, P_TARGET, appendix_a_profile
from sparksim.bias.first_token import StepCase
from sparksim.bias.first_token_mc import monte_carlo_first_token
from sparksim.bias.model_cases import drafter_cases, model_cases
from sparksim.bias.path_decider import PathDecider, exact_first_token
from sparksim.cost.profile import Profile, load_profile
from sparksim.policies.two_step import TwoStep

REPO = Path(__file__).resolve().parents[1]
LOSSLESS_SPECS = ["static:gamma=1", "static:gamma=2", "greedy", "threshold:t=0.6", "two-step:delay=1",
                  "two-step:delay=2", "smartspec", "dynamic-sd"]


def toy_case() -> StepCase:
    """A five-token drafter whose c_2 straddles argmax's boundary on the App. A costs (c_2 > 0.528)."""
    q2 = np.array([[4, 1, 1, 1, 1], [1, 3, 1, 2, 1], [1, 1, 1, 1, 4], [2, 2, 2, 2, 2], [1, 5, 1, 1, 1]], float)
    return StepCase.make(p_t=[0.35, 0.05, 0.25, 0.15, 0.20], q1=[0.15, 0.30, 0.10, 0.25, 0.20], c1=0.8,
                            c2=[0.9, 0.1, 0.7, 0.3, 0.95], q2=q2, name="toy")


def cost_profile(step_ms: list[float], name: str = "toy-costs") -> Profile:
    """A profile with step_ms[i] milliseconds at B = i + 1 tokens (no drafter, no KV terms)."""
    return Profile(
        name=name,
        card={"source": "published", "hardware": "test", "model": "-", "dtype": "-", "date": "2026-01-01",
              "command": "tests/test_bias_exact.py"},
        tokens=np.arange(1.0, len(step_ms) + 1), step_ms=np.asarray(step_ms, float),
    )


# --------------------------------------------------------------------------- (a) exact = Monte Carlo


@pytest.mark.parametrize("spec", ["argmax", "threshold:t=0.6", "greedy", "two-step:delay=0"])
def test_the_exact_law_lies_in_the_monte_carlo_bootstrap_ci(spec: str) -> None:
    case = toy_case()
    decider = PathDecider(spec, appendix_a_profile())
    exact = exact_first_token(case, decider)
    assert exact.dist.sum() == pytest.approx(1.0, abs=1e-12)
    mc = monte_carlo_first_token(case, decider, 10_000, seed=11)
    for k in range(case.vocab):
        ci = mc.probability(k, level=0.999, n_resamples=1000, seed=k)
        assert ci.contains(float(exact.dist[k])), (spec, k, float(exact.dist[k]), str(ci))
        assert ci.high - ci.low < 0.035  # the CI is tight enough to catch a wrong law
    tv = mc.tv(case.p_t, witness=exact.dist > case.p_t, level=0.999, n_resamples=1000, seed=99)
    assert tv.contains(exact.tv), (spec, exact.tv, str(tv))


def test_the_toy_exercises_every_branch() -> None:
    """Why: (a) only checks what the toy reaches: ℓ = 0, 1 and 2 all occur, and argmax is biased."""
    case = toy_case()
    ell_argmax = exact_first_token(case, PathDecider("argmax", appendix_a_profile())).lengths
    ell_threshold = exact_first_token(case, PathDecider("threshold:t=0.6", appendix_a_profile())).lengths
    assert set(ell_argmax.tolist()) == {0, 2} and set(ell_threshold.tolist()) == {1, 2}
    assert exact_first_token(case, PathDecider("argmax", appendix_a_profile())).tv > 0.02


def test_monte_carlo_samples_the_whole_step_and_a_split_sample_tv_sees_no_bias_in_a_lossless_policy() -> None:
    case = toy_case()
    mc = monte_carlo_first_token(case, PathDecider("greedy", appendix_a_profile()), 10_000, seed=3)
    assert mc.tokens.shape == (10_000,) and mc.dist.sum() == pytest.approx(1.0)
    split = mc.tv(case.p_t, level=0.999, n_resamples=1000)  # no exact witness: the samples alone
    assert split.contains(0.0) and split.high < 0.04


# --------------------------------------------------------------------------- (b) lossless to float precision


def random_toy(rng: np.random.Generator, vocab: int = 6) -> StepCase:
    return StepCase.make(p_t=rng.dirichlet(np.ones(vocab)), q1=rng.dirichlet(np.ones(vocab)),
                            c1=float(rng.uniform(0.3, 1.0)), c2=rng.uniform(0.0, 1.0, vocab),
                            q2=rng.dirichlet(np.ones(vocab), size=vocab), context=float(rng.integers(10, 500)))


def random_costs(rng: np.random.Generator, n: int) -> Profile:
    """Costs with random increments: Θ's peak, and so argmax's cut, moves with the confidences."""
    return cost_profile(list(np.cumsum(rng.uniform(0.2, 1.0, n)) * 10.0))


@pytest.mark.parametrize("batch", [1, 3])
def test_lossless_policies_leave_the_target_law_exactly_on_random_toy_drafters(batch: int) -> None:
    worst: dict[str, float] = {}
    for seed in range(8):
        rng = np.random.default_rng(seed)
        cases = [random_toy(rng) for _ in range(4)]
        profile = random_costs(rng, 3 * batch)
        table = exact_table(cases, [*LOSSLESS_SPECS, "argmax"], profile, batch=batch, warmup=3, seed=seed)
        for spec, g in table.groupby("policy"):
            worst[str(spec)] = max(worst.get(str(spec), 0.0), float(g["tv"].max()))
    for spec in LOSSLESS_SPECS:
        assert worst[spec] < 1e-12, (spec, worst[spec])
    assert worst["argmax"] > 1e-3, worst  # the same toys do bias argmax: (b) is not vacuous


def test_summary_and_neighbours() -> None:
    rng = np.random.default_rng(5)
    cases = [random_toy(rng) for _ in range(5)]
    rows = realised_rows(cases, seed=0)
    others, contexts, history = neighbours(cases, rows, 3, batch=3, warmup=2)
    assert others.tolist() == rows[[4, 0]].tolist()
    assert contexts.tolist() == [cases[3].context, cases[4].context, cases[0].context]
    assert [h.shape for h in history] == [(3, 2), (3, 2)]
    table = exact_table(cases, ["argmax", "greedy"], random_costs(rng, 9), batch=3)
    summary = summarise(table).set_index("policy")
    assert summary.loc["greedy", "lossless"] and summary.loc["greedy", "claims_lossless"]
    assert not summary.loc["argmax", "claims_lossless"]
    assert len(summary.loc["argmax", "worst"]) == 3


class CopiedTwoStep(TwoStep):
    """A plug-in policy (not sparksim's own): PathDecider deep-copies it for every path."""


def test_a_plugin_policy_is_deep_copied_and_decides_as_the_builtin_one() -> None:
    rng = np.random.default_rng(2)
    profile = random_costs(rng, 12)
    history = [rng.uniform(0.2, 1.0, (4, 2)) for _ in range(3)]
    others = rng.uniform(0.2, 1.0, (3, 2))
    rows = rng.uniform(0.0, 1.0, (40, 2))
    ours = PathDecider("two-step:delay=1", profile, others, np.zeros(4), history)
    plugin = PathDecider("tests.test_bias_exact:CopiedTwoStep:delay=1", profile, others, np.zeros(4), history)
    assert type(plugin.policy) is CopiedTwoStep
    assert ours.lengths(rows).tolist() == plugin.lengths(rows).tolist()
    assert ours.lengths(rows).tolist() == ours.lengths(rows).tolist()  # no path sees another's decision


def test_the_oracle_has_no_exact_law_here() -> None:
    from sparksim.errors import ConfigError

    with pytest.raises(ConfigError, match="realised outcome"):
        PathDecider("oracle", appendix_a_profile())


# --------------------------------------------------------------------------- (c) the paper's App. A


def test_appendix_a_argmax_gives_085_instead_of_070() -> None:
    case = appendix_a_case()
    assert case.p_t.tolist() == P_TARGET.tolist() and case.q1.tolist() == P_DRAFT.tolist()
    profile = appendix_a_profile()  # the bias lab's own construction
    argmax = exact_first_token(case, PathDecider("argmax", profile))
    assert argmax.dist[0] == pytest.approx(0.85, abs=1e-15)
    assert argmax.tv == pytest.approx(0.15, abs=1e-15)
    assert argmax.lengths.tolist() == [2, 0]  # x_1 = A lifts c_2, and with it its own admission
    assert exact_first_token(case, PathDecider("two-step:delay=0", profile)).dist[0] == pytest.approx(0.85)
    for spec in ("greedy", "static:gamma=2", "two-step", "threshold"):
        assert exact_first_token(case, PathDecider(spec, profile)).dist[0] == pytest.approx(0.7, abs=1e-15)


def test_the_cli_prints_the_exact_appendix_a_table() -> None:
    from typer.testing import CliRunner

    from sparksim.cli import app

    result = CliRunner().invoke(app, ["bias", "--exact", "--policy", "argmax", "--policy", "greedy",
                                      "--mc", "4000"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "0.850000" in result.output and "0.700000" in result.output and "biased" in result.output
    bad = CliRunner().invoke(app, ["bias", "--target", "x"])
    assert bad.exit_code == 1 and "only with --exact" in bad.output


# --------------------------------------------------------------------------- (d) real models


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    pytest.importorskip("torch")
    from tests._drafter_fixtures import save_pair

    tmp = tmp_path_factory.mktemp("bias_exact")
    target_dir, drafter_dir = save_pair(tmp)  # γ = 4: the lab keeps its first two positions
    prompts = tmp / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"key": f"p{i}", "domain": ("math", "chat")[i % 2],
                                           "prompt": f"User: question {i}?\nAssistant: "}) + "\n"
                               for i in range(3)))
    return target_dir, drafter_dir, prompts


@pytest.fixture(scope="module")
def tiny_cases(tiny_pair: tuple[Path, Path, Path]) -> list[StepCase]:
    target_dir, drafter_dir, prompts = tiny_pair
    return model_cases(target_dir, drafter_dir, prompts, 5, max_new_tokens=12, seed=0, log=lambda _: None)


def test_the_real_model_path_runs_end_to_end(tiny_cases: list[StepCase]) -> None:
    assert len(tiny_cases) == 5 and len({c.name for c in tiny_cases}) == 5
    for c in tiny_cases:
        assert c.vocab == 260 and c.p_t.sum() == pytest.approx(1.0, abs=1e-12)
        assert c.q1.sum() == pytest.approx(1.0, abs=1e-12) and 0 < c.c1 < 1 and ((c.c2 > 0) & (c.c2 < 1)).all()
        assert np.ptp(c.c2) > 0  # the Markov embedding of x_1 moves c_2
    profile = load_profile(REPO / "profiles" / "h100-qwen3-8b-analytic")
    table = exact_table(tiny_cases, [*LOSSLESS_SPECS, "argmax", "two-step:delay=0"], profile, batch=2)
    summary = summarise(table)
    print(summary.drop(columns=["worst", "label"]).to_string())
    assert summary.set_index("policy").loc[LOSSLESS_SPECS, "max_tv"].max() < 1e-12


def test_the_cases_are_what_the_drafter_samples_from(tiny_pair: tuple[Path, Path, Path]) -> None:
    """Why: the exact lab must read q_1, c_1 and c_2(x_1) exactly as the recorder's `draft` samples them."""
    import torch

    from sparksim.drafter.model import draft
    from sparksim.drafter.target import load_target
    from sparksim.drafter.train import load_drafter

    target_dir, drafter_dir, _ = tiny_pair
    target = load_target(target_dir)
    drafter = load_drafter(drafter_dir, target)
    ctx = [256, 72, 105, 33, 32, 87, 104, 97, 116]
    case = drafter_cases(target, drafter, [ctx], temperature=1.0, temps=[2.0, 0.5, 1.0, 1.0])[0]
    ids = torch.tensor([ctx])
    with torch.no_grad():
        _, hidden = target.forward_masked(ids, torch.arange(len(ctx))[None], None)
        out = drafter.backbone(drafter.context(drafter.target_features(hidden)), ids,
                               torch.tensor([[len(ctx) - 1]]))
        d = draft(drafter, out, ids[:, -1:], 1.0, torch.Generator().manual_seed(0))
    x1 = int(d.tokens[0, 0, 0])
    conf = d.conf_logits[0, 0].double().numpy()
    np.testing.assert_allclose(case.q1, d.probs[0, 0, 0].double().numpy(), atol=1e-6)
    assert case.c1 == pytest.approx(1 / (1 + np.exp(-conf[0] / 2.0)), abs=1e-6)
    assert case.c2[x1] == pytest.approx(1 / (1 + np.exp(-conf[1] / 0.5)), abs=1e-6)


def test_argmax_bias_shows_on_the_real_model_path_when_costs_put_c2_at_the_boundary(
        tiny_cases: list[StepCase]) -> None:
    """With SPS(1) = 1 and SPS(2) = SPS(3) = s, argmax verifies x_1 iff c_1(1 + c_2(x_1)) > 1/s − 1.
    Choosing s at the median c_2 of one context splits its x_1 in two: argmax must be biased there,
    and the lossless policies not."""
    case = max(tiny_cases, key=lambda c: float(np.ptp(c.c2)))
    s = 1.0 / (1.0 + case.c1 * (1.0 + float(np.median(case.c2))))
    profile = cost_profile([1000.0, 1000.0 / s, 1000.0 / s], "boundary")
    argmax = exact_first_token(case, PathDecider("argmax", profile))
    assert argmax.depends_on_x1 and argmax.tv > 1e-6, argmax.tv
    for spec in ("greedy", "static:gamma=2", "two-step:delay=1", "threshold"):
        res = exact_first_token(case, PathDecider(spec, profile, history=[case.rows()[:1]] * 2))
        assert res.tv < 1e-12, (spec, res.tv)


def test_the_cli_runs_the_real_model_path(tiny_pair: tuple[Path, Path, Path], tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from sparksim.cli import app

    target_dir, drafter_dir, prompts = tiny_pair
    out = tmp_path / "per-context.csv"
    args: list[Any] = ["bias", "--exact", "--target", target_dir, "--drafter", drafter_dir, "--prompts", prompts,
                       "--contexts", "3", "--max-new-tokens", "8", "--profile",
                       REPO / "profiles" / "h100-qwen3-8b-analytic", "--policy", "greedy", "--policy", "argmax",
                       "--batch", "2", "--out", out]
    result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "mean TV" in result.output and "greedy" in result.output
    assert len(out.read_text().splitlines()) == 1 + 2 * 3
