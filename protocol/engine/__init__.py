"""What the engine builds and writes for a trainer, below both the trainer and the game side.

* :mod:`~protocol.engine.networks`: the three flow-matching networks as the engine builds them (§6.3);
* :mod:`~protocol.engine.chunks`: where each step of an action chunk sits in the decoder (§5.4, §11 item 5);
* :mod:`~protocol.engine.configs`: the configs and initial snapshots for training on a recording (§4, §5.3);
* :mod:`~protocol.engine.export`: the TrainingMaterials export as files (§5.5).

Pure like the rest of :mod:`protocol`: values in, values and bytes out; callers bring the clock and the
file system. Import from the modules.
"""

from __future__ import annotations

__all__: list[str] = []
