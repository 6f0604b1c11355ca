"""``la-trainer install-engine PROJECT``: make an Unreal project's engine run la-trainer, without touching
engine files, in a way that survives an engine update and can be undone.

Where the engine looks (UE 5.8, spec §1.1, §11 item 1): it runs
``<Project>/Intermediate/PipInstall/{Scripts/python.exe | bin/python3}`` on
``<EnginePath>/Plugins/Experimental/LearningCore/Content/Python/train.py``, where ``EnginePath`` is
``-LearningAgentsEnginePath=`` from the command line, else the process settings' ``EditorEngineRelativePath``
(default the engine folder) or ``NonEditorEngineRelativePath`` in a packaged game. ``EnginePath`` is used
for nothing but that script's location. So everything is written inside the project:

* ``<Project>/LaTrainer/site-packages/``: la-trainer (its ``protocol`` and ``trainer`` packages, copied
  from this installation) and its small dependencies (msgpack, click, posix_ipc on POSIX), installed with
  ``<engine python> -m pip install --no-deps --target``: the engine's torch and numpy are used as they are
  and never touched. The engine deletes and rebuilds ``PipInstall`` when its Python changes; this folder
  is not inside it.
* ``<Project>/LaTrainer/Engine/Plugins/Experimental/LearningCore/Content/Python/train.py``: a shim that puts
  that folder on ``sys.path``, records where the engine's own ``train.py`` is (for the hand-over of other
  trainers, :mod:`trainer.handover`) and runs la-trainer's drop-in; if la-trainer cannot be imported (the
  engine's Python minor version changed, a file is missing) it says why and runs the engine's own script.
* ``<Project>/LaTrainer/install.json``: what was installed where, with every file written (``--undo``
  removes exactly those).

The user then passes ``-LearningAgentsEnginePath="<Project>/LaTrainer/Engine"`` to the editor or game
(every trainer of the project goes through la-trainer; other methods are handed to the engine's script),
or sets ``EditorEngineRelativePath``/``NonEditorEngineRelativePath`` in the flow-matching call site's
process settings (only that call site; it is saved with the project and survives engine updates).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import click

from trainer import __version__
from trainer.errors import LaunchError
from trainer.handover import DROPIN_MARKER

__all__ = [
    "INSTALL_FOLDER",
    "Installation",
    "PipRunner",
    "engine_python",
    "find_engine_dir",
    "install",
    "install_engine_command",
    "uninstall",
]

INSTALL_FOLDER = "LaTrainer"
"""The folder inside the project that holds everything install-engine writes."""
RECORD_NAME = "install.json"
RECORD_VERSION = 1
ENGINE_SCRIPT = ("Plugins", "Experimental", "LearningCore", "Content", "Python", "train.py")
"""The engine's ``train.py`` below an engine folder (spec §1.1, 5.8)."""
DEPENDENCIES = ("msgpack", "click")
"""la-trainer's own dependencies besides torch and numpy (pyproject.toml), installed next to it."""
POSIX_DEPENDENCIES = ("posix_ipc",)
WINDOWS_DEPENDENCIES = ("colorama",)
"""click's own dependency on Windows (installed with --no-deps, so named here)."""
PACKAGES = ("protocol", "trainer")
"""What the engine runs: the codecs and the trainer. The game-side emulator is not needed in an engine."""
PROBE = (
    "import json, sys\n"
    "sys.path.insert(0, sys.argv[1])\n"
    "out = {'python': '%d.%d.%d' % sys.version_info[:3]}\n"
    "for name in ('torch', 'numpy', 'msgpack', 'click', 'trainer.dropin'):\n"
    "    try:\n"
    "        module = __import__(name, fromlist=['_'])\n"
    "        out[name] = getattr(module, '__version__', 'ok')\n"
    "    except Exception as error:\n"
    "        out[name] = 'missing: %s' % error\n"
    "print(json.dumps(out))\n"
)
"""Run with the engine's Python: what it can import once the target folder is on its path."""

