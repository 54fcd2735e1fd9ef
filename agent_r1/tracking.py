"""MLflow tracking: the one module in agent-r1 that imports mlflow.

Every call names its run explicitly (``MlflowClient`` with run ids): MLflow's "active run" is
per thread, and Prefect runs tasks in other threads, so nothing here relies on it. mlflow is
imported lazily, after :func:`configure` has switched its telemetry off (MLflow decides about
telemetry once, when it is first imported).

Layout: one top-level run per pipeline run (:meth:`Tracker.start_pipeline_run`), one nested
run per stage (:meth:`Tracker.stage_run`), and trained agents registered as model versions
with aliases (``challenger``, ``champion``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import numbers
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_EXPERIMENT = "agent-r1"
PARENT_TAG = "mlflow.parentRunId"


def configure(project_dir: Path | str = ".") -> str:
    """Switch MLflow's telemetry off and return the tracking URI.

    ``MLFLOW_TRACKING_URI`` wins when set; otherwise a SQLite file at
    ``<project_dir>/mlruns/mlflow.db`` (MLflow's file store is deprecated and errors in recent
    versions), whose artifacts go to ``<project_dir>/mlruns/artifacts``.
    """
    _disable_telemetry()
    if uri := os.environ.get("MLFLOW_TRACKING_URI"):
        return uri
    root = Path(project_dir).resolve() / "mlruns"
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root / 'mlflow.db'}"


def is_registry_uri(src: str) -> bool:
    """A ``models:/`` or ``runs:/`` URI: a model :meth:`Tracker.load_agent` downloads, not a folder or hub id."""
    return str(src).startswith(("models:/", "runs:/"))


def flatten(d: dict, prefix: str = "") -> dict[str, str]:
    """A nested dict as ``{"a.b.c": "value"}``; lists are JSON-encoded, other leaves ``str``-ed."""
    out: dict[str, str] = {}
    for key, value in d.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            out.update(flatten(value, name))
        elif isinstance(value, (list, tuple)):
            out[name] = json.dumps(value, default=str)
        else:
            out[name] = str(value)
    return out


def _clean_name(key: str) -> str:
    """``key`` made acceptable to MLflow as a metric or param name.

    Characters other than alphanumerics, ``_ - . /`` and space become ``_``, and empty, ``.``
    and ``..`` path segments are dropped (MLflow rejects names that normalise to another path).
    """
    name = re.sub(r"[^\w.\- /]", "_", str(key))
    return "/".join(part for part in name.split("/") if part not in ("", ".", "..")) or "_"


def _sqlite_file(uri: str) -> Path | None:
    """The database file of a local SQLite store; None for other stores (a tracking server)."""
    if not uri.startswith("sqlite:///") or ":memory:" in uri:
        return None
    return Path(uri.removeprefix("sqlite:///")).resolve()


def _artifact_root(uri: str) -> str | None:
    """Artifacts of a local SQLite store live next to the database, in ``artifacts/``.

    For other stores (a tracking server) the server decides, so this returns None.
    """
    db = _sqlite_file(uri)
    return None if db is None else (db.parent / "artifacts").as_uri()


@contextlib.contextmanager
def _store_lock(uri: str):
    """Hold ``<db>.lock`` (``flock``) while a SQLite store is opened: MLflow creates and migrates
    a new database's tables on first use, and two processes doing it at once break each other's
    migration (``duplicate column name``). Other stores need no lock."""
    db = _sqlite_file(uri)
    if db is None:
        yield
        return
    db.parent.mkdir(parents=True, exist_ok=True)  # as MLflow makes a new store's folder
    with open(db.with_name(db.name + ".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class _AgentRegistry:
    """Trained agents as registered model versions with aliases (``challenger``, ``champion``).
    Part of :class:`Tracker` (it uses the tracker's ``client`` and ``uri``)."""

    client: Any
    uri: str

    def log_agent(
        self,
        run_id: str,
        checkpoint_dir: Path | str,
        registered_name: str,
        alias: str = "challenger",
        tags: dict | None = None,
    ) -> str:
        """Log a Hugging Face checkpoint folder as a ``transformers`` model of run ``run_id``,
        register it as a new version of ``registered_name``, point ``alias`` at it and tag it.

        Returns the version. :meth:`load_agent` gives the folder back, with the settings file the
        checkpoint was trained with (``agent_r1.checkpoints.SETTINGS_FILE``) where it has one.
        """
        import mlflow.transformers
        import transformers
        from mlflow.entities import LoggedModelOutput, LoggedModelStatus
        from mlflow.exceptions import MlflowException
        from mlflow.models import Model

        from agent_r1.models import load_model

        checkpoint_dir = Path(checkpoint_dir).resolve()  # an absolute path is never taken for a hub id
        model, tokenizer = load_model(checkpoint_dir, dtype="auto")
        experiment_id = self.client.get_run(run_id).info.experiment_id
        logged = self.client.create_logged_model(
            experiment_id, name=registered_name, source_run_id=run_id, tags=_str_dict(tags)
        )
        with tempfile.TemporaryDirectory() as tmp:
            mlflow.transformers.save_model(
                {"model": model, "tokenizer": tokenizer},
                path=f"{tmp}/model",
                task="text-generation",
                mlflow_model=Model(artifact_path=logged.artifact_location, run_id=run_id, model_id=logged.model_id),
                # Inferring requirements would reload the model in a subprocess; a model card
                # would be fetched from the Hub.
                pip_requirements=["torch", f"transformers=={transformers.__version__}"],
                model_card=_model_card(registered_name),
            )
            _copy_settings(checkpoint_dir, Path(tmp, "model"))
            self.client.log_model_artifacts(logged.model_id, f"{tmp}/model")
        self.client.finalize_logged_model(logged.model_id, LoggedModelStatus.READY)
        self.client.log_outputs(run_id, [LoggedModelOutput(logged.model_id, step=0)])
        try:
            self.client.create_registered_model(registered_name)
        except MlflowException as e:
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        # The source is the artifact location, not ``models:/<model_id>``: the SQL registry
        # resolves the latter through the process-wide tracking URI, not this client's.
        version = self.client.create_model_version(
            registered_name,
            source=logged.artifact_location,
            run_id=run_id,
            tags=_str_dict(tags),
            model_id=logged.model_id,
        ).version
        self.set_alias(registered_name, alias, version)
        return str(version)

    def load_agent(self, model_uri: str, dst: Path | str | None = None) -> Path:
        """Download an agent and return its Hugging Face folder (``agent_r1.models.load_model``
        loads it).

        ``model_uri`` is ``models:/<name>@<alias>``, ``models:/<name>/<version>``,
        ``models:/<model id>``, ``runs:/<run id>/<path>`` or any artifact URI. It is downloaded
        into ``dst`` (a new temporary folder by default); the returned folder is the one in it
        holding ``config.json``, with the tokenizer files beside it.
        """
        from mlflow.artifacts import download_artifacts

        dst = Path(dst) if dst is not None else Path(tempfile.mkdtemp(prefix="agent-r1-model-"))
        dst.mkdir(parents=True, exist_ok=True)
        local = Path(
            download_artifacts(artifact_uri=self._model_source(model_uri), dst_path=str(dst), tracking_uri=self.uri)
        )
        folder = next((p.parent for p in sorted(local.rglob("config.json"))), None)
        if folder is None:
            raise FileNotFoundError(f"{model_uri} holds no Hugging Face model (no config.json)")
        if not (folder / "tokenizer_config.json").exists():
            # the transformers flavor keeps the tokenizer in components/tokenizer/
            for tok_config in local.rglob("tokenizer_config.json"):
                shutil.copytree(tok_config.parent, folder, dirs_exist_ok=True)
                break
        return folder

    def _model_source(self, model_uri: str) -> str:
        """The artifact URI behind a ``models:/`` or ``runs:/`` URI, resolved with this client.

        (MLflow's own resolution of these URIs uses the process-wide registry URI.)
        """
        scheme, _, rest = model_uri.partition(":/")
        rest = rest.lstrip("/")
        if scheme == "models":
            if "@" in rest:
                name, alias = rest.split("@", 1)
                version = self.client.get_model_version_by_alias(name, alias).version
            elif "/" in rest:
                name, version = rest.split("/", 1)
            else:
                return self.client.get_logged_model(rest).artifact_location
            return self.client.get_model_version_download_uri(name, version)
        if scheme == "runs":
            run_id, _, path = rest.partition("/")
            run = self.client.get_run(run_id)
            models = self.client.search_logged_models(
                [run.info.experiment_id], filter_string=f"source_run_id = '{run_id}'"
            )
            named = [m for m in models if m.name == path]
            if named:
                return max(named, key=lambda m: m.creation_timestamp).artifact_location
            return f"{run.info.artifact_uri}/{path}"
        return model_uri

    def alias_version(self, name: str, alias: str) -> dict[str, Any] | None:
        """``{"version", "run_id", "tags", "metrics"}`` of the version ``alias`` points at (the
        metrics are its run's latest), or None when the model or the alias does not exist."""
        from mlflow.exceptions import MlflowException

        try:
            model = self.client.get_registered_model(name)
        except MlflowException as e:
            if e.error_code == "RESOURCE_DOES_NOT_EXIST":
                return None
            raise
        if alias not in model.aliases:
            return None
        mv = self.client.get_model_version(name, model.aliases[alias])
        metrics = dict(self.client.get_run(mv.run_id).data.metrics) if mv.run_id else {}
        return {"version": str(mv.version), "run_id": mv.run_id, "tags": dict(mv.tags), "metrics": metrics}

    def set_alias(self, name: str, alias: str, version: str | int) -> None:
        """Point ``alias`` at ``version`` (moving it from any other version)."""
        self.client.set_registered_model_alias(name, alias, str(version))

    def set_version_tag(self, name: str, version: str | int, key: str, value: Any) -> None:
        self.client.set_model_version_tag(name, str(version), key, str(value))


class Tracker(_AgentRegistry):
    """Runs, metrics, artifacts and (from :class:`_AgentRegistry`) registered agents in one
    MLflow experiment."""

    def __init__(self, uri: str | None = None, experiment: str = DEFAULT_EXPERIMENT, project_dir: Path | str = "."):
        self.uri = uri or configure(project_dir)
        _disable_telemetry()
        from mlflow import MlflowClient

        with _store_lock(self.uri):  # the first process creates the tables, the others wait
            self.client = MlflowClient(self.uri, registry_uri=self.uri)
            self.experiment_id = self._experiment(experiment)

    def _experiment(self, name: str) -> str:
        """The id of experiment ``name``, created (or restored from the bin) if needed."""
        from mlflow.exceptions import MlflowException

        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            try:
                return self.client.create_experiment(name, artifact_location=_artifact_root(self.uri))
            except MlflowException:  # created meanwhile by another process
                exp = self.client.get_experiment_by_name(name)
                if exp is None:
                    raise
        if exp.lifecycle_stage == "deleted":
            self.client.restore_experiment(exp.experiment_id)
        return exp.experiment_id

    # -- runs ---------------------------------------------------------------------------------

    def start_pipeline_run(
        self, run_name: str, params: dict, tags: dict | None = None, run_id: str | None = None
    ) -> str:
        """A top-level run with ``params`` (a nested config) logged; returns its id.

        With ``run_id`` of an existing run (resume after a crash) that run is reopened instead:
        its status goes back to RUNNING and ``params`` must agree with those it already has.
        """
        if run_id is not None and self._exists(run_id):
            self.client.update_run(run_id, status="RUNNING")
            self.set_tags(run_id, tags or {})
        else:
            run_id = self.client.create_run(self.experiment_id, run_name=run_name, tags=_str_dict(tags)).info.run_id
        self.log_params(run_id, params)
        return run_id

    def stage_run(self, parent_id: str, stage: str) -> str:
        """The nested run named ``stage`` under ``parent_id``: reopened if it exists, else new."""
        if (run_id := self.child_runs(parent_id).get(stage)) is not None:
            self.client.update_run(run_id, status="RUNNING")
            return run_id
        experiment_id = self.client.get_run(parent_id).info.experiment_id
        return self.client.create_run(experiment_id, run_name=stage, tags={PARENT_TAG: parent_id}).info.run_id

    def child_runs(self, parent_id: str) -> dict[str, str]:
        """``{stage name: run id}`` of the nested runs of ``parent_id`` (the oldest per name)."""
        experiment_id = self.client.get_run(parent_id).info.experiment_id
        runs = self.client.search_runs(
            [experiment_id],
            filter_string=f"tags.`{PARENT_TAG}` = '{parent_id}'",
            order_by=["attributes.start_time ASC"],
        )
        children: dict[str, str] = {}
        for run in runs:
            children.setdefault(run.info.run_name, run.info.run_id)
        return children

    def end_run(self, run_id: str, status: str = "FINISHED") -> None:
        """Close a run as FINISHED, FAILED or KILLED."""
        self.client.set_terminated(run_id, status=status)

    def run_info(self, run_id: str) -> dict[str, Any]:
        """A run's name, status, params, tags and latest metrics."""
        run = self.client.get_run(run_id)
        return {
            "name": run.info.run_name,
            "status": run.info.status,
            "params": dict(run.data.params),
            "metrics": dict(run.data.metrics),
            "tags": dict(run.data.tags),
        }

    def _exists(self, run_id: str) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_run(run_id)
        except MlflowException as e:
            if e.error_code == "RESOURCE_DOES_NOT_EXIST":
                return False
            raise
        return True

    def set_tags(self, run_id: str, tags: dict) -> None:
        """Set (or overwrite) the run's tags."""
        from mlflow.entities import RunTag

        if tags:
            self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in _str_dict(tags).items()])

    # -- params and metrics -------------------------------------------------------------------

    def log_params(self, run_id: str, params: dict) -> None:
        """Log a nested dict as dotted params (long values truncated to MLflow's limit).

        Params the run already has with the same value are skipped, so a resumed run can log its
        config again; a different value raises ValueError naming the keys (MLflow params are
        write-once: a changed config needs a new run).
        """
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        new = {_clean_name(k): v[:MAX_PARAM_VAL_LENGTH] for k, v in flatten(params).items()}
        old = self.client.get_run(run_id).data.params
        changed = sorted(k for k in new if k in old and old[k] != new[k])
        if changed:
            diffs = "; ".join(f"{k}: {old[k]!r} -> {new[k]!r}" for k in changed)
            raise ValueError(f"run {run_id} already has different values for params {changed} ({diffs})")
        todo = [Param(k, v) for k, v in new.items() if k not in old]
        for i in range(0, len(todo), MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(run_id, params=todo[i : i + MAX_PARAMS_TAGS_PER_BATCH])

    def log_metrics(self, run_id: str, metrics: dict, step: int | None = None) -> None:
        """Log the finite numbers of ``metrics`` (other values are skipped) at ``step``."""
        from mlflow.entities import Metric
        from mlflow.utils.validation import MAX_METRICS_PER_BATCH

        now = int(time.time() * 1000)
        batch = [
            Metric(_clean_name(k), float(v), now, step or 0)
            for k, v in metrics.items()
            if isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
        ]
        for i in range(0, len(batch), MAX_METRICS_PER_BATCH):
            self.client.log_batch(run_id, metrics=batch[i : i + MAX_METRICS_PER_BATCH])

    def metric_history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        """Every ``(step, value)`` logged for metric ``key``, in step order."""
        history = self.client.get_metric_history(run_id, _clean_name(key))
        return [(m.step, m.value) for m in sorted(history, key=lambda m: (m.step, m.timestamp))]

    # -- artifacts ----------------------------------------------------------------------------

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        self.client.log_text(run_id, text, artifact_file)

    def log_dict(self, run_id: str, obj: Any, artifact_file: str) -> None:
        """``obj`` as JSON, or YAML when ``artifact_file`` ends in .yaml/.yml."""
        self.client.log_dict(run_id, obj, artifact_file)

    def log_artifact(self, run_id: str, local_path: Path | str, artifact_path: str | None = None) -> None:
        """Log a file, or a folder (kept under its own name, inside ``artifact_path``)."""
        local_path = Path(local_path)
        if local_path.is_dir():
            dst = f"{artifact_path}/{local_path.name}" if artifact_path else local_path.name
            self.client.log_artifacts(run_id, str(local_path), dst)
        else:
            self.client.log_artifact(run_id, str(local_path), artifact_path)

    def log_curves(self, run_id: str, history: list[dict], keys: list[str], artifact_file: str = "curves.png") -> None:
        """One PNG with a subplot per key of ``history`` (:func:`agent_r1.plots.curves_figure`);
        nothing is logged when no key appears."""
        from agent_r1.plots import curves_figure

        if (fig := curves_figure(history, keys)) is not None:
            self.client.log_figure(run_id, fig, artifact_file)


def _disable_telemetry() -> None:
    """Opt out of MLflow's usage telemetry unless the user opted in; must run before mlflow is
    first imported. (MLflow also honours ``DO_NOT_TRACK=true``.)"""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


def _str_dict(d: dict | None) -> dict[str, str]:
    return {str(k): str(v) for k, v in (d or {}).items()}


def _model_card(name: str):
    """A local model card, so that MLflow does not look for one on the Hugging Face Hub."""
    from huggingface_hub import ModelCard

    return ModelCard(
        f"---\nlibrary_name: transformers\ntags: [agent-r1]\n---\n# {name}\n\nAn agent trained with agent-r1.\n"
    )


def _copy_settings(checkpoint_dir: Path, saved: Path) -> None:
    """The env settings the checkpoint was trained with (where it records them) into the folder of
    the saved model that holds its config.json, so they travel with the registered model."""
    from agent_r1.checkpoints import SETTINGS_FILE

    if (checkpoint_dir / SETTINGS_FILE).exists():
        weights = next(p.parent for p in sorted(saved.rglob("config.json")))
        shutil.copy(checkpoint_dir / SETTINGS_FILE, weights / SETTINGS_FILE)
