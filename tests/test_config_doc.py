"""The configuration reference: every config key has a description, and docs/config.md is what
the generator writes from the config classes (regenerate it with `make docs`)."""

from pathlib import Path

from pydantic import BaseModel
from typer.testing import CliRunner

from agent_r1.cli import app
from agent_r1.config import RunConfig
from agent_r1.config_doc import field_docs, markdown, rows

ROOT = Path(__file__).resolve().parents[1]


def _keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        out.append(prefix + name)
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            out += _keys(field.annotation, f"{prefix}{name}.")
    return out


def test_every_config_key_is_documented():
    documented = {r["key"]: r["description"] for r in rows()}
    assert list(documented) == _keys(RunConfig)  # every key, sections included, in order
    missing = [k for k, d in documented.items() if not d]
    assert not missing, f"config fields without a docstring (a string on the line after the field): {missing}"


def test_docs_config_md_is_current():
    assert (ROOT / "docs" / "config.md").read_text() == markdown(), "docs/config.md is stale: run `make docs`"


def test_show_config_doc_prints_the_reference():
    result = CliRunner().invoke(app, ["show-config", "--doc"])
    assert result.exit_code == 0, result.output
    assert result.output == markdown()
    row = next(line for line in result.output.splitlines() if line.startswith("| `rl.group_size`"))
    assert row == "| `rl.group_size` | `int (≥ 1)` | `8` | Episodes sampled per question (the group of GRPO and RLOO). |"


def test_field_docs_reads_attribute_docstrings_only():
    class Base(BaseModel):
        a: int = 1
        """first"""

    class Child(Base):
        # a comment is not a description
        b: int = 2
        c: str = "x"
        """third,
        on two lines"""

    assert field_docs(Child) == {"a": "first", "c": "third, on two lines"}
