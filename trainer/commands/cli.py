"""``la-trainer``: the human-friendly command line (click).

The engine uses ``scripts/train.py`` with its own grammar; people use these subcommands. Every value is
checked before anything slow happens (no torch import, no link opened): a wrong input ends within a
second with exit code 2 and one paragraph naming the value, what is accepted and how to fix it (README,
"Exit codes"). Options come from the command line, ``LA_TRAINER_<NAME>`` environment variables and
``la-trainer.json`` (:mod:`trainer.settings.options`, the one namespace; click reads no environment itself).
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import click

from trainer import __version__

__all__ = [
    "LIVE_ONLY_OPTIONS",
    "MORE_OPTIONS",
    "NonEmptyPath",
    "main",
    "offline_training_options",
    "training_options",
    "training_overrides",
]


class NonEmptyPath(click.Path):
    """:class:`click.Path` that refuses an empty value: ``Path("")`` is the current folder, which the user
    did not name (``--out ""`` from an unset shell variable would write the outputs there)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail(f"{value!r} is empty: name a folder or file ('.' for the current folder)", param, ctx)
        return super().convert(value, param, ctx)


def _more_options() -> str:
    from trainer.settings.options import experimental_options

    return (
        "Every option here is also LA_TRAINER_<NAME> and a key of la-trainer.json, where more options live "
        "(README, 'Trainer options'). Experimental (research knobs, off or neutral by default, may change "
        f"or go): {', '.join(experimental_options())}."
    )


MORE_OPTIONS = _more_options()
"""The epilog of every training command's ``--help``: where the other options are, and which are
experimental."""

LIVE_ONLY_OPTIONS = ("sync_every_iterations", "sync_every_seconds", "wait")
"""Options that mean something only with a game on the other end (networks sent back to it, the wait for
it): ``offline`` and ``record`` do not list them (:func:`offline_training_options`)."""
_TRAINING_KEYS = (
    "iteration_num",
    "device",
    "sync_every_iterations",
    "sync_every_seconds",
    "ode_steps",
    "time_distribution",
    "threads",
    "compile",
    "resume",
    "wait",
    "tensorboard",
    "mlflow",
)
"""The options every training command shares on its command line, in the order of their decorators."""


def offline_training_options(func: Any) -> Any:
    """:func:`training_options` without :data:`LIVE_ONLY_OPTIONS`, for the commands that train from files."""
    return training_options(func, live=False)


def training_options(func: Any, *, live: bool = True) -> Any:
    """Options shared by every training subcommand. Each is also ``LA_TRAINER_<NAME>`` and a key of
    ``la-trainer.json`` (README, "Trainer options"); values are checked by :mod:`trainer.settings.options`.
    ``live`` False: without :data:`LIVE_ONLY_OPTIONS`."""
    decorators = [
        click.option(
            "--iterations",
            "iteration_num",
            type=int,
            default=None,
            help="Override the config's IterationNum (0: follow the config).",
        ),
        click.option(
            "--device",
            type=str,
            default=None,
            help="cpu, cuda, cuda:N (refused when not there) or gpu (cuda when present, else the CPU); "
            "default: the config's Device.",
        ),
        click.option(
            "--sync-every-iterations",
            type=int,
            default=None,
            help="Send networks back to the game every N iterations (0: by time only).",
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
            help="Euler steps the game uses (ODEStepsNum, 1-100); enables few-step distillation.",
        ),
        click.option(
            "--time-distribution",
            type=str,
            default=None,
            help="t distribution: uniform | beta:A,B | logit_normal[:LOC,SCALE] | power:K.",
        ),
        click.option("--threads", type=int, default=None, help="torch CPU threads (0: automatic)."),
        click.option(
            "--compile",
            type=str,
            default=None,
            help="on|off: torch.compile the training step (needs a C++ compiler or Triton; default off).",
        ),
        click.option("--resume/--no-resume", default=None, help="Resume from the last checkpoint."),
        click.option(
            "--wait",
            metavar="SECONDS",
            type=float,
            default=None,
            help="Bound of a wait that cannot see the game (attach mode before the game came or where its process "
            "cannot be seen; socket --once before the game connected); "
            "0: no bound. Default 600. A server (socket, shm --serve) waits for each game without a bound.",
        ),
        click.option(
            "--tensorboard/--no-tensorboard",
            default=None,
            help="Write TensorBoard logs (also switched on by the engine's UseTensorBoard).",
        ),
        click.option(
            "--mlflow",
            metavar="URI",
            type=str,
            default=None,
            help="Log to MLflow at this tracking URI ('default': MLflow's own); also UseMLflow in Unreal.",
        ),
    ]
    for name, decorator in reversed(list(zip(_TRAINING_KEYS, decorators, strict=True))):
        if live or name not in LIVE_ONLY_OPTIONS:
            func = decorator(func)
    return func


