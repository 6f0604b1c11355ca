"""Every run leaves a record: a run folder with the effective options, the engine's settings, a metrics log
and the final networks, in plain stdlib formats (JSON, JSON lines) that any tool can read.

Layout (``<task_dir>`` is the run's task folder: the engine's ``<TaskName><N>`` for a spawned run, the
numbered folder we make for socket and offline runs, the user's folder for attach mode)::

    <task_dir>/la-trainer-status.msgpack          the live status (trainer.records.progress; la-trainer watch)
    <task_dir>/Snapshots/                         snapshots and resumable checkpoints
    <task_dir>/runs/<run name>/options.json       our options as this run used them
    <task_dir>/runs/<run name>/option-sources.json where each came from (a settings file, the environment,
                                                  the command line, or "default")
    <task_dir>/runs/<run name>/engine-config.json the engine's config (its own socket-JSON form)
    <task_dir>/runs/<run name>/metrics.jsonl      one JSON object per line, every TRACK_EVERY iterations
    <task_dir>/runs/<run name>/run.json           who/where/when, and at the end: phase, exit code,
                                                  last iteration and loss, the networks written
    <task_dir>/runs/<run name>/Networks/          network_<id>.bin: the final networks (snapshot bytes)
    <task_dir>/runs/<run name>/heldout-actions.json with a held-out set (trainer.training.heldout): demonstrated and
                                                  sampled actions of the last measurement
    <task_dir>/runs/<run name>/Networks/best/     the networks of the lowest held-out flow loss, when
                                                  they are not the ones sent

The run name is the engine's own (spec §7.2, the name of its TensorBoard run):
``<TaskName>_<TrainerMethod>_<CommType>_<TimeStamp>``, so the record, the TensorBoard run and the MLflow
run of one training carry the same name. ``runs/`` keeps several records apart where one task folder
serves several runs (attach mode reuses the folder the user names). A name an earlier run of the project
already has (two offline runs of one export share its TimeStamp) gets ``_2``, ``_3``, ...
(:func:`free_run_name`), so every run has its own record folder, TensorBoard folder and MLflow run name.

A metrics line::

    {"iteration": 1200, "phase": "flow_matching", "loss": 0.4123, "iterations_per_second": 1850.2,
     "learning_rate": 0.0001, "sync_rounds": 3, "elapsed_s": 0.65}

``phase`` is ``flow_matching`` or ``distillation`` (the two losses are on different scales and are never
mixed in one series); ``elapsed_s`` counts from the first training iteration of this process.

With a held-out set (:mod:`trainer.training.heldout`) a second kind of line holds each measurement on it, ``best``
true when its selection score is the highest so far::

    {"iteration": 1000, "heldout": {"selection": 0.31, "selection_f1": 0.9, "selection_energy": 0.59,
     "selection_coverage": 0.93, "selection_precision": 0.88, "flow_loss": 0.71, "energy_score": 0.29,
     "energy_distance": 0.01, "w1": 0.05, "w1_raw": [0.02, ...], "coverage": 0.86, "precision": 0.81,
     "seconds": 0.02}, "best": true}

and the recipe pilot (:mod:`trainer.training.recipes`) a third, at each of its looks::

    {"iteration": 1000, "recipe": {"iteration": 1000, "stage": "pick", "chosen": "sharp", "stopped":
     ["standard"], "scores": {"sharp": {"score": 0.35, ...}, "standard": {"score": 0.21, ...}}}}
"""

from __future__ import annotations

import contextlib
import glob
import json
import math
import os
import re
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from protocol.config import TrainerConfig
from protocol.names import FLOW_MATCHING, CommType
from trainer.errors import LaunchError
from trainer.settings.options import TrainerOptions, options_json
from trainer.system.atomic import atomic_write, rewrite_in_place
from trainer.system.diskspace import OptionalWrite, is_no_space

if TYPE_CHECKING:
    from trainer.records.trackers import Trackers

