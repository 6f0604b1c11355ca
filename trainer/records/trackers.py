"""Experiment trackers: TensorBoard and MLflow, switched on from Unreal or from our side.

Either side switches each one on: the engine's trainer settings ``UseTensorBoard`` / ``UseMLflow`` (with
``MLflowTrackingUri``, spec §4.1), or our options ``tensorboard`` / ``mlflow`` (``--tensorboard``,
``--mlflow URI``, ``LA_TRAINER_TENSORBOARD=1``, ``LA_TRAINER_MLFLOW=URI`` or ``la-trainer.json``), so a
game whose settings are baked in can still be tracked.

Both packages are optional (extras ``tensorboard``, ``mlflow``; ``mlflow-skinny`` is enough for writing):
when one is asked for but not installed, the trainer says so once and trains on. A tracker that fails
while training (an MLflow server gone) is switched off with one warning: a tracker must never end a run.
A full disk is one warning per outage and the tracker is tried again at its next point
(:class:`trainer.system.diskspace.OptionalWrite`).

Where things go (spec §7.2, the engine's own trainer):

* TensorBoard: ``<TempDirectory>/TensorBoard/runs/<run name>``. [INF] ``TempDirectory`` is not sent over
  the socket: then ``<task_dir>/TensorBoard/runs/...``, and with no task folder, ``./TensorBoard/runs/...``.
* MLflow: the tracking URI (ours when given, else ``MLflowTrackingUri``, else MLflow's own default), one
  run named like the TensorBoard folder.

What is logged (what people compare runs by): every :data:`TRACK_EVERY` iterations and at the end, the
smoothed loss of each phase under its own key (``loss/flow_matching``, ``loss/distillation``: different
objectives on different scales), ``iterations_per_second``, ``learning_rate`` and ``sync_rounds``
(:class:`trainer.records.runrecord.MetricsPoint`); with a held-out set, at each of its measurements,
``heldout/flow_loss``, ``heldout/energy_score``, ``heldout/coverage`` ... (:mod:`trainer.training.heldout`); once, the
configuration as parameters (our options and the engine's training settings); at the end, the final
networks as artefacts (MLflow).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from protocol.config import TrainerConfig
from trainer.settings.options import TrainerOptions
from trainer.system.console import log
from trainer.system.diskspace import OptionalWrite

__all__ = ["TRACK_EVERY", "Trackers", "tensorboard_runs"]

TRACK_EVERY = 100
"""Iterations between two tracker points (and metrics-log lines): often enough for a curve, rare enough
to cost nothing measurable."""

MLFLOW_DEFAULT = "default"
"""``--mlflow default``: MLflow's own default tracking location (``MLFLOW_TRACKING_URI`` or ``./mlruns``)."""


def tensorboard_runs(config: TrainerConfig, task_dir: Path | None) -> Path:
    """The folder that holds the TensorBoard runs: ``<TempDirectory>/TensorBoard/runs`` (the engine's
    IntermediatePath, where its own trainer writes them), else under the task folder, else the working
    folder. Every run of a project shares it, so a run name must be free there
    (:func:`trainer.records.runrecord.free_run_name`)."""
    if config.temp_directory:
        root = Path(config.temp_directory)
    else:
        root = task_dir if task_dir is not None else Path.cwd()
    return root / "TensorBoard" / "runs"


class _Tracker(Protocol):
    name: str

    def scalars(self, step: int, values: Mapping[str, float]) -> None: ...
    def params(self, values: Mapping[str, str]) -> None: ...
    def artifacts(self, paths: Sequence[Path]) -> None: ...
    def close(self) -> None: ...


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

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        for key, value in values.items():
            self._writer.add_scalar(key, value, step)

    def params(self, values: Mapping[str, str]) -> None:
        # TensorBoard's text plugin renders markdown: one table row per setting.
        rows = "\n".join(f"| {key} | {value} |" for key, value in sorted(values.items()))
        self._writer.add_text("config", f"| setting | value |\n|---|---|\n{rows}", 0)

    def artifacts(self, paths: Sequence[Path]) -> None:
        """TensorBoard has no artefacts; the final networks are in the run record (trainer.records.runrecord)."""

    def close(self) -> None:
        self._writer.close()


class _MLflow:
    name = "MLflow"

    def __init__(self, mlflow: Any, uri: str, name: str) -> None:
        if uri:
            mlflow.set_tracking_uri(uri)
        self._mlflow = mlflow
        self._run = mlflow.start_run(run_name=name)

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self._mlflow.log_metrics(dict(values), step=step)

    def params(self, values: Mapping[str, str]) -> None:
        self._mlflow.log_params(dict(values))

    def artifacts(self, paths: Sequence[Path]) -> None:
        for path in paths:
            self._mlflow.log_artifact(str(path), artifact_path="networks")

    def close(self) -> None:
        self._mlflow.end_run()


