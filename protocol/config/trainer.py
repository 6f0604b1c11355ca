"""The trainer config (spec §4.1): parse and encode.

The shared-memory and file transports send it as ``trainer-config.json`` with ``TempDirectory``; the
socket sends it as the ``TrainerSettings`` key of its one object, without.
"""

from __future__ import annotations

from protocol.config.fields import (
    FieldTable,
    ParseContext,
    bool_reader,
    float_reader,
    int_reader,
    join_path,
    read_fields,
    str_reader,
    write_fields,
)
from protocol.config.values import FlowMatchingTrainingSettings, TrainerConfig
from protocol.ints import INT32_MAX
from protocol.json_fields import json_object, json_str

__all__ = ["DEVICES", "parse_trainer_config", "read_trainer", "trainer_config_to_json"]

DEVICES = ("GPU", "CPU")
"""The ``Device`` values the engine offers; any other string is kept, with a warning."""

_TRAINING_FIELDS: FieldTable = (
    ("IterationNum", "iteration_num", int_reader()),
    ("LearningRate", "learning_rate", float_reader()),
    ("WeightDecay", "weight_decay", float_reader()),
    ("BatchSize", "batch_size", int_reader(lo=1)),
    ("ObservationNoiseScale", "observation_noise_scale", float_reader()),
    ("NormalizeLatents", "normalize_latents", bool_reader),
    ("Seed", "seed", int_reader(lo=-INT32_MAX - 1)),
    ("SaveSnapshots", "save_snapshots", bool_reader),
    # >= 1: the trainer takes ``iteration % IterationsPerSnapshot``; 0 would divide by zero.
    ("IterationsPerSnapshot", "iterations_per_snapshot", int_reader(lo=1)),
)
"""(JSON key, attribute, reader) for :class:`FlowMatchingTrainingSettings`, in engine order."""

_TRAINER_FIELDS: FieldTable = (
    ("TrainerMethod", "trainer_method", str_reader),
    ("TimeStamp", "time_stamp", str_reader),
    ("EmbedNormalizationsInWeights", "embed_normalizations_in_weights", bool_reader),
    ("Device", "device", str_reader),
    ("UseTensorBoard", "use_tensorboard", bool_reader),
    ("UseMLflow", "use_mlflow", bool_reader),
    ("MLflowTrackingUri", "mlflow_tracking_uri", str_reader),
)
"""Scalar trainer-config keys (the nested settings object and TempDirectory are handled apart)."""


def parse_trainer_config(
    obj: object,
    warnings: list[str] | None = None,
    *,
    path: str = "",
    source: str = "trainer-config.json",
    expect_temp_directory: bool = True,
) -> TrainerConfig:
    """Parse a trainer config object (§4.1). ``TempDirectory`` is read when present; its absence is a
    warning only when ``expect_temp_directory`` (shared memory and exported files add it, the socket not)."""
    ctx = ParseContext(source, warnings if warnings is not None else [])
    return read_trainer(obj, ctx, path, expect_temp_directory)


def read_trainer(obj: object, ctx: ParseContext, path: str, expect_temp_directory: bool) -> TrainerConfig:
    """:func:`parse_trainer_config` within a parse that is already under way (the assemblies)."""
    node = json_object(obj, path or "trainer config", source=ctx.source)
    values = read_fields(node, _TRAINER_FIELDS, TrainerConfig, path, ctx)
    settings_path = join_path(path, "FlowMatchingTrainingSettings")
    if "FlowMatchingTrainingSettings" in node:
        settings_obj = json_object(node["FlowMatchingTrainingSettings"], settings_path, source=ctx.source)
        training = FlowMatchingTrainingSettings(
            **read_fields(settings_obj, _TRAINING_FIELDS, FlowMatchingTrainingSettings, settings_path, ctx)  # type: ignore[arg-type]
        )
        ctx.unknown(settings_obj, tuple(k for k, _, _ in _TRAINING_FIELDS), settings_path)
    else:
        ctx.missing_object(settings_path)
        training = FlowMatchingTrainingSettings()
    temp_directory: str | None = None
    if "TempDirectory" in node:
        temp_directory = json_str(node["TempDirectory"], join_path(path, "TempDirectory"), source=ctx.source)
    elif expect_temp_directory:
        ctx.warnings.append(
            f"{ctx.where(join_path(path, 'TempDirectory'))} is missing; no temp directory is known"
        )
    if values["device"] not in DEVICES:
        ctx.warnings.append(
            f"{ctx.where(join_path(path, 'Device'))} {values['device']!r} is not one of {', '.join(DEVICES)}; kept as given"
        )
    known = (*(k for k, _, _ in _TRAINER_FIELDS), "FlowMatchingTrainingSettings", "TempDirectory")
    ctx.unknown(node, known, path)
    return TrainerConfig(training=training, temp_directory=temp_directory, **values)  # type: ignore[arg-type]


def trainer_config_to_json(cfg: TrainerConfig, include_temp_directory: bool = True) -> dict[str, object]:
    """The trainer config object the engine writes; ``TempDirectory`` only when asked for and known."""
    out = write_fields(cfg, _TRAINER_FIELDS[:2])
    out["FlowMatchingTrainingSettings"] = write_fields(cfg.training, _TRAINING_FIELDS)
    out.update(write_fields(cfg, _TRAINER_FIELDS[2:]))
    if include_temp_directory and cfg.temp_directory is not None:
        out["TempDirectory"] = cfg.temp_directory
    return out
