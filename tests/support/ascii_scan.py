"""Finds string literals outside ASCII in a source tree (docstrings skipped): the trainer's messages reach
consoles that are not UTF-8, so what it prints stays ASCII (shared by the trainer's and the bench's tests)."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path


def _docstring_nodes(tree: ast.Module) -> set[int]:
    """ids of docstrings (module, class, function) and attribute docstrings (a string after an
    assignment): documentation, never printed."""
    found: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        if (
            isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
        ):
            found.add(id(body[0].value))
        for before, after in itertools.pairwise(body):
            if (
                isinstance(before, ast.Assign | ast.AnnAssign)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
            ):
                found.add(id(after.value))
    return found


def non_ascii_literals(root: Path) -> list[str]:
    """``path:line: literal`` for every string literal (f-string parts included) under ``root`` that
    holds a non-ASCII character and is not a docstring."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = _docstring_nodes(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docs
                and not node.value.isascii()
            ):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {node.value[:80]!r}")
    return found
