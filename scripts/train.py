#!/usr/bin/env python3
"""Drop-in replacement for the engine's ``LearningCore/Content/Python/train.py`` (Unreal 5.8).

The engine runs ``<python> train.py <TaskName> -p DIR -m MODULE -l|"" --nne-cpu-path DIR SharedMemory
TASK_DIR -g GUID`` or ``... Socket IP:PORT TEMP_DIR`` (spec §1.2-1.4). Point the engine at this file
(``-LearningAgentsEnginePath`` or a copy in place of the engine's script) and it trains flow-matching
policies with la-trainer. It works from a source checkout without installation: the repository root is
put on ``sys.path`` first.
"""

from __future__ import annotations

import sys
from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parent.parent
if str(_REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(_REPO_ROOT))

from trainer.app import engine_main  # noqa: E402  (sys.path must be set first)

if __name__ == "__main__":
    sys.exit(engine_main(sys.argv[1:]))
