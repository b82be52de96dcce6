"""Code shape: no function in src/dlscale is longer than MAX_BODY_LINES (STYLE.md: read it in one sitting).

A function's length is its body's: from its first statement after the docstring to its last
line, so nested functions count towards the function that holds them (and are checked on
their own as well).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "dlscale"
MAX_BODY_LINES = 60


def body_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the first statement after the docstring to the function's last line."""
    body = fn.body
    if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return fn.end_lineno - body[0].lineno + 1


def long_functions(path: Path, limit: int = MAX_BODY_LINES) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return [f"{shown}:{node.lineno}: {node.name} is {body_lines(node)} lines (limit {limit})"
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and body_lines(node) > limit]


def test_body_lines_counts_from_after_the_docstring():
    fn = ast.parse('def f():\n    """Doc\n    string."""\n    a = 1\n\n    return a\n').body[0]
    assert body_lines(fn) == 3  # "a = 1", the blank line, "return a"
    only_doc = ast.parse('def g():\n    """Only a docstring."""\n').body[0]
    assert body_lines(only_doc) == 1


def test_long_functions_names_file_line_and_length(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("def short():\n    pass\n\n\ndef long():\n" + "    x = 1\n" * 5)
    assert long_functions(p, limit=4) == [f"{p}:5: long is 5 lines (limit 4)"]


@pytest.mark.parametrize("path", sorted(SRC.rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_no_function_over_the_limit(path):
    found = long_functions(path)
    assert not found, "split these functions:\n" + "\n".join(found)
