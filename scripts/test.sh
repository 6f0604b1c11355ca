#!/usr/bin/env bash
# The README's test command: lint, type-check and run the whole test suite (slow tests included).
# Arguments go to pytest (e.g. -k options). CI runs exactly this (.ci/run).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/setup_env.sh
source "$ROOT/scripts/setup_env.sh"
la_trainer_setup test
cd "$ROOT"
echo "== ruff"
ruff check .
echo "== mypy (strict on protocol/)"
mypy protocol trainer emulator benchmarks scripts
echo "== hadolint (Dockerfile)"
if command -v hadolint >/dev/null 2>&1; then hadolint Dockerfile; else echo "hadolint not available on this platform: skipped"; fi
echo "== pytest"
python -m pytest "$@"
