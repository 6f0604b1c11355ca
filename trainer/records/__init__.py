"""What a run leaves for people to read: the status file and progress lines
(:mod:`~trainer.records.progress`), the run record (:mod:`~trainer.records.runrecord`) and the
TensorBoard / MLflow trackers (:mod:`~trainer.records.trackers`).

Imports :mod:`trainer.training`, :mod:`trainer.settings` and :mod:`trainer.system` below it, never the
session or the command line (tests/test_architecture.py). Import from the modules.
"""

__all__: list[str] = []
