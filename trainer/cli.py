"""``la-trainer``: the human-friendly command line (click).

The engine uses ``scripts/train.py`` with its own grammar; people use these subcommands. Options that a
user sets per machine rather than per run can also come from ``LA_TRAINER_*`` environment variables.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any, ClassVar

import click

from trainer import __version__
from trainer.exitcodes import ExitCode

__all__ = ["main"]

_OPTION_HELP = "See README, 'Trainer options'."


def _common_training_options(func: Any) -> Any:
    """Options shared by every training subcommand (each also settable as LA_TRAINER_<NAME>)."""
    decorators = [
        click.option(
            "--iterations",
            "iteration_num",
            type=int,
            default=None,
            help="Override the config's IterationNum.",
        ),
        click.option(
            "--device", type=str, default=None, help='Override the config\'s Device ("cpu", "cuda").'
        ),
        click.option(
            "--sync-every-iterations",
            type=int,
            default=None,
            help="Send networks back to the game every N iterations.",
        ),
        click.option(
            "--sync-every-seconds",
            type=float,
            default=None,
            help="Send networks back to the game at most this often (default 2 s).",
        ),
        click.option(
            "--ode-steps",
            type=int,
            default=None,
            help="Euler steps the game uses (ODEStepsNum); enables few-step distillation.",
        ),
        click.option(
            "--time-distribution",
            type=str,
            default=None,
            help="t distribution: uniform | beta:a,b | logit_normal:m,s | power:k.",
        ),
        click.option("--threads", type=int, default=None, help="torch CPU threads (0: automatic)."),
        click.option(
            "--compile",
            type=click.Choice(["on", "off"]),
            default=None,
            help="torch.compile the training step (needs a C++ compiler or Triton; default off).",
        ),
        click.option("--resume/--no-resume", default=None, help="Resume from the last checkpoint."),
    ]
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


def _overrides(kwargs: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "iteration_num",
        "device",
        "sync_every_iterations",
        "sync_every_seconds",
        "ode_steps",
        "time_distribution",
        "threads",
        "compile",
        "resume",
    )
    return {k: kwargs.pop(k) for k in keys if k in kwargs}


def _exit(code: int) -> None:
    sys.exit(int(code))


class _LazyGroup(click.Group):
    """Subcommands defined in other modules, imported only when used, so ``la-trainer --help`` stays
    fast (no torch or matplotlib import just to list commands)."""

    lazy: ClassVar[dict[str, tuple[str, str, str]]] = {
        "bench": (
            "emulator.bench",
            "bench_command",
            "Measure training speed, replay ingest, startup and sync against their limits.",
        ),
        "demo": (
            "emulator.demo",
            "demo_command",
            "The whole loop on the built-in game emulator, with a report.",
        ),
        "record": ("trainer.record_cli", "record_command", "Train from .record files and a recorder schema."),
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy:
            import importlib

            module_name, attribute, _ = self.lazy[cmd_name]
            command = getattr(importlib.import_module(module_name), attribute)
            if not isinstance(command, click.Command):
                raise TypeError(f"{module_name}.{attribute} is not a click command")
            return command
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            if name in self.lazy:
                rows.append((name, self.lazy[name][2]))
            else:
                command = super().get_command(ctx, name)
                if command is not None and not command.hidden:
                    rows.append((name, command.get_short_help_str(limit=formatter.width - 6 - len(name))))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(
    cls=_LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "LA_TRAINER"},
)
@click.version_option(__version__, "--version", prog_name="la-trainer")
def main() -> None:
    """Flow-matching trainer for Unreal Engine Learning Agents.

    \b
    Examples:
      la-trainer demo                                  # the whole loop on the built-in emulator
      la-trainer shm ./MyTask --create                 # attach mode: prints the engine switches
      la-trainer socket --host 0.0.0.0 --port 48491    # serve a game on another machine
      la-trainer offline Intermediate/LearningCore/TrainingMaterials
      la-trainer watch Intermediate/LearningCore/Training0
    """


@main.command("shm")
@click.argument("task_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--guid", "-g", type=str, default=None, help="Controls GUID (generated with --create if omitted)."
)
@click.option(
    "--create",
    "-c",
    is_flag=True,
    help="Create the control block (for -LearningAgentsUseExternalTrainingProcess).",
)
@click.option(
    "--config-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the game writes its config JSONs (-LearningAgentsConfigPath); default TASK_DIR/Configs.",
)
@_common_training_options
def shm_command(
    task_dir: Path, guid: str | None, create: bool, config_dir: Path | None, **kwargs: Any
) -> None:
    """Train over shared memory, attached to a game by controls GUID.

    \b
    Example (start this first, then the game with the printed switches):
      la-trainer shm ./Intermediate/LearningCore/External --create
    """
    from protocol.argv import LaunchArgs, SharedMemoryArgs
    from protocol.guid import parse_guid
    from trainer.app import open_link_for_launch, run_with_link
    from trainer.options import load_options
    from trainer.timeouts import Timeouts

    overrides = _overrides(kwargs)
    if guid is None:
        if not create:
            raise click.UsageError("--guid is required unless --create makes a new control block.")
        guid = "{" + str(uuid.uuid4()).upper() + "}"
    else:
        try:
            guid = parse_guid(guid).braced_upper()
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="--guid") from None
    task_dir.mkdir(parents=True, exist_ok=True)
    config_dir = (config_dir or task_dir / "Configs").resolve()
    config_dir.mkdir(parents=True, exist_ok=True)
    if create:
        click.echo("Start the game with these command-line switches:")
        click.echo(
            f"  -LearningAgentsUseExternalTrainingProcess -LearningAgentsControlsGuid={guid} "
            f'-LearningAgentsConfigPath="{config_dir}"'
        )
    args = LaunchArgs(
        task_name="External",
        trainer_path=None,
        trainer_module=None,
        log=True,
        nne_cpu_path=None,
        mode=SharedMemoryArgs(
            task_dir=str(task_dir), controls_guid=guid, create_mem=create, make_task_dir=True, num_processes=1
        ),
    )
    options = load_options(task_dir, overrides)
    timeouts = Timeouts.from_env()
    _exit(
        run_with_link(
            lambda flag: open_link_for_launch(args, timeouts, config_dir, flag),
            options=options,
            task_dir=task_dir,
        )
    )


@main.command("socket")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=48491, show_default=True, type=click.IntRange(1, 65535), help="TCP port.")
@click.option(
    "--temp-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("la-trainer-runs"),
    show_default=True,
    help="Where snapshots and status files go.",
)
@_common_training_options
def socket_command(host: str, port: int, temp_dir: Path, **kwargs: Any) -> None:
    """Train over TCP: this process listens, the game connects.

    \b
    Example (on the GPU server; then start the game with the printed switches):
      la-trainer socket --host 0.0.0.0 --port 48491
    """
    from protocol.argv import LaunchArgs, SocketArgs
    from trainer.app import open_link_for_launch, run_with_link
    from trainer.options import load_options
    from trainer.timeouts import Timeouts

    overrides = _overrides(kwargs)
    temp_dir.mkdir(parents=True, exist_ok=True)
    click.echo("Start the game with these command-line switches:")
    shown_host = host if host not in ("0.0.0.0", "::") else "<this machine's address>"
    click.echo(
        f"  -LearningAgentsUseExternalTrainingProcess -LearningAgentsIpAddress={shown_host} "
        f"-LearningAgentsPort={port}"
    )
    args = LaunchArgs(
        task_name="External",
        trainer_path=None,
        trainer_module=None,
        log=True,
        nne_cpu_path=None,
        mode=SocketArgs(host=host, port=port, temp_directory=str(temp_dir), num_processes=1),
    )
    options = load_options(temp_dir, overrides)
    timeouts = Timeouts.from_env()
    _exit(
        run_with_link(
            lambda flag: open_link_for_launch(args, timeouts, None, flag), options=options, task_dir=temp_dir
        )
    )


@main.command("offline")
@click.argument("materials", type=click.Path(exists=True, file_okay=False, path_type=Path))
@_common_training_options
def offline_command(materials: Path, **kwargs: Any) -> None:
    """Train from the engine's exported TrainingMaterials folder.

    Writes the trained Networks/network_<id>.bin next to the received ones (same size and header).

    \b
    Example:
      la-trainer offline MyProject/Intermediate/LearningCore/TrainingMaterials
    """
    from trainer.app import run_with_link
    from trainer.links import FileTrainerLink
    from trainer.options import load_options
    from trainer.transport.files import find_training_materials

    overrides = _overrides(kwargs)
    folder = find_training_materials(materials)
    options = load_options(folder, overrides)
    _exit(run_with_link(lambda flag: FileTrainerLink(folder), options=options, task_dir=folder))


@main.command("watch")
@click.argument("task_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--interval", default=1.0, show_default=True, help="Seconds between refreshes.")
@click.option("--once", is_flag=True, help="Print the status once and exit.")
def watch_command(task_dir: Path, interval: float, once: bool) -> None:
    """Show live progress of a run (reads TASK_DIR/la-trainer-status.msgpack).

    \b
    Example:
      la-trainer watch MyProject/Intermediate/LearningCore/Training0
    """
    from trainer.progress import STATUS_FILE_NAME, read_status

    path = task_dir / STATUS_FILE_NAME
    while True:
        if path.is_file():
            try:
                status = read_status(path)
            except (OSError, ValueError) as error:
                click.echo(f"status file unreadable: {error}")
            else:
                pct = 100.0 * status.iteration / status.total if status.total else 0.0
                age = time.time() - status.updated
                click.echo(
                    f"{status.phase}: iteration {status.iteration}/{status.total} ({pct:.1f}%) "
                    f"loss {status.loss:.5f} {status.iterations_per_second:,.0f} it/s syncs {status.syncs} "
                    f"(pid {status.pid}, updated {age:.0f}s ago) {status.message}"
                )
                if once or status.phase in ("complete", "stopped", "failed"):
                    return
        else:
            click.echo(f"waiting for {path} ...")
            if once:
                _exit(ExitCode.USAGE)
        time.sleep(interval)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
