"""Experiment trackers the engine's config can ask for: ``UseTensorBoard`` and ``UseMLflow`` (spec §4.1, §7.2).

Both packages are optional (neither is a dependency of la-trainer): when the config asks for one that is
not installed, the trainer says so once and trains on. A tracker that fails while training (disk full, an
MLflow server gone) is switched off with one warning: a tracker must never end a run.

Where things go (spec §7.2, the engine's own trainer):

* TensorBoard: ``<TempDirectory>/TensorBoard/runs/<TaskName>_<TrainerMethod>_<CommType>_<TimeStamp>``.
  [INF] ``TempDirectory`` is not sent over the socket: then ``<task_dir>/TensorBoard/runs/...``, and with
  no task folder either, ``./TensorBoard/runs/...``. ``TaskName`` is the task folder's name (the engine
  names it after the task, ``Training0`` by default).
* MLflow: the tracking URI ``MLflowTrackingUri`` when not empty (else MLflow's own default), one run
  named like the TensorBoard folder.

Logged every :data:`TRACK_EVERY` iterations and at the end (not every iteration, so tracking costs nothing
measurable): ``loss`` (the smoothed training loss, as on the progress line) and ``sync_rounds``.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from protocol.config import TrainerConfig
from trainer.progress import log

__all__ = ["TRACK_EVERY", "Trackers", "run_name"]

TRACK_EVERY = 100
"""Iterations between two tracker points."""


class _Tracker(Protocol):
    name: str

    def scalars(self, step: int, values: dict[str, float]) -> None: ...
    def close(self) -> None: ...


def run_name(config: TrainerConfig, task_name: str, comm_type: str) -> str:
    """``<TaskName>_<TrainerMethod>_<CommType>_<TimeStamp>``, safe as one path component."""
    parts = [task_name or "Training", config.trainer_method or "FlowMatching", comm_type or "Unknown"]
    if config.time_stamp:
        parts.append(config.time_stamp)
    return re.sub(r"[^A-Za-z0-9._-]+", "_", "_".join(parts))


def _optional(module: str) -> ModuleType | None:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


class _TensorBoard:
    name = "TensorBoard"

    def __init__(self, writer_class: Any, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self._writer = writer_class(log_dir=str(folder))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self._writer.add_scalar(key, value, step)

    def close(self) -> None:
        self._writer.close()


class _MLflow:
    name = "MLflow"

    def __init__(self, mlflow: Any, uri: str, name: str) -> None:
        if uri:
            mlflow.set_tracking_uri(uri)
        self._mlflow = mlflow
        self._run = mlflow.start_run(run_name=name)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self._mlflow.log_metrics(values, step=step)

    def close(self) -> None:
        self._mlflow.end_run()


class Trackers:
    """The trackers this run's config asks for (possibly none); cheap no-ops when empty."""

    def __init__(self, trackers: list[_Tracker]) -> None:
        self._trackers = trackers

    @property
    def names(self) -> list[str]:
        return [t.name for t in self._trackers]

    @classmethod
    def for_run(
        cls,
        config: TrainerConfig,
        task_dir: Path | None,
        comm_type: str,
        *,
        import_module: Any = _optional,
    ) -> Trackers:
        """Open what ``UseTensorBoard`` / ``UseMLflow`` ask for; warn once for each one that cannot open.

        ``import_module``: how an optional package is imported (tests pass a fake)."""
        name = run_name(config, task_dir.name if task_dir is not None else "", comm_type)
        trackers: list[_Tracker] = []
        if config.use_tensorboard:
            module = import_module("torch.utils.tensorboard")
            if module is None:
                log(
                    "warning: UseTensorBoard is true but the 'tensorboard' package is not installed "
                    "(pip install tensorboard); training without TensorBoard."
                )
            else:
                if config.temp_directory:
                    root = Path(config.temp_directory)
                else:
                    root = task_dir if task_dir is not None else Path.cwd()
                folder = root / "TensorBoard" / "runs" / name
                try:
                    trackers.append(_TensorBoard(module.SummaryWriter, folder))
                    log(f"la-trainer: TensorBoard logs in {folder}")
                except Exception as error:  # an optional tracker must not end the run
                    log(f"warning: TensorBoard could not open {folder} ({error}); training without it.")
        if config.use_mlflow:
            module = import_module("mlflow")
            if module is None:
                log(
                    "warning: UseMLflow is true but the 'mlflow' package is not installed (pip install "
                    "mlflow); training without MLflow."
                )
            else:
                try:
                    trackers.append(_MLflow(module, config.mlflow_tracking_uri, name))
                    log(
                        f"la-trainer: MLflow run {name!r} ({config.mlflow_tracking_uri or 'default tracking URI'})"
                    )
                except Exception as error:
                    log(f"warning: MLflow could not start a run ({error}); training without it.")
        return cls(trackers)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Log ``values`` at ``step`` to every tracker; one that fails is dropped with one warning."""
        for tracker in list(self._trackers):
            try:
                tracker.scalars(step, values)
            except Exception as error:
                log(f"warning: {tracker.name} failed ({error}); training on without it.")
                self._trackers.remove(tracker)

    def close(self) -> None:
        for tracker in self._trackers:
            try:
                tracker.close()
            except Exception as error:
                log(f"warning: closing {tracker.name} failed ({error}).")
        self._trackers = []
