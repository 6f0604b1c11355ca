"""la-trainer install-engine against a fake engine and project tree (trainer.commands.install_engine).

The engine's Python is played by this interpreter (it has torch, numpy, msgpack and click), pip by a
stand-in that records its arguments (tests run offline); the real pip run is in docs/unreal-install.md.
The installed shim then runs whole engine sessions: a flow-matching one trains, a BehaviorCloning one
reaches the engine's own train.py.

Install and undo are transactions (stage, then swap by renames): the failure tests make the N-th rename
fail for every N a swap does, and a deletion fail the way a loaded ``.pyd`` does on Windows, and compare
the whole tree, byte for byte, with what it was.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from emulator.launch import ENGINE_STAND_IN_EXIT, EngineLayout
from trainer.commands.install_engine import (
    ASIDE_PREFIX,
    ENGINE_PINS,
    ENGINE_SCRIPT,
    INSTALL_FOLDER,
    engine_python,
    engine_requirements,
    find_engine_dir,
    install,
    install_engine_command,
    leftovers,
    uninstall,
)
from trainer.dropin.handover import DROPIN_MARKER, is_la_trainer_script
from trainer.errors import LaunchError

REPO = Path(__file__).resolve().parents[2]


class RecordingPip:
    """pip --target's footprint: per requirement a dist-info folder (which also says which install wrote
    it: ``tag``). No package folder: the real msgpack and posix_ipc must stay importable."""

    def __init__(self, tag: str = "first") -> None:
        self.calls: list[tuple[Path, list[str], Path]] = []
        self.tag = tag

    def __call__(self, python: Path, requirements: Sequence[str], target: Path) -> None:
        self.calls.append((python, list(requirements), target))
        for requirement in requirements:
            name, _, version = requirement.partition("==")
            (target / f"{name}-{version}.dist-info").mkdir(parents=True, exist_ok=True)
            (target / f"{name}-{version}.dist-info" / "RECORD").write_text("")
            (target / f"{name}-{version}.dist-info" / "INSTALLED_BY").write_text(self.tag)


def fake_probe(python: Path, site_packages: Path) -> dict[str, str]:
    """The probe's answer without starting a Python that imports torch (the real probe runs in the tests
    above and in the slow session test)."""
    return {"python": "3.11.8", "torch": "2.5.1", "numpy": "1.26.4", "trainer.dropin": "ok"}


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (hidden staging and aside folders included), with its bytes."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _installed(tmp_path: Path, tag: str = "first") -> tuple[Path, Path]:
    project, engine = _project(tmp_path)
    install(project, engine_dir=engine, python=Path(sys.executable), pip=RecordingPip(tag), probe=fake_probe)
    return project, engine


class FailingRename:
    """``os.replace`` that raises PermissionError (as Windows does for a folder holding an open file) on
    the calls numbered in ``failing`` (0-based) and renames on every other one."""

    def __init__(self, failing: Callable[[int], bool]) -> None:
        self.failing = failing
        self.calls = 0
        self.real = os.replace

    def __call__(self, source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        number = self.calls
        self.calls += 1
        if self.failing(number):
            raise PermissionError(13, "Permission denied", str(source))
        self.real(source, target)


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
    assert python == Path(sys.executable) and target.name == "site-packages"
    assert target.parent.parent == root  # staged beside the installation, then swapped in
    # The tested versions, not the newest pip finds.
    assert requirements == ["msgpack==1.2.4", "click==8.5.1", "posix_ipc==1.3.2"]
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


def _pins(path: Path) -> dict[str, str]:
    """``name==version`` lines of a pip constraints file (markers and comments dropped)."""
    pins = {}
    for line in path.read_text().splitlines():
        requirement = line.split("#", 1)[0].split(";", 1)[0].strip()
        if "==" in requirement:
            name, _, version = requirement.partition("==")
            pins[name.strip().lower().replace("-", "_")] = version.strip()
    return pins


def test_the_engine_pins_are_the_versions_ci_tests() -> None:
    """install-engine's pins live in the module (a wheel carries it, not constraints.txt); both files CI
    installs from must say the same for every package install-engine puts beside the engine's torch."""
    tested = _pins(REPO / "constraints.txt")
    engine_env = _pins(REPO / "constraints-engine.txt")
    assert set(ENGINE_PINS) <= set(tested), set(ENGINE_PINS) - set(tested)
    for name, version in ENGINE_PINS.items():
        assert tested[name] == version, (name, tested[name], version)
        assert engine_env.get(name, version) == version, (name, engine_env[name], version)
    assert engine_requirements("win32") == ["msgpack==1.2.4", "click==8.5.1", "colorama==0.4.6"]
    assert engine_requirements("linux") == ["msgpack==1.2.4", "click==8.5.1", "posix_ipc==1.3.2"]


