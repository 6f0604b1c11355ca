#!/usr/bin/env bash
# The tests that depend on torch and numpy, on the versions the engine installs (constraints-engine.txt:
# torch 2.5.1, numpy 1.26.4; spec §11 item 1), in a second virtual environment. CI runs it after
# scripts/test.sh (.ci/run); arguments go to pytest.
#
# The environment is kept between runs (LA_TRAINER_ENGINE_VENV, default <repo>/.venv-engine) and rebuilt
# only when constraints-engine.txt or pyproject.toml change. torch comes from PyTorch's CPU index (about
# 200 MB) where it is reachable, else from PyPI (the CUDA build on Linux: about 5 GB, 1-3 minutes).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${LA_TRAINER_ENGINE_VENV:-$ROOT/.venv-engine}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
STAMP="$VENV/.la-trainer-engine-installed"
HASH="$(cat constraints-engine.txt pyproject.toml | sha256sum | cut -d' ' -f1)"
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
# Sessions in every mode (shared memory spawned and attach, socket, offline), the engine inference path on
# the returned networks, the autograd and fused steps, distillation, the compat shims and checkpoints.
"$VENV/bin/python" -m pytest -p no:cacheprovider \
    tests/integration/test_modes.py \
    tests/integration/test_real_install.py \
    tests/trainer/test_step.py \
    tests/trainer/test_fused_step.py \
    tests/trainer/test_distill.py \
    tests/trainer/test_torch_compat.py \
    tests/trainer/test_model.py \
    tests/trainer/test_checkpoint.py \
    -k "not paused and not late" \
    "$@"
echo "== engine-torch step took $(($(date +%s) - START)) s"
