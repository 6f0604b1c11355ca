"""The repository carries its own reference documents (issue 24 item 9).

Nothing tracked may point at the folder of shared notes that only the project's authors have: the engine
contract is docs/protocol.md and the benchmark tasks are docs/benchmarks.md. Every "spec §N" citation in
the code must land on a section of docs/protocol.md, and every relative link of the README and docs/ must
reach a file of the repository.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROTOCOL = REPO / "docs" / "protocol.md"

# Written in two parts so that this file is not itself a hit of the check it makes.
_SHARED = "shared" + "/"
_SPEC_NAME = "ue-" + "protocol.md"
FORBIDDEN = re.compile(
    "|".join(re.escape(s) for s in ("../" + _SHARED, _SHARED + "spec", _SHARED + "benchmarks", _SPEC_NAME))
)
LINKED_DOCS = (
    "README.md",
    "benchmarks/README.md",
    *(f"docs/{p.name}" for p in sorted((REPO / "docs").glob("*.md"))),
)


def tracked_text_files() -> list[Path]:
    """Every tracked file that decodes as UTF-8 (git's list; the working tree where there is no .git)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60
        ).stdout.decode("utf-8")
        paths = [REPO / name for name in listed.split("\0") if name]
    except (OSError, subprocess.SubprocessError):
        skip = {".git", ".venv", ".venv-engine", "__pycache__", "node_modules"}
        paths = [p for p in REPO.rglob("*") if p.is_file() and not skip.intersection(p.parts)]
    texts: list[Path] = []
    for path in paths:
        if not path.is_file():
            continue  # deleted in the working tree, not yet committed
        try:
            path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(path)
    return texts


def test_no_tracked_file_refers_to_the_shared_notes() -> None:
    hits = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in tracked_text_files()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if FORBIDDEN.search(line)
    ]
    assert not hits, (
        "references to documents outside the repository (use docs/protocol.md, docs/benchmarks.md):\n"
        + ("\n".join(hits))
    )


def test_the_forbidden_pattern_catches_what_it_must() -> None:
    # The check above can only fail if its pattern matches the spellings that were in the tree.
    for line in (
        "engine is `../" + _SHARED + "spec/" + _SPEC_NAME + "`",
        "(spec: " + _SHARED + "spec/" + _SPEC_NAME + ")",
        "the protocol specification `" + _SPEC_NAME + "` (kept with the project's",
        "open loop (``" + _SHARED + "benchmarks.md`` B1)",
    ):
        assert FORBIDDEN.search(line), line
    assert not FORBIDDEN.search("see docs/protocol.md §2.4 and docs/benchmarks.md B1")


def _sections(text: str) -> tuple[set[str], dict[str, set[int]]]:
    """Numbered headings of docs/protocol.md ("2", "2.4", ...) and the numbered items under §10, §11 and
    Unknowns."""
    headings: set[str] = set()
    items: dict[str, set[int]] = {}
    current = ""
    for line in text.splitlines():
        heading = re.match(r"^#{2,3} (\d+)(?:\.(\d+))?\.? ", line)
        if heading is not None:
            current = heading[1] if heading[2] is None else f"{heading[1]}.{heading[2]}"
            headings.add(current)
            continue
        if line.startswith("## Unknowns"):
            current = "Unknowns"
            continue
        item = re.match(r"^(\d+)\. ", line)
        if item is not None and current in ("10", "11", "Unknowns"):
            items.setdefault(current, set()).add(int(item[1]))
    return headings, items


def _numbers(text: str) -> list[int]:
    """``6``, ``6-9``, ``6, 7`` -> the item numbers."""
    out: list[int] = []
    for part in re.split(r",\s*|\s+and\s+", text):
        bounds = [int(n) for n in re.findall(r"\d+", part)]
        if len(bounds) == 2:
            out.extend(range(bounds[0], bounds[1] + 1))
        else:
            out.extend(bounds)
    return out


def test_every_spec_citation_lands_on_a_section_of_the_protocol_page() -> None:
    headings, items = _sections(PROTOCOL.read_text(encoding="utf-8"))
    assert {"1.2", "2.3", "2.4", "3", "6.1", "6.2", "6.4"} <= headings
    assert items["10"] == set(range(1, 12)) and items["11"] == set(range(1, 10))
    assert items["Unknowns"] == set(range(1, 12))
    missing: list[str] = []
    for path in tracked_text_files():
        if path.suffix not in (".py", ".md", ".sh", ".ps1", ".toml", ".txt") and path.name != "Dockerfile":
            continue
        text = path.read_text(encoding="utf-8")
        where = path.relative_to(REPO)
        for whole, major, minor in re.findall(r"(§(\d+)(?:\.(\d+))?)", text):
            if major in ("10", "11") and minor:
                if int(minor) not in items[major]:
                    missing.append(f"{where}: {whole} (no item {minor} in §{major})")
            elif (f"{major}.{minor}" if minor else major) not in headings:
                missing.append(f"{where}: {whole}")
        for major, numbers in re.findall(r"§(10|11) items? ([\d, -]+(?:and \d+)?)", text):
            missing += [f"{where}: §{major} item {n}" for n in _numbers(numbers) if n not in items[major]]
        for numbers in re.findall(r"Unknowns? (\d+(?:-\d+)?)", text):
            missing += [f"{where}: Unknowns {n}" for n in _numbers(numbers) if n not in items["Unknowns"]]
    assert not missing, "citations of docs/protocol.md that match no section:\n" + "\n".join(
        sorted(set(missing))
    )


@pytest.mark.parametrize("document", LINKED_DOCS)
def test_relative_links_of_the_docs_exist_inside_the_repository(document: str) -> None:
    path = REPO / document
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text(encoding="utf-8")):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        resolved = (path.parent / target).resolve()
        assert resolved.is_relative_to(REPO), f"{document}: link outside the repository: {target}"
        assert resolved.exists(), f"{document}: broken link: {target}"


def test_the_readme_and_the_design_page_link_both_reference_pages() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    design = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    for page in ("protocol.md", "benchmarks.md"):
        assert f"](docs/{page})" in readme, page
        assert f"]({page})" in design, page
