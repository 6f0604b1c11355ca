"""Numbers from ``LA_TRAINER_*`` variables that are not options (``LA_TRAINER_TIMEOUT_SCALE``), refused as
options are: at once, exit code 2, one paragraph with the variable, its value, what is accepted and the
fix (the form of :class:`trainer.settings.options.OptionError`). Below :mod:`trainer.settings.options` and
:mod:`trainer.settings.timeouts`, which both import nothing else of ours, so either can use it."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping

from trainer.errors import LaunchError

__all__ = ["environment_number"]


def environment_number(
    name: str,
    default: float,
    expected: str,
    check: Callable[[float], bool],
    environ: Mapping[str, str] | None = None,
) -> float:
    """The number in the variable ``name`` (``default`` when unset or empty).

    Raises:
        LaunchError: not a finite number, or ``check`` refuses it; the message says ``expected``.
    """
    raw = (os.environ if environ is None else environ).get(name, "")
    if not raw.strip():
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not check(value):
        raise LaunchError(
            f"environment variable {name} is set to {raw!r}, but it must be {expected}. "
            f"Change or unset {name} in the environment that starts the trainer."
        )
    return value
