"""The ``agent-r1`` command line."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Train tool-using LLM agents with end-to-end RL.")
console = Console()


def _quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    for name in ("DeepSpeed", "deepspeed", "torch.distributed", "bm25s", "httpx"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _config(pipeline: str, config_file: Path, overrides: list[str]):
    from agent_r1.config import ConfigError, load_config, parse_overrides

    try:
        return load_config(pipeline, config_file, parse_overrides(overrides))
    except ConfigError as e:
        console.print(f"[red]{e}[/red]")
        raise typer.Exit(2) from None


def results_table(results: dict, title: str, timings: dict | None = None) -> Table:
    table = Table(title=title)
    for col in ("split", "method", "EM", "F1", "n", "tool calls", "format err", "turns"):
        table.add_column(col, justify="right" if col not in ("split", "method") else "left")
    for split in sorted(results):
        for method, m in results[split].items():
            table.add_row(split, method, f"{m['em']:.3f}", f"{m['f1']:.3f}", str(m["n"]), f"{m['tool_calls']:.2f}",
                          f"{m['format_error_rate']:.3f}", f"{m['turns']:.2f}")
    if timings:
        table.caption = "wall time: " + ", ".join(f"{k[:-2]} {v:.0f}s" for k, v in timings.items())
    return table


@app.command()
def train(
    pipeline: str = typer.Option("default", "--pipeline", "-p", help="named pipeline in the config file"),
    config_file: Path = typer.Option(Path("pipelines.yaml"), "--config", help="pipelines file"),
    overrides: list[str] = typer.Option([], "--set", "-s", help="override a key, e.g. -s rl.iterations=10"),
    control: bool = typer.Option(False, help="also run the SFT-only control for RL's wall time"),
):
    """Data → SFT cold start → RL → held-out evaluation; writes <output_dir>/metrics/eval.json."""
    _quiet_libraries()
    cfg = _config(pipeline, config_file, overrides)
    from agent_r1.progress import Progress
    from agent_r1.run import train_and_evaluate

    results = train_and_evaluate(cfg, Progress(), control=control)
    timings = json.loads((cfg.out / "metrics" / "timings.json").read_text())
    shown = {k: v for k, v in results.items() if k == cfg.eval.split or k.endswith("hop")}
    console.print(results_table(shown, f"held-out evaluation ({cfg.name})", timings))
    console.print(f"metrics: {cfg.out / 'metrics' / 'eval.json'}")


@app.command("show-config")
def show_config(
    pipeline: str = typer.Option("default", "--pipeline", "-p"),
    config_file: Path = typer.Option(Path("pipelines.yaml"), "--config"),
    overrides: list[str] = typer.Option([], "--set", "-s"),
):
    """Print the fully resolved, validated config of a pipeline."""
    cfg = _config(pipeline, config_file, overrides)
    sys.stdout.write(cfg.model_dump_json(indent=2) + "\n")


if __name__ == "__main__":
    app()
