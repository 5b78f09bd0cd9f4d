"""`sparksim policies`: list every registered verification policy."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape
from rich.table import Table

from sparksim.cli.common import check_out, console, err_console, friendly_errors, plural
from sparksim.errors import ConfigError

DEFAULT_PROMPTS = Path("models/tinylm-d128-l6/data/test.jsonl")  # the held-out prompts of the built-in target

if TYPE_CHECKING:
    import pandas as pd


def list_policies() -> None:
    """List every registered policy with its rule and whether it is lossless."""
    from sparksim.policies import REGISTRY

    table = Table(title="verification policies")
    table.add_column("name", style="bold", no_wrap=True)
    table.add_column("lossless", no_wrap=True)
    table.add_column("rule", ratio=3)
    table.add_column("source", ratio=2)
    for name in sorted(REGISTRY):
        cls = REGISTRY[name]
        lossless = "upper bound" if cls.upper_bound else ("yes" if cls.lossless else "NO")
        table.add_row(name, lossless, cls.rule, cls.paper)
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command("policies")(list_policies)
    app.command("bias")(bias)


@friendly_errors
def bias(
    policy: list[str] = typer.Option(
        [], "--policy",
        help="policy to test, with parameters as NAME:param=value,... or FILE.py:Class:param=value "
             "(repeat; default: every registered policy, or a standard set with --exact)"),
    trials: int | None = typer.Option(None, "--trials", min=100, help="Monte Carlo trials per policy (default 20,000)"),
    seed: int = typer.Option(0, "--seed", help="master seed; each policy draws its own stream from it"),
    exact: bool = typer.Option(
        False, "--exact",
        help="compute the first emitted token's law exactly (no sampling): on the paper's App. A case, or "
             "with --target/--drafter on real contexts"),
    target: Path | None = typer.Option(None, "--target", help="--exact: target model directory"),
    drafter: Path | None = typer.Option(None, "--drafter", help="--exact: DSpark/DFlash drafter directory (γ ≥ 2)"),
    contexts: int | None = typer.Option(
        None, "--contexts", min=1, help="--exact: held-out contexts to enumerate (default 200; --span: 3)"),
    prompts: Path | None = typer.Option(
        None, "--prompts",
        help="--exact: held-out prompt file the target answers (contexts are prefixes of its answers; "
             f"default {DEFAULT_PROMPTS})"),
    batch: int | None = typer.Option(
        None, "--batch", min=1, help="--exact: requests R sharing the step (R−1 others from other contexts; default 1)"),
    profile: Path | None = typer.Option(
        None, "--profile",
        help="--exact: SPS profile pricing the step (default: profiles/cpu-tinylm-d128-live-measured; "
             "App. A: the paper's SPS)"),
    temperature: float | None = typer.Option(
        None, "--temperature", min=0.0, help="--exact: sampling temperature (default 1.0)"),
    max_new_tokens: int | None = typer.Option(
        None, "--max-new-tokens", min=1, help="--exact: response length cap (default 128)"),
    cuts: int | None = typer.Option(
        None, "--cuts-per-response", min=1,
        help="--exact: contexts cut from each response (the target answers ⌈contexts / this⌉ prompts; default 4)"),
    warmup: int | None = typer.Option(
        None, "--warmup", min=0, help="--exact: earlier steps shown to stateful policies (default 4)"),
    mc: int = typer.Option(
        0, "--mc", min=0,
        help="--exact: also sample each policy's worst context N times and show the Monte Carlo TV with its "
             "bootstrap 95% CI"),
    out: Path | None = typer.Option(None, "--out", help="--exact: write the per-context table to this CSV"),
    threads: int | None = typer.Option(None, "--threads", min=0, help="--exact: torch threads (0 = default)"),
    span: int = typer.Option(
        0, "--span", min=0,
        help="with --target/--drafter: Monte Carlo over SPAN-token continuations from the live engine, each "
             "policy against plain decoding (--mc continuations each, default 2000; --contexts of them)"),
) -> None:
    """Run the bias lab (paper App. A): P(first token = A) must be 0.7 for a lossless policy.

    With --exact the first emitted token's law is enumerated instead of sampled: on the paper's two-token case, or with --target/--drafter on held-out contexts of a real target and drafter (docs/bias.md).
    """
    # an option the chosen check does not read is refused, never ignored
    def refuse(unread: dict[str, object], why: str) -> None:
        given = [name for name, v in unread.items() if v is not None]
        if given:
            raise ConfigError(f"{', '.join(given)}: {why}")

    prompts_file = prompts or DEFAULT_PROMPTS
    if span:
        if exact:
            raise ConfigError("--span and --exact are two different checks; give one")
        refuse({"--trials": trials, "--max-new-tokens": max_new_tokens, "--cuts-per-response": cuts,
                "--warmup": warmup}, "not read by --span")
        _bias_span(policy, seed, target, drafter, 3 if contexts is None else contexts, prompts_file,
                   batch or 1, profile, 1.0 if temperature is None else temperature, span, mc or 2000, out,
                   threads or 0)
        return
    if exact:
        refuse({"--trials": trials}, "not read by --exact (it samples nothing; --mc N samples)")
        _bias_exact(policy, seed, target, drafter, 200 if contexts is None else contexts, prompts_file,
                    batch or 1, profile, 1.0 if temperature is None else temperature, max_new_tokens or 128,
                    cuts or 4, 4 if warmup is None else warmup, mc, out, threads or 0)
        return
    refuse({"--target": target, "--drafter": drafter, "--profile": profile, "--out": out, "--mc": mc or None,
            "--contexts": contexts, "--prompts": prompts, "--batch": batch, "--temperature": temperature,
            "--max-new-tokens": max_new_tokens, "--cuts-per-response": cuts, "--warmup": warmup,
            "--threads": threads}, "only with --exact (or --span); the Monte Carlo lab reads --policy, --trials and --seed")
    trials = trials or 20_000
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from sparksim.bias.biaslab import bias_table
    from sparksim.policies import REGISTRY, make_policy, parse_policy_spec

    names = policy or sorted(REGISTRY)
    for spec in names:  # a bad name or parameter fails in one line before any trial
        name, params = parse_policy_spec(spec)
        params.pop("drafter", None)
        make_policy(name, 2, params)
    with Progress(TextColumn("[bold]bias lab[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console, transient=True) as bar:
        task = bar.add_task("", total=trials * len(names))
        offset = {spec: i * trials for i, spec in enumerate(names)}
        df = bias_table(names, trials=trials, seed=seed, progress=lambda spec, done: bar.update(
            task, completed=offset[spec] + done, description=spec))
    console.print(bias_lab_table(df, trials))


def bias_lab_table(df: pd.DataFrame, trials: int) -> Table:
    """Return the bias lab's table: one row per policy, its P(first token = A) and a verdict.

    In an 80-column terminal the verdict and the numbers are never wrapped or cut; a long
    policy label folds onto more lines instead.
    """
    table = Table(title=f"bias lab: P(first token = A), 0.7 for a lossless policy; {trials} trials each")
    table.add_column("policy", overflow="fold")  # the full label, never cut
    for col in ("P(A)", "± stderr", "z", "verdict"):
        table.add_column(col, no_wrap=True)
    for row in df.to_dict("records"):
        z = float(row["z"])
        verdict = "[red]biased[/]" if row["biased"] else "[green]consistent with lossless[/]"
        # escape: "[not lossless]" in a label is text, not rich markup
        table.add_row(escape(str(row["label"])), f"{row['p_first_A']:.4f}", f"{row['stderr']:.4f}",
                      f"{z:+.1f}", verdict)
    return table


def _bias_exact(specs: list[str], seed: int, target: Path | None, drafter: Path | None, n_contexts: int,
                prompts: Path, batch: int, profile_dir: Path | None, temperature: float, max_new_tokens: int,
                cuts: int, warmup: int, mc: int, out: Path | None, threads: int) -> None:
    """`sparksim bias --exact`: the exact first-token law per policy (sparksim.bias.bias_exact)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from sparksim.bias import bias_exact as bx
    from sparksim.bias.biaslab import appendix_a_profile
    from sparksim.bias.model_cases import model_cases
    from sparksim.bias.path_decider import PathDecider
    from sparksim.cost.profile import load_profile

    if (target is None) != (drafter is None):
        raise ConfigError("--exact: give both --target and --drafter (or neither, for the paper's App. A case)")
    if out is not None:
        check_out(out, kind="file")
    names = list(specs) or list(bx.DEFAULT_SPECS)
    for spec in names:  # a bad name or parameter fails in one line before any work
        PathDecider(spec, appendix_a_profile())
    if target is None or drafter is None:
        prof = load_profile(profile_dir) if profile_dir is not None else appendix_a_profile()
        cases = [bx.appendix_a_case()]
        where = f"paper App. A (V = {{A, B}}, p_t = (0.7, 0.3)), profile {prof.name}"
    else:
        if profile_dir is None:
            if not bx.DEFAULT_PROFILE.is_dir():
                raise ConfigError(f"--exact: the default profile {bx.DEFAULT_PROFILE} is not here; pass --profile")
            profile_dir = bx.DEFAULT_PROFILE
        prof = load_profile(profile_dir)
        from sparksim.cli.common import need_torch

        need_torch()
        import torch

        if threads:
            torch.set_num_threads(threads)
        cases = model_cases(target, drafter, prompts, n_contexts, temperature=temperature, seed=seed,
                            max_new_tokens=max_new_tokens, cuts_per_response=cuts, log=lambda msg: err_console.print(msg, highlight=False))
        where = (f"{len(cases)} contexts of {target} + {drafter} (prompts {prompts}, T = {temperature:g}), "
                 f"profile {prof.name}")
    with Progress(TextColumn("[bold]exact bias[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console, transient=True) as bar:
        task = bar.add_task("", total=len(cases) * len(names))
        offset = {spec: i * len(cases) for i, spec in enumerate(names)}
        df = bx.exact_table(cases, names, prof, batch=batch, warmup=warmup, seed=seed,
                            progress=lambda spec, done: bar.update(task, completed=offset[spec] + done,
                                                                   description=spec))
    summary = bx.summarise(df)
    checks = bx.monte_carlo_check(cases, df, prof, mc, batch=batch, warmup=warmup, seed=seed) if mc else None
    console.print(f"exact first-token bias, γ = 2, batch R = {batch}: {where}", highlight=False)
    console.print(f"TV = ½‖P(first token) − p_t‖₁; lossless to float precision: max TV < {bx.LOSSLESS_TV:g}",
                  highlight=False)
    tables, named = exact_tables(summary, df, checks, app_a=target is None)
    for table in tables:
        console.print(table)
    if named:
        console.print("contexts: " + "; ".join(f"#{c} {escape(named[c])}" for c in sorted(named)),
                      highlight=False)
    if checks is not None:
        console.print("Monte Carlo: 'witness' estimates P(S) − p_t(S) on the exact witness set S = {y: P(y) > "
                      "p_t(y)} (unbiased for the exact TV; 0 when S is empty); 'split' estimates a TV lower "
                      "bound from the samples alone (its CI is what sampling alone can resolve).", highlight=False)
    if out is not None:
        from sparksim.atomic import write_text

        write_text(out, df.drop(columns="dist").to_csv(index=False))
        console.print(f"per-context table: {out}")


def exact_tables(summary: pd.DataFrame, df: pd.DataFrame, checks: pd.DataFrame | None, *, app_a: bool
                 ) -> tuple[list[Table], dict[int, str]]:
    """Return `bias --exact`'s tables and the contexts they point at (number → name).

    One question per table, so each fits an 80-column terminal with its policy names and
    verdicts whole: the verdict per policy; on real contexts, where and why (whether ℓ
    depended on x₁, the worst contexts); with --mc, the Monte Carlo check of each policy's
    worst context.
    """
    verdicts = Table(title="verdict per policy")
    verdicts.add_column("policy", overflow="fold")
    for col in (["P(first = A)", "TV"] if app_a else ["mean TV", "max TV"]):
        verdicts.add_column(col, no_wrap=True)
    verdicts.add_column("verdict", no_wrap=True)
    why = Table(title="where the bias is, and why")
    why.add_column("policy", overflow="fold")
    why.add_column("ℓ uses x₁", justify="right", no_wrap=True)
    why.add_column("P(verify x₁)", justify="right", no_wrap=True)
    why.add_column("worst contexts (TV)")
    mc = Table(title="Monte Carlo TV at each policy's worst context, 95% bootstrap CI")
    mc.add_column("policy", overflow="fold")
    mc.add_column("context", justify="right", no_wrap=True)
    mc.add_column("witness TV [CI]")
    mc.add_column("split TV [CI]")
    named: dict[int, str] = {}
    for i, row in enumerate(summary.to_dict("records")):
        if row["lossless"]:
            verdict = "[green]lossless[/]" if row["claims_lossless"] else "[yellow]no bias on these contexts[/]"
        else:
            verdict = "[red]BIASED (claims lossless)[/]" if row["claims_lossless"] else "[red]biased[/]"
        label = escape(str(row["label"]))
        if app_a:
            first = df[df["policy"] == row["policy"]].iloc[0]
            verdicts.add_row(label, f"{first['dist'][0]:.6f}", f"{first['tv']:.3g}", verdict)
        else:
            named.update((c, name) for c, name, _ in row["worst"])
            verdicts.add_row(label, f"{row['mean_tv']:.3g}", f"{row['max_tv']:.3g}", verdict)
            why.add_row(label, f"{row['depends_on_x1']}/{row['contexts']}", f"{row['mean_p_verify']:.3f}",
                        "; ".join(f"#{c} {tv:.3g}" for c, _, tv in row["worst"]))
        if checks is not None:
            c = checks.iloc[i]
            mc.add_row(label, f"#{c['context']}", str(c["mc_tv_witness"]), str(c["mc_tv_split"]))
    tables = [verdicts] if app_a else [verdicts, why]
    return tables + ([mc] if checks is not None else []), named


def span_table(rows: list[dict[str, Any]]) -> Table:
    """Return `bias --span`'s table: per context and policy, the TV lower bound and a verdict.

    The verdict and the figures are never wrapped or cut in an 80-column terminal; a long
    policy label folds onto more lines instead.
    """
    table = Table(title="bias over spans, against plain decoding")
    table.add_column("ctx", no_wrap=True)
    table.add_column("policy", overflow="fold")
    table.add_column("max TV lower bound [95% CI], where")
    table.add_column("min Holm p", justify="right", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    for r in rows:
        biased = r["biased"]
        table.add_row(str(r["context"]), escape(str(r["policy"])),
                      f"{r['max_tv_lower_bound']:.3f} [{r['ci95_low']:.3f}, {r['ci95_high']:.3f}] at position "
                      f"{r['at_position']}; CI > 0 at {plural(r['positions_ci_above_0'], 'position')}",
                      f"{r['min_p_holm']:.3g}", "[red]biased[/]" if biased else "[green]no detectable bias[/]")
    return table


def _bias_span(specs: list[str], seed: int, target: Path | None, drafter: Path | None, n_contexts: int,
               prompts: Path, batch: int, profile_dir: Path | None, temperature: float, span: int, n: int,
               out: Path | None, threads: int) -> None:
    """`sparksim bias --span N`: long-span Monte Carlo on the live engine (sparksim.live.span)."""
    from sparksim.bias.bias_exact import DEFAULT_PROFILE, DEFAULT_SPECS
    from sparksim.cli.common import need_torch

    if target is None or drafter is None:
        raise ConfigError("--span needs --target and --drafter (the live engine writes the continuations)")
    if out is not None:
        check_out(out, kind="file")
    need_torch()
    import pandas as pd
    import torch

    from sparksim.cost.profile import load_profile
    from sparksim.live.engine import LiveModels
    from sparksim.live.run import read_prompt_ids
    from sparksim.live.span import span_bias

    torch.set_num_threads(threads or 1)
    prof = load_profile(profile_dir or DEFAULT_PROFILE)
    models = LiveModels.load(target, drafter)
    names = list(specs) or [s for s in DEFAULT_SPECS if not s.startswith("static")] + ["static:gamma=7"]
    every = read_prompt_ids(prompts)
    contexts = every[:: max(1, len(every) // n_contexts)][:n_contexts]  # spread over the file's domains
    rows = span_bias(models, contexts, names, prof, n, span, batch=batch, seed=seed, temperature=temperature,
                     progress=lambda line: err_console.print(line, highlight=False))
    df = pd.DataFrame(rows)
    console.print(f"bias over {span}-token spans: the live engine ({target} + {drafter}), {n} continuations "
                  f"per policy and context, batch R = {batch}, against plain decoding; TV lower bound "
                  "(split-half witness) at its worst position, 95% bootstrap CI; chi-square Holm-adjusted",
                  highlight=False)
    table = span_table(rows)
    console.print(table)
    if out is not None:
        from sparksim.atomic import write_text

        write_text(out, df.to_csv(index=False))
        console.print(f"table: {out}")
