#!/usr/bin/env python3
"""la-trainer drop-in for the engine's train.py, from a source checkout: a thin shim over the packaged one
(``trainer/dropin/train.py``, :mod:`trainer.dropin`).

Works without installation: the repository root is put on ``sys.path`` first. Also
``torchrun --standalone --nproc-per-node N scripts/train.py <engine argv>`` (the scale-out trainer). To run
la-trainer from an engine, use ``la-trainer install-engine`` (docs/unreal-install.md) rather than copying
this file over the engine's own: the engine's other trainers must keep their script.
"""

import sys
from pathlib import Path

_REPO_ROOT = str(Path(__file__).resolve().parents[1])
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from trainer.dropin import main  # noqa: E402  (sys.path must be set first)

if __name__ == "__main__":
    sys.exit(main())
