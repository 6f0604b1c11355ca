"""The game side, emulated: what Unreal Engine does around an external flow-matching trainer.

The emulator plays the engine's part of a session against the real trainer process, so that tests, the
demo and the benchmarks exercise the trainer exactly as a game would:

* ``game`` holds the engine's half of every handshake per transport (shared memory, socket, file export),
  ``drive`` the engine's training story over a live half (BeginTraining, then the tick loop), ``launch``
  the engine's process side (directories, command line, the spawned trainer), ``session`` a whole
  recorded session in any mode;
* ``inference`` runs the engine's sampling path (§6.4) in numpy, ``tasks`` holds the benchmark tasks
  B1-B3 (data, experts, metrics), ``demo`` is ``la-trainer demo``, ``bench`` the speed bench.

The rule: the engine side shares no code path with the trainer's training maths (no torch, no
``trainer.training.steps``/``trainer.training.job``), so a bug there cannot hide by being made twice; only ``bench``, which
times the trainer's own step against a reference loop, imports them. What the engine
itself defines (configs, the network builder, the export layout) comes from ``protocol`` and
``protocol.engine``, like the trainer's; the game side may use the trainer's transports
(``trainer.session.transport``: regions, sockets) to move bytes, never to decide what the bytes mean. The trainer
never imports this package: ``la-trainer demo``/``bench`` are loaded by name.
"""

__all__: list[str] = []