def training_overrides(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The shared training options out of a command's keyword arguments (None: not given)."""
    return {k: kwargs.pop(k) for k in _TRAINING_KEYS if k in kwargs}


def _exit(code: int) -> None:
    sys.exit(int(code))


def _check_device_before_listening(device: str) -> None:
    """A trainer that waits for games (``socket``, ``shm``) refuses an explicit CUDA device this machine
    lacks now, before it listens or prints the game's switches (exit 2): otherwise each game that
    connected would be refused in turn while it waited. torch is imported only for such a device."""
    if device == "cuda" or device.startswith("cuda:"):
        from trainer.training.device import check_device_option

        check_device_option(device)


def _wait_note(sources: Mapping[str, str], wait: float) -> str:
    """The line that says a ``wait`` someone set does not apply to a server (empty when nobody set it).

    A server's job is to be there whenever a game comes (an editor restarted, PIE started again, the
    Docker image's health check), so it waits for each game without a bound and ends on SIGINT/SIGTERM;
    a bounded wait for one game is ``--once``, where the option applies."""
    source = sources.get("wait")
    if source is None:
        return ""
    return (
        f"la-trainer: note: {source} sets wait to {wait:g} s, which does not apply to a server: it waits for "
        "each game without a bound until SIGINT/SIGTERM. With --once (one session) the wait for the game is "
        "bounded by it."
    )


class _LazyGroup(click.Group):
    """Subcommands defined in other modules, imported only when used, so ``la-trainer --help`` stays
    fast (no torch or matplotlib import just to list commands). The game side's commands (``demo``,
    ``bench``) are named by string: ``trainer`` never imports ``emulator``.

    It is also where a refusal becomes a paragraph and an exit code: a :class:`trainer.errors.TrainerError`
    or :class:`protocol.errors.ProtocolError` raised by any command (bad options, an empty folder, a
    corrupt file) is printed as ``la-trainer: <paragraph>`` with its documented code, never a traceback.
    """

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
        "doctor": (
            "trainer.commands.doctor",
            "doctor_command",
            "Check this machine: Python, torch, GPU, shared memory, extras.",
        ),
        "install-engine": (
            "trainer.commands.install_engine",
            "install_engine_command",
            "Make an Unreal project's engine run la-trainer (no engine file changed; --undo).",
        ),
        "record": (
            "trainer.commands.record",
            "record_command",
            "Train from .record files and a recorder schema.",
        ),
        "report": (
            "trainer.commands.report",
            "report_command",
            "Draw a run's loss curve from its metrics log.",
        ),
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy:
            import importlib

            module_name, attribute, _ = self.lazy[cmd_name]
            try:
                module = importlib.import_module(module_name)
            except ImportError as error:
                raise click.ClickException(
                    f"'{cmd_name}' is not available in this installation ({error}). Reinstall la-trainer "
                    "(pip install la-trainer) or run it from a checkout."
                ) from None
            command = getattr(module, attribute)
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
                    # No limit that cuts a sentence ("..."): write_dl wraps a long one.
                    rows.append((name, command.get_short_help_str(limit=500)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        from protocol.errors import ProtocolError
        from trainer.errors import TrainerError, exit_code_for

        try:
            return super().invoke(ctx)
        except (TrainerError, ProtocolError) as error:
            prefix = "" if isinstance(error, TrainerError) else f"{type(error).__name__}: "
            click.echo(f"la-trainer: {prefix}{error}", err=True)
            ctx.exit(int(exit_code_for(error)))


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="la-trainer")
def main() -> None:
    """Flow-matching trainer for Unreal Engine Learning Agents.

    \b
    Examples:
      la-trainer demo                                  # the whole loop on the built-in emulator
      la-trainer doctor                                # is this machine ready? (torch, GPU, extras)
      la-trainer shm ./MyTask --create                 # attach mode: prints the engine switches
      la-trainer socket --host 0.0.0.0 --port 48491    # serve a game on another machine
      la-trainer offline Intermediate/LearningCore/TrainingMaterials
      la-trainer watch Intermediate/LearningCore       # follow the newest run
      la-trainer report Intermediate/LearningCore      # its loss curve as a PNG
    """


@main.command("shm", epilog=MORE_OPTIONS)
@click.argument("task_dir", type=NonEmptyPath(file_okay=False, path_type=Path))
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
    type=NonEmptyPath(file_okay=False, path_type=Path),
    default=None,
    help="Where the game writes its config JSONs (-LearningAgentsConfigPath); default TASK_DIR/Configs.",
)
@click.option(
    "--serve/--once",
    default=False,
    help="With --create: after a session, reset the control block and serve the next game on the same "
    "GUID (an editor restarted, PIE started again) until SIGINT/SIGTERM. Default --once: exit after one "
    "session.",
)
@training_options
def shm_command(
    task_dir: Path, guid: str | None, create: bool, config_dir: Path | None, serve: bool, **kwargs: Any
) -> None:
    """Train over shared memory, attached to a game by controls GUID.

    \b
    Example (start this first, then the game with the printed switches):
      la-trainer shm ./Intermediate/LearningCore/External --create
      la-trainer shm ./Intermediate/LearningCore/External --create --serve   # session after session
    """
    from protocol.argv import LaunchArgs, SharedMemoryArgs
    from protocol.guid import parse_guid
    from trainer.records.runrecord import check_output_folder
    from trainer.session.app import open_link_for_launch, run_with_link, serve_sessions
    from trainer.settings.options import load_options_traced
    from trainer.settings.timeouts import Timeouts

    if serve and not create:
        raise click.UsageError(
            "--serve needs --create: only a control block this trainer created outlives one game session."
        )

    loaded = load_options_traced(
        task_dir if task_dir.is_dir() else None,
        training_overrides(kwargs),
        shared_dir=task_dir.resolve().parent,  # the project-wide file (trainer.settings.options.load_options)
    )
    options = loaded.options
    timeouts = Timeouts.from_env(options.wait)
    _check_device_before_listening(options.device)
    if guid is None:
        if not create:
            raise click.UsageError("--guid is required unless --create makes a new control block.")
        guid = "{" + str(uuid.uuid4()).upper() + "}"
    else:
        try:
            guid = parse_guid(guid).braced_upper()
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="--guid") from None
    check_output_folder(task_dir, "TASK_DIR")
    config_dir = check_output_folder((config_dir or task_dir / "Configs").resolve(), "--config-dir")
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

    def open_link(flag: Any) -> Any:
        link = open_link_for_launch(args, timeouts, config_dir, flag, serve=serve)
        if create:
            # Only once the block is ours: a refusal (a second trainer on this GUID) comes without them.
            click.echo("Start the game with these command-line switches:")
            click.echo(
                f"  -LearningAgentsUseExternalTrainingProcess -LearningAgentsControlsGuid={guid} "
                f'-LearningAgentsConfigPath="{config_dir}"'
            )
        return link

    click.echo(loaded.settings_line())
    sources = loaded.every_source()
    if serve and _wait_note(loaded.sources, options.wait):
        click.echo(_wait_note(loaded.sources, options.wait))
    if serve:
        # Every session in TASK_DIR: each gets its own run record under TASK_DIR/runs.
        _exit(
            serve_sessions(
                open_link,
                options=options,
                task_dir_for=lambda _: task_dir,
                option_sources=sources,
                task_name=task_dir.resolve().name,
            )
        )
    # TASK_DIR is the user's folder: its whole name starts the run name (res2 stays res2).
    _exit(
        run_with_link(
            open_link,
            options=options,
            task_dir=task_dir,
            option_sources=sources,
            task_name=task_dir.resolve().name,
        )
    )