__all__ = [
    "HELDOUT_ACTIONS_FILE",
    "METRICS_FILE",
    "OPTIONS_FILE",
    "OPTION_SOURCES_FILE",
    "RUNS_DIR",
    "RUN_FILE",
    "MetricsPoint",
    "RunLog",
    "RunRecord",
    "check_output_folder",
    "find_run_folders",
    "free_run_name",
    "new_task_folder",
    "read_metrics",
    "run_name",
    "task_name_of",
]

RUNS_DIR = "runs"
OPTIONS_FILE = "options.json"
OPTION_SOURCES_FILE = "option-sources.json"
ENGINE_CONFIG_FILE = "engine-config.json"
METRICS_FILE = "metrics.jsonl"
HELDOUT_ACTIONS_FILE = "heldout-actions.json"
RUN_FILE = "run.json"
NETWORKS_DIR = "Networks"

_TASK_ID_LIMIT = 100_000
"""Give up looking for a free task number after this many (a broken file system must not spin forever)."""


def task_name_of(task_dir: Path | None) -> str:
    """The engine's TaskName from its task folder ``<TaskName><TaskId>`` (spec §1.2: joined without a
    separator, e.g. ``Training0`` -> ``Training``); ``Training`` (the engine's default) without a folder.

    [INF] A TaskName that itself ends in digits loses them here; only run names are affected."""
    if task_dir is None:
        return "Training"
    return task_dir.name.rstrip("0123456789") or task_dir.name or "Training"


def _writable(folder: Path) -> str:
    """Empty when this process can create a file in ``folder``, else why not. Both the permission bits
    (:func:`os.access`) and a real probe file: root passes every permission check, yet a read-only mount
    still refuses it, and an ACL can refuse what the bits allow."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return "this user may not write there"
    probe = folder / f".la-trainer-probe-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        return f"a file cannot be written there ({error.strerror or error})"
    return ""


def check_output_folder(path: Path, option: str) -> Path:
    """Make ``path`` a folder this process can write, before any link opens or anything slow starts; the
    one check of every folder a command writes into (``--out``, ``--temp-dir``, ``TASK_DIR``).

    A missing folder is created with its missing parents (as ``mkdir -p``: ``--out runs/seed3`` needs
    no preparation). Refused, with exit code 2 and the path: a file where the folder (or one of its
    parents) should be, a folder that cannot be created, one this process cannot write into.
    ``option`` names where the path came from (``--out``), for the message.

    Raises:
        LaunchError: the folder is not usable; the message names it, why, and the fix.
    """

    def refuse(why: str, fix: str) -> LaunchError:
        return LaunchError(f"the output folder {str(path)!r} ({option}) cannot be used: {why}. {fix}")

    other = (
        f"or choose another folder with {option}" if option.startswith("-") else f"or choose another {option}"
    )
    blocking = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise refuse(f"{str(blocking)!r} is a file, not a folder", f"Move that file away {other}.")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise refuse(
            f"it cannot be created ({error.strerror or error}){_owners(path)}",
            f"{_container_fix()}Create it yourself with write permission for this user, {other}.",
        ) from None
    why = _writable(path)
    if why:
        raise refuse(
            f"{why}{_owners(path)}", f"{_container_fix()}Give this user write permission there, {other}."
        )
    return path


def _owners(path: Path) -> str:
    """Who this process is and who owns the folder (or its nearest existing parent), where uids exist:
    the usual cause is a folder made by another user (Docker makes a missing host folder as root)."""
    getuid = getattr(os, "getuid", None)
    if getuid is None:
        return ""  # Windows: no uids
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    try:
        owner = existing.stat().st_uid if existing is not None else None
    except OSError:
        owner = None
    where = f"; {str(existing)!r} belongs to uid {owner}" if owner is not None else ""
    return f" (this process runs as uid {getuid()}{where})"


def _container_fix() -> str:
    """In a container (the Docker image runs as its own user, uid 10001): run it as the host folder's owner,
    as the README's docker run does."""
    from trainer.system.container import in_container

    if not in_container():
        return ""
    return (
        'In Docker, run the container as the folder\'s owner: docker run --user "$(id -u):$(id -g)" ... '
        "(README, 'Socket'; the image's own user is uid 10001), or use a named volume (-v la-trainer-runs:/runs). "
    )


