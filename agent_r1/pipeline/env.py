"""Offline and contained by default: the orchestration tools' settings for this project.

Called by every front door (CLI, flows) before Prefect, MLflow or DVC is imported. Each value
is a default: a variable the user already set wins.
"""

from __future__ import annotations

import os
from pathlib import Path

OFFLINE = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",  # Prefect server's usage reports
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "1",  # the cross-tool convention (MLflow, others)
    "DVC_NO_ANALYTICS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def contain(project_dir: str | Path = ".") -> dict[str, str]:
    """Set the offline switches and keep Prefect's state in ``<project>/.prefect``."""
    project = Path(project_dir).resolve()
    values = OFFLINE | {"PREFECT_HOME": str(project / ".prefect")}
    for key, value in values.items():
        os.environ.setdefault(key, value)
    return {k: os.environ[k] for k in values}
