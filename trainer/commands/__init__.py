"""The ``la-trainer`` command line (:mod:`~trainer.commands.cli`, click) and each subcommand of its own:
``record`` (:mod:`~trainer.commands.record`), ``watch`` (:mod:`~trainer.commands.watch`), ``report``
(:mod:`~trainer.commands.report`), ``doctor`` (:mod:`~trainer.commands.doctor`) and ``install-engine``
(:mod:`~trainer.commands.install_engine`). With ``scripts/train.py`` and the drop-in, the only place
that reads a command line.

The top group with :mod:`trainer.dropin` and :mod:`trainer.distributed` (tests/test_architecture.py).
Import from the modules.
"""

__all__: list[str] = []
