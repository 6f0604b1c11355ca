"""``la-trainer record``: train from ``.record`` files (spec §5.2) without a running game.

The recorder's files hold only data, so this builds what ``BeginTraining`` would (spec §5.3, §6.3): the
replay buffer (one episode per record), the engine's configs and the three initial networks from the
schema JSON the recorder writes (``{"ObservationSchema": ..., "ActionSchema": ...}``, spec §5.1), with
:mod:`protocol.engine`. It writes them as a ``TrainingMaterials`` export (spec §5.5) under ``--out`` and
trains that folder offline, so the output is exactly what ``la-trainer offline`` produces:
``<out>/Offline<N>/Networks/network_<id>.bin`` snapshots (the export keeps its initial networks). The
training options are the shared ones of every training command (``--iterations``, ``--device``, ...;
:mod:`trainer.settings.options`), checked before any file is read.

Refusals exit with the documented codes (README, "Exit codes"): an unreadable file or a ``--schema`` file
that is not the recorder's schema file is a usage error (2); records or schemas that cannot be trained
on, including a schema element the engine's builder cannot build, are bad data (6), as the trainer maps
the same errors everywhere else.
"""

from __future__ import annotations

import glob
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import click
import numpy as np

from protocol.config import (
    ACTIVATION_FUNCTIONS,
    FlowMatchingSettings,
    FlowMatchingTrainingSettings,
    TrainerConfig,
    parse_json,
)
from protocol.engine.configs import build_engine_session, format_time_stamp
from protocol.engine.export import TRAINING_MATERIALS_DIR, encode_training_materials, export_folder_name
from protocol.errors import ProtocolError
from protocol.ints import INT32_MAX, INT32_MIN
from protocol.record import Record, read_records, records_to_replay_buffer
from trainer.commands.cli import MORE_OPTIONS, NonEmptyPath, offline_training_options, training_overrides
from trainer.errors import NoSpace
from trainer.exitcodes import ExitCode
from trainer.records.runrecord import check_output_folder, new_task_folder
from trainer.session.app import run_with_link
from trainer.session.links.files import OFFLINE_TASK_NAME, FileTrainerLink, default_output_parent
from trainer.settings.options import check_command_value, load_options, load_options_traced
from trainer.system.atomic import atomic_write
from trainer.system.console import warn
from trainer.system.diskspace import is_no_space, no_space_paragraph
from trainer.system.lockfile import OutputFolderLock

__all__ = [
    "EXTREME_VALUE",
    "RECORD_ITERATIONS",
    "RECORD_MAX_BATCH",
    "RECORD_VALUES",
    "RecordBadData",
    "RecordUsageError",
    "expand_record_paths",
    "extreme_columns",
    "record_command",
]

RECORD_ITERATIONS = 20000
"""IterationNum of the generated trainer config unless ``--iterations`` says otherwise (the engine's
default of 1,000,000 is meant for a game that keeps running; 20k trains the demo tasks well)."""


RECORD_MAX_BATCH = 1 << 20
"""Largest ``--batch-size`` (1,048,576 rows): every row of a step holds a HiddenLayerSize-wide activation
per layer and its gradient, so 100,000,000 rows of 128 units need over 100 GB for one step (it ended in an
out-of-memory traceback), and a batch past a million rows trains no better than a smaller one."""

RECORD_VALUES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "--batch-size": (
        f"a whole number from 1 to {RECORD_MAX_BATCH} (the rows of one training step; each holds every "
        "layer's activations, so a larger batch needs more memory than a machine has; the engine's "
        "default is 256)",
        lambda v: 1 <= v <= RECORD_MAX_BATCH,
    ),
    "--learning-rate": ("a finite number > 0", lambda v: v > 0),
    "--seed": (f"a whole number from {INT32_MIN} to {INT32_MAX}", lambda v: INT32_MIN <= v <= INT32_MAX),
    "--hidden-layers": (f"a whole number from 1 to {INT32_MAX}", lambda v: 1 <= v <= INT32_MAX),
    "--hidden-size": (f"a whole number from 1 to {INT32_MAX}", lambda v: 1 <= v <= INT32_MAX),
    "--chunk": (f"a whole number from 1 to {INT32_MAX}", lambda v: 1 <= v <= INT32_MAX),
}
"""What the generated configs may hold (the engine's own ranges, protocol.config), checked by
:func:`trainer.settings.options.check_command_value` before any file is read: a value the config reader would
refuse later would be blamed on the generated export, a file the user never wrote."""


EXTREME_VALUE = 1e6
"""A recorded value beyond +-this is reported (:func:`extreme_columns`): a game's observations and actions
are scaled to about +-10 (the engine's observation scales), and a flipped byte in a float's exponent makes
values of 1e33 that would decide the run's standardisation on their own."""

_SHOWN_COLUMNS = 5
"""Columns named one by one in the warning; more are counted."""


