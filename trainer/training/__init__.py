"""The maths and the model: the protocol -> tensors boundary (:mod:`~trainer.training.data`), the
stateless flow-matching maths (:mod:`~trainer.training.flow`), the model and its normalisation
(:mod:`~trainer.training.model`, :mod:`~trainer.training.normalization`), the NNE layer tree <-> torch
(:mod:`~trainer.training.nne_torch`), the training steps (:mod:`~trainer.training.steps`), one job
(:mod:`~trainer.training.job`) with its checkpoints (:mod:`~trainer.training.checkpoint`), the held-out
measurements (:mod:`~trainer.training.heldout`), the device (:mod:`~trainer.training.device`) and the
CPU thread policy (:mod:`~trainer.training.threads`).

Never touches sockets, records or the command line: it imports only :mod:`trainer.settings` and
:mod:`trainer.system` below it (tests/test_architecture.py). Import from the modules.
"""

__all__: list[str] = []
