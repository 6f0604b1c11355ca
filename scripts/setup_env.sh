#!/usr/bin/env bash
# Creates (or reuses) the project's virtual environment in .venv and installs the package with the
# tested pins from constraints.txt. Sourced by scripts/demo.sh and scripts/test.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${LA_TRAINER_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
    echo "Creating virtual environment in $VENV"
    "$PYTHON" -m venv "$VENV"
fi
STAMP="$VENV/.la-trainer-installed"
HASH="$(cat "$ROOT/pyproject.toml" "$ROOT/constraints.txt" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$HASH" ]; then
    echo "Installing la-trainer and its dependencies (torch CPU build pinned in constraints.txt)"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -c "$ROOT/constraints.txt" -e "$ROOT[dev,plots]"
    echo "$HASH" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