def extreme_columns(records: Sequence[Record], origins: Sequence[str]) -> list[str]:
    """One warning line per observation or action column with a finite value beyond +-:data:`EXTREME_VALUE`:
    the column, its range over every record, and the record (``origins[i]`` names ``records[i]``) that
    holds the largest. Non-finite values are left to the data check that refuses them (exit 6)."""
    found: list[str] = []
    for kind in ("observation", "action"):
        tables = [record.observations if kind == "observation" else record.actions for record in records]
        width = tables[0].shape[1] if tables else 0
        for column in range(width):
            values = [table[:, column][np.isfinite(table[:, column])] for table in tables]
            peaks = [float(np.abs(part).max()) if part.size else 0.0 for part in values]
            worst = int(np.argmax(peaks))
            if peaks[worst] <= EXTREME_VALUE:
                continue
            every = np.concatenate(values)
            found.append(
                f"{kind} column {column} of the records ranges from {every.min():.4g} to {every.max():.4g} "
                f"(largest magnitude in {origins[worst]}); values beyond +-{EXTREME_VALUE:g} are not what a game "
                "records and will dominate the training: a damaged file (flipped bytes) looks like this. "
                "Check or leave out that record."
            )
    if len(found) > _SHOWN_COLUMNS:
        found = [*found[:_SHOWN_COLUMNS], f"and {len(found) - _SHOWN_COLUMNS} more columns like these."]
    return found


class RecordUsageError(click.ClickException):
    """A file named on the command line cannot be read."""

    exit_code = ExitCode.USAGE


class RecordBadData(click.ClickException):
    """The records or schemas cannot be trained on (as :func:`trainer.errors.exit_code_for` maps the
    ConfigError, RecordError and ReplayError these come from)."""

    exit_code = ExitCode.BAD_DATA


def _machine_device() -> str:
    """The config's Device for this machine: ``GPU`` where torch sees CUDA, else ``CPU``."""
    import torch

    return "GPU" if torch.cuda.is_available() else "CPU"


def _load_schemas(path: Path) -> tuple[Mapping[str, object], Mapping[str, object]]:
    try:
        document = parse_json(path.read_bytes(), str(path))
    except (OSError, ProtocolError) as error:
        raise click.BadParameter(f"{path} is not readable JSON: {error}", param_hint="--schema") from None
    if (
        not isinstance(document, dict)
        or "ObservationSchema" not in document
        or "ActionSchema" not in document
    ):
        raise click.BadParameter(
            f"{path} must hold an object with 'ObservationSchema' and 'ActionSchema' (the recorder's schema file)",
            param_hint="--schema",
        )
    obs, act = document["ObservationSchema"], document["ActionSchema"]
    if not isinstance(obs, dict) or not isinstance(act, dict):
        raise click.BadParameter(f"{path}: both schemas must be JSON objects", param_hint="--schema")
    return obs, act


_WILDCARDS = frozenset("*?[")


def expand_record_paths(arguments: Sequence[str]) -> list[Path]:
    r"""The files the command line names, each wildcard pattern (``*``, ``?``, ``[...]``) expanded here in
    sorted order: PowerShell and cmd.exe hand ``Saved\Recordings\*.record`` to the program as typed (a
    POSIX shell expands it first, and passes it as typed when nothing matches). A name that exists is
    taken as it is, wildcard characters and all (a file may be called ``take[1].record``).

    Raises:
        RecordUsageError: a name that does not exist, a folder, or a pattern that matches no file (exit 2).
    """
    found: list[Path] = []
    for argument in arguments:
        path = Path(argument)
        if not path.exists() and _WILDCARDS & set(argument):
            matches = sorted(Path(match) for match in glob.glob(argument, recursive=True))
            files = [match for match in matches if match.is_file()]
            if not files:
                raise RecordUsageError(f"no file matches {argument}")
            found.extend(files)
        elif not path.exists():
            raise RecordUsageError(f"{argument}: no such file")
        elif path.is_dir():
            raise RecordUsageError(f"{argument} is a folder: name its files ({path / '*.record'})")
        else:
            found.append(path)
    return found


