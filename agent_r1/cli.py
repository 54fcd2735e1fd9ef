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
from typer.core import TyperGroup

console = Console()


def _expected_errors() -> tuple[type[Exception], ...]:
    """What a user's input or machine causes: a bad config, bad data or checkpoint, a missing file,
    an MCP server that cannot start, a sandbox layer the machine lacks."""
    from agent_r1.checkpoints import CheckpointError
    from agent_r1.config import ConfigError
    from agent_r1.data import DataError
    from agent_r1.rollout.loop import ContextBudgetError
    from agent_r1.tools import MCPConfigError, SandboxUnavailable

    return (ConfigError, DataError, CheckpointError, ContextBudgetError, MCPConfigError, SandboxUnavailable,
            FileNotFoundError, IsADirectoryError, NotADirectoryError)


def _error(message: str) -> None:
    console.print(message, style="red", markup=False, highlight=False, soft_wrap=True)


class _Commands(TyperGroup):
    """Runs a command; an expected error is printed in red without a traceback (exit code 1),
    unless ``--debug`` asks for the traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except Exception as e:
            if ctx.params.get("debug") or not isinstance(e, _expected_errors()):
                raise
            if _rank() == 0:  # with N ranks, every rank has the error; one says it
                _error(f"error: {e}")
            raise typer.Exit(1) from None


app = typer.Typer(cls=_Commands, add_completion=False, no_args_is_help=True,
                  help="Train tool-using LLM agents with end-to-end RL.")


@app.callback()
def main(debug: bool = typer.Option(False, "--debug", envvar="AGENT_R1_DEBUG",
                                    help="show the traceback of an expected error (bad config, data, missing file)")):
    """Train tool-using LLM agents with end-to-end RL."""


def _rank() -> int:
    """This process's rank under a launcher (torchrun sets RANK), else 0."""
    return int(os.environ.get("RANK", "0"))


