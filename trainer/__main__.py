"""``python -m trainer``: the ``la-trainer`` command without the console script on PATH (on Windows a
venv's ``Scripts`` folder rarely is): ``python -m trainer demo``, ``python -m trainer doctor``, ..."""

from __future__ import annotations

import os

from trainer.commands.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main(prog_name="la-trainer")
