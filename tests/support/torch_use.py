"""Which test files use torch: the ones CI also runs on the engine's torch (scripts/test_engine_torch.sh).

A test file uses torch when importing it imports torch, or when it runs the trainer as a process (the
``integration`` marker says so: that process imports torch). "Importing it imports torch" is followed
through this repository's own packages (``trainer``, ``emulator``, ``benchmarks``, ``protocol``,
``tests``, ``scripts``): the test file's imports count wherever they stand (an ``import torch`` inside a
test runs under that test), an own module's only when they run at import time (module level, ``if``/
``try`` blocks included, ``if TYPE_CHECKING`` blocks not). A function-level import deep in the library
(``trainer.handover`` reaching ``trainer.run`` only when it hands a run over) would otherwise mark almost
every test, torch or not.

The walk reads source text (``ast``) and imports nothing, so it gives the same answer in every environment,
whether or not torch is installed there.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
OWN_PACKAGES = frozenset({"trainer", "emulator", "benchmarks", "protocol", "tests", "scripts"})
TORCH = "torch"


def _module_file(dotted: str, root: Path) -> Path | None:
    """The source file of an own module (``a.b`` → ``a/b.py`` or ``a/b/__init__.py``), or None."""
    base = root.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _package_of(path: Path, root: Path) -> list[str]:
    """The dotted package a source file lives in, as parts (``trainer/steps/fused.py`` → trainer, steps)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return parts[:-1]


def _runs_at_import(tree: ast.Module) -> list[ast.stmt]:
    """The statements of a module that run when it is imported (``if TYPE_CHECKING`` bodies excluded)."""
    pending: list[ast.stmt] = list(tree.body)
    out: list[ast.stmt] = []
    while pending:
        node = pending.pop()
        out.append(node)
        if isinstance(node, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(node.test):
                pending.extend(node.body)
            pending.extend(node.orelse)
        elif isinstance(node, ast.Try):
            pending.extend([*node.body, *node.orelse, *node.finalbody])
            for handler in node.handlers:
                pending.extend(handler.body)
        elif isinstance(node, ast.With):
            pending.extend(node.body)
    return out


def _imported_names(path: Path, root: Path, *, anywhere: bool) -> set[str]:
    """The dotted module names the file imports (each ``from a import b`` also names ``a.b``): every import
    statement when ``anywhere``, else those that run at import time."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    statements = list(ast.walk(tree)) if anywhere else _runs_at_import(tree)
    names: set[str] = set()
    for node in statements:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = _package_of(path, root)
                anchor = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


@cache
def _closure(path: Path, root: Path) -> frozenset[str]:
    """Top-level names of the outside modules that importing the file at ``path`` (resolved) imports."""
    outside: set[str] = set()
    seen: set[Path] = set()
    pending = [path]
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        for name in _imported_names(current, root, anywhere=current == path):
            top = name.split(".")[0]
            if top not in OWN_PACKAGES:
                outside.add(top)
                continue
            parts = name.split(".")
            # Importing a.b.c runs a/__init__.py and a/b/__init__.py first.
            for depth in range(1, len(parts) + 1):
                found = _module_file(".".join(parts[:depth]), root)
                if found is not None and found not in seen:
                    pending.append(found)
    return frozenset(outside)


def imports_torch(path: Path, root: Path = REPO_ROOT) -> bool:
    """Whether importing the test file at ``path`` imports torch (``root``: the repository it belongs to)."""
    return TORCH in _closure(path.resolve(), root.resolve())


def suite_test_files() -> list[Path]:
    """Every test module of the suite (``tests/**/test_*.py``), sorted."""
    return sorted((REPO_ROOT / "tests").rglob("test_*.py"))