def _quiet_libraries() -> None:
    from agent_r1.pipeline.env import contain

    contain()
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    # with N ranks, rank 0 reports; the others only warn
    logging.basicConfig(level=logging.INFO if _rank() == 0 else logging.WARNING,
                        format="%(message)s" if _rank() == 0 else f"[rank {_rank()}] %(message)s")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    for name in ("DeepSpeed", "deepspeed", "torch.distributed", "bm25s", "httpx"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _config(pipeline: str, config_file: Path, overrides: list[str]):
    from agent_r1.config import ConfigError, load_config, parse_overrides

    try:
        cfg = load_config(pipeline, config_file, parse_overrides(overrides))
    except ConfigError as e:
        _error(str(e))
        raise typer.Exit(2) from None
    if cfg.runtime.threads:
        from agent_r1.pipeline.stages import use_runtime

        use_runtime(cfg)
    return cfg


# Columns of every results table; the rest of a method's numbers are the environment's declared
# metrics (EM and F1 for QA, its own for another environment), each a column of its own.
_TABLE_FIXED = {"n": "n", "tool_calls": "tool calls", "format_error_rate": "format err", "turns": "turns"}
_NOT_METRICS = {"reward", "answered", "tokens", "env_errors", "format_errors", "timeouts", "truncated_tool_outputs",
                "tool_errors"}


def results_table(results: dict, title: str, timings: dict | None = None) -> Table:
    """eval.json as a table: a row per split and method; a column for every metric the
    environment declares (em and f1 first), then n, tool calls, format errors and turns."""
    rows = [(split, method, m) for split in sorted(results) for method, m in results[split].items()]
    declared: list[str] = []
    for _, _, m in rows:
        declared += [k for k, v in m.items() if k not in declared and k not in _TABLE_FIXED and k not in _NOT_METRICS
                     and isinstance(v, (int, float)) and not isinstance(v, bool)]
    declared.sort(key=lambda k: (("em", "f1").index(k) if k in ("em", "f1") else 2))
    table = Table(title=title)
    for col in ("split", "method"):
        table.add_column(col)
    for col in [{"em": "EM", "f1": "F1"}.get(k, k) for k in declared] + list(_TABLE_FIXED.values()):
        table.add_column(col, justify="right")
    nan = float("nan")
    for split, method, m in rows:
        table.add_row(split, method, *[f"{m.get(k, nan):.3f}" for k in declared], str(m.get("n", 0)),
                      f"{m.get('tool_calls', nan):.2f}", f"{m.get('format_error_rate', nan):.3f}", f"{m.get('turns', nan):.2f}")
    if timings:
        table.caption = "wall time: " + ", ".join(f"{k[:-2]} {v:.0f}s" for k, v in timings.items())
    return table


def kinds_table(results: dict, split: str, title: str) -> Table | None:
    """EM per kind of task (eval.json's ``em_by_qtype``) of ``split``: a row per kind, a column per
    method; None when the data has no kinds."""
    methods = {m: r.get("em_by_qtype") or {} for m, r in results.get(split, {}).items()}
    kinds = sorted({q for by in methods.values() for q in by})
    if not kinds:
        return None
    table = Table(title=title)
    table.add_column("kind")
    for m in methods:
        table.add_column(m, justify="right")
    for q in kinds:
        table.add_row(q, *[f"{by[q]:.3f}" if q in by else "" for by in methods.values()])
    return table


def _print_kinds(results: dict, split: str) -> None:
    """Print :func:`kinds_table` of ``split`` where the data has kinds."""
    if kinds := kinds_table(results, split, f"EM by kind (qtype), {split}"):
        console.print(kinds)


def _tracker(track: bool):
    if not track:
        return None
    from agent_r1.tracking import Tracker

    return Tracker()


PIPELINE = typer.Option("default", "--pipeline", "-p", help="named pipeline in the config file")
CONFIG = typer.Option(None, "--config", help="pipelines file (default: ./pipelines.yaml, else built-in defaults)")
SET = typer.Option([], "--set", "-s", help="override a key, e.g. -s rl.iterations=10")
TRACK = typer.Option(True, "--track/--no-track", help="log to MLflow (MLFLOW_TRACKING_URI or ./mlruns/mlflow.db)")


@app.command()
def train(
    pipeline: str = PIPELINE,
    config_file: Path = CONFIG,
    overrides: list[str] = SET,
    control: bool = typer.Option(False, help="also run the SFT-only control for RL's wall time"),
    track: bool = TRACK,
    nproc: int = typer.Option(1, "--nproc", min=1,
                              help="data-parallel ranks on this machine (torchrun underneath; one per GPU on a GPU machine)"),
):
    """All stages: data → SFT → RL → held-out evaluation → register (MLflow), in this process or
    on --nproc ranks (also when a launcher such as torchrun started this process as one rank)."""
    if nproc > 1:
        _launch(nproc, ["train", "-p", pipeline, *(["--config", str(config_file)] if config_file else []),
                        *[x for o in overrides for x in ("-s", o)], "--control" if control else "--no-control",
                        "--track" if track else "--no-track"])
    _quiet_libraries()
    cfg = _config(pipeline, config_file, overrides)
    from agent_r1.pipeline import run_all
    from agent_r1.pipeline.dvc_lock import record_in_dvc_lock
    from agent_r1.pipeline.health import needs_a_look
    from agent_r1.progress import Progress

    from agent_r1.learner.distributed import shutdown

    out = run_all(cfg, _tracker(track and _rank() == 0), Progress(enabled=_rank() == 0), with_control=control)
    ranks = shutdown()
    if _rank() == 0:
        record_in_dvc_lock(cfg, config_file, overrides, "register" if track else "evaluate")
        shown = {k: v for k, v in out["eval"].items() if k == cfg.eval.split or k.endswith("hop") or k.startswith("curve_")}
        console.print(results_table(shown, f"held-out evaluation ({cfg.name})", out["timings"]))
        _print_kinds(out["eval"], cfg.eval.split)
        console.print(f"metrics: {cfg.out / 'metrics' / 'eval.json'}")
        if look := needs_a_look(out["health"]):
            console.print(f"[yellow]needs a look: the run raised health alarms ({look}; docs/health.md)[/yellow]")
        if out["register"]:
            r = out["register"]
            console.print(f"registered {r['model']} v{r['version']} as {r['alias']}: {r['reason']}")
    if ranks > 1:
        # One of N ranks, its work done and recorded: leave without running C++ destructors, where a
        # communication thread still alive at exit aborts the process (seen 2 times in 14 two-node runs)
        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
        os._exit(0)


@app.command("control")
def control_cmd(
    pipeline: str = PIPELINE,
    config_file: Path = CONFIG,
    overrides: list[str] = SET,
    seconds: float = typer.Option(None, help="how long to train (default: RL's recorded training time)"),
):
    """The SFT-only control alone: SFT trained further from the run's SFT checkpoint for
    --seconds (checkpoints/sft_control); `agent-r1 evaluate sft_control=<it>` scores it."""
    _quiet_libraries()
    cfg = _config(pipeline, config_file, overrides)
    from agent_r1.pipeline.control import control
    from agent_r1.progress import Progress

    console.print(f"wrote {control(cfg, seconds, Progress())}")


def _launch(nproc: int, args: list[str]) -> None:
    """Run ``agent-r1 ARGS`` as ``nproc`` ranks under torchrun on this machine, and exit with its status."""
    import subprocess

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        _error(f"error: --nproc {nproc}: this process is already one of {os.environ['WORLD_SIZE']} ranks of a launcher")
        raise typer.Exit(2)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "agent_r1.cli", *args]
    raise typer.Exit(subprocess.run(cmd, check=False).returncode)


