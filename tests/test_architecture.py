"""The layout's rules, checked on the source tree (docs/design.md, "Parts and directions").

Four parts with one-way dependencies: ``protocol`` (pure codecs) ← ``trainer`` (the process the engine
runs) ← ``emulator`` (the game side: engine emulator, tasks, demo, speed bench) ← ``benchmarks`` (not
installed). Inside ``trainer`` the same rule holds between its groups, lowest first: ``system`` <
``settings`` < ``training`` < ``records`` < ``session`` < ``distributed`` < ``dropin`` < ``commands``
(:data:`GROUPS`). Every ``import`` statement counts, including the ones inside functions and under ``if
TYPE_CHECKING``: a lazy import is still a dependency, and a circle through one is still a circle. The CLI
may name optional subcommands of the game side as strings (loaded with :mod:`importlib` only when asked
for); no test here can see those, and none needs to.
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

GROUPS = ("system", "settings", "training", "records", "session", "distributed", "dropin", "commands")
"""``trainer``'s groups, lowest first: a module imports only its own group and the groups before it.

``system``: the operating system (console, atomic writes, liveness, Win32, lock file, OpenMP, torch API);
``settings``: options, ``LA_TRAINER_*`` names, timeouts; ``training``: the maths and the model, no sockets,
records or command line; ``records``: status, run record, trackers; ``session``: one run with the engine
(the story, links, transports, the process around it); ``distributed``: one rank of a scale-out run;
``dropin``: the engine's ``train.py`` and the hand-over to the engine's own trainers; ``commands``: the
``la-trainer`` command line."""
BASE_MODULES = ("trainer.errors", "trainer.exitcodes")
"""Below every group: the error classes and the exit codes, which import nothing else of ours."""
ROOT_IMPORTS = ("trainer.system.openmp",)
"""What the package root (``trainer/__init__.py``, imported by every process before any of our modules)
may import: the OpenMP wait, set before any module imports torch."""
MAX_TOP_LEVEL_MODULES = 8
"""Modules directly in ``trainer/`` (``__init__``, ``__main__``, ``errors``, ``exitcodes``): everything else
lives in a group, so that a concern is found by its folder's name."""

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


def _circles(edges: list[Edge]) -> list[list[str]]:
    """Every strongly connected component of more than one module in ``edges``."""
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for edge in edges:
        if edge.target in MODULES and edge.target != edge.source:
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
    return circles


def test_no_import_circles_between_modules() -> None:
    """No two modules import each other, directly or round a loop, not even through an import inside a
    function or under ``if TYPE_CHECKING`` (every part, tests included)."""
    assert _circles(EDGES) == []


def _trainer_floor(module: str) -> tuple[int, str] | None:
    """(floor, name) of a ``trainer`` module: -1 for :data:`BASE_MODULES`, a group's index in
    :data:`GROUPS`, ``len(GROUPS)`` for an entry point (a ``__main__`` module: run, never imported);
    None outside every group (the next test names those)."""
    parts = module.split(".")
    if module in BASE_MODULES:
        return -1, "base"
    if parts[-1] == "__main__":
        return len(GROUPS), "entry point"
    if len(parts) > 1 and parts[1] in GROUPS:
        return GROUPS.index(parts[1]), parts[1]
    return None


def _upward_imports(edges: list[Edge]) -> list[str]:
    found = []
    for e in edges:
        if _part(e.source) != "trainer" or _part(e.target) != "trainer" or e.target not in MODULES:
            continue
        if e.source == "trainer":
            if e.target not in ROOT_IMPORTS:
                found.append(
                    f"trainer/__init__.py:{e.line} imports {e.target} (the root may import {ROOT_IMPORTS})"
                )
            continue
        if e.target == "trainer":
            continue  # the version: the root is below every group
        source, target = _trainer_floor(e.source), _trainer_floor(e.target)
        if source is None or target is None:
            continue
        (source_floor, source_group), (target_floor, target_group) = source, target
        if target_floor > source_floor:
            found.append(
                f"{MODULES[e.source].relative_to(ROOT)}:{e.line} ({source_group}) imports {e.target} ({target_group})"
            )
    return found


def test_trainer_groups_import_only_groups_below_them() -> None:
    assert _upward_imports(EDGES) == []


def test_every_trainer_module_is_in_a_group_or_one_of_few_at_the_top() -> None:
    top = sorted(p.name for p in (ROOT / "trainer").glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top
    strays = [
        name
        for name in MODULES
        if _part(name) == "trainer"
        and name.count(".") >= 1
        and name not in BASE_MODULES
        and name.split(".")[1] not in (*GROUPS, "__main__")
    ]
    assert strays == []
    folders = sorted(p.name for p in (ROOT / "trainer").iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == sorted(GROUPS)


def test_the_group_rule_would_see_an_upward_or_circular_import() -> None:
    """The guard on a layout it must refuse: the training story importing the command line (upward),
    and 74b51c8's held-out module and job importing each other (a circle through TYPE_CHECKING)."""
    upward = Edge("trainer.session.run", "trainer.commands.doctor", 1, False)
    assert len(_upward_imports([upward])) == 1
    lazy = Edge("trainer.training.job", "trainer.training.heldout", 1, True)
    typed = Edge("trainer.training.heldout", "trainer.training.job", 2, False)
    assert _circles([lazy, typed]) == [["trainer.training.heldout", "trainer.training.job"]]


def test_every_message_goes_through_the_console() -> None:
    """One line writer (:mod:`trainer.system.console`) survives the engine's closed pipe; a bare
    ``print`` would end a run with a traceback instead of its exit code."""
    found = []
    for path in _sources("trainer"):
        if path.name == "console.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


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
