"""The city_facts tools: ``lookup(city)`` over the task's city table, ``calc(expression)``.

``lookup_tool`` is a tool *factory*: the config names it and the pipeline calls it with the
prepared data folder (``data_dir``), so the tool reads that run's ``corpus.parquet``. ``calc``
is a ready `Tool` (made by ``@tool``). Both are fast and keep no state, so they run in a thread
(``thread_safe=True``) rather than a worker process.
"""

from __future__ import annotations

import ast
import operator
from pathlib import Path

from agent_r1.data import load_corpus
from agent_r1.tools import Tool, ToolOutput, tool


def lookup_tool(data_dir: Path) -> Tool:
    """The ``lookup`` tool over ``<data_dir>/corpus.parquet`` (one document per city: the
    title is the city, the text its facts)."""
    facts = {row.title.lower(): (row.title, row.text) for row in load_corpus(data_dir).itertuples()}

    def lookup(city: str) -> ToolOutput:
        """Look up the facts about a city: its country, population and founding year.

        Args:
            city: The city's name, e.g. Lorvik.
        """
        hit = facts.get(city.strip().lower())
        if hit is None:
            return ToolOutput(f"No city named {city!r}.", {"city": None})
        title, text = hit
        return ToolOutput(f"{title}: {text}", {"city": title})

    return tool(lookup, timeout_s=2.0, thread_safe=True)


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
        ast.USub: operator.neg, ast.UAdd: operator.pos}
_MAX_EXPONENT, _MAX_CHARS = 64, 200


def _eval(node: ast.AST) -> int | float:
    """Arithmetic on number literals only: anything else (names, calls, attributes) is refused,
    so no code the model writes ever runs."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise ValueError(f"exponent {right} is too large (at most {_MAX_EXPONENT})")
        return _OPS[type(node.op)](left, right)
    raise ValueError(f"only numbers and + - * / // % ** ( ) are allowed, not {type(node).__name__}")


@tool(timeout_s=2.0, thread_safe=True)
def calc(expression: str) -> str:
    """Evaluate an arithmetic expression, e.g. 5200 - 3100.

    Args:
        expression: Numbers with + - * / // % ** and parentheses.
    """
    if len(expression) > _MAX_CHARS:
        raise ValueError(f"the expression is longer than {_MAX_CHARS} characters")
    value = _eval(ast.parse(expression, mode="eval").body)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)