@app.command()
def stage(
    name: str = typer.Argument(..., help="prepare | sft | train | evaluate | register"),
    pipeline: str = PIPELINE,
    config_file: Path = CONFIG,
    overrides: list[str] = SET,
    track: bool = TRACK,
    method: list[str] = typer.Option([], "--method", "-m", help="train: only these RL methods (default: the pipeline's)"),
):
    """Run one pipeline stage (what dvc.yaml calls). Stages log into the pipeline's open MLflow
    run; the last stage (register) closes it."""
    _quiet_libraries()
    from agent_r1.pipeline import STAGES, Recorder, stages
    from agent_r1.progress import Progress

    if name not in STAGES:
        console.print(f"[red]unknown stage {name!r}; stages: {', '.join(STAGES)}[/red]")
        raise typer.Exit(2)
    cfg = _config(pipeline, config_file, overrides)
    if os.environ.get("DVC_STAGE") and Path("dvc.yaml").is_file():  # run by dvc repro / dvc exp run
        from agent_r1.pipeline.dvc_lock import untracked_inherited_keys

        if problem := untracked_inherited_keys(pipeline, config_file=config_file or Path("pipelines.yaml")):
            _error(f"error: {problem}")
            raise typer.Exit(2)
    tracker = _tracker(track)
    rec = Recorder(cfg, tracker)
    run_id = rec.open()
    with rec.timed_stage(name, {}) as slog:
        if name == "register":
            if tracker is None:
                console.print("[red]register needs MLflow tracking (drop --no-track)[/red]")
                raise typer.Exit(2)
            r = stages.register(cfg, tracker, run_id)
            console.print(f"registered {r['model']} v{r['version']} as {r['alias']}: {r['reason']}")
        elif name == "prepare":
            console.print(stages.prepare(cfg, slog))
        elif name == "train":
            for path in stages.train(cfg, slog, Progress(), tracker, methods=method or None):
                console.print(f"wrote {path}")
        elif name == "evaluate":
            results = stages.evaluate(cfg, slog, Progress())
            console.print(results_table({k: v for k, v in results.items() if k.endswith("hop")}, f"held-out evaluation ({cfg.name})"))
            _print_kinds(results, cfg.eval.split)
        else:
            console.print(f"wrote {getattr(stages, name)(cfg, slog, Progress())}")
    if name == STAGES[-1]:
        rec.close()


def _sources(items: list[str]) -> dict[str, str] | None:
    """``["grpo=outputs/x/checkpoints/grpo", "models:/agent-r1@champion", "path"]`` → {method: source}."""
    if not items:
        return None
    out = {}
    for item in items:
        name, _, src = item.rpartition("=") if "=" in item.split(":/")[0] else ("", "", item)
        out[name or (src.split("@")[-1] if src.startswith("models:/") else Path(src).name)] = src
    return out


