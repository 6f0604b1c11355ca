"""The trainer's side of one run with the engine, over any transport: the training story, top to bottom
(:mod:`~trainer.session.run`), the held-out round it runs (:mod:`~trainer.session.heldout`), snapshot
files (:mod:`~trainer.session.snapshots`), the process around a session (:mod:`~trainer.session.app`:
signals, exit codes, serving one game after another), one link per transport
(:mod:`~trainer.session.links`) and the byte movers under them (:mod:`~trainer.session.transport`).

Imports the groups below it (records, training, settings, system); the command line, the drop-in and
scale-out sit above it (tests/test_architecture.py). Import from the modules.
"""

__all__: list[str] = []
