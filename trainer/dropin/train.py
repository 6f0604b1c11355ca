#!/usr/bin/env python3
"""la-trainer drop-in for the engine's train.py (Unreal 5.8 ``LearningCore/Content/Python/train.py``).

The engine runs ``<python> train.py <TaskName> -p DIR -m MODULE -l|"" --nne-cpu-path DIR SharedMemory
TASK_DIR -g GUID`` or ``... Socket IP:PORT TEMP_DIR`` (spec §1.2-1.4). This file ships inside the package,
so it works from a wheel or ``pip install --target``: ``la-trainer install-engine`` points the engine at
it (docs/unreal-install.md). Also the scale-out trainer under torchrun (:mod:`trainer.dropin`).
"""

import sys
from pathlib import Path

# Run as a script, this file's own folder (trainer/dropin) is sys.path[0]: the package root must be
# importable instead, and a module beside this file must not shadow a top-level one.
_HERE = Path(__file__).resolve().parent
_ROOT = str(_HERE.parents[1])
if sys.path and sys.path[0] and Path(sys.path[0]).resolve() == _HERE:
    sys.path[0] = _ROOT
elif _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from trainer.dropin import main  # noqa: E402  (sys.path must be set first)

if __name__ == "__main__":
    sys.exit(main())