@app.command()
def evaluate(
    sources: list[str] = typer.Argument(None, help="[method=]checkpoint folder, hub id or models:/<name>@<alias>; "
                                        "default: the pipeline's baselines, sft and RL checkpoints"),
    pipeline: str = PIPELINE,
    config_file: Path = CONFIG,
    overrides: list[str] = SET,
    track: bool = TRACK,
    data: Path = typer.Option(None, "--data", help="score these task rows instead of the pipeline's test split: a "
                              ".jsonl file, or a folder of test.jsonl (and corpus.jsonl where a tool reads one)"),
    out: Path = typer.Option(None, "--out", help="with --data: the folder it writes (default: "
                             "outputs/evaluations/<name of --data without .jsonl>)"),
):
    """Held-out evaluation (greedy, fixed seed): EM, F1, format, tool use, search recall, by hops
    and by kind of task (qtype).

    Each checkpoint is evaluated with the env settings it was trained with (system prompt, context
    budget, environment, tools), except those set here with -s env.<key>=<value>; where they differ
    from the pipeline's, a warning names them. A method named `naive_rag` is scored with the Naive
    RAG protocol (one retrieval with the question, then the answer). Results are merged into
    <output_dir>/metrics/eval.json (replacing one that scored other rows).

    With --data, the rows of a file are prepared and scored in one go, every row of them, with no
    training file: into --out (data/, metrics/eval.json), not the pipeline's output_dir.
    """
    _quiet_libraries()
    from agent_r1.config import parse_overrides
    from agent_r1.pipeline import NULL_LOG, StageLog, stages
    from agent_r1.progress import Progress

    cfg = _config(pipeline, config_file, overrides)
    env_set = set(parse_overrides(overrides).get("env") or {})
    if data is not None:
        cfg = _rows_config(cfg, data, out, sources)
    elif out is not None:
        _error("error: --out goes with --data (the pipeline's evaluation writes into its output_dir)")
        raise typer.Exit(2)
    tracker = _tracker(track)
    run_id, slog = None, NULL_LOG
    if tracker is not None:  # its own MLflow run, apart from any unfinished pipeline run
        run_id = tracker.start_pipeline_run(f"{cfg.name}-evaluation", cfg.model_dump(mode="json"), {"pipeline": cfg.name})
        slog = StageLog(tracker, tracker.stage_run(run_id, "evaluate"))
    status = "FAILED"
    try:
        checkpoints = _sources(sources)
        if data is not None:
            checkpoints = _prepare_rows(cfg, data, checkpoints, env_set, tracker, slog)
        named = sources is not None or data is not None  # none: the pipeline's own, in its env (as its stage)
        results = stages.evaluate(cfg, slog, Progress(), checkpoints, tracker, merge=sources is not None,
                                  env_set=env_set if named else None)
        status = "FINISHED"
    except (FileNotFoundError, OSError, ValueError) as e:
        _error(str(e))
        raise typer.Exit(1) from None
    finally:
        if run_id is not None:
            slog.end(status)
            tracker.end_run(run_id, status)
    console.print(results_table(results, f"held-out evaluation ({cfg.name}, split {cfg.eval.split})"))
    _print_kinds(results, cfg.eval.split)
    console.print(f"metrics: {cfg.out / 'metrics' / 'eval.json'}")


def _rows_config(cfg, data: Path, out: Path | None, sources: list[str] | None):
    """The config of `evaluate --data`: the rows of ``data`` as the test split (data.source jsonl),
    everything written under ``out`` (default outputs/evaluations/<name>), no held-out curve."""
    if not sources:
        _error("error: --data needs the checkpoints to score, e.g. agent-r1 evaluate outputs/code/rl/grpo --data rows.jsonl")
        raise typer.Exit(2)
    if not data.exists():
        _error(f"error: --data: {data} not found (a .jsonl file of task rows, or a folder with test.jsonl)")
        raise typer.Exit(2)
    out = out or Path("outputs") / "evaluations" / data.name.removesuffix(".jsonl")
    return cfg.model_copy(update={"output_dir": str(out), "data": cfg.data.model_copy(update={"source": "jsonl", "path": str(data)}),
                                  "eval": cfg.eval.model_copy(update={"split": "test", "every": 0})})


