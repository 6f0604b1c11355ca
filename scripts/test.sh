#!/usr/bin/env bash
# The README's test command: lint, type-check and run the whole test suite (slow tests included).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
echo "== ruff"
ruff check .
echo "== mypy (strict on protocol/)"
mypy protocol trainer emulator benchmarks scripts
echo "== hadolint (Dockerfile)"
if command -v hadolint >/dev/null 2>&1; then hadolint Dockerfile; else echo "hadolint not available on this platform: skipped"; fi
echo "== pytest"
python -m pytest "$@"
