"""docs/faults.md stays true (issue 30 item 7): its tables of injected faults name tests that exist, and
every test of the fault suite (``tests/faults/``) has a row there.

The tests are collected by reading the source (``def test_*`` at module level, as pytest collects them
here), so the check runs in a fraction of a second and needs none of the suite's fixtures.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "docs" / "faults.md"
FAULTS = ROOT / "tests" / "faults"
_NAMED = re.compile(r"`([\w/]+\.py)::(\w+)`")


def collected_tests(path: Path) -> set[str]:
    """The test functions pytest collects from one module (module-level ``test_*`` functions)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_")
    }


def fault_tests() -> set[str]:
    """Every test of the fault suite, as ``faults/<file>::<test>``."""
    return {
        f"faults/{path.name}::{name}"
        for path in sorted(FAULTS.glob("test_*.py"))
        for name in collected_tests(path)
    }


def table_rows(text: str) -> list[tuple[int, list[str], list[str]]]:
    """``(line, cells, named tests)`` of every body row of the document's tables."""
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith("|") or set(line.replace("|", "").strip()) <= {"-", " "}:
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if cells[0] == "fault injected":
            continue  # a header
        rows.append((number, cells, [f"{file}::{name}" for file, name in _NAMED.findall(line)]))
    return rows


def test_every_row_says_what_is_injected_and_left_and_names_a_test() -> None:
    rows = table_rows(TABLE.read_text(encoding="utf-8"))
    assert len(rows) > 20
    for number, cells, named in rows:
        assert len(cells) == 3, (
            f"docs/faults.md:{number}: three cells (fault, what it leaves, tests): {cells}"
        )
        assert cells[0] and cells[1], f"docs/faults.md:{number}: a fault and what it must leave"
        assert named, f"docs/faults.md:{number}: the row names no test (`faults/test_x.py::test_y`)"


def test_every_named_test_exists() -> None:
    missing = []
    for number, _, named in table_rows(TABLE.read_text(encoding="utf-8")):
        for entry in named:
            file, name = entry.split("::")
            path = ROOT / "tests" / file
            if not path.is_file() or name not in collected_tests(path):
                missing.append(f"docs/faults.md:{number}: {entry}")
    assert missing == [], "rows name tests that do not exist:\n" + "\n".join(missing)


def test_every_fault_test_has_a_row() -> None:
    named = {entry for _, _, entries in table_rows(TABLE.read_text(encoding="utf-8")) for entry in entries}
    tests = fault_tests()
    assert len(tests) > 50
    unlisted = sorted(tests - named)
    assert unlisted == [], (
        "fault tests without a row in docs/faults.md (add one: the fault, what it must leave, the test):\n"
        + "\n".join(unlisted)
    )


def test_the_check_fails_on_a_table_that_lost_a_row_or_names_a_ghost(tmp_path: Path) -> None:
    """What makes the two checks above able to fail: a row removed, a test renamed."""
    text = TABLE.read_text(encoding="utf-8")
    first_row = next(line for line in text.splitlines() if _NAMED.search(line))
    shorter = text.replace(first_row + "\n", "")
    named = {entry for _, _, entries in table_rows(shorter) for entry in entries}
    assert fault_tests() - named, "removing a row left every fault test listed"
    ghost = text.replace("::test_spawned_socket`", "::test_spawned_sockets`")
    ghosts = [
        entry
        for _, _, entries in table_rows(ghost)
        for entry in entries
        if entry.split("::")[1] not in collected_tests(ROOT / "tests" / entry.split("::")[0])
    ]
    assert ghosts == ["faults/test_game_killed.py::test_spawned_sockets"]


def test_the_table_is_linked_from_the_readme_and_the_design() -> None:
    for document in ("README.md", "docs/design.md"):
        assert "faults.md" in (ROOT / document).read_text(encoding="utf-8"), document