def _prepare_rows(cfg, data: Path, checkpoints: dict[str, str], env_set: set[str], tracker, slog) -> dict[str, str]:
    """`evaluate --data`: the checkpoints as local folders (checked), and the rows prepared under the
    config's output_dir, checked against the env the first checkpoint was trained with."""
    from agent_r1.checkpoints import trained_settings, validate_checkpoint
    from agent_r1.pipeline import stages

    checkpoints = {m: stages.checkpoint_folder(cfg, m, src, tracker) for m, src in checkpoints.items()}
    for folder in checkpoints.values():  # a missing checkpoint named before the rows are checked
        validate_checkpoint(folder)
    first = next(iter(checkpoints.values()))
    if not (Path(first).is_dir() and trained_settings(first)):
        console.print(f"warning: {first} records no env settings (not a checkpoint folder a pipeline wrote): the rows "
                      f"are checked against pipeline {cfg.name!r}'s env ({cfg.env.name})", style="yellow", markup=False,
                      highlight=False, soft_wrap=True)
    info = stages.prepare(stages.trained_config(cfg, first, env_set, warn=False), slog)
    console.print(f"prepared {info['test_questions']} rows of {data} into {cfg.out / 'data'}")
    return checkpoints


@app.command()
def show(
    source: str = typer.Argument(..., help="checkpoint folder, hub id or models:/<name>@<alias>"),
    n: int = typer.Option(3, "-n", help="episodes to show"),
    hops: int = typer.Option(2, help="questions with this many hops"),
    naive_rag: bool = typer.Option(False, help="use the Naive RAG protocol instead of the agent loop"),
    out: Path = typer.Option(None, help="also write the transcripts to this markdown file"),
    pipeline: str = PIPELINE,
    config_file: Path = CONFIG,
    overrides: list[str] = SET,
):
    """Print a few held-out episodes as transcripts: question, each turn, observations, answer, reward."""
    _quiet_libraries()
    from rich.markdown import Markdown

    from agent_r1.data.synthetic import load_split
    from agent_r1.envs import NaiveRAGEnv
    from agent_r1.models import load_model
    from agent_r1.run import Agent, evaluate_agent, make_tools, tasks_for
    from agent_r1.tracking import is_registry_uri
    from agent_r1.transcripts import transcripts

    cfg = _config(pipeline, config_file, overrides)
    if is_registry_uri(source):
        source = str(_tracker(True).load_agent(source, cfg.out / "state" / "show_model"))
    model, tokenizer = load_model(source)
    data_dir = cfg.out / "data"
    tasks = tasks_for(load_split(data_dir, cfg.eval.split), [hops], n, cfg.seed)
    agent = Agent(model, tokenizer, make_tools(cfg, data_dir, cfg.eval.split), cfg, NaiveRAGEnv if naive_rag else None)
    _, trajs = evaluate_agent(agent, tasks)
    text = transcripts(trajs, tasks, limit=n)
    console.print(Markdown(text))
    if out:
        out.write_text(text)


@app.command()
def recall(
    k: list[int] = typer.Option([1, 2, 5, 10], "-k", help="cut-offs"),
    pipeline: str = PIPELINE,
    config_file: Path = CONFIG,
    overrides: list[str] = SET,
):
    """Search recall@k of the gold documents for the raw questions of the eval split (the Naive
    RAG retrieval); writes <output_dir>/metrics/retrieval.json. Run the prepare stage first."""
    _quiet_libraries()
    from agent_r1.data.synthetic import load_corpus, load_split
    from agent_r1.evaluate import retrieval_recall
    from agent_r1.tools import SearchIndex

    cfg = _config(pipeline, config_file, overrides)
    data_dir = cfg.out / "data"
    test = load_split(data_dir, cfg.eval.split)
    result = retrieval_recall(SearchIndex(load_corpus(data_dir, cfg.eval.split)), test.to_dict("records"), tuple(k))
    table = Table(title=f"search recall@k for the raw question ({cfg.name}, split {cfg.eval.split})")
    for col in ["questions", "n", *[f"recall@{x}" for x in k]]:
        table.add_column(col, justify="left" if col == "questions" else "right")
    for name, row in result.items():
        table.add_row(name, str(row["n"]), *[f"{row[f'recall@{x}']:.3f}" for x in k])
    console.print(table)
    out = cfg.out / "metrics" / "retrieval.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))


