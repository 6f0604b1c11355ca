"""la-trainer: the external training process for Unreal Engine Learning Agents (flow matching).

Everything the trainer does with side effects lives here, grouped by concern, lowest first (each group
imports only the ones before it; docs/design.md, tests/test_architecture.py): :mod:`~trainer.system` (the
operating system: console, atomic writes, liveness), :mod:`~trainer.settings` (options, ``LA_TRAINER_*``
names, timeouts), :mod:`~trainer.training` (the maths and the model), :mod:`~trainer.records` (status,
run record, trackers), :mod:`~trainer.session` (one run with the engine: the story, links, transports),
:mod:`~trainer.distributed` (one rank of a scale-out run), :mod:`~trainer.dropin` (the engine's
``train.py`` and the hand-over) and :mod:`~trainer.commands` (the ``la-trainer`` command line). Byte
layouts live in :mod:`protocol`; the game side (emulator, demo, speed bench) in ``emulator``, which this
package never imports.
"""

import os

from trainer.system.openmp import set_openmp_wait_defaults

__version__ = "0.1.0"
"""The one version source: pyproject.toml reads it (``[tool.setuptools.dynamic]``)."""
__all__ = ["__version__"]

# Here, not in an entry point: every process we start (console script, python -m trainer, the engine's
# train.py drop-in, torchrun ranks) imports this package before any of our modules imports torch, whose
# OpenMP runtime reads the variable once, when it loads (trainer.system.openmp says why and what).
set_openmp_wait_defaults(os.environ)