def _flat_params(options: TrainerOptions, config: TrainerConfig) -> dict[str, str]:
    """Our options as ``option.<name>`` and the engine's training settings as ``engine.<Key>``, as text."""
    from dataclasses import fields

    from protocol.config import trainer_config_to_json

    values = {f"option.{f.name}": str(getattr(options, f.name)) for f in fields(options)}

    def walk(prefix: str, obj: object) -> None:
        if isinstance(obj, dict):
            for key, value in obj.items():
                walk(f"{prefix}.{key}" if prefix else str(key), value)
        else:
            text = json.dumps(obj) if not isinstance(obj, str) else obj
            values[f"engine.{prefix}"] = text[:500]  # MLflow's parameter value limit in older servers

    walk("", trainer_config_to_json(config))
    return values


class Trackers:
    """The trackers this run asks for (possibly none); cheap no-ops when empty."""

    def __init__(self, trackers: list[_Tracker]) -> None:
        self._trackers = trackers
        self._disks = {id(t): OptionalWrite(f"{t.name}'s logs", "at its next point") for t in trackers}

    @property
    def names(self) -> list[str]:
        return [t.name for t in self._trackers]

    @classmethod
    def for_run(
        cls,
        config: TrainerConfig,
        options: TrainerOptions,
        name: str,
        task_dir: Path | None,
        *,
        import_module: Any = _optional,
    ) -> Trackers:
        """Open what the engine's settings or our options ask for; warn once for each one that cannot
        open. ``name``: this run's own name (the run record folder's, :func:`trainer.records.runrecord.free_run_name`:
        never one an earlier run of the project used, so two runs never share a TensorBoard folder or an
        MLflow run name). ``import_module``: how an
        optional package is imported (tests pass a fake)."""
        trackers: list[_Tracker] = []
        if config.use_tensorboard or options.tensorboard:
            asked = "UseTensorBoard is true" if config.use_tensorboard else "--tensorboard is on"
            module = import_module("torch.utils.tensorboard")
            if module is None:
                log(
                    f"warning: {asked} but the 'tensorboard' package is not installed "
                    "(pip install tensorboard, or the la-trainer[tensorboard] extra); training without TensorBoard."
                )
            else:
                folder = tensorboard_runs(config, task_dir) / name
                try:
                    trackers.append(_TensorBoard(module.SummaryWriter, folder))
                    log(f"la-trainer: TensorBoard logs in {folder} (tensorboard --logdir {folder.parent})")
                except Exception as error:  # an optional tracker must not end the run
                    log(f"warning: TensorBoard could not open {folder} ({error}); training without it.")
        if config.use_mlflow or options.mlflow:
            asked = f"--mlflow {options.mlflow}" if options.mlflow else "UseMLflow is true"
            uri = options.mlflow if options.mlflow else config.mlflow_tracking_uri
            uri = "" if uri == MLFLOW_DEFAULT else uri
            module = import_module("mlflow")
            if module is None:
                log(
                    f"warning: {asked} but the 'mlflow' package is not installed (pip install mlflow-skinny, "
                    "or the la-trainer[mlflow] extra); training without MLflow."
                )
            else:
                try:
                    trackers.append(_MLflow(module, uri, name))
                    log(f"la-trainer: MLflow run {name!r} ({uri or 'default tracking URI'})")
                except Exception as error:
                    log(f"warning: MLflow could not start a run ({error}); training without it.")
        tracking = cls(trackers)
        tracking.params(_flat_params(options, config))
        return tracking

    def _each(self, what: str, call: Any) -> None:
        for tracker in list(self._trackers):
            disk = self._disks.setdefault(
                id(tracker), OptionalWrite(f"{tracker.name}'s logs", "at its next point")
            )
            try:
                call(tracker)
            except Exception as error:
                # A full disk: keep the tracker (warned once per outage) and try again at the next point;
                # anything else switches it off.
                if disk.failed(getattr(tracker, "folder", Path.cwd()), error):
                    continue
                log(f"warning: {tracker.name} failed to log {what} ({error}); training on without it.")
                self._trackers.remove(tracker)
                continue
            disk.written()

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        """Log ``values`` at ``step`` to every tracker; one that fails is dropped with one warning."""
        self._each("metrics", lambda t: t.scalars(step, values))

    def params(self, values: Mapping[str, str]) -> None:
        """The run's configuration, once."""
        self._each("parameters", lambda t: t.params(values))

    def artifacts(self, paths: Sequence[Path]) -> None:
        """Files to keep with the run (the final networks)."""
        if paths:
            self._each("artefacts", lambda t: t.artifacts(paths))

    def close(self) -> None:
        for tracker in self._trackers:
            try:
                tracker.close()
            except Exception as error:
                log(f"warning: closing {tracker.name} failed ({error}).")
        self._trackers = []