@app.command()
def table(
    in_domain: str = typer.Option("test_2hop", help="eval.json split of the question types RL trains on"),
    out_domain: str = typer.Option("test_3hop", help="eval.json split of questions RL never trains on"),
    pipeline: str = PIPELINE,
    config_file: Path = CONFIG,
    overrides: list[str] = SET,
):
    """Print the comparison table (markdown) of a pipeline's metrics/eval.json."""
    from agent_r1.evaluate import comparison_markdown

    cfg = _config(pipeline, config_file, overrides)
    path = cfg.out / "metrics" / "eval.json"
    if not path.exists():
        _error(f"{path} not found: run the pipeline (or `agent-r1 evaluate`) first")
        raise typer.Exit(1)
    sys.stdout.write(comparison_markdown(json.loads(path.read_text()), in_domain, out_domain))


@app.command()
def seeds(
    runs: list[Path] = typer.Argument(..., help="output folders of runs that differ only in their seed"),
    rl: str = typer.Option("grpo", help="the RL method whose lift over SFT is reported"),
    wall_s: float = typer.Option(None, help="the runs' wall time, for the last line"),
    name: str = typer.Option(None, help="the last line's name (default <rl>_lift)"),
):
    """Held-out EM of several seeds' runs (mean ± sd per hop count) and RL's lift over its SFT start."""
    from agent_r1.evaluate import seed_report

    paths = [r / "metrics" / "eval.json" for r in runs]
    if missing := [str(p) for p in paths if not p.exists()]:
        _error(f"no eval.json in: {', '.join(missing)} (run the pipeline first)")
        raise typer.Exit(1)
    sys.stdout.write(seed_report([json.loads(p.read_text()) for p in paths], rl=rl, wall_s=wall_s, name=name))


@app.command("mlflow-ui")
def mlflow_ui(port: int = typer.Option(5000, help="port on 127.0.0.1")):
    """Open the MLflow UI on this project's tracking store (127.0.0.1 only)."""
    from agent_r1.pipeline.env import contain
    from agent_r1.tracking import configure

    contain()
    uri = configure()
    console.print(f"MLflow UI for {uri} at http://127.0.0.1:{port}")
    os.execvp(sys.executable, [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1", "--port", str(port)])


@app.command("vllm-model")
def vllm_model(
    folder: Path = typer.Argument(..., help="the folder to write (copy it to the server's machine, or share it)"),
    pipeline: str = PIPELINE,
    config_file: Path = CONFIG,
    overrides: list[str] = SET,
):
    """Write the folder a vLLM server run elsewhere (rollout.vllm.url) starts from: the pipeline's
    model.name_or_path (the tiny model: its RL start, checkpoints/sft) with untied embeddings, and
    print the command that starts the server with the options the pipeline's own server would get."""
    _quiet_libraries()
    import shlex

    from transformers import AutoConfig

    from agent_r1.pipeline.rl_driver import start_path
    from agent_r1.rollout.build import vllm_server_args
    from agent_r1.rollout.vllm_engine import served_model

    cfg = _config(pipeline, config_file, overrides)
    folder = served_model(cfg.model.name_or_path or start_path(cfg), folder.absolute())
    args = vllm_server_args(cfg, AutoConfig.from_pretrained(folder))
    server = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), *args,
              "--host", "0.0.0.0", "--port", "8000"]
    typer.echo(f"wrote {folder} (untied); start the server from it (VLLM_SERVER_DEV_MODE=1 opens its weight-sync "
               "routes: keep it on a private network):")
    typer.echo("VLLM_SERVER_DEV_MODE=1 " + shlex.join(server))
    typer.echo("then train with -s rollout.engine=vllm -s rollout.vllm.url=http://<server>:8000 "
               "-s rollout.vllm.weights_dir=<a folder the server reads at the same path>")


@app.command("show-config")
def show_config(
    pipeline: str = PIPELINE,
    config_file: Path = CONFIG,
    overrides: list[str] = SET,
    doc: bool = typer.Option(False, "--doc", help="print the reference of every key (markdown: docs/config.md) instead"),
):
    """Print the fully resolved, validated config of a pipeline (JSON), or with --doc the
    configuration reference: every key's type, default and description."""
    if doc:
        from agent_r1.config_doc import markdown

        sys.stdout.write(markdown())
        return
    cfg = _config(pipeline, config_file, overrides)
    sys.stdout.write(cfg.model_dump_json(indent=2) + "\n")


if __name__ == "__main__":
    app()
