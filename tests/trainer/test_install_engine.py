"""la-trainer install-engine against a fake engine and project tree (trainer.install_engine).

The engine's Python is played by this interpreter (it has torch, numpy, msgpack and click), pip by a
stand-in that records its arguments (tests run offline); the real pip run is in docs/unreal-install.md.
The installed shim then runs whole engine sessions: a flow-matching one trains, a BehaviorCloning one
reaches the engine's own train.py.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from emulator.launch import ENGINE_STAND_IN_EXIT, EngineLayout
from trainer.errors import LaunchError
from trainer.handover import DROPIN_MARKER, is_la_trainer_script
from trainer.install_engine import (
    ENGINE_SCRIPT,
    INSTALL_FOLDER,
    engine_python,
    find_engine_dir,
    install,
    install_engine_command,
    uninstall,
)


class RecordingPip:
    def __init__(self) -> None:
        self.calls: list[tuple[Path, list[str], Path]] = []

    def __call__(self, python: Path, requirements: Sequence[str], target: Path) -> None:
        self.calls.append((python, list(requirements), target))
        for name in requirements:  # what pip --target leaves: the package and its dist-info
            (target / f"{name}-0.0.dist-info").mkdir(parents=True, exist_ok=True)
            (target / f"{name}-0.0.dist-info" / "RECORD").write_text("")


def _project(tmp_path: Path) -> tuple[Path, Path]:
    """A project and the engine folder of a fake engine tree (with the engine's train.py stand-in)."""
    layout = EngineLayout.create(tmp_path / "ue")
    return layout.project_dir, layout.engine_dir


def test_the_engine_python_path_is_the_one_the_engine_runs(tmp_path: Path) -> None:
    assert (
        engine_python(tmp_path, platform="win32") == tmp_path / "Intermediate/PipInstall/Scripts/python.exe"
    )
    assert engine_python(tmp_path, platform="linux") == tmp_path / "Intermediate/PipInstall/bin/python3"


def test_the_engine_is_found_from_the_pip_install_venv(tmp_path: Path) -> None:
    project, engine = _project(tmp_path)
    venv = project / "Intermediate" / "PipInstall"
    venv.mkdir(parents=True)
    home = engine / "Binaries" / "ThirdParty" / "Python3" / "Linux" / "bin"
    (venv / "pyvenv.cfg").write_text(
        f"home = {home}\ninclude-system-site-packages = false\nversion = 3.11.8\n"
    )
    assert find_engine_dir(project) == engine
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    assert find_engine_dir(project) is None


def test_install_writes_only_inside_the_project_and_undo_removes_exactly_that(tmp_path: Path) -> None:
    project, engine = _project(tmp_path)
    engine_files = sorted(p for p in engine.rglob("*") if p.is_file())
    engine_bytes = {p: p.read_bytes() for p in engine_files}
    pip = RecordingPip()
    done = install(project, engine_dir=engine, python=Path(sys.executable), pip=pip)
    root = project / INSTALL_FOLDER

    ((python, requirements, target),) = pip.calls
    assert python == Path(sys.executable) and target == root / "site-packages"
    assert requirements[:2] == ["msgpack", "click"]
    assert done.shim == root / "Engine" / Path(*ENGINE_SCRIPT)
    assert is_la_trainer_script(done.shim) and DROPIN_MARKER in done.shim.read_text()
    assert (root / "site-packages" / "trainer" / "dropin" / "train.py").is_file()
    assert not (root / "site-packages" / "emulator").exists()  # the engine does not need the game side
    assert done.versions["trainer.dropin"] == "ok" and done.versions["torch"]
    # The engine tree is exactly as it was.
    assert sorted(p for p in engine.rglob("*") if p.is_file()) == engine_files
    assert all(p.read_bytes() == engine_bytes[p] for p in engine_files)

    record = json.loads((root / "install.json").read_text())
    assert record["engine_train_py"] == str(engine / Path(*ENGINE_SCRIPT))
    listed = set(record["files"])
    written = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    assert listed == written

    keep = root / "my-notes.txt"  # not ours: undo must leave it
    keep.write_text("mine")
    removed = uninstall(project)
    assert {p.relative_to(root.resolve()).as_posix() for p in removed} == listed
    assert [p for p in root.rglob("*") if p.is_file()] == [keep]


def test_install_refuses_a_project_without_the_engine_python(tmp_path: Path) -> None:
    project, engine = _project(tmp_path)
    with pytest.raises(LaunchError, match="PipInstall"):
        install(project, engine_dir=engine, pip=RecordingPip())


def test_install_refuses_an_engine_without_learning_core(tmp_path: Path) -> None:
    project, _ = _project(tmp_path)
    with pytest.raises(LaunchError, match="LearningCore"):
        install(project, engine_dir=tmp_path, python=Path(sys.executable), pip=RecordingPip())


def test_undo_without_an_install_says_so(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="nothing to undo"):
        uninstall(tmp_path)


def test_the_command_prints_what_it_did_and_how_to_undo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trainer.install_engine as module

    project, engine = _project(tmp_path)
    monkeypatch.setattr(module, "pip_install", RecordingPip())
    result = CliRunner().invoke(
        install_engine_command, [str(project), "--engine", str(engine), "--python", sys.executable]
    )
    assert result.exit_code == 0, result.output
    assert f'-LearningAgentsEnginePath="{project / INSTALL_FOLDER / "Engine"}"' in result.output
    assert "EditorEngineRelativePath" in result.output and "--undo" in result.output
    assert result.output.isascii()
    undone = CliRunner().invoke(install_engine_command, [str(project), "--undo"])
    assert undone.exit_code == 0 and "-LearningAgentsEnginePath" in undone.output
    assert not (project / INSTALL_FOLDER).exists()


@pytest.mark.integration
@pytest.mark.slow
def test_the_installed_shim_trains_flow_matching_and_hands_other_methods_to_the_engine(
    tmp_path: Path,
) -> None:
    """Whole sessions through the shim, with the emulator as the engine: the package is imported from
    LaTrainer/site-packages (the copy, not this checkout), flow matching trains to Complete, and a
    BehaviorCloning config reaches the engine's own train.py (the fake tree's stand-in, exit 99)."""
    from emulator.game import ShmGame
    from emulator.launch import TrainerProcess, make_task_dir, shared_memory_command
    from emulator.session import EngineTask, Mode, build_session_config, run_engine_session
    from tests.support.sessions import SETTINGS

    work = tmp_path / "session"
    layout = EngineLayout.create(work / "engine")  # the tree run_engine_session uses below
    done = install(
        layout.project_dir, engine_dir=layout.engine_dir, python=Path(sys.executable), pip=RecordingPip()
    )
    copy = done.site_packages / "trainer" / "dropin" / "__init__.py"
    copy.write_text(
        copy.read_text() + "\nprint('la-trainer imported from LaTrainer/site-packages', flush=True)\n"
    )
    task = EngineTask.benchmark("bimodal", size=200, seed=0)
    record = run_engine_session(Mode.SHM, task, work, replace(SETTINGS, script=done.shim))
    record.check()
    assert record.exit_code == 0 and record.completed, record.describe()
    assert any("imported from LaTrainer/site-packages" in line for line in record.log), record.describe()

    config, _ = build_session_config(task, SETTINGS, str(layout.intermediate_dir))
    config = replace(config, trainer=replace(config.trainer, trainer_method="BehaviorCloning"))
    task_dir = make_task_dir(layout.intermediate_dir)
    game = ShmGame.create(task_dir / "Configs", timeout=60.0)
    proc = TrainerProcess(
        shared_memory_command(layout, "Training", task_dir, game.controls_guid, script=done.shim),
        cwd=layout.root,
    )
    try:
        game.process_alive = proc.alive
        game.begin(config)
        code = proc.wait(60.0)
        output = proc.output()
    finally:
        proc.close()
        game.close()
    assert code == ENGINE_STAND_IN_EXIT, output
    assert "'BehaviorCloning'" in output and "stand-in for the engine's own train.py: it ran" in output