@click.command("record", epilog=MORE_OPTIONS)
@click.argument("records", nargs=-1, required=True, type=str)
@click.option(
    "--schema",
    "schema_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help='Schema JSON written by the recorder: {"ObservationSchema": ..., "ActionSchema": ...}.',
)
@click.option(
    "--out",
    type=NonEmptyPath(file_okay=False, path_type=Path),
    default=Path("la-trainer-record"),
    show_default=True,
    help="Folder for the TrainingMaterials export and the trained networks (in a new Offline<N> folder).",
)
@click.option("--batch-size", type=int, default=256, show_default=True, help="BatchSize (1 to 1048576).")
@click.option("--learning-rate", type=float, default=1e-4, show_default=True, help="LearningRate (> 0).")
@click.option("--seed", type=int, default=1234, show_default=True, help="Seed (a 32-bit integer).")
@click.option(
    "--hidden-layers", type=int, default=1, show_default=True, help="HiddenLayerNum (engine default 1)."
)
@click.option("--hidden-size", type=int, default=128, show_default=True, help="HiddenLayerSize.")
@click.option("--activation", type=click.Choice(ACTIVATION_FUNCTIONS), default="ELU", show_default=True)
@click.option("--chunk", type=int, default=1, show_default=True, help="ActionChunkSize.")
@click.option("--embed/--no-embed", default=True, show_default=True, help="EmbedNormalizationsInWeights.")
@offline_training_options
def record_command(
    records: tuple[str, ...],
    schema_path: Path,
    out: Path,
    batch_size: int,
    learning_rate: float,
    seed: int,
    hidden_layers: int,
    hidden_size: int,
    activation: str,
    chunk: int,
    embed: bool,
    **kwargs: Any,
) -> None:
    """Train from .record files and a recorder schema file.

    The generated config trains on what this machine has (Device GPU where CUDA is visible, else CPU;
    --device overrides it) with the network the options describe, whose size the log names.

    \b
    Example:
      la-trainer record Saved/Recordings/*.record --schema Saved/Recordings/schema.json --out runs/rec1
    """
    overrides = training_overrides(kwargs)
    load_options(None, overrides)  # refuse a bad value before reading any file
    own = {
        "--batch-size": batch_size,
        "--learning-rate": learning_rate,
        "--seed": seed,
        "--hidden-layers": hidden_layers,
        "--hidden-size": hidden_size,
        "--chunk": chunk,
    }
    for flag, value in own.items():
        expected, check = RECORD_VALUES[flag]
        check_command_value(flag, value, expected, check)
    paths = expand_record_paths(records)
    obs_schema, act_schema = _load_schemas(schema_path)
    all_records: list[Record] = []
    origins: list[str] = []
    for path in paths:
        try:
            read = read_records(path.read_bytes())
        except OSError as error:
            raise RecordUsageError(f"{path}: {error}") from None
        except ProtocolError as error:
            raise RecordBadData(f"{path}: {error}") from None
        all_records.extend(read)
        origins.extend(f"{path.name} record {index}" for index in range(len(read)))
    if not all_records:
        raise RecordBadData("the .record files hold no records: nothing to train on")
    try:
        replay = records_to_replay_buffer(all_records)
    except ProtocolError as error:
        raise RecordBadData(f"records do not fit together: {error}") from None
    for line in extreme_columns(all_records, origins):
        warn(line)
    now = datetime.now()
    trainer = TrainerConfig(
        time_stamp=format_time_stamp(now),
        training=FlowMatchingTrainingSettings(
            iteration_num=int(overrides.get("iteration_num") or RECORD_ITERATIONS),
            learning_rate=learning_rate,
            batch_size=batch_size,
            seed=seed,
        ),
        embed_normalizations_in_weights=embed,
        # The engine writes its IntermediatePath here; ours is the --out folder that holds the export.
        temp_directory=str(out.resolve()),
    )
    flow_matching = FlowMatchingSettings(
        action_chunk_size=chunk,
        hidden_layer_num=hidden_layers,
        hidden_layer_size=hidden_size,
        activation_function=activation,
    )
    try:
        session, snapshots = build_engine_session(
            obs_schema, act_schema, replay, trainer=trainer, flow_matching=flow_matching
        )
    except ProtocolError as error:
        raise RecordBadData(
            f"cannot build the engine's networks and configs for this schema: {error}"
        ) from None
    check_output_folder(out, "--out")  # after the inputs: a refused input leaves no folder behind
    # One run per output folder: a second record --out into it is refused while this one trains (exit 2).
    with OutputFolderLock(out):
        # The engine's default Device is GPU; this config is ours, so it says what this machine has (a
        # CPU-only machine would otherwise warn about a missing GPU on every run; --device still overrides
        # it). Asked only now: it imports torch, which no refusal above waits for.
        session = replace(session, trainer=replace(session.trainer, device=_machine_device()))
        try:
            files = encode_training_materials(session, dict(enumerate(snapshots)), replay)
        except ProtocolError as error:
            raise RecordBadData(f"cannot encode the engine's export for these records: {error}") from None
        folder = out / TRAINING_MATERIALS_DIR / export_folder_name(now)
        try:
            for relative, data in files.items():
                target = folder / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(target, data)
        except OSError as error:
            if not is_no_space(error):
                raise
            raise NoSpace(
                no_space_paragraph("the export of the records", folder, error, "Nothing was trained.")
            ) from None
        click.echo(
            f"la-trainer: {len(all_records)} records, {replay.step_num} steps; export written to {folder}"
        )
        # The settings files as in every mode (trainer.settings.options.load_options): --out is the
        # project folder. Warned once already.
        loaded = load_options_traced(None, overrides, warn=lambda _: None, shared_dir=out)
        output = new_task_folder(default_output_parent(folder), OFFLINE_TASK_NAME)
        link = FileTrainerLink(folder, output_dir=output)
        click.echo(f"la-trainer: training; outputs in {output}")
        click.echo(loaded.settings_line())
        sys.exit(
            run_with_link(
                lambda flag: link,
                options=loaded.options,
                task_dir=output,
                option_sources=loaded.every_source(),
                task_name=output.name,  # as offline: Offline<N> names its run
            )
        )
