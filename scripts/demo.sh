#!/usr/bin/env bash
# The README's demo command: the complete loop on the built-in game emulator and the six-path task.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
exec la-trainer demo "$@"
