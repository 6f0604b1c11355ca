"""The wheel is complete: built from the checkout, installed into an empty folder and run with no checkout on
the path, ``la-trainer demo --quick`` trains through the packaged drop-in and ``python -m trainer`` works.

The demo spawns the trainer the way the engine does, by the file path of the drop-in ``train.py``; from a
wheel that file must come from the installed package (``trainer/dropin/train.py``), not from the
repository's ``scripts/``. The dependencies (torch, numpy, ...) are the test environment's own; only la-trainer
itself comes from the wheel.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def test_the_quick_demo_runs_from_an_installed_wheel(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(dist), str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = dist.glob("la_trainer-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"trainer/__main__.py", "trainer/dropin/train.py", "emulator/demo/run.py"} <= names
    assert any(name.endswith("licenses/LICENSE") for name in names)
    assert not any(name.startswith(("scripts/", "tests/", "benchmarks/")) for name in names)

    site = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    run_dir = tmp_path / "elsewhere"
    run_dir.mkdir()
    # The installed copy first on the path; the checkout nowhere (an editable install of it in this
    # environment resolves later, and the check below proves which copy is imported).
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run(
        [
            sys.executable,
            "-c",
            "import trainer, emulator.launch as l; print(trainer.__file__); print(l.TRAIN_SCRIPT)",
        ],
        cwd=run_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert where.returncode == 0, where.stderr
    trainer_file, script = where.stdout.split()
    assert (
        Path(trainer_file).is_relative_to(site) and Path(script) == site / "trainer" / "dropin" / "train.py"
    )

    demo = subprocess.run(
        [sys.executable, "-m", "trainer", "demo", "--quick", "--out", str(run_dir / "demo")],
        cwd=run_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert demo.returncode == 0, demo.stdout[-4000:] + demo.stderr[-4000:]
    assert (run_dir / "demo" / "report.md").is_file()
    assert str(REPO) not in demo.stdout + demo.stderr  # nothing ran from the checkout
