"""la-trainer: the external training process for Unreal Engine Learning Agents (flow matching).

Everything the trainer does with side effects lives here: transports, torch, the training story, the
command line. Byte layouts live in :mod:`protocol`; the game side (emulator, demo, speed bench) in
``emulator``, which this package never imports.
"""

__version__ = "0.1.0"
"""The one version source: pyproject.toml reads it (``[tool.setuptools.dynamic]``)."""
__all__ = ["__version__"]
