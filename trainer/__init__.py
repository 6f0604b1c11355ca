"""la-trainer: the external training process for Unreal Engine Learning Agents (flow matching).

Everything with side effects lives here: transports, torch, the training loop, the CLI and the
game-side emulator. Byte layouts live in :mod:`protocol`.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