def new_task_folder(parent: Path, task_name: str) -> Path:
    """Create ``<parent>/<TaskName><N>`` for the smallest free N, as the engine numbers its shared-memory
    task folders (spec §1.2), and return it.

    Like the engine, a number is free when ``<TaskName><N>/Configs`` does not exist, and the ``Configs``
    folder is created: then the engine, numbering its own runs in the same folder, skips ours, and
    resume's search for earlier runs of a task (``trainer.training.checkpoint``) finds socket and offline runs
    as it finds the engine's.
    """
    parent.mkdir(parents=True, exist_ok=True)
    for task_id in range(_TASK_ID_LIMIT):
        folder = parent / f"{task_name}{task_id}"
        configs = folder / "Configs"
        if configs.exists():
            continue
        try:
            configs.mkdir(parents=True, exist_ok=False)
        except FileExistsError:
            continue  # another process took this number between the check and the mkdir
        return folder
    raise OSError(f"no free task number below {_TASK_ID_LIMIT} under {parent}")


def free_run_name(name: str, task_dir: Path | None, tensorboard_runs: Path | None = None) -> str:
    """``name``, or ``name_2``, ``name_3``, ...: the first that no earlier run of the project uses, so
    every run has a name of its own for its record folder, its TensorBoard folder and its MLflow run.

    The engine's run name carries the config's TimeStamp, which two runs share when they train from one
    export (offline, twice): each gets its own ``Offline<N>`` task folder, but without this both logged
    into one TensorBoard folder and two MLflow runs of one name. Taken: a run record of that name in
    ``task_dir`` or a sibling task folder (``<task_dir>/../*/runs/<name>``, the project's other runs),
    or a TensorBoard run folder of that name in ``tensorboard_runs``.
    """

    def taken(candidate: str) -> bool:
        if tensorboard_runs is not None and (tensorboard_runs / candidate).exists():
            return True
        if task_dir is None:
            return False
        if (task_dir / RUNS_DIR / candidate).exists():
            return True
        return any(task_dir.parent.glob(f"*/{RUNS_DIR}/{glob.escape(candidate)}"))

    chosen, suffix = name, 2
    while taken(chosen) and suffix < _TASK_ID_LIMIT:
        chosen, suffix = f"{name}_{suffix}", suffix + 1
    return chosen


def run_name(task_name: str, trainer_method: str, comm_type: str, time_stamp: str) -> str:
    """``<TaskName>_<TrainerMethod>_<CommType>_<TimeStamp>`` (spec §7.2), safe as one path component."""
    parts = [task_name or "Training", trainer_method or FLOW_MATCHING, str(comm_type or CommType.UNKNOWN)]
    if time_stamp:
        parts.append(time_stamp)
    return re.sub(r"[^A-Za-z0-9._-]+", "_", "_".join(parts))


@dataclass(frozen=True, slots=True)
class MetricsPoint:
    """One line of ``metrics.jsonl`` (also what the trackers log)."""

    iteration: int
    phase: str
    """``flow_matching`` or ``distillation``."""
    loss: float
    """Smoothed training loss of the phase (as on the progress line)."""
    iterations_per_second: float
    learning_rate: float
    sync_rounds: int
    elapsed_s: float

    def tracker_values(self) -> dict[str, float]:
        """The point as tracker scalars: each phase's loss under its own key."""
        return {
            f"loss/{self.phase}": self.loss,
            "iterations_per_second": self.iterations_per_second,
            "learning_rate": self.learning_rate,
            "sync_rounds": float(self.sync_rounds),
        }


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _finite_json(value: Any) -> Any:
    """``value`` with every non-finite float (nested in dicts and lists too) replaced by None."""
    if isinstance(value, float):
        return _finite_or_none(value)
    if isinstance(value, Mapping):
        return {key: _finite_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_json(item) for item in value]
    return value


