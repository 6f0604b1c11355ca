"""TensorBoard / MLflow: switched on from Unreal (UseTensorBoard / UseMLflow) or from our side (--tensorboard,
--mlflow URI); where runs go; what is logged (losses per phase, it/s, learning rate, the configuration,
the final networks); and that a missing or failing tracker never ends a run (trainer/records/trackers.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from protocol.config import TrainerConfig
from trainer.records.runrecord import MetricsPoint, RunLog, free_run_name, run_name
from trainer.records.trackers import Trackers
from trainer.settings.options import TrainerOptions


class FakeWriter:
    instances: ClassVar[list[FakeWriter]] = []

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        self.points: list[tuple[str, float, int]] = []
        self.texts: list[tuple[str, str]] = []
        self.closed = False
        FakeWriter.instances.append(self)

    def add_scalar(self, key: str, value: float, step: int) -> None:
        self.points.append((key, value, step))

    def add_text(self, key: str, text: str, step: int) -> None:
        self.texts.append((key, text))

    def close(self) -> None:
        self.closed = True


class FakeMlflow:
    def __init__(self) -> None:
        self.uri: str | None = None
        self.run_name: str | None = None
        self.metrics: list[tuple[dict[str, float], int]] = []
        self.params: dict[str, str] = {}
        self.artifacts: list[tuple[str, str]] = []
        self.ended = False

    def set_tracking_uri(self, uri: str) -> None:
        self.uri = uri

    def start_run(self, run_name: str) -> object:
        self.run_name = run_name
        return object()

    def log_metrics(self, values: dict[str, float], step: int) -> None:
        self.metrics.append((dict(values), step))

    def log_params(self, values: dict[str, str]) -> None:
        self.params.update(values)

    def log_artifact(self, path: str, artifact_path: str) -> None:
        self.artifacts.append((path, artifact_path))

    def end_run(self) -> None:
        self.ended = True


def importer(modules: dict[str, Any]) -> Any:
    return lambda name: modules.get(name)


CONFIG = TrainerConfig(time_stamp="2026-12-02_17-40-123", use_tensorboard=True, use_mlflow=True)
NAME = "Training_FlowMatching_SharedMemory_2026-12-02_17-40-123"
OFF = TrainerOptions()


def test_run_name_is_the_engines_pattern_and_one_path_component() -> None:
    assert run_name("Training", "FlowMatching", "SharedMemory", CONFIG.time_stamp) == NAME
    assert run_name("", "", "Socket", "a/b c") == "Training_FlowMatching_Socket_a_b_c"


def test_missing_packages_warn_once_each_and_train_on(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trackers = Trackers.for_run(CONFIG, OFF, NAME, tmp_path, import_module=importer({}))
    assert trackers.names == []
    trackers.scalars(100, {"loss/flow_matching": 1.0})
    trackers.close()
    out = capsys.readouterr().out
    assert out.count("UseTensorBoard is true but the 'tensorboard' package is not installed") == 1
    assert out.count("UseMLflow is true but the 'mlflow' package is not installed") == 1
    assert "mlflow-skinny" in out


def test_tensorboard_folder_follows_temp_directory_then_task_dir(tmp_path: Path) -> None:
    FakeWriter.instances.clear()
    tb = SimpleNamespace(SummaryWriter=FakeWriter)
    config = replace(CONFIG, use_mlflow=False, temp_directory=str(tmp_path / "Temp"))
    trackers = Trackers.for_run(
        config, OFF, NAME, tmp_path / "Training3", import_module=importer({"torch.utils.tensorboard": tb})
    )
    assert trackers.names == ["TensorBoard"]
    expected = tmp_path / "Temp" / "TensorBoard" / "runs" / NAME
    assert FakeWriter.instances[-1].log_dir == str(expected) and expected.is_dir()
    point = MetricsPoint(100, "flow_matching", 0.5, 1234.0, 1e-4, 2, 0.1)
    trackers.scalars(100, point.tracker_values())
    trackers.close()
    assert FakeWriter.instances[-1].points == [
        ("loss/flow_matching", 0.5, 100),
        ("iterations_per_second", 1234.0, 100),
        ("learning_rate", 1e-4, 100),
        ("sync_rounds", 2.0, 100),
    ]
    assert FakeWriter.instances[-1].closed
    # The configuration went in once as a text table.
    assert [key for key, _ in FakeWriter.instances[-1].texts] == ["config"]
    assert "| engine.FlowMatchingTrainingSettings.IterationNum |" in FakeWriter.instances[-1].texts[0][1]
    # The socket sends no TempDirectory: the task folder holds the runs.
    Trackers.for_run(
        replace(config, temp_directory=None),
        OFF,
        NAME,
        tmp_path / "Training4",
        import_module=importer({"torch.utils.tensorboard": tb}),
    )
    assert FakeWriter.instances[-1].log_dir.startswith(str(tmp_path / "Training4" / "TensorBoard" / "runs"))


def test_the_two_phases_log_under_separate_keys() -> None:
    fm = MetricsPoint(100, "flow_matching", 0.5, 10.0, 1e-3, 0, 1.0).tracker_values()
    distill = MetricsPoint(200, "distillation", 0.02, 10.0, 1e-3, 0, 2.0).tracker_values()
    assert "loss/flow_matching" in fm and "loss/distillation" not in fm
    assert "loss/distillation" in distill and "loss/flow_matching" not in distill


def test_mlflow_gets_uri_run_name_metrics_params_and_networks(tmp_path: Path) -> None:
    fake = FakeMlflow()
    config = replace(CONFIG, use_tensorboard=False, mlflow_tracking_uri="http://mlflow:5000")
    trackers = Trackers.for_run(config, OFF, NAME, tmp_path, import_module=importer({"mlflow": fake}))
    trackers.scalars(200, {"loss/flow_matching": 0.25})
    network = tmp_path / "network_0.bin"
    network.write_bytes(b"x")
    trackers.artifacts([network])
    trackers.close()
    assert fake.uri == "http://mlflow:5000"
    assert fake.run_name == NAME
    assert fake.metrics == [({"loss/flow_matching": 0.25}, 200)] and fake.ended
    assert fake.params["option.time_distribution"] == str(OFF.time_distribution)
    assert fake.params["engine.FlowMatchingTrainingSettings.BatchSize"] == str(config.training.batch_size)
    assert fake.artifacts == [(str(network), "networks")]


@pytest.mark.parametrize(
    ("option", "engine_uri", "expected_uri"),
    [("http://ours:5000", "", "http://ours:5000"), ("http://ours:5000", "http://theirs", "http://ours:5000")],
)
def test_our_options_switch_trackers_on_without_the_engine(
    tmp_path: Path, option: str, engine_uri: str, expected_uri: str
) -> None:
    FakeWriter.instances.clear()
    fake = FakeMlflow()
    config = TrainerConfig(time_stamp="x", mlflow_tracking_uri=engine_uri)  # engine: both off
    options = TrainerOptions(tensorboard=True, mlflow=option)
    modules = {"torch.utils.tensorboard": SimpleNamespace(SummaryWriter=FakeWriter), "mlflow": fake}
    trackers = Trackers.for_run(config, options, NAME, tmp_path, import_module=importer(modules))
    assert trackers.names == ["TensorBoard", "MLflow"]
    assert fake.uri == expected_uri


def test_mlflow_default_leaves_the_uri_to_mlflow(tmp_path: Path) -> None:
    fake = FakeMlflow()
    trackers = Trackers.for_run(
        TrainerConfig(),
        TrainerOptions(mlflow="default"),
        NAME,
        tmp_path,
        import_module=importer({"mlflow": fake}),
    )
    assert trackers.names == ["MLflow"] and fake.uri is None


def test_a_failing_tracker_is_dropped_with_one_warning(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    class Broken(FakeWriter):
        def add_scalar(self, key: str, value: float, step: int) -> None:
            raise OSError("No space left on device")

    fake = FakeMlflow()
    trackers = Trackers.for_run(
        CONFIG,
        OFF,
        NAME,
        tmp_path,
        import_module=importer(
            {"torch.utils.tensorboard": SimpleNamespace(SummaryWriter=Broken), "mlflow": fake}
        ),
    )
    for step in (100, 200, 300):
        trackers.scalars(step, {"loss/flow_matching": 1.0})
    assert trackers.names == ["MLflow"]
    assert [step for _, step in fake.metrics] == [100, 200, 300]
    assert capsys.readouterr().out.count("TensorBoard failed to log metrics (No space left on device)") == 1


def test_nothing_asked_nothing_opened(tmp_path: Path) -> None:
    calls: list[str] = []
    trackers = Trackers.for_run(
        TrainerConfig(), OFF, NAME, tmp_path, import_module=lambda name: calls.append(name)
    )
    assert trackers.names == [] and calls == []


def _open_run(task_dir: Path, config: TrainerConfig, options: TrainerOptions = OFF) -> RunLog:
    runlog = RunLog()
    runlog.open(
        task_dir=task_dir,
        name=run_name("Offline", "FlowMatching", "Files", config.time_stamp),
        options=options,
        config=config,
        engine_config={},
        info={},
        first_iteration=0,
    )
    return runlog


def test_two_runs_of_one_export_get_names_of_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two offline runs of one export: one TimeStamp (the export's), two Offline<N> task folders beside
    each other. Each run's record, TensorBoard folder and MLflow run carry its own name, the record
    folder's (before: both were Offline_FlowMatching_Files_<stamp>, one TensorBoard folder)."""
    named: list[str] = []

    def for_run(config: Any, options: Any, name: str, task_dir: Any, **_: Any) -> Trackers:
        named.append(name)
        return Trackers([])

    monkeypatch.setattr(Trackers, "for_run", for_run)  # looked up on the class: a plain function
    config = replace(CONFIG, temp_directory=str(tmp_path))  # the export's IntermediatePath: one TB root
    first = _open_run(tmp_path / "Offline0", config)
    second = _open_run(tmp_path / "Offline1", config)
    assert first.folder is not None and second.folder is not None
    assert first.name == first.folder.name and second.name == second.folder.name
    assert first.name != second.name
    assert named == [first.name, second.name]
    assert second.name == first.name + "_2"


def test_a_name_that_a_tensorboard_run_already_has_is_not_reused(tmp_path: Path) -> None:
    """Without a run record (run_record off) the TensorBoard folder alone shows the name is taken."""
    config = replace(CONFIG, temp_directory=str(tmp_path))
    taken = run_name("Offline", "FlowMatching", "Files", config.time_stamp)
    (tmp_path / "TensorBoard" / "runs" / taken).mkdir(parents=True)
    runlog = _open_run(tmp_path / "Offline0", config, replace(OFF, run_record=False))
    assert runlog.record is None
    assert runlog.name == taken + "_2"
    assert free_run_name("fresh", tmp_path / "Offline0", tmp_path / "TensorBoard" / "runs") == "fresh"
