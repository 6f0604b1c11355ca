"""What the trainer needs from the operating system, with no knowledge of training or of the engine's
messages: the one line writer every message goes through (:mod:`~trainer.system.console`), atomic file
writes (:mod:`~trainer.system.atomic`), process liveness (:mod:`~trainer.system.liveness`) and the Win32
prototype table under it (:mod:`~trainer.system.win32`), one trainer per control block
(:mod:`~trainer.system.lockfile`), the OpenMP wait set before torch loads (:mod:`~trainer.system.openmp`)
and the few torch calls whose API moved (:mod:`~trainer.system.torch_compat`).

The lowest group of :mod:`trainer`: it imports nothing of ours but :mod:`trainer.errors` and
:mod:`trainer.exitcodes` (tests/test_architecture.py). Import from the modules.
"""

__all__: list[str] = []