def _iso(stamp: float) -> str:
    return datetime.fromtimestamp(stamp).astimezone().isoformat(timespec="seconds")


class RunRecord:
    """The record folder of one run. Every write is best effort: a record must never end a run. A full disk
    is one warning per outage (:class:`trainer.system.diskspace.OptionalWrite`); each later write tries
    again (the metrics lines of the outage are lost), and run.json's end is written in place when an
    atomic write cannot get the space. Any other write error stops the record with one warning."""

    def __init__(self, folder: Path, info: dict[str, Any], warn: Any = None) -> None:
        self.folder = folder
        self._info = info
        self._metrics: IO[str] | None = None
        self._warn = warn
        self._failed = False
        self._disk = OptionalWrite("the run record", "at its next line")

    @classmethod
    def create(
        cls,
        task_dir: Path,
        name: str,
        *,
        options: TrainerOptions,
        engine_config: Mapping[str, object],
        info: Mapping[str, object],
        warn: Any = None,
        option_sources: Mapping[str, str] | None = None,
    ) -> RunRecord:
        """Make ``<task_dir>/runs/<name>`` (``<name>_2``, ... when taken) and write the options (and, when
        known, where each came from: :meth:`trainer.settings.options.LoadedOptions.every_source`), the engine's
        config and the opening ``run.json``."""
        base = task_dir / RUNS_DIR
        base.mkdir(parents=True, exist_ok=True)
        folder = base / name
        suffix = 2
        while True:
            try:
                folder.mkdir(exist_ok=False)
                break
            except FileExistsError:
                folder = base / f"{name}_{suffix}"
                suffix += 1
        record = cls(
            folder,
            {
                "name": folder.name,
                "task_dir": str(task_dir),
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": _iso(time.time()),
                **info,
                "ended": None,
                "phase": "training",
                "exit_code": None,
            },
            warn,
        )
        record._write(OPTIONS_FILE, json.dumps(options_json(options), indent=2) + "\n")
        if option_sources is not None:
            record._write(OPTION_SOURCES_FILE, json.dumps(dict(option_sources), indent=2) + "\n")
        record._write(ENGINE_CONFIG_FILE, json.dumps(engine_config, indent=2) + "\n")
        record._write(RUN_FILE, json.dumps(record._info, indent=2) + "\n")
        return record

    def metrics(self, point: MetricsPoint) -> None:
        """Append one line to ``metrics.jsonl`` (flushed: a killed run keeps every line written)."""
        if self._failed:
            return
        try:
            if self._metrics is None:
                self._metrics = (self.folder / METRICS_FILE).open("a", encoding="utf-8")
            row = {k: (_finite_or_none(v) if isinstance(v, float) else v) for k, v in asdict(point).items()}
            self._metrics.write(json.dumps(row) + "\n")
            self._metrics.flush()
        except OSError as error:
            self._give_up(error)
            return
        self._disk.written()

    def line(self, row: Mapping[str, Any]) -> None:
        """Append another kind of line to ``metrics.jsonl`` (a held-out measurement: ``{"iteration": N,
        "heldout": {...}}``, :mod:`trainer.training.heldout`); non-finite numbers become null."""
        if self._failed:
            return
        try:
            if self._metrics is None:
                self._metrics = (self.folder / METRICS_FILE).open("a", encoding="utf-8")
            self._metrics.write(json.dumps(_finite_json(row)) + "\n")
            self._metrics.flush()
        except OSError as error:
            self._give_up(error)
            return
        self._disk.written()

    def note(self, key: str, value: object) -> None:
        """Keep ``value`` under ``key`` in run.json (written with the run's end)."""
        self._info[key] = value

    def json_file(self, name: str, value: Mapping[str, Any]) -> None:
        """Write ``value`` as the record's file ``name`` (replaced atomically)."""
        self._write(name, json.dumps(_finite_json(value)) + "\n")

    def networks(self, blobs: Mapping[int, bytes], folder: str = NETWORKS_DIR) -> list[Path]:
        """The final networks as ``Networks/network_<id>.bin`` (the engine's export naming); ``folder``:
        another folder of the record (``Networks/best``)."""
        paths = []
        for network_id, data in sorted(blobs.items()):
            path = self.folder / folder / f"network_{network_id}.bin"
            if self._write_bytes(path, data):
                paths.append(path)
        return paths

    def finish(
        self, *, phase: str, exit_code: int, iteration: int, loss: float, outputs: Iterable[Path] = ()
    ) -> None:
        """Close the metrics log and complete ``run.json`` with how the run ended."""
        if self._metrics is not None:
            try:
                self._metrics.close()
            except OSError:
                pass
            self._metrics = None
        self._info.update(
            ended=_iso(time.time()),
            phase=phase,
            exit_code=int(exit_code),
            iteration=iteration,
            loss=_finite_or_none(loss),
            outputs=[str(p) for p in outputs],
        )
        self._write(RUN_FILE, json.dumps(self._info, indent=2) + "\n", last_word=True)

    def _write(self, name: str, text: str, *, last_word: bool = False) -> None:
        self._write_bytes(self.folder / name, text.encode("utf-8"), last_word=last_word)

    def _write_bytes(self, path: Path, data: bytes, *, last_word: bool = False) -> bool:
        if self._failed:
            return False
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, data, durable=False)
        except OSError as error:
            # The end of run.json on a full disk: the atomic write's temporary file gets no space, but the
            # opening run.json's own page takes its last word (without it the run would look killed).
            if last_word and is_no_space(error) and path.is_file() and _rewritten(path, data):
                return True
            self._give_up(error)
            return False
        self._disk.written()
        return True

    def _give_up(self, error: OSError) -> None:
        if self._metrics is not None and is_no_space(error):
            # Buffered text that could not be written would be written again at the next flush, in the
            # middle of a later line: drop it with the handle, and reopen at the next line.
            with contextlib.suppress(OSError):
                self._metrics.close()
            self._metrics = None
        if self._disk.failed(self.folder, error):
            return  # warned (once per outage); the next write tries again
        self._failed = True
        if self._warn is not None:
            self._warn(f"warning: the run record in {self.folder} stopped: {error}; training goes on.")