def test_undo_removes_the_bytecode_runs_wrote_and_keeps_the_users_files(tmp_path: Path) -> None:
    project, engine = _installed(tmp_path)
    root = project / INSTALL_FOLDER
    written = [
        root / "site-packages" / "trainer" / "__pycache__" / "dropin.cpython-311.pyc",
        root / "site-packages" / "msgpack" / "__pycache__" / "__init__.cpython-311.pyc",
        root / "Engine" / "Plugins" / "Experimental" / "LearningCore" / "Content" / "Python" / "stray.pyc",
    ]
    for path in written:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\x00bytecode")
    mine = [root / "notes.txt", root / "site-packages" / "my_helper.py"]
    for path in mine:
        path.write_text("mine")

    removed = uninstall(project)

    assert set(written) <= set(removed)
    assert sorted(p for p in root.rglob("*") if p.is_file()) == sorted(mine)
    assert all(p.read_text() == "mine" for p in mine)
    assert not any("__pycache__" in p.parts for p in root.rglob("*"))
    (root / "notes.txt").unlink()
    (root / "site-packages" / "my_helper.py").unlink()
    (root / "site-packages").rmdir()
    install(project, engine_dir=engine, python=Path(sys.executable), pip=RecordingPip(), probe=fake_probe)
    uninstall(project)
    assert not root.exists()  # nothing of the user's left: the folder goes too


def test_a_reinstall_keeps_the_users_files_in_the_installed_folders(tmp_path: Path) -> None:
    project, engine = _installed(tmp_path)
    root = project / INSTALL_FOLDER
    (root / "site-packages" / "my_helper.py").write_text("mine")
    (root / "site-packages" / "trainer" / "__pycache__").mkdir()
    (root / "site-packages" / "trainer" / "__pycache__" / "old.pyc").write_bytes(b"old")
    install(
        project, engine_dir=engine, python=Path(sys.executable), pip=RecordingPip("second"), probe=fake_probe
    )
    assert (root / "site-packages" / "my_helper.py").read_text() == "mine"
    assert not (root / "site-packages" / "trainer" / "__pycache__").exists()  # stale bytecode goes
    assert (root / "site-packages" / "click-8.5.1.dist-info" / "INSTALLED_BY").read_text() == "second"


def _rename_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, action: str) -> int:
    """How many renames a successful re-install (or undo) of a whole installation does."""
    project, engine = _installed(tmp_path / "count")
    counter = FailingRename(lambda number: False)
    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", counter)
        if action == "install":
            install(
                project,
                engine_dir=engine,
                python=Path(sys.executable),
                pip=RecordingPip("second"),
                probe=fake_probe,
            )
        else:
            uninstall(project)
    return counter.calls


