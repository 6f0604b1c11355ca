"""The layout's rules, checked on the source tree (docs/design.md, "Parts and directions").

Four parts with one-way dependencies: ``protocol`` (pure codecs) ← ``trainer`` (the process the engine
runs) ← ``emulator`` (the game side: engine emulator, tasks, demo, speed bench) ← ``benchmarks`` (not
installed). Every ``import`` statement counts, including the ones inside functions: a lazy import is
still a dependency. The CLI may name optional subcommands of the game side as strings (loaded with
:mod:`importlib` only when asked for); no test here can see those, and none needs to.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("protocol", "trainer", "emulator", "benchmarks")
"""Lowest first: a part may import the parts before it, never the ones after it."""
OURS = (*PARTS, "tests", "scripts")

MAX_MODULE_LINES = 800
TABLE_MODULES = {"protocol/nne/layers.py"}
"""Pure tables exempt from the size rule: the 31 NNE layer types, one frozen dataclass each."""

IMPURE_FOR_PROTOCOL = {"socket", "mmap", "posix_ipc", "torch", "threading", "time", "subprocess", "os"}
"""What ``protocol`` never touches (docs/design.md: bytes in, values out; no IO, clocks or torch)."""


@dataclass(frozen=True, slots=True)
class Edge:
    source: str
    target: str
    line: int
    top_level: bool
    """Executed at import time (module level, not under ``if TYPE_CHECKING``)."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources(*tops: str) -> Iterator[Path]:
    for top in tops:
        yield from sorted((ROOT / top).rglob("*.py"))


MODULES = {_module_name(p): p for p in _sources(*OURS)}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if path.name != "__init__.py":
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _blocks(node: ast.stmt) -> Iterator[list[ast.stmt]]:
    for field in ("body", "orelse", "finalbody"):
        block = getattr(node, field, None)
        if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
            yield block
    for handler in getattr(node, "handlers", []):
        yield handler.body
    for case in getattr(node, "cases", []):
        yield case.body


def _edges(module: str, path: Path) -> Iterator[Edge]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))

    def visit(body: list[ast.stmt], top: bool) -> Iterator[Edge]:
        for node in body:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield Edge(module, alias.name, node.lineno, top)
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(module, path, node)
                submodules = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES]
                # ``from pkg import sub`` depends on the submodule; ``from pkg import name`` on pkg.
                for name in submodules or [target]:
                    yield Edge(module, name, node.lineno, top)
            elif isinstance(node, ast.If) and _is_type_checking(node):
                yield from visit(node.body, False)
                yield from visit(node.orelse, top)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                # A function body runs when called: its imports are lazy (still dependencies).
                yield from visit(node.body, False)
            else:
                # if/try/with/for/while and class bodies run with the statement that holds them.
                for block in _blocks(node):
                    yield from visit(block, top)

    yield from visit(tree.body, True)


EDGES = [edge for name, path in MODULES.items() for edge in _edges(name, path)]


def _part(module: str) -> str:
    return module.split(".", 1)[0]


def _violations(source_part: str, forbidden: set[str]) -> list[str]:
    return [
        f"{MODULES[e.source].relative_to(ROOT)}:{e.line} imports {e.target}"
        for e in EDGES
        if _part(e.source) == source_part and _part(e.target) in forbidden
    ]


@pytest.mark.parametrize("part", PARTS)
def test_parts_import_only_parts_below_them(part: str) -> None:
    above = set(PARTS[PARTS.index(part) + 1 :]) | {"tests", "scripts"}
    assert _violations(part, above) == []


def test_protocol_is_pure() -> None:
    found = [
        f"{MODULES[e.source].relative_to(ROOT)}:{e.line} imports {e.target}"
        for e in EDGES
        if _part(e.source) == "protocol" and _part(e.target) in IMPURE_FOR_PROTOCOL
    ]
    assert found == []


def test_no_import_circles_between_modules() -> None:
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for edge in EDGES:
        if edge.top_level and edge.target in MODULES and edge.target != edge.source:
            graph[edge.source].add(edge.target)
    # Tarjan's strongly connected components: any component with more than one module is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            connect(name)
    assert circles == []


def test_tests_share_helpers_only_through_the_support_package() -> None:
    found = [
        f"{MODULES[e.source].relative_to(ROOT)}:{e.line} imports {e.target}"
        for e in EDGES
        if _part(e.source) == "tests"
        and _part(e.target) == "tests"
        and not e.target.startswith("tests.support")
        and not e.source.startswith("tests.support")
    ]
    assert found == []


def test_no_source_module_is_over_the_size_limit() -> None:
    too_long = {}
    for path in _sources(*PARTS, "scripts"):
        relative = path.relative_to(ROOT).as_posix()
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_MODULE_LINES and relative not in TABLE_MODULES:
            too_long[relative] = lines
    assert too_long == {}


def test_the_checks_see_imports() -> None:
    """The rules above are only as good as the import scan: it must find lazy and relative imports."""
    sample = MODULES["trainer.commands.cli"]
    found = {e.target for e in _edges("trainer.commands.cli", sample)}
    assert "click" in found
    assert any(t.startswith("trainer.") for t in found)
    assert any(not e.top_level for e in _edges("trainer.commands.cli", sample))
