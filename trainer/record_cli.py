"""``la-trainer record``: train from ``.record`` files (spec §5.2) without a running game.

The recorder's files hold only data, so this builds what ``BeginTraining`` would (spec §5.3, §6.3): the
replay buffer (one episode per record), the engine's configs and the three initial networks from the
schema JSON the recorder writes (``{"ObservationSchema": ..., "ActionSchema": ...}``, spec §5.1). It
writes them as a ``TrainingMaterials`` export (spec §5.5) and trains that folder offline, so the output
is exactly what ``la-trainer offline`` produces: ``Networks/network_<id>.bin`` snapshots.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

__all__ = ["record_command"]


def _load_schemas(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    try:
        document = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, ValueError) as error:
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


@click.command("record")
@click.argument(
    "records", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option(
    "--schema",
    "schema_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help='Schema JSON written by the recorder: {"ObservationSchema": ..., "ActionSchema": ...}.',
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("la-trainer-record"),
    show_default=True,
    help="Folder for the TrainingMaterials export and the trained networks.",
)
@click.option("--iterations", type=int, default=20000, show_default=True, help="IterationNum.")
@click.option("--batch-size", type=int, default=256, show_default=True)
@click.option("--learning-rate", type=float, default=1e-4, show_default=True)
@click.option("--seed", type=int, default=1234, show_default=True)
@click.option(
    "--hidden-layers", type=int, default=1, show_default=True, help="HiddenLayerNum (engine default 1)."
)
@click.option("--hidden-size", type=int, default=128, show_default=True, help="HiddenLayerSize.")
@click.option(
    "--activation", type=click.Choice(["ELU", "ReLU", "TanH", "GELU"]), default="ELU", show_default=True
)
@click.option("--chunk", type=int, default=1, show_default=True, help="ActionChunkSize.")
@click.option("--embed/--no-embed", default=True, show_default=True, help="EmbedNormalizationsInWeights.")
@click.option(
    "--device", type=str, default="GPU", show_default=True, help='"GPU" (falls back to CPU) or "CPU".'
)
def record_command(
    records: tuple[Path, ...],
    schema_path: Path,
    out: Path,
    iterations: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
    hidden_layers: int,
    hidden_size: int,
    activation: str,
    chunk: int,
    embed: bool,
    device: str,
) -> None:
    """Train from .record files and a recorder schema file.

    \b
    Example:
      la-trainer record Saved/Recordings/*.record --schema Saved/Recordings/schema.json --out runs/rec1
    """
    from emulator.game import FileExport
    from emulator.session import EngineTask, SessionSettings, build_session_config
    from protocol.errors import ProtocolError
    from protocol.record import Record, read_records, records_to_replay_buffer
    from trainer.app import run_with_link
    from trainer.links import FileTrainerLink
    from trainer.options import load_options

    obs_schema, act_schema = _load_schemas(schema_path)
    all_records: list[Record] = []
    for path in records:
        try:
            all_records.extend(read_records(path.read_bytes()))
        except (OSError, ProtocolError) as error:
            raise click.ClickException(f"{path}: {error}") from None
    if not all_records:
        raise click.ClickException("the .record files hold no records: nothing to train on")
    try:
        replay = records_to_replay_buffer(all_records)
    except ProtocolError as error:
        raise click.ClickException(f"records do not fit together: {error}") from None
    task = EngineTask("record", obs_schema, act_schema, replay)
    settings = SessionSettings(
        iteration_num=iterations,
        batch_size=batch_size,
        learning_rate=learning_rate,
        seed=seed,
        device=device,
        embed_normalizations_in_weights=embed,
        hidden_layer_num=hidden_layers,
        hidden_layer_size=hidden_size,
        activation=activation,
        action_chunk_size=chunk,
    )
    try:
        session, snapshots = build_session_config(task, settings, None)
    except (ProtocolError, NotImplementedError) as error:
        raise click.ClickException(f"cannot build the engine's networks for this schema: {error}") from None
    out.mkdir(parents=True, exist_ok=True)
    folder = FileExport(out).write(session, dict(enumerate(snapshots)), replay)
    click.echo(f"la-trainer: {len(all_records)} records, {replay.step_num} steps; export written to {folder}")
    options = load_options(folder)
    code = run_with_link(lambda flag: FileTrainerLink(folder), options=options, task_dir=folder)
    if code == 0:
        click.echo(
            f"la-trainer: trained networks in {folder / 'Networks'} (network_0.bin denoiser, 1 encoder, 2 decoder)"
        )
    sys.exit(code)
