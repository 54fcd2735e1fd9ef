"""Where stages report: one MLflow run per pipeline run, a nested run per stage.

Stages receive a :class:`StageLog`; with tracking off it is a no-op, so the stage functions run
the same with or without MLflow. The pipeline run's id is kept in ``<output_dir>/state/`` until
the last stage closes it, so a stage re-run after a crash (or the next stage, started by DVC in
a new process) logs into the same run. Everything MLflow goes through :mod:`agent_r1.tracking`.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agent_r1.config import RunConfig
from agent_r1.pipeline.state import computed_precision

log = logging.getLogger(__name__)


class StageLog:
    """Metrics, params and artifacts of one stage (a nested MLflow run), or nothing."""

    def __init__(self, tracker=None, run_id: str | None = None):
        self.tracker, self.run_id = tracker, run_id

    def __bool__(self) -> bool:
        return self.tracker is not None

    def child(self, name: str) -> "StageLog":
        """A run nested in this one (e.g. one per method in a comparison)."""
        return StageLog(self.tracker, self.tracker.stage_run(self.run_id, name)) if self else self

    def end(self, status: str = "FINISHED") -> None:
        if self:
            self.tracker.end_run(self.run_id, status)

    def metrics(self, values: dict, step: int | None = None) -> None:
        if self:
            self.tracker.log_metrics(self.run_id, values, step)

    def params(self, values: dict) -> None:
        if self:
            self.tracker.log_params(self.run_id, values)

    def tags(self, values: dict) -> None:
        if self:
            self.tracker.set_tags(self.run_id, values)

    def text(self, text: str, artifact_file: str) -> None:
        if self:
            self.tracker.log_text(self.run_id, text, artifact_file)

    def artifact(self, path: Path, artifact_path: str | None = None) -> None:
        if self:
            self.tracker.log_artifact(self.run_id, str(path), artifact_path)

    def curves(self, history: list[dict], keys: list[str], artifact_file: str) -> None:
        if self and history:
            self.tracker.log_curves(self.run_id, history, keys, artifact_file)


NULL_LOG = StageLog()


def code_version() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def dvc_data_hash(cfg: RunConfig, lock: Path = Path("dvc.lock")) -> str | None:
    """The md5 DVC recorded for ``<output_dir>/data`` in dvc.lock (None outside a DVC run)."""
    if not lock.exists():
        return None
    import yaml

    want = Path(cfg.output_dir) / "data"
    for stage in (yaml.safe_load(lock.read_text()) or {}).get("stages", {}).values():
        for out in stage.get("outs", []):
            if Path(out.get("path", "")) == want:
                return out.get("md5")
    return None


class Recorder:
    """Opens (or, after a crash, reopens) the pipeline's MLflow run and hands out stage logs."""

    def __init__(self, cfg: RunConfig, tracker=None):
        self.cfg, self.tracker = cfg, tracker
        self.state_file = cfg.out / "state" / "mlflow_run.json"
        self.run_id: str | None = None

    def open(self, run_id: str | None = None) -> str | None:
        """The pipeline run: ``run_id`` if given, else the unfinished one on disk, else a new one."""
        if self.tracker is None:
            return None
        if run_id is None and self.state_file.exists():
            run_id = json.loads(self.state_file.read_text())["run_id"]
        params = self.cfg.model_dump(mode="json") | {"precision_computed": computed_precision(self.cfg)}
        tags = {"pipeline": self.cfg.name, "code_version": code_version()}
        if dvc_hash := dvc_data_hash(self.cfg):
            tags["data_version_dvc"] = dvc_hash
        try:
            self.run_id = self.tracker.start_pipeline_run(self.cfg.name, params, tags, run_id=run_id)
        except ValueError as e:  # the config changed since the unfinished run: a new run
            log.warning("not resuming MLflow run %s (%s); starting a new one", run_id, e)
            self.run_id = self.tracker.start_pipeline_run(self.cfg.name, params, tags)
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")  # a kill mid-write must not leave half a file
        tmp.write_text(json.dumps({"run_id": self.run_id}))
        tmp.replace(self.state_file)
        return self.run_id

    def stage(self, name: str) -> StageLog:
        if self.tracker is None:
            return NULL_LOG
        if self.run_id is None:
            self.open()
        return StageLog(self.tracker, self.tracker.stage_run(self.run_id, name))

    @contextmanager
    def timed_stage(self, name: str, timings: dict) -> Iterator[StageLog]:
        """One stage's nested run: FAILED if the block raises, else FINISHED with its wall time
        (also put in ``timings[f"{name}_s"]``)."""
        slog = self.stage(name)
        t0 = time.perf_counter()
        try:
            yield slog
        except BaseException:
            slog.end("FAILED")
            raise
        timings[f"{name}_s"] = time.perf_counter() - t0
        slog.metrics({"wall_s": timings[f"{name}_s"]})
        slog.end()

    def close(self, status: str = "FINISHED") -> None:
        """End the pipeline run; the next stage run starts a new pipeline run."""
        if self.tracker is not None and self.run_id is not None:
            self.tracker.end_run(self.run_id, status)
            self.state_file.unlink(missing_ok=True)
            self.run_id = None
