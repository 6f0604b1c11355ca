#!/usr/bin/env bash
# End to end with a real pip: install-engine into a project whose engine Python is torch 2.5.1
# (/work/venv251), then engine sessions through the shim, run by that Python.
set -euo pipefail
W=/tmp/h16/e2e; rm -rf "$W"; mkdir -p "$W"
cd /work/main
source .venv/bin/activate
python - <<PY
from emulator.launch import EngineLayout
EngineLayout.create("$W/session/engine")
PY
time la-trainer install-engine "$W/session/engine/Project" --engine "$W/session/engine/Engine" --python ${ENGINE_PYTHON:-/work/venv251/bin/python}
find "$W/session/engine/Project/LaTrainer" -maxdepth 2 | sort | head -30
cat "$W/session/engine/Project/LaTrainer/install.json" | python -c "import json,sys; d=json.load(sys.stdin); print(d['versions'], len(d['files']), 'files')"
# A flow-matching session through the shim, the emulator (and therefore the shim) run by the engine's Python.
PYTHONPATH=/work/main ${ENGINE_PYTHON:-/work/venv251/bin/python} - <<PY
from dataclasses import replace
from pathlib import Path
from emulator.session import EngineTask, Mode, run_engine_session
from tests.support.sessions import SETTINGS
shim = Path("$W/session/engine/Project/LaTrainer/Engine/Plugins/Experimental/LearningCore/Content/Python/train.py")
for mode in (Mode.SHM, Mode.SOCKET):
    rec = run_engine_session(mode, EngineTask.benchmark("pendulum", size=10, seed=0), "$W/session", replace(SETTINGS, script=shim))
    rec.check()
    print(mode.value, "exit", rec.exit_code, "completed", rec.completed, "rounds", len(rec.rounds))
    print("\n".join(l for l in rec.log if "torch" in l or "la-trainer 0" in l)[:400])
PY
time la-trainer install-engine "$W/session/engine/Project" --undo
find "$W/session/engine/Project" -maxdepth 1 | sort
