#!/usr/bin/env bash
# The tests that depend on torch and numpy, on the versions the engine installs (constraints-engine.txt:
# torch 2.5.1, numpy 1.26.4; spec §11 item 1), in a second virtual environment. CI runs it after
# scripts/test.sh (.ci/run); arguments go to pytest (after the marker selection).
#
# The environment is kept between runs (LA_TRAINER_ENGINE_VENV, default <repo>/.venv-engine) and rebuilt
# only when constraints-engine.txt or the build and project tables of pyproject.toml change. torch comes
# from PyTorch's CPU index (about 200 MB) where it is reachable, else from PyPI (the CUDA build on Linux:
# about 5 GB, 1-3 minutes).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${LA_TRAINER_ENGINE_VENV:-$ROOT/.venv-engine}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
STAMP="$VENV/.la-trainer-engine-installed"
# What the environment is built from: the engine pins and pyproject's build, project and setuptools tables
# (tool settings such as pytest markers or ruff rules do not change what is installed).
HASH="$( (cat constraints-engine.txt
    awk '/^\[/ { keep = ($0 ~ /^\[(build-system|project|tool\.setuptools)/) } keep' pyproject.toml) |
    sha256sum | cut -d' ' -f1)"
START=$(date +%s)
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$HASH" ]; then
    rm -rf "$VENV"
    echo "== engine-torch environment: creating $VENV with $PYTHON ($("$PYTHON" --version 2>&1))"
    "$PYTHON" -m venv "$VENV"
    PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -c constraints-engine.txt)
    if ! "${PIP[@]}" --retries 0 --timeout 15 torch --index-url https://download.pytorch.org/whl/cpu; then
        echo "PyTorch's CPU index is not reachable: torch from PyPI instead (the CUDA build on Linux)"
        "${PIP[@]}" torch
    fi
    "${PIP[@]}" -e . pytest hypothesis
    echo "$HASH" >"$STAMP"
    echo "== engine-torch environment ready after $(($(date +%s) - START)) s"
fi
"$VENV/bin/python" -c 'import numpy, sys, torch; print(f"== pytest on torch {torch.__version__}, numpy {numpy.__version__}, python {sys.version.split()[0]}")'
# Every test that uses torch, selected by marker: tests/conftest.py marks each test whose module can import
# torch (tests/support/torch_use.py follows the imports through this repository's packages) or that runs
# the trainer process (`integration`) as `torch`; a test kept out for time carries `not_on_engine_torch`
# with its reason at the test. tests/test_engine_torch_step.py fails when a test file that imports torch
# is not selected here.
ENGINE_TORCH_TESTS="torch and not not_on_engine_torch"
"$VENV/bin/python" -m pytest -p no:cacheprovider -m "$ENGINE_TORCH_TESTS" tests "$@"
echo "== engine-torch step took $(($(date +%s) - START)) s"
