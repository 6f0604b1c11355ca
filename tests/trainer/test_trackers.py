"""UseTensorBoard / UseMLflow: where runs go, what is logged, and that a missing or failing tracker never
ends a run (trainer/trackers.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from protocol.config import TrainerConfig
from trainer.trackers import Trackers, run_name


class FakeWriter:
    instances: ClassVar[list[FakeWriter]] = []

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        self.points: list[tuple[str, float, int]] = []
        self.closed = False
        FakeWriter.instances.append(self)

    def add_scalar(self, key: str, value: float, step: int) -> None:
        self.points.append((key, value, step))

    def close(self) -> None:
        self.closed = True


class FakeMlflow:
    def __init__(self) -> None:
        self.uri: str | None = None
        self.run_name: str | None = None
        self.metrics: list[tuple[dict[str, float], int]] = []
        self.ended = False

    def set_tracking_uri(self, uri: str) -> None:
        self.uri = uri

    def start_run(self, run_name: str) -> object:
        self.run_name = run_name
        return object()

    def log_metrics(self, values: dict[str, float], step: int) -> None:
        self.metrics.append((dict(values), step))

    def end_run(self) -> None:
        self.ended = True


def importer(modules: dict[str, Any]) -> Any:
    return lambda name: modules.get(name)


CONFIG = TrainerConfig(time_stamp="2026-12-02_17-40-123", use_tensorboard=True, use_mlflow=True)


def test_run_name_is_the_engines_pattern_and_one_path_component() -> None:
    assert (
        run_name(CONFIG, "Training0", "SharedMemory")
        == "Training0_FlowMatching_SharedMemory_2026-12-02_17-40-123"
    )
    odd = replace(CONFIG, time_stamp="a/b c", trainer_method="")
    assert run_name(odd, "", "Socket") == "Training_FlowMatching_Socket_a_b_c"


def test_missing_packages_warn_once_each_and_train_on(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trackers = Trackers.for_run(CONFIG, tmp_path, "Socket", import_module=importer({}))
    assert trackers.names == []
    trackers.scalars(100, {"loss": 1.0})
    trackers.close()
    err = capsys.readouterr().out
    assert err.count("UseTensorBoard is true but the 'tensorboard' package is not installed") == 1
    assert err.count("UseMLflow is true but the 'mlflow' package is not installed") == 1


def test_tensorboard_folder_follows_temp_directory_then_task_dir(tmp_path: Path) -> None:
    FakeWriter.instances.clear()
    tb = SimpleNamespace(SummaryWriter=FakeWriter)
    config = replace(CONFIG, use_mlflow=False, temp_directory=str(tmp_path / "Temp"))
    trackers = Trackers.for_run(
        config,
        tmp_path / "Training3",
        "SharedMemory",
        import_module=importer({"torch.utils.tensorboard": tb}),
    )
    assert trackers.names == ["TensorBoard"]
    expected = (
        tmp_path
        / "Temp"
        / "TensorBoard"
        / "runs"
        / "Training3_FlowMatching_SharedMemory_2026-12-02_17-40-123"
    )
    assert FakeWriter.instances[-1].log_dir == str(expected) and expected.is_dir()
    trackers.scalars(100, {"loss": 0.5, "sync_rounds": 2.0})
    trackers.close()
    assert FakeWriter.instances[-1].points == [("loss", 0.5, 100), ("sync_rounds", 2.0, 100)]
    assert FakeWriter.instances[-1].closed
    # The socket sends no TempDirectory: the task folder holds the runs.
    Trackers.for_run(
        replace(config, temp_directory=None),
        tmp_path / "Training4",
        "Socket",
        import_module=importer({"torch.utils.tensorboard": tb}),
    )
    assert FakeWriter.instances[-1].log_dir.startswith(str(tmp_path / "Training4" / "TensorBoard" / "runs"))


def test_mlflow_gets_uri_run_name_and_metrics(tmp_path: Path) -> None:
    fake = FakeMlflow()
    config = replace(CONFIG, use_tensorboard=False, mlflow_tracking_uri="http://mlflow:5000")
    trackers = Trackers.for_run(
        config, tmp_path / "Training0", "Files", import_module=importer({"mlflow": fake})
    )
    trackers.scalars(200, {"loss": 0.25})
    trackers.close()
    assert fake.uri == "http://mlflow:5000"
    assert fake.run_name == "Training0_FlowMatching_Files_2026-12-02_17-40-123"
    assert fake.metrics == [({"loss": 0.25}, 200)] and fake.ended


def test_a_failing_tracker_is_dropped_with_one_warning(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    class Broken(FakeWriter):
        def add_scalar(self, key: str, value: float, step: int) -> None:
            raise OSError("No space left on device")

    fake = FakeMlflow()
    trackers = Trackers.for_run(
        CONFIG,
        tmp_path,
        "Socket",
        import_module=importer(
            {"torch.utils.tensorboard": SimpleNamespace(SummaryWriter=Broken), "mlflow": fake}
        ),
    )
    for step in (100, 200, 300):
        trackers.scalars(step, {"loss": 1.0})
    assert trackers.names == ["MLflow"]
    assert [step for _, step in fake.metrics] == [100, 200, 300]
    assert capsys.readouterr().out.count("TensorBoard failed (No space left on device)") == 1


def test_nothing_asked_nothing_opened(tmp_path: Path) -> None:
    calls: list[str] = []
    trackers = Trackers.for_run(
        TrainerConfig(), tmp_path, "Socket", import_module=lambda name: calls.append(name)
    )
    assert trackers.names == [] and calls == []