@main.command(
    "socket",
    short_help="Train over TCP: a server the game connects to, session after session.",
    epilog=MORE_OPTIONS,
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=48491, show_default=True, type=click.IntRange(1, 65535), help="TCP port.")
@click.option(
    "--temp-dir",
    type=NonEmptyPath(file_okay=False, path_type=Path),
    default=Path("la-trainer-runs"),
    show_default=True,
    help="Each run gets a folder External<N> here (status, snapshots, run record); la-trainer.json here "
    "applies to every run.",
)
@click.option(
    "--config-wait",
    metavar="SECONDS",
    type=float,
    default=None,
    help="Bound from a connection's first byte to its complete config message; a connection that misses "
    "it is closed while other connections are served (one that has sent nothing is not timed: a game "
    "sends its config when it begins training). 0: no bound. Default 60.",
)
@click.option(
    "--serve/--once",
    default=True,
    help="Default --serve: a server; after each session it listens again on the same port for the next "
    "game, with no bound on the wait, until SIGINT/SIGTERM. --once: exit after one session (the wait for "
    "the game is then bounded by --wait).",
)
@training_options
def socket_command(
    host: str, port: int, temp_dir: Path, config_wait: float | None, serve: bool, **kwargs: Any
) -> None:
    """Train over TCP: this process listens, the game connects; it serves one game session after another
    (--once: one session).

    \b
    Example (on the GPU server; then start the game with the printed switches):
      la-trainer socket --host 0.0.0.0 --port 48491
    """
    from protocol.argv import LaunchArgs, SocketArgs
    from protocol.errors import ArgvError
    from trainer.errors import LaunchError
    from trainer.records.runrecord import check_output_folder, new_task_folder
    from trainer.session.app import open_link_for_launch, run_with_link, serve_sessions
    from trainer.settings.options import load_options_traced
    from trainer.settings.timeouts import Timeouts

    try:
        mode = SocketArgs(host=host, port=port, temp_directory=str(temp_dir), num_processes=1)
    except ArgvError:
        # The engine's grammar refuses it (spaces, brackets, a leading '-'): say it in this command's terms.
        raise click.BadParameter(
            f"{host!r} is not a host name or address (no spaces, brackets, '/' or leading '-'); use an "
            "address of this machine: 0.0.0.0 for all of them, 127.0.0.1 for this machine only.",
            param_hint="--host",
        ) from None
    overrides = training_overrides(kwargs)
    if config_wait is not None:
        overrides["config_wait"] = config_wait
    loaded = load_options_traced(None, overrides, shared_dir=temp_dir if temp_dir.is_dir() else None)
    options = loaded.options
    timeouts = Timeouts.from_env(options.wait, config_wait=options.config_wait)
    _check_device_before_listening(options.device)
    runs = check_output_folder(temp_dir, "--temp-dir")
    task_dir: Path | None = None
    if serve:
        # Each session's folder is made once a game's config is in (serve_sessions, config_first): a
        # connection that never sends one (a port scan, a stray client) leaves no External<N> behind.
        click.echo(f"Run folders: {runs / 'External'}<N>, one per game session, made when its config comes")
    else:
        task_dir = new_task_folder(runs, "External")
        click.echo(f"Run folder: {task_dir}")
    if loaded.settings_line():
        click.echo(loaded.settings_line())
    sources = loaded.every_source()
    if serve and _wait_note(loaded.sources, options.wait):
        click.echo(_wait_note(loaded.sources, options.wait))
    args = LaunchArgs(
        task_name="External",
        trainer_path=None,
        trainer_module=None,
        log=True,
        nne_cpu_path=None,
        mode=mode,
    )

    def open_link(flag: Any) -> Any:
        link = open_link_for_launch(args, timeouts, None, flag, serve=serve)
        # Only once the port is ours: a refusal (port in use, a wrong address) comes without them.
        click.echo("Start the game with these command-line switches:")
        shown_host = host if host not in ("0.0.0.0", "::") else "<this machine's address>"
        click.echo(
            f"  -LearningAgentsUseExternalTrainingProcess -LearningAgentsIpAddress={shown_host} "
            f"-LearningAgentsPort={port}"
        )
        return link

    if serve:

        def session_folder(session: int) -> Path:
            try:
                folder = new_task_folder(runs, "External")
            except OSError as error:
                raise LaunchError(
                    f"cannot create the run folder of session {session + 1} under {runs}: "
                    f"{error.strerror or error}"
                ) from None
            click.echo(f"Run folder: {folder}")
            return folder

        _exit(
            serve_sessions(
                open_link,
                options=options,
                task_dir_for=session_folder,
                config_first=True,
                option_sources=sources,
            )
        )
    _exit(run_with_link(open_link, options=options, task_dir=task_dir, option_sources=sources))


