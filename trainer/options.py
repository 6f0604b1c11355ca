"""Our own knobs: settings the engine does not send (cadences, time distribution, threads, distillation).

The engine's config decides *what* to train (spec §4). These options decide *how* this trainer runs it.
They come from, in increasing priority: defaults, a ``la-trainer.json`` file in the task directory (so an
engine-spawned run can be tuned without touching the engine), ``LA_TRAINER_*`` environment variables,
and explicit CLI options. One dataclass, parsed once at the edge.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from trainer.errors import LaunchError

__all__ = ["SETTINGS_FILE_NAME", "TrainerOptions", "load_options"]

SETTINGS_FILE_NAME = "la-trainer.json"
ENV_PREFIX = "LA_TRAINER_"


@dataclass(frozen=True, slots=True)
class TrainerOptions:
    """How to run a training job. Field names double as settings-file keys and env-var suffixes."""

    sync_every_iterations: int = 0
    """Send networks 0, 1, 2 back every N iterations (0: use ``sync_every_seconds`` only)."""
    sync_every_seconds: float = 2.0
    """Send networks back at most this often (0: iterations only). The engine takes one round per tick."""
    progress_every_seconds: float = 5.0
    """One plain progress line on stdout at this period (the engine copies stdout into its log)."""
    time_distribution: str = "logit_normal:0,1"
    """Training-time distribution of t: uniform | beta:a,b | logit_normal:m,s | power:k.

    Default chosen by the quality benchmark (benchmarks/quality.py, engine inference path, 3 seeds, 12k
    iterations): logit-normal(0, 1) beat uniform, Beta(1, 1.5) and U² at every step count ≥ 2 on B1
    (on-mode at 8 Euler steps 0.910 ± 0.007 against 0.898 ± 0.003 for uniform) and on B2 (success; see
    the flow-matching issue's closing note and README)."""
    ema_decay: float = 0.999
    """Exponential moving average of the weights used for every export (0 disables)."""
    ode_steps: int = 0
    """Euler step count the game uses (ODEStepsNum); > 0 enables few-step distillation for that count."""
    distill_fraction: float = 0.25
    """Share of IterationNum spent on distillation when ``ode_steps`` > 0."""
    compile: str = "off"
    """torch.compile the fused training step: on | off (trainer/steps/compiled.py). Needs a C++ compiler
    (CPU) or Triton (CUDA) and a few seconds to compile; measured no faster on a 2-core CPU."""
    threads: int = 0
    """torch intra-op threads (0: choose automatically, 1 for small networks)."""
    device: str = ""
    """Override the config's Device ("cpu", "cuda", "cuda:1"); empty: follow the config."""
    iteration_num: int = 0
    """Override IterationNum (0: follow the config)."""
    status_file: bool = True
    """Write <task_dir>/la-trainer-status.msgpack for ``la-trainer watch``."""
    checkpoint_every_seconds: float = 60.0
    """Write a resumable checkpoint at most this often (0: only at the end)."""
    resume: bool = False
    """Resume from the last checkpoint in the snapshot folder."""


_CHOICES: dict[str, tuple[str, ...]] = {"compile": ("on", "off")}
"""String options with a fixed set of values, checked where they are read (so the error names the source)."""


def _article(noun: str) -> str:
    return f"an {noun}" if noun[:1] in "aeiou" else f"a {noun}"


def _coerce(name: str, raw: object, template: object, source: str) -> object:
    """Converts ``raw`` to the type of the default ``template``, with an error naming the source."""
    if name in _CHOICES:
        text = str(raw).strip().lower()
        if text not in _CHOICES[name]:
            raise LaunchError(
                f"{source}: option '{name}' must be one of {', '.join(_CHOICES[name])}, got {raw!r}."
            )
        return text
    try:
        if isinstance(template, bool):
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
        if isinstance(template, int):
            if isinstance(raw, float) and not raw.is_integer():
                raise ValueError(raw)
            return int(raw)  # type: ignore[call-overload]
        if isinstance(template, float):
            return float(raw)  # type: ignore[arg-type]
        return str(raw)
    except (TypeError, ValueError):
        raise LaunchError(
            f"{source}: option '{name}' must be {_article(type(template).__name__)}, got {raw!r}."
        ) from None


def load_options(
    task_dir: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> TrainerOptions:
    """Defaults < ``<task_dir>/la-trainer.json`` < ``LA_TRAINER_*`` env vars < ``overrides``."""
    options = TrainerOptions()
    defaults = {f.name: getattr(options, f.name) for f in fields(options)}
    values: dict[str, object] = {}
    if task_dir is not None:
        path = Path(task_dir) / SETTINGS_FILE_NAME
        if path.is_file():
            try:
                loaded = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as error:
                raise LaunchError(f"Settings file {path} is not readable JSON: {error}.") from None
            if not isinstance(loaded, dict):
                raise LaunchError(f"Settings file {path} must hold a JSON object.")
            for key, raw in loaded.items():
                if key not in defaults:
                    raise LaunchError(
                        f"Settings file {path}: unknown option '{key}'. Known: {', '.join(sorted(defaults))}."
                    )
                values[key] = _coerce(key, raw, defaults[key], str(path))
    env = os.environ if environ is None else environ
    for key, default in defaults.items():
        env_name = ENV_PREFIX + key.upper()
        if env_name in env:
            values[key] = _coerce(key, env[env_name], default, f"environment variable {env_name}")
    for key, raw in (overrides or {}).items():
        if raw is None:
            continue
        if key not in defaults:
            raise LaunchError(f"Unknown option '{key}'.")
        values[key] = _coerce(key, raw, defaults[key], "command line")
    return replace(options, **values)  # type: ignore[arg-type]