def _rewritten(path: Path, data: bytes) -> bool:
    """:func:`rewrite_in_place`, True when it worked."""
    try:
        rewrite_in_place(path, data)
    except OSError:
        return False
    return True


_REPLACED = chr(0xFFFD)
"""What a byte that is not UTF-8 reads as (the replacement character; kept out of the source's literals,
which are ASCII)."""


def read_metrics(path: Path, *, unreadable: list[int] | None = None) -> list[dict[str, Any]]:
    """The points of a ``metrics.jsonl`` (a run folder or the file itself); a torn last line (a killed
    run) is skipped, and so is any line that is not JSON: bytes that are not UTF-8 (a damaged file, a
    full disk's torn write) are read as U+FFFD, so they spoil their line only. ``unreadable`` collects
    the 1-based numbers of the damaged lines skipped (not a torn last line).

    Raises:
        FileNotFoundError: no metrics log there.
    """
    file = path / METRICS_FILE if path.is_dir() else path
    points = []
    with file.open(encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                point = json.loads(line)
            except ValueError:
                # A killed run's torn last line (no newline) is expected; anything else is damage.
                if unreadable is not None and line.strip() and (line.endswith("\n") or _REPLACED in line):
                    unreadable.append(number)
                continue
            if isinstance(point, dict) and isinstance(point.get("iteration"), int):
                points.append(point)
    return points


def find_run_folders(path: Path) -> list[Path]:
    """Run folders (those holding ``run.json``) at or below ``path``, newest first (by ``run.json``'s
    modification time). ``path`` may be a run folder, a task folder, the engine's ``LearningCore`` folder
    or the project's ``Intermediate`` folder (only ``runs/`` folders are searched below it, so a large
    tree such as the engine's ``PipInstall`` is not walked)."""
    if (path / RUN_FILE).is_file():
        return [path]
    patterns = (f"{RUNS_DIR}/*/{RUN_FILE}", f"*/{RUNS_DIR}/*/{RUN_FILE}", f"*/*/{RUNS_DIR}/*/{RUN_FILE}")
    files = {file for pattern in patterns for file in path.glob(pattern) if file.is_file()}
    return [file.parent for file in sorted(files, key=lambda f: f.stat().st_mtime, reverse=True)]


class RunLog:
    """What a run leaves behind besides its networks, for the training story: the run record
    (:class:`RunRecord`, unless the ``run_record`` option is off) and the trackers
    (:class:`trainer.records.trackers.Trackers`), fed the same :class:`MetricsPoint` every ``TRACK_EVERY``
    iterations. Created empty before the config arrives; :meth:`open` once the run's name is known."""

    def __init__(self) -> None:
        self.record: RunRecord | None = None
        self.trackers: Trackers | None = None
        self.name = ""
        self._clock = time.perf_counter()
        self._started = self._clock
        self._last_iteration = 0
        self._last_point: MetricsPoint | None = None
        self._closed = False

    @property
    def folder(self) -> Path | None:
        return self.record.folder if self.record is not None else None

    def open(
        self,
        *,
        task_dir: Path | None,
        name: str,
        options: TrainerOptions,
        config: TrainerConfig,
        engine_config: Mapping[str, object],
        info: Mapping[str, object],
        first_iteration: int,
        option_sources: Mapping[str, str] | None = None,
    ) -> None:
        from trainer.records.trackers import Trackers, tensorboard_runs
        from trainer.system.console import log

        # One name for the record, the TensorBoard folder and the MLflow run: the engine's, unless an
        # earlier run of the project took it (free_run_name); then the record folder's, as made.
        self.name = free_run_name(name, task_dir, tensorboard_runs(config, task_dir))
        if task_dir is not None and options.run_record:
            try:
                self.record = RunRecord.create(
                    task_dir,
                    self.name,
                    options=options,
                    engine_config=engine_config,
                    info=info,
                    warn=log,
                    option_sources=option_sources,
                )
                self.name = self.record.folder.name
                log(f"la-trainer: run record in {self.record.folder}")
            except OSError as error:
                log(f"warning: cannot create the run record under {task_dir} ({error}); training without it.")
        self.trackers = Trackers.for_run(config, options, self.name, task_dir)
        self._clock = self._started = time.perf_counter()
        self._last_iteration = first_iteration

    def point(
        self,
        iteration: int,
        phase: str,
        loss: float,
        learning_rate: float,
        sync_rounds: int,
        *,
        when: float | None = None,
    ) -> None:
        """One metrics point at ``iteration``; it/s over the iterations since the previous point.
        ``when``: the ``time.perf_counter()`` of that iteration, for a point written later (its loss was
        read from the device with others, :mod:`trainer.session.points`); default now."""
        now = time.perf_counter() if when is None else when
        elapsed = now - self._clock
        rate = (iteration - self._last_iteration) / elapsed if elapsed > 0 else 0.0
        self._clock, self._last_iteration = now, iteration
        point = MetricsPoint(
            iteration=iteration,
            phase=phase,
            loss=float(loss),
            iterations_per_second=rate,
            learning_rate=float(learning_rate),
            sync_rounds=sync_rounds,
            elapsed_s=now - self._started,
        )
        self._last_point = point
        if self.record is not None:
            self.record.metrics(point)
        if self.trackers is not None:
            self.trackers.scalars(iteration, point.tracker_values())

    def heldout(
        self, iteration: int, record: Mapping[str, Any], scalars: Mapping[str, float], *, best: bool
    ) -> None:
        """One held-out measurement (:mod:`trainer.training.heldout`): a ``{"iteration", "heldout", "best"}`` line
        in ``metrics.jsonl`` (``best``: the lowest flow loss so far) and ``scalars`` to the trackers."""
        if self.record is not None:
            self.record.line({"iteration": iteration, "heldout": dict(record), "best": best})
        if self.trackers is not None:
            self.trackers.scalars(iteration, scalars)

    def threads(self, iteration: int, choice: Mapping[str, Any]) -> None:
        """A thread-count measurement (:mod:`trainer.training.threads`): a ``{"iteration", "threads"}`` line in
        ``metrics.jsonl``; run.json keeps the last one as ``threads``."""
        if self.record is not None:
            self.record.line({"iteration": iteration, "threads": dict(choice)})
            self.record.note("threads", dict(choice))

    def recipe(
        self,
        iteration: int | None,
        look: Mapping[str, Any] | None,
        scalars: Mapping[str, float],
        summary: Mapping[str, Any],
    ) -> None:
        """The recipe (:mod:`trainer.training.recipes`): run.json keeps ``summary`` as ``recipe``; a pilot's
        look is also a ``{"iteration", "recipe"}`` line in ``metrics.jsonl`` and ``scalars`` to the
        trackers (``recipe/<name>/selection``)."""
        if self.record is not None:
            if look is not None and iteration is not None:
                self.record.line({"iteration": iteration, "recipe": dict(look)})
            self.record.note("recipe", dict(summary))
        if self.trackers is not None and scalars and iteration is not None:
            self.trackers.scalars(iteration, scalars)

    def heldout_actions(self, value: Mapping[str, Any]) -> None:
        """Demonstrated and sampled held-out actions of the last measurement (``heldout-actions.json``),
        for ``la-trainer report``'s picture."""
        if self.record is not None:
            self.record.json_file(HELDOUT_ACTIONS_FILE, value)

    def best_networks(self, blobs: Mapping[int, bytes]) -> list[Path]:
        """Keep the networks of the best held-out measurement in ``Networks/best`` (:mod:`trainer.training.heldout`)."""
        return self.record.networks(blobs, f"{NETWORKS_DIR}/best") if self.record is not None else []

    def networks(self, blobs: Mapping[int, bytes]) -> list[Path]:
        """Keep the final networks in the record (and hand them to the trackers as artefacts)."""
        paths = self.record.networks(blobs) if self.record is not None else []
        if self.trackers is not None:
            self.trackers.artifacts(paths)
        return paths

    def finish(
        self, *, phase: str, exit_code: int, iteration: int, loss: float, outputs: Iterable[Path] = ()
    ) -> None:
        """Complete run.json and close the trackers (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self.record is not None:
            self.record.finish(
                phase=phase, exit_code=exit_code, iteration=iteration, loss=loss, outputs=outputs
            )
        if self.trackers is not None:
            self.trackers.close()

    def abort(self, error: BaseException) -> None:
        """The run ends with ``error``: record it as failed with its documented exit code (as interrupted
        for a repeated Ctrl-C after the state was saved, exit code 8)."""
        from trainer.errors import exit_code_for
        from trainer.exitcodes import ExitCode

        last = self._last_point
        code = exit_code_for(error)
        self.finish(
            phase="interrupted" if code is ExitCode.INTERRUPTED else "failed",
            exit_code=int(code),
            iteration=last.iteration if last is not None else self._last_iteration,
            loss=last.loss if last is not None else math.nan,
        )