@main.command("offline", epilog=MORE_OPTIONS)
@click.argument("materials", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--out",
    type=NonEmptyPath(file_okay=False, path_type=Path),
    default=None,
    help="Folder for the trained networks, status and run record (default: a new Offline<N> folder "
    "beside the engine's task folders). The export itself is never written to.",
)
@offline_training_options
def offline_command(materials: Path, out: Path | None, **kwargs: Any) -> None:
    """Train from the engine's exported TrainingMaterials folder.

    Writes the trained OUT/Networks/network_<id>.bin (same sizes and headers as the exported ones) and
    names them on exit; the export keeps its initial networks, so every run starts from them.

    \b
    Example:
      la-trainer offline MyProject/Intermediate/LearningCore/TrainingMaterials
    """
    from trainer.records.runrecord import check_output_folder, new_task_folder
    from trainer.session.app import run_with_link
    from trainer.session.links.files import OFFLINE_TASK_NAME, FileTrainerLink, default_output_parent
    from trainer.session.transport.files import find_training_materials
    from trainer.settings.options import SETTINGS_FILE_NAME, load_options, load_options_traced
    from trainer.system.lockfile import OutputFolderLock

    overrides = training_overrides(kwargs)
    # The values first (a typo must not wait for the folder checks), then with the settings files: the
    # project's (beside TrainingMaterials/) and the output folder's (trainer.settings.options.load_options).
    load_options(None, overrides)
    folder = find_training_materials(materials)
    project = default_output_parent(folder)
    loaded = load_options_traced(
        out if out is not None and out.is_dir() else None,
        overrides,
        warn=lambda _: None,  # warned once already
        shared_dir=project,
    )
    options = loaded.options
    if (folder / SETTINGS_FILE_NAME).exists():
        click.echo(
            f"la-trainer: warning: {folder / SETTINGS_FILE_NAME} is not read (an export is the engine's input); "
            f"settings for every run go in {project / SETTINGS_FILE_NAME} (README, 'Trainer options').",
            err=True,
        )
    if out is None:
        out = new_task_folder(check_output_folder(project, "--out"), OFFLINE_TASK_NAME)
    link = FileTrainerLink(folder, output_dir=out)  # refuses an export as the output folder
    check_output_folder(out, "--out")
    # One run per output folder: a second run into it is refused while this one trains (exit 2).
    with OutputFolderLock(out):
        click.echo(f"la-trainer: training from {folder}; outputs in {out}")
        click.echo(loaded.settings_line())
        _exit(
            run_with_link(
                lambda flag: link,
                options=options,
                task_dir=out,
                option_sources=loaded.every_source(),
                # The output folder's whole name starts the run name: --out res2 gives
                # res2_FlowMatching_Files_..., and each Offline<N> its own, so a run in a new folder needs
                # no _2 to differ from another.
                task_name=out.resolve().name,
            )
        )


@main.command("watch", short_help="Follow the newest run below a folder (--once: a health check).")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--interval",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0.05),
    help="Seconds between refreshes.",
)
@click.option(
    "--once", is_flag=True, help="Print the status once; exit 0 only for a healthy running or completed run."
)
@click.option(
    "--max-age",
    default=60.0,
    show_default=True,
    type=click.FloatRange(min=1.0),
    help="Seconds without a status update after which a run counts as stale (a live trainer writes every 10 s).",
)
def watch_command(path: Path, interval: float, once: bool, max_age: float) -> None:
    """Follow a run: a task folder, the engine's LearningCore folder or the project's Intermediate folder
    (the newest run below it is followed).

    Redraws one line on a terminal and ends with the run. Exit code: 0 running or completed; the run's
    own exit code when it ended otherwise (8 interrupted, 9 diverged, ...); 11 stale (no update for
    --max-age seconds); 12 dead (the trainer is gone without recording an end); 2 no run found.

    \b
    Examples:
      la-trainer watch MyProject/Intermediate/LearningCore
      la-trainer watch /runs --once --max-age 120      # a health check
    """
    from trainer.commands.watch import watch

    _exit(watch(path, interval=interval, once=once, max_age=max_age))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