@pytest.mark.parametrize("action", ["install", "undo"])
def test_a_failed_rename_at_any_step_leaves_the_previous_installation_whole(
    action: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Re-install over an installation (and undo it) with the N-th rename failing, for every N the swap
    does: each time the error names the path and the fix, and the tree is byte for byte what it was,
    without leftovers."""
    count = _rename_count(tmp_path, monkeypatch, action)
    assert count == (6 if action == "install" else 3)  # 3 entries aside (+ 3 new ones in)
    project, engine = _installed(tmp_path / "project")
    root = project / INSTALL_FOLDER
    (root / "site-packages" / "trainer" / "__pycache__").mkdir()
    (root / "site-packages" / "trainer" / "__pycache__" / "run.pyc").write_bytes(b"a run's bytecode")
    before = _tree(root)
    for failing in range(count):
        rename = FailingRename(failing.__eq__)
        with monkeypatch.context() as patch, pytest.raises(LaunchError) as raised:
            patch.setattr(os, "replace", rename)
            if action == "install":
                install(
                    project,
                    engine_dir=engine,
                    python=Path(sys.executable),
                    pip=RecordingPip("second"),
                    probe=fake_probe,
                )
            else:
                uninstall(project)
        message = str(raised.value)
        assert "Permission denied" in message and "Close the Unreal editor" in message, message
        assert "previous installation is unchanged" in message
        assert _tree(root) == before, failing
        assert leftovers(project) == []
    uninstall(project)  # and the installation still undoes
    assert not root.exists()


def test_when_the_rollback_fails_too_the_message_says_where_the_previous_installation_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project, engine = _installed(tmp_path)
    root = project / INSTALL_FOLDER
    before = _tree(root)
    with monkeypatch.context() as patch, pytest.raises(LaunchError) as raised:
        patch.setattr(os, "replace", FailingRename(lambda number: number >= 3))  # the first swap-in on
        install(
            project,
            engine_dir=engine,
            python=Path(sys.executable),
            pip=RecordingPip("second"),
            probe=fake_probe,
        )
    (aside,) = [p for p in leftovers(project) if p.name.startswith(ASIDE_PREFIX)]
    assert str(aside) in str(raised.value) and "move them back" in str(raised.value)
    # Nothing was lost: the old entries are whole in the folder the message names.
    assert _tree(aside) == before


def test_an_old_file_that_cannot_be_deleted_does_not_break_the_swap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Windows: a running trainer's loaded .pyd cannot be deleted, but the folder holding it is renamed
    aside. The new installation is complete; the aside folder is reported and removed by the next run."""
    project, engine = _installed(tmp_path)
    root = project / INSTALL_FOLDER
    real_rmtree = shutil.rmtree

    def rmtree_holding_a_pyd(path: str | os.PathLike[str], *args: object, **kwargs: object) -> None:
        if Path(path).name.startswith(ASIDE_PREFIX):
            raise PermissionError(
                13, "Access is denied", str(Path(path) / "site-packages/msgpack/_cmsgpack.pyd")
            )
        real_rmtree(path, *args, **kwargs)  # type: ignore[arg-type]

    import trainer.commands.install_engine as module

    monkeypatch.setattr(module, "pip_install", RecordingPip("second"))
    monkeypatch.setattr(module, "_probe", fake_probe)
    from trainer.commands.cli import main

    with monkeypatch.context() as patch:
        patch.setattr(shutil, "rmtree", rmtree_holding_a_pyd)
        result = CliRunner().invoke(
            main, ["install-engine", str(project), "--engine", str(engine), "--python", sys.executable]
        )
    assert result.exit_code == 0, result.output
    (stuck,) = leftovers(project)
    assert stuck.name.startswith(ASIDE_PREFIX) and str(stuck) in result.output
    record = json.loads((root / "install.json").read_text())
    owned = {
        p.relative_to(root).as_posix()
        for n in ("site-packages", "Engine")
        for p in (root / n).rglob("*")
        if p.is_file()
    }
    assert owned | {"install.json"} == set(record["files"])
    assert (root / "site-packages" / "msgpack-1.2.4.dist-info" / "INSTALLED_BY").read_text() == "second"
    # The next run, with the file released, removes the leftover.
    result = CliRunner().invoke(main, ["install-engine", str(project), "--undo"])
    assert result.exit_code == 0, result.output
    assert leftovers(project) == [] and not root.exists()


def test_a_failure_while_staging_leaves_the_previous_installation_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project, engine = _installed(tmp_path)
    root = project / INSTALL_FOLDER
    before = _tree(root)

    def failing_pip(python: Path, requirements: Sequence[str], target: Path) -> None:
        RecordingPip("second")(python, requirements, target)
        raise LaunchError("pip could not install msgpack==1.2.4 (no network)")

    with pytest.raises(LaunchError, match="no network"):
        install(project, engine_dir=engine, python=Path(sys.executable), pip=failing_pip, probe=fake_probe)
    assert _tree(root) == before

    def failing_copy(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(root / "x" / "trainer"))

    with monkeypatch.context() as patch, pytest.raises(LaunchError, match="writable") as raised:
        patch.setattr(shutil, "copytree", failing_copy)
        install(
            project,
            engine_dir=engine,
            python=Path(sys.executable),
            pip=RecordingPip("second"),
            probe=fake_probe,
        )
    assert "x/trainer" in str(raised.value) and "unchanged" in str(raised.value)
    assert _tree(root) == before


def _cli_install(project: Path, engine: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    import trainer.commands.install_engine as module
    from trainer.commands.cli import main

    monkeypatch.setattr(module, "pip_install", RecordingPip("second"))
    monkeypatch.setattr(module, "_probe", fake_probe)
    return CliRunner().invoke(
        main, ["install-engine", str(project), "--engine", str(engine), "--python", sys.executable]
    )


@pytest.mark.parametrize("failing", [0, 1], ids=["staging-folder", "aside-folder"])
def test_a_project_it_cannot_write_to_ends_with_exit_2_and_the_fix(
    failing: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The PermissionError a read-only project raises (injected: CI runs as root, which writes anyway),
    when the staging folder is made and when the aside folder is (after staging, before the swap)."""
    project, engine = _installed(tmp_path)
    root = project / INSTALL_FOLDER
    before = _tree(root)
    real_mkdtemp = tempfile.mkdtemp
    calls: list[int] = []

    def read_only(*args: Any, **kwargs: Any) -> str:
        calls.append(len(calls))
        if len(calls) - 1 == failing:
            raise PermissionError(13, "Permission denied", str(root / "new-folder"))
        return str(real_mkdtemp(*args, **kwargs))

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    result = _cli_install(project, engine, monkeypatch)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and f"cannot write in {root / 'new-folder'}" in result.output
    assert "writable" in result.output and "unchanged" in result.output
    assert _tree(root) == before  # byte for byte, and no staging folder left


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes read-only folders")
def test_a_read_only_project_ends_with_exit_2_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer.commands.cli import main

    project, engine = _installed(tmp_path)
    root = project / INSTALL_FOLDER
    before = _tree(root)
    root.chmod(0o555)
    try:
        result = _cli_install(project, engine, monkeypatch)
        undone = CliRunner().invoke(main, ["install-engine", str(project), "--undo"])
    finally:
        root.chmod(0o755)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "writable" in result.output
    assert undone.exit_code == 2 and "writable" in undone.output, undone.output
    assert _tree(root) == before


def test_the_command_prints_what_it_did_and_how_to_undo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trainer.commands.install_engine as module

    project, engine = _project(tmp_path)
    monkeypatch.setattr(module, "pip_install", RecordingPip())
    result = CliRunner().invoke(
        install_engine_command, [str(project), "--engine", str(engine), "--python", sys.executable]
    )
    assert result.exit_code == 0, result.output
    assert f'-LearningAgentsEnginePath="{project / INSTALL_FOLDER / "Engine"}"' in result.output
    assert "EditorEngineRelativePath" in result.output and "--undo" in result.output
    assert "absolute path" in result.output and "folder picker" in result.output
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
