"""How the trainer is told to run: our own options (:mod:`~trainer.settings.options`: la-trainer.json <
``LA_TRAINER_*`` < the command line, checked once where they are read), the one settings object every
wait reads (:mod:`~trainer.settings.timeouts`) and the one table of ``LA_TRAINER_*`` names that are not
options (:mod:`~trainer.settings.environment`).

Torch-free, so a bad value is refused within a fraction of a second of starting. Imports only
:mod:`trainer.system` below it (tests/test_architecture.py). Import from the modules.
"""

__all__: list[str] = []
