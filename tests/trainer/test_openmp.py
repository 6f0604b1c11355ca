"""The OpenMP wait set before torch loads (trainer.system.openmp): in every process that imports trainer, never
over a user's own choice."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from emulator.launch import REPO_ROOT
from trainer.system.openmp import (
    GOMP_SPIN_COUNT,
    OPENBLAS_THREADS,
    USER_BLAS_THREAD_VARIABLES,
    USER_OPENMP_WAIT_VARIABLES,
    set_openmp_wait_defaults,
)


def test_the_spin_is_set_where_the_user_chose_nothing() -> None:
    environ: dict[str, str] = {"PATH": "/bin"}
    assert set_openmp_wait_defaults(environ)
    assert environ["GOMP_SPINCOUNT"] == GOMP_SPIN_COUNT == "30000"
    assert environ["OPENBLAS_NUM_THREADS"] == OPENBLAS_THREADS == "1"


@pytest.mark.parametrize("name", USER_OPENMP_WAIT_VARIABLES)
def test_a_users_openmp_wait_is_left_alone(name: str) -> None:
    value = "PASSIVE" if name == "OMP_WAIT_POLICY" else "7"
    environ = {name: value, "OPENBLAS_NUM_THREADS": "4"}
    assert not set_openmp_wait_defaults(environ)
    assert environ == {name: value, "OPENBLAS_NUM_THREADS": "4"}


@pytest.mark.parametrize("name", USER_BLAS_THREAD_VARIABLES)
def test_a_users_blas_thread_count_is_left_alone(name: str) -> None:
    environ = {name: "3", "GOMP_SPINCOUNT": "5"}
    assert not set_openmp_wait_defaults(environ)
    assert environ == {name: "3", "GOMP_SPINCOUNT": "5"}


def _spin_seen_by_a_new_process(extra: dict[str, str]) -> str:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in USER_OPENMP_WAIT_VARIABLES and k not in USER_BLAS_THREAD_VARIABLES
    }
    env.update(extra, PYTHONPATH=str(REPO_ROOT))
    # What a process started by the trainer (torchrun ranks, the drop-in's children) inherits, and what the
    # OpenMP runtime reads when `import torch` loads it after `import trainer`.
    code = "import os, trainer, torch; print(os.environ.get('GOMP_SPINCOUNT', '-'))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_importing_trainer_sets_the_spin_before_torch_loads_in_a_new_process() -> None:
    assert _spin_seen_by_a_new_process({}) == GOMP_SPIN_COUNT
    assert _spin_seen_by_a_new_process({"GOMP_SPINCOUNT": "123"}) == "123"
