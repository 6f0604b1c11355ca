#!/usr/bin/env bash
# The README's demo command: the complete loop on the built-in game emulator and the six-path task.
# Arguments go to `la-trainer demo` (e.g. --quick).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/setup_env.sh
source "$ROOT/scripts/setup_env.sh"
la_trainer_setup demo
cd "$ROOT"
exec la-trainer demo "$@"