PipRunner = Callable[[Path, Sequence[str], Path], None]
"""``(engine python, requirements, target folder)``: installs the requirements into the folder."""


def engine_python(project: Path, *, platform: str | None = None) -> Path:
    """``<Project>/Intermediate/PipInstall/Scripts/python.exe`` (Windows) or ``.../bin/python3`` (spec §1.1)."""
    tail = ("Scripts", "python.exe") if (platform or sys.platform) == "win32" else ("bin", "python3")
    return project.joinpath("Intermediate", "PipInstall", *tail)


def find_engine_dir(project: Path) -> Path | None:
    """The engine folder, from the PipInstall venv's ``pyvenv.cfg``: its ``home`` is the engine's bundled
    Python, ``<Engine>/Binaries/ThirdParty/Python3/<Platform>`` (Linux: ``.../<Platform>/bin``)."""
    cfg = project / "Intermediate" / "PipInstall" / "pyvenv.cfg"
    try:
        lines = cfg.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() == "home":
            home = Path(value.strip())
            for parent in (home, *home.parents):
                if parent.name == "Binaries" and parent.parent.joinpath(*ENGINE_SCRIPT).is_file():
                    return parent.parent
    return None


def pip_install(python: Path, requirements: Sequence[str], target: Path) -> None:
    """The real :data:`PipRunner`: ``<python> -m pip install --no-deps --target <target> <requirements>``."""
    command = [str(python), "-m", "pip", "install", "--no-deps", "--upgrade", "--target", str(target)]
    done = subprocess.run([*command, *requirements], capture_output=True, text=True)
    if done.returncode != 0:
        raise LaunchError(
            f"pip could not install {' '.join(requirements)} with the engine's Python {python} "
            f"(exit code {done.returncode}):\n{done.stdout[-1500:]}{done.stderr[-1500:]}"
        )


@dataclass(frozen=True, slots=True)
class Installation:
    """What :func:`install` did (the content of ``install.json``)."""

    project: Path
    engine_dir: Path
    engine_train_py: Path
    python: Path
    engine_path: Path
    """The folder to pass as ``-LearningAgentsEnginePath`` (holds the shim)."""
    shim: Path
    site_packages: Path
    files: tuple[str, ...]
    """Every file written, relative to ``<Project>/LaTrainer``."""
    versions: dict[str, str]

    def record(self) -> dict[str, object]:
        return {
            "format": "la-trainer install-engine",
            "version": RECORD_VERSION,
            "la_trainer": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "project": str(self.project),
            "engine_dir": str(self.engine_dir),
            "engine_train_py": str(self.engine_train_py),
            "python": str(self.python),
            "engine_path": str(self.engine_path),
            "versions": self.versions,
            "files": list(self.files),
        }


def _shim_text(engine_train_py: Path) -> str:
    """The ``train.py`` the engine runs: paths relative to itself (the project may move), the engine's
    script absolute (used only if it still exists; else trainer.handover finds it from --nne-cpu-path)."""
    return f'''"""{DROPIN_MARKER}: written by `la-trainer install-engine` (la-trainer {__version__}).

The engine runs this file because -LearningAgentsEnginePath (or the call site's EngineRelativePath) points
at the LaTrainer/Engine folder above it. Remove with `la-trainer install-engine <Project> --undo`.
"""

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SITE_PACKAGES = HERE.parents[5] / "site-packages"
ENGINE_TRAIN_PY = Path({str(engine_train_py)!r})

if ENGINE_TRAIN_PY.is_file():
    os.environ.setdefault("LA_TRAINER_ENGINE_TRAIN_PY", str(ENGINE_TRAIN_PY))
if sys.path and sys.path[0] and Path(sys.path[0]).resolve() == HERE:
    sys.path[0] = str(SITE_PACKAGES)
else:
    sys.path.insert(0, str(SITE_PACKAGES))

try:
    from trainer.dropin import main
except Exception as error:  # la-trainer cannot run on this Python: the engine's trainer still can
    print(
        f"la-trainer: cannot start ({{type(error).__name__}}: {{error}}); running the engine's own "
        f"train.py instead. Run `la-trainer install-engine` again for this project (the engine's Python "
        f"may have changed).",
        flush=True,
    )
    command = [sys.executable, str(ENGINE_TRAIN_PY), *sys.argv[1:]]
    if sys.platform == "win32":
        sys.exit(subprocess.call(command, stdin=subprocess.DEVNULL, stdout=1, stderr=2))
    os.execv(sys.executable, command)

if __name__ == "__main__":
    sys.exit(main())
'''


