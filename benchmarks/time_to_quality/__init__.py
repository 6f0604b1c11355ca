"""Time-to-quality benchmark: how many iterations (and seconds) a policy needs to reach each target.

For every task and seed the trainer's own :class:`trainer.training.job.TrainingJob` (the code the trainer process
runs, stepped in this process) is trained **once**, and the networks it would send at each evaluation
point are exported, encoded as snapshots, read back and scored through the engine's inference path
(:class:`emulator.inference.EnginePolicy`: encoder -> 8 explicit Euler steps from N(0, I) -> decoder).
The first evaluation point where every target of the task holds is the run's iterations-to-target; the
wall-clock of the optimisation iterations up to it is its time-to-target.

Every run of a variant is set beside the same run of an **engine-style loop**
(:data:`~benchmarks.time_to_quality.variants.ENGINE_LOOP`, variant ``engine-loop``): la-trainer with
uniform t, AdamW with amsgrad at the given learning rate, one rate for every weight, no EMA, no schedule,
the engine's initial networks, trained on the same data from the same seed. That is what the engine's
settings and spec §7.2/§6.4 describe; the engine's own flow-matching trainer source has not been seen, so
it stands in for that trainer rather than copying it. Ratios compare runs at the same learning rate.

Modules: :mod:`~.tasks` (tasks, targets, evaluation), :mod:`~.variants` (the training settings
compared), :mod:`~.run` (one training with its evaluation points, one JSON line), :mod:`~.report`
(iterations and seconds to each target, the tables), :mod:`~.cli` (``python -m
benchmarks.time_to_quality``).

Seeds: training seed ``s`` draws the demonstrations of seed ``s`` and trains with ``Seed = 1234 + s``.
Reported numbers use seeds 0, 1, 2 and evaluation seed 1000; settings are chosen on seeds 100, 101 and
evaluation seed 2000, which the reported numbers never use.
"""

from __future__ import annotations

__all__: list[str] = []
