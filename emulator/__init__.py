"""The game side, emulated: what the engine does around an external flow-matching trainer.

``networks`` builds the three initial networks as the engine does (spec §6.3), ``inference`` runs the
engine's sampling path (§6.4) in numpy, ``tasks`` holds the benchmark tasks B1-B3 (data, experts,
metrics). Nothing here imports torch: the emulator must not share code paths with the trainer it tests.
"""

__all__: list[str] = []
