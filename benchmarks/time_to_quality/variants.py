"""The training settings the benchmark compares: the trainer's default, an engine-style loop, and the
rows of the ablation, each as :class:`trainer.settings.options.TrainerOptions` values (the trainer's own knobs,
so every row is something a user can set in ``la-trainer.json``).

:data:`TRAINING_KNOBS` lists the options that change the training maths; :data:`ENGINE_LOOP` sets every
one of them to the engine's plain loop (spec §7.2: uniform t, no EMA, no schedule). A test checks that
every option is classified, so a knob added later cannot leak into the engine loop unnoticed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace

from trainer.settings.options import TrainerOptions, options_json, parse_option

__all__ = [
    "DEFAULT",
    "ENGINE_LOOP",
    "ENGINE_LOOP_OPTIONS",
    "OTHER_KNOBS",
    "TRAINING_KNOBS",
    "Variant",
    "parse_variant",
]

TRAINING_KNOBS = frozenset(
    {
        "time_distribution",
        "ema_decay",
        "layer_lr",
        "spread_start",
        "spread_gain",
        "ode_steps",
        "distill_fraction",
        "draws_per_row",
        "heldout_share",
        "recipe",
    }
)
"""Options that change what is trained or how (the engine loop pins each of them)."""
OTHER_KNOBS = frozenset(
    {
        "sync_every_iterations",
        "sync_every_seconds",
        "progress_every_seconds",
        "compile",
        "threads",
        "device",
        "iteration_num",
        "status_file",
        "checkpoint_every_seconds",
        "resume",
        "wait",
        "config_wait",
        "run_record",
        "tensorboard",
        "mlflow",
        "heldout_min_episodes",
        "heldout_every_iterations",
        "heldout_send_best",
    }
)
"""Options that do not change the training maths (cadences, threads, files): left at their values."""

ENGINE_LOOP_OPTIONS: Mapping[str, object] = {
    "time_distribution": "uniform",
    "ema_decay": 0.0,
    "layer_lr": "same",
    "spread_start": 0.7,
    "spread_gain": 0.0,
    "ode_steps": 0,
    "distill_fraction": 0.25,
    "draws_per_row": 1,
    "heldout_share": 0.0,
    "recipe": "auto",
}
"""An engine-style loop, as far as the engine's settings and spec §6.4/§7.2 say (its flow-matching trainer
source has not been seen): t ~ U[0, 1), no EMA, one learning rate for every weight, the plain linear path
(no late-time source spread), no few-step distillation, one (x0, t) draw per row, no held-out episodes.
AdamW with amsgrad at the config's learning rate and weight decay, constant, is what every variant's
optimiser is."""


@dataclass(frozen=True, slots=True)
class Variant:
    """A named set of option overrides. ``freeze_encoder``: train with the encoder's weights frozen (the
    trainer before issue 17 did that under the engine default; kept to measure what it cost)."""

    name: str
    options: Mapping[str, object] = field(default_factory=dict)
    freeze_encoder: bool = False

    def trainer_options(self, base: TrainerOptions) -> TrainerOptions:
        return replace(base, **self.options)  # type: ignore[arg-type]

    def settings(self) -> dict[str, object]:
        """Every training knob's value in this variant (what a result row records)."""
        values = options_json(self.trainer_options(TrainerOptions()))
        out: dict[str, object] = {name: values[name] for name in sorted(TRAINING_KNOBS)}
        out["freeze_encoder"] = self.freeze_encoder
        return out


DEFAULT = Variant("default")
"""The trainer's defaults (:class:`TrainerOptions`)."""
ENGINE_LOOP = Variant("engine-loop", ENGINE_LOOP_OPTIONS)
"""The engine-style loop (:data:`ENGINE_LOOP_OPTIONS`), the baseline of every ratio."""
_NAMED = {v.name: v for v in (DEFAULT, ENGINE_LOOP, Variant("frozen-encoder", {}, freeze_encoder=True))}


def parse_variant(text: str) -> Variant:
    """A variant by name (``default``, ``engine-loop``, ``frozen-encoder``) or ``NAME=key:value;...``
    (option overrides, e.g. ``pow02=time_distribution:power:0.2;ema_decay:0.99``)."""
    if text in _NAMED:
        return _NAMED[text]
    name, sep, spec = text.partition("=")
    if not sep or not name:
        raise ValueError(f"unknown variant {text!r}: use {', '.join(_NAMED)} or NAME=key:value;...")
    known = {f.name: f for f in fields(TrainerOptions)}
    overrides: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in spec.split(";"))):
        key, _, value = item.partition(":")
        if key not in known:
            raise ValueError(f"variant {name!r}: unknown option {key!r}")
        default = getattr(TrainerOptions(), key)
        if isinstance(default, bool):
            overrides[key] = value == "true"
        elif isinstance(default, int | float | str):
            overrides[key] = type(default)(value)
        else:  # an option value with a grammar of its own (time_distribution): checked, kept as text
            overrides[key] = str(parse_option(key, value, f"variant {name!r}"))
    return Variant(name, overrides)