def _probe(python: Path, site_packages: Path) -> dict[str, str]:
    done = subprocess.run(
        [str(python), "-c", PROBE, str(site_packages)], capture_output=True, text=True, timeout=300
    )
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise LaunchError(
            f"the engine's Python {python} could not be run (exit code {done.returncode}): {done.stderr[-800:]}"
        ) from None
    return {str(k): str(v) for k, v in found.items()}


def _copy_packages(site_packages: Path) -> None:
    """This installation's own packages into the target (a checkout, a wheel and a target install alike)."""
    import importlib

    for name in PACKAGES:
        origin = importlib.import_module(name).__file__
        if origin is None:
            raise LaunchError(f"the package {name!r} of this installation has no files to copy")
        source = Path(origin).resolve().parent
        destination = site_packages / name
        if destination.exists():
            shutil.rmtree(destination)
        shutil.copytree(source, destination, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def _listing(root: Path, folder: Path) -> list[str]:
    return sorted(str(p.relative_to(root).as_posix()) for p in folder.rglob("*") if p.is_file())


def install(
    project: Path,
    *,
    engine_dir: Path | None = None,
    python: Path | None = None,
    pip: PipRunner = pip_install,
    platform: str | None = None,
) -> Installation:
    """Install into ``project`` (see the module docstring); a previous installation is replaced."""
    project = project.resolve()
    if not project.is_dir():
        raise LaunchError(f"the project folder {project} does not exist")
    python = python or engine_python(project, platform=platform)
    if not python.is_file():
        raise LaunchError(
            f"the engine's Python {python} does not exist. Open the project in the editor once with the "
            "Learning Agents plugins enabled: PythonFoundationPackages creates that environment "
            "(Intermediate/PipInstall) and PythonMLPackages installs torch into it. Then run this again."
        )
    engine_dir = (engine_dir.resolve() if engine_dir is not None else None) or find_engine_dir(project)
    if engine_dir is None:
        raise LaunchError(
            f"cannot tell which engine the project uses (no engine path in {project}/Intermediate/PipInstall/"
            "pyvenv.cfg); pass --engine <Engine folder> (the folder that holds Binaries and Plugins)."
        )
    engine_train_py = engine_dir.joinpath(*ENGINE_SCRIPT)
    if not engine_train_py.is_file():
        raise LaunchError(
            f"{engine_train_py} does not exist: --engine must be the engine's 'Engine' folder of a UE 5.8 "
            "install with the LearningCore plugin."
        )
    root = project / INSTALL_FOLDER
    if (root / RECORD_NAME).is_file():
        uninstall(project, quiet=True)
    site_packages = root / "site-packages"
    site_packages.mkdir(parents=True, exist_ok=True)
    extra = POSIX_DEPENDENCIES if (platform or sys.platform) != "win32" else WINDOWS_DEPENDENCIES
    pip(python, [*DEPENDENCIES, *extra], site_packages)
    _copy_packages(site_packages)
    engine_path = root / "Engine"
    shim = engine_path.joinpath(*ENGINE_SCRIPT)
    shim.parent.mkdir(parents=True, exist_ok=True)
    shim.write_text(_shim_text(engine_train_py), encoding="utf-8")
    versions = _probe(python, site_packages)
    files = (*_listing(root, site_packages), *_listing(root, engine_path), RECORD_NAME)
    done = Installation(
        project, engine_dir, engine_train_py, python, engine_path, shim, site_packages, files, versions
    )
    (root / RECORD_NAME).write_text(json.dumps(done.record(), indent=1), encoding="utf-8")
    return done


def uninstall(project: Path, *, quiet: bool = False) -> list[Path]:
    """Remove exactly the files ``install.json`` lists (then the folders left empty); returns them."""
    root = project.resolve() / INSTALL_FOLDER
    record_path = root / RECORD_NAME
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        files = [str(f) for f in record["files"]]
    except (OSError, ValueError, KeyError, TypeError) as error:
        if quiet:
            return []
        raise LaunchError(f"nothing to undo: {record_path} is missing or unreadable ({error})") from None
    removed: list[Path] = []
    for name in files:
        path = (root / name).resolve()
        if root.resolve() not in path.parents:
            continue  # a record edited to point outside LaTrainer is not followed
        try:
            path.unlink()
            removed.append(path)
        except FileNotFoundError:
            continue
    folders = sorted({p.parent for p in removed}, key=lambda p: len(p.parts), reverse=True)
    for folder in folders:
        while folder != root.parent and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
            folder = folder.parent
    return removed


def _report(done: Installation) -> list[str]:
    switch = f'-LearningAgentsEnginePath="{done.engine_path}"'
    versions = ", ".join(f"{k} {v}" for k, v in done.versions.items())
    return [
        f"Installed la-trainer {__version__} for {done.project}:",
        f"  {done.site_packages}  (la-trainer, msgpack, click; installed with --no-deps: the engine's "
        "torch and numpy are used as they are)",
        f"  {done.shim}  (the train.py the engine will run; runs the engine's own {done.engine_train_py} for "
        "other trainers, and if la-trainer cannot start)",
        f"  {done.project / INSTALL_FOLDER / RECORD_NAME}  (what was written, for --undo)",
        f"The engine's Python {done.python}: {versions}",
        "Nothing in the engine or in Intermediate/PipInstall was changed. To use it, either:",
        f"  - add {switch} to the editor's (or game's) command line: every trainer of this project then",
        "    starts la-trainer, which hands BehaviorCloning and PPO runs to the engine's own train.py; or",
        "  - set EditorEngineRelativePath (NonEditorEngineRelativePath in a packaged game) in the process",
        f"    settings of the flow-matching call site to {done.engine_path} (only that call site).",
        f"To undo: la-trainer install-engine {done.project} --undo, and remove that switch or setting.",
    ]


@click.command("install-engine")
@click.argument("project", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--engine",
    "engine_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="The engine's 'Engine' folder (default: found from the project's Intermediate/PipInstall).",
)
@click.option(
    "--python",
    "python",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="The engine's Python (default: PROJECT/Intermediate/PipInstall/Scripts/python.exe or bin/python3; "
    "give it when -LearningAgentsIntermediatePath moves that environment).",
)
@click.option("--undo", is_flag=True, help="Remove exactly what a previous install-engine wrote.")
def install_engine_command(project: Path, engine_dir: Path | None, python: Path | None, undo: bool) -> None:
    """Make the engine of an Unreal project run la-trainer (nothing in the engine is changed).

    \b
    Example:
      la-trainer install-engine "C:/Projects/MyGame"
      la-trainer install-engine ~/Projects/MyGame --engine ~/UE_5.8/Engine
      la-trainer install-engine ~/Projects/MyGame --undo
    """
    if undo:
        removed = uninstall(project)
        click.echo(
            f"Removed {len(removed)} files that la-trainer install-engine wrote under {project / INSTALL_FOLDER}."
        )
        click.echo(
            "Also remove -LearningAgentsEnginePath from the editor's command line, or set the call site's "
            "EditorEngineRelativePath/NonEditorEngineRelativePath back to the engine folder."
        )
        return
    done = install(project, engine_dir=engine_dir, python=python, pip=pip_install)
    for line in _report(done):
        click.echo(line)
    problems = [f"{k} ({v})" for k, v in done.versions.items() if v.startswith("missing")]
    if problems:
        raise LaunchError(
            "the engine's Python cannot import " + ", ".join(problems) + "; la-trainer will not start there "
            "until that is fixed (the shim then runs the engine's own train.py)."
        )
