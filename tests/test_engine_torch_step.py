"""CI's second step runs the torch tests on the engine's torch (scripts/test_engine_torch.sh, issue 24 item 10).

The step selects by marker over the whole suite. These tests fail when a test file that imports torch
(directly or through this repository's modules, or by running the trainer) would not be run by that step,
and when the selection goes back to substrings of test names (which once dropped the NormalizeLatents,
late-time and observation-noise tests because their names contain "late").
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.torch_use import KEPT_OFF_ENGINE_TORCH, REPO_ROOT, imports_torch, suite_test_files

SCRIPT = REPO_ROOT / "scripts" / "test_engine_torch.sh"
DIRECT_TORCH_IMPORT = re.compile(r"^\s*(import torch\b|from torch\b)", re.M)


def step_marker_expression() -> str:
    """The ``-m`` expression the step gives pytest (the script's ENGINE_TORCH_TESTS)."""
    script = SCRIPT.read_text(encoding="utf-8")
    found = re.search(r'^ENGINE_TORCH_TESTS="([^"]+)"$', script, re.M)
    assert found is not None, "scripts/test_engine_torch.sh no longer names its marker expression"
    return found[1]


def test_the_step_selects_the_whole_suite_by_marker_not_by_name() -> None:
    script = SCRIPT.read_text(encoding="utf-8")
    runs = [line for line in script.splitlines() if "-m pytest" in line]
    assert len(runs) == 1, runs
    assert '-m "$ENGINE_TORCH_TESTS" tests "$@"' in runs[0]
    assert " -k " not in script
    assert step_marker_expression() == "torch and not not_on_engine_torch"


def test_the_analysis_sees_every_direct_import_and_follows_own_modules() -> None:
    direct = [f for f in suite_test_files() if DIRECT_TORCH_IMPORT.search(f.read_text(encoding="utf-8"))]
    assert direct, "no test file imports torch directly: the pattern is wrong"
    assert all(imports_torch(f) for f in direct), [str(f) for f in direct if not imports_torch(f)]
    # Through trainer.training.normalization's own imports only, and never for the pure protocol tests.
    normalization_tests = REPO_ROOT / "tests" / "trainer" / "test_normalization.py"
    assert not DIRECT_TORCH_IMPORT.search(normalization_tests.read_text(encoding="utf-8"))
    assert imports_torch(normalization_tests)
    assert not any(imports_torch(f) for f in (REPO_ROOT / "tests" / "protocol").glob("test_*.py"))


def test_what_counts_as_importing_torch(tmp_path: Path) -> None:
    files = {
        "trainer/__init__.py": "",
        "trainer/heavy.py": "import torch\n",
        "trainer/lazy.py": "def load() -> None:\n    import torch\n",
        "trainer/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n",
        "trainer/guarded.py": "try:\n    import torch\nexcept ImportError:\n    torch = None\n",
        "trainer/sub/__init__.py": "from .. import heavy\n",
        "trainer/sub/leaf.py": "",
        "tests/test_through_a_module.py": "from trainer.heavy import load\n",
        "tests/test_through_a_package.py": "import trainer.sub.leaf\n",
        "tests/test_inside_a_test.py": "def test_it() -> None:\n    import trainer.heavy\n",
        "tests/test_guarded.py": "from trainer import guarded\n",
        "tests/test_lazy_in_the_library.py": "from trainer import lazy\n",
        "tests/test_for_the_type_checker.py": "from trainer import typed\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    found = {p.name for p in (tmp_path / "tests").glob("test_*.py") if imports_torch(p, tmp_path)}
    assert found == {
        "test_through_a_module.py",
        "test_through_a_package.py",
        "test_inside_a_test.py",
        "test_guarded.py",
    }


def collect(*options: str) -> list[str]:
    """Node ids of the suite that pytest collects with ``options``."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *options, "tests"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return [line for line in done.stdout.splitlines() if line.startswith("tests/") and "::" in line]


@pytest.mark.slow
def test_every_test_kept_out_of_the_step_is_named_and_every_name_matches() -> None:
    kept_out = collect("-o", "addopts=--strict-markers", "-m", "torch and not_on_engine_torch")
    for prefix in KEPT_OFF_ENGINE_TORCH:
        assert any(node.startswith(prefix) for node in kept_out), (
            f"no torch test matches {prefix!r}: stale entry"
        )
    # The table is an exception list, not the step: most of the torch tests stay in.
    everything = collect("-o", "addopts=--strict-markers", "-m", "torch")
    assert len(kept_out) < len(everything) / 5, (len(kept_out), len(everything))


@pytest.mark.slow
def test_every_test_file_that_uses_torch_is_run_by_the_engine_step() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            step_marker_expression(),
            "tests",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    # With the suite's own -q, --collect-only -q prints "path: count" per file; with -v, node ids.
    selected = {
        re.split(r"::|: \d+$", line)[0]
        for line in done.stdout.splitlines()
        if re.match(r"tests/\S+\.py(::|: \d+$)", line)
    }
    using_torch = {str(f.relative_to(REPO_ROOT)) for f in suite_test_files() if imports_torch(f)}
    missing = sorted(using_torch - selected)
    assert not missing, f"test files that import torch but are not run on the engine's torch: {missing}"
    # The integration sessions run the trainer process, which imports torch: they are in the step too.
    assert "tests/integration/test_modes.py" in selected
