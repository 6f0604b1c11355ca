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
  ``<engine python> -m pip install --no-deps --target`` at the versions CI tests (:data:`ENGINE_PINS`, equal
  to ``constraints.txt``): the engine's torch and numpy are used as they are and never touched. The engine deletes and rebuilds ``PipInstall`` when its Python changes; this folder
  is not inside it.
* ``<Project>/LaTrainer/Engine/Plugins/Experimental/LearningCore/Content/Python/train.py``: a shim that puts
  that folder on ``sys.path``, records where the engine's own ``train.py`` is (for the hand-over of other
  trainers, :mod:`trainer.dropin.handover`) and runs la-trainer's drop-in; if la-trainer cannot be imported (the
  engine's Python minor version changed, a file is missing) it says why and runs the engine's own script.
* ``<Project>/LaTrainer/install.json``: what was installed where, with every file written (``--undo``
  removes exactly those, and the bytecode that runs wrote beside them).

Install and undo are transactions: the new state is built in a hidden sibling folder, then swapped in by
renames (the old entries aside, the new ones in, the old ones deleted). Any failure undoes the renames
done, so the previous installation stays whole, and ends with exit code 2 and the path that failed. An
old entry that cannot be deleted after the swap (Windows: a running trainer's loaded ``.pyd``; a folder
holding one can be renamed where its files cannot be deleted) stays in a hidden folder that the next run
removes.

The user then passes ``-LearningAgentsEnginePath="<Project>/LaTrainer/Engine"`` to the editor or game
(every trainer of the project goes through la-trainer; other methods are handed to the engine's script),
or sets ``EditorEngineRelativePath``/``NonEditorEngineRelativePath`` in the flow-matching call site's
process settings (only that call site; it is saved with the project and survives engine updates).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import click

from trainer import __version__
from trainer.dropin.handover import DROPIN_MARKER
from trainer.errors import LaunchError
from trainer.system.atomic import replace_file

__all__ = [
    "ENGINE_PINS",
    "INSTALL_FOLDER",
    "Installation",
    "PipRunner",
    "engine_python",
    "engine_requirements",
    "find_engine_dir",
    "install",
    "install_engine_command",
    "leftovers",
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
ENGINE_PINS: dict[str, str] = {
    "msgpack": "1.2.4",
    "click": "8.5.1",
    "posix_ipc": "1.3.2",
    "colorama": "0.4.6",
}
"""The versions installed beside the engine's torch: those CI tests (``constraints.txt``; a test keeps the two
equal). They are written here because a wheel of la-trainer carries this module but not constraints.txt."""
OWNED = ("site-packages", "Engine", RECORD_NAME)
"""The entries of ``<Project>/LaTrainer`` that install-engine writes, each replaced as a whole; anything
else in that folder is the user's and is kept."""
STAGING_PREFIX = ".install-engine-new-"
"""Hidden folder beside the owned entries where the next state is built (same file system: renames)."""
ASIDE_PREFIX = ".install-engine-old-"
"""Hidden folder the replaced entries are renamed into before they are deleted."""
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
ProbeRunner = Callable[[Path, Path], dict[str, str]]
"""``(engine python, site-packages)``: what that Python imports from there, by module (:data:`PROBE`)."""


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


def engine_requirements(platform: str | None = None) -> list[str]:
    """What pip installs beside the engine's torch, pinned (``msgpack==1.2.4``, ...)."""
    extra = POSIX_DEPENDENCIES if (platform or sys.platform) != "win32" else WINDOWS_DEPENDENCIES
    return [f"{name}=={ENGINE_PINS[name]}" for name in (*DEPENDENCIES, *extra)]


def pip_install(python: Path, requirements: Sequence[str], target: Path) -> None:
    """The real :data:`PipRunner`: ``<python> -m pip install --no-deps --target <target> <requirements>``
    (the target is a fresh staging folder: nothing to upgrade)."""
    command = [str(python), "-m", "pip", "install", "--no-deps", "--target", str(target)]
    try:
        done = subprocess.run([*command, *requirements], capture_output=True, text=True)
    except OSError as error:
        raise LaunchError(f"the engine's Python {python} could not be started ({error})") from None
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
    script absolute (used only if it still exists; else trainer.dropin.handover finds it from --nne-cpu-path)."""
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

# A missing torch, numpy, msgpack or posix_ipc is handled by la-trainer itself (trainer.dropin): other
# trainers go to the engine's script, a FlowMatching run ends with one line naming what is missing. Only
# when la-trainer's own package cannot be imported does this file run the engine's script for every run.
try:
    from trainer.dropin import main
except Exception as error:  # la-trainer cannot run on this Python: the engine's trainer still can
    message = (
        f"la-trainer: cannot start ({{type(error).__name__}}: {{error}}); running the engine's own "
        f"train.py instead (FlowMatching runs need la-trainer). Run `la-trainer install-engine` again "
        f"for this project (the engine's Python may have changed)."
    )
    # ASCII whatever the pipe's encoding: a path in the error must not end this process instead.
    print(message.encode("ascii", "backslashreplace").decode("ascii"), flush=True)
    command = [sys.executable, str(ENGINE_TRAIN_PY), *sys.argv[1:]]
    if sys.platform == "win32":
        sys.exit(subprocess.call(command, stdin=subprocess.DEVNULL, stdout=1, stderr=2))
    os.execv(sys.executable, command)

if __name__ == "__main__":
    sys.exit(main())
'''


def _probe(python: Path, site_packages: Path) -> dict[str, str]:
    # -B: the probe leaves no bytecode of its own in the folder being installed.
    try:
        done = subprocess.run(
            [str(python), "-B", "-c", PROBE, str(site_packages)], capture_output=True, text=True, timeout=300
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise LaunchError(f"the engine's Python {python} could not be run ({error})") from None
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
        shutil.copytree(source, site_packages / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def _listing(root: Path, folder: Path) -> list[str]:
    return sorted(str(p.relative_to(root).as_posix()) for p in folder.rglob("*") if p.is_file())


def _is_bytecode(relative: str) -> bool:
    """A file that Python writes beside what it imports (a run's ``__pycache__``), never one we install."""
    path = PurePosixPath(relative)
    return "__pycache__" in path.parts or path.suffix in (".pyc", ".pyo")


def _owned_files(root: Path) -> list[str]:
    """Every file now in the owned entries of ``root``, relative to it."""
    files: list[str] = []
    for name in OWNED:
        entry = root / name
        if entry.is_dir():
            files += _listing(root, entry)
        elif entry.is_file():
            files.append(name)
    return files


def _recorded_files(root: Path) -> set[str] | None:
    """The files ``install.json`` lists, or None when there is no readable record."""
    try:
        record = json.loads((root / RECORD_NAME).read_text(encoding="utf-8"))
        return {str(f) for f in record["files"]}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _carry_over(root: Path, staging: Path, recorded: set[str] | None) -> None:
    """Copy into ``staging`` the files of the owned entries that are the user's (neither listed in the
    record nor bytecode), so that replacing an entry as a whole keeps them. Without a record every file
    there is taken to be install-engine's: the entries' names are ours."""
    if recorded is None:
        return
    for relative in _owned_files(root):
        if relative in recorded or _is_bytecode(relative):
            continue
        target = staging / relative
        if not target.exists():  # a file of the new installation wins over a user's file of that name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / relative, target)


def _remove_quietly(path: Path) -> bool:
    """Delete a folder we made; False if (part of) it stays, e.g. a ``.pyd`` a running trainer has loaded
    on Windows. What stays is hidden and removed by the next run (:func:`_clean_leftovers`)."""
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def leftovers(project: Path) -> list[Path]:
    """Hidden staging and aside folders that a run could not delete (or a killed run left)."""
    root = project.resolve() / INSTALL_FOLDER
    if not root.is_dir():
        return []
    return sorted(p for prefix in (STAGING_PREFIX, ASIDE_PREFIX) for p in root.glob(f"{prefix}*"))


def _clean_leftovers(project: Path) -> None:
    for path in leftovers(project):
        _remove_quietly(path)


def _cannot_write(root: Path, error: OSError) -> LaunchError:
    where = error.filename or root
    return LaunchError(
        f"install-engine cannot write in {where} ({error.strerror or error}). The project folder must be "
        f"writable by this user: make {root.parent} writable (it may be read-only, on a read-only share, or "
        "owned by another account) and run again. The previous installation, if any, is unchanged."
    )


def _swap(root: Path, staging: Path) -> Path:
    """Replace the owned entries of ``root`` by those in ``staging``; returns the folder holding the old ones.

    Each step is a rename inside ``root`` (one file system: atomic). The record goes aside first and comes
    in last, so a half-done swap never looks like an installation. On a failure the renames done are undone
    in reverse order, leaving the previous installation whole, and a :class:`LaunchError` says what failed.
    """
    try:
        aside = Path(tempfile.mkdtemp(prefix=ASIDE_PREFIX, dir=root))
    except OSError as error:
        raise _cannot_write(root, error) from None
    done: list[tuple[Path, Path]] = []
    try:
        for name in reversed(OWNED):
            if os.path.lexists(root / name):
                replace_file(root / name, aside / name)
                done.append((root / name, aside / name))
        for name in OWNED:
            if os.path.lexists(staging / name):
                replace_file(staging / name, root / name)
                done.append((staging / name, root / name))
    except OSError as error:
        stuck: list[Path] = []
        for source, target in reversed(done):
            try:
                replace_file(target, source)
            except OSError:
                stuck.append(source)
        where = error.filename or root
        if stuck:
            raise LaunchError(
                f"install-engine could not move {where} ({error.strerror or error}) nor put back "
                f"{', '.join(str(p) for p in stuck)}: the previous installation's entries are in {aside}. "
                f"Close the Unreal editor or game of this project, move them back into {root}, and run "
                "install-engine again."
            ) from None
        _remove_quietly(aside)
        raise LaunchError(
            f"install-engine could not move {where} ({error.strerror or error}): a file in it is in use or "
            "protected. Close the Unreal editor or game of this project (a running trainer keeps its files "
            f"open; on Windows they cannot be moved or deleted while it runs), check that {root} is writable "
            "by this user, and run again. The previous installation is unchanged."
        ) from None
    return aside


def _replace_owned(root: Path, staging: Path) -> None:
    """Swap ``staging`` in (keeping the user's files of the old entries), then delete what was replaced."""
    try:
        _carry_over(root, staging, _recorded_files(root))
    except OSError as error:
        raise _cannot_write(root, error) from None
    aside = _swap(root, staging)
    _remove_quietly(aside)


def install(
    project: Path,
    *,
    engine_dir: Path | None = None,
    python: Path | None = None,
    pip: PipRunner = pip_install,
    probe: ProbeRunner | None = None,
    platform: str | None = None,
) -> Installation:
    """Install into ``project`` (see the module docstring); a previous installation is replaced, and stays
    whole if anything fails (:class:`LaunchError`, exit code 2)."""
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
    _clean_leftovers(project)
    try:
        root.mkdir(exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=root))
    except OSError as error:
        raise _cannot_write(root, error) from None
    try:
        try:
            (staging / "site-packages").mkdir()
        except OSError as error:
            raise _cannot_write(root, error) from None
        pip(python, engine_requirements(platform), staging / "site-packages")
        try:
            _copy_packages(staging / "site-packages")
            shim = staging.joinpath("Engine", *ENGINE_SCRIPT)
            shim.parent.mkdir(parents=True, exist_ok=True)
            shim.write_text(_shim_text(engine_train_py), encoding="utf-8")
        except OSError as error:
            raise _cannot_write(root, error) from None
        versions = (probe or _probe)(python, staging / "site-packages")
        files = (
            *_listing(staging, staging / "site-packages"),
            *_listing(staging, staging / "Engine"),
            RECORD_NAME,
        )
        engine_path = root / "Engine"
        done = Installation(
            project,
            engine_dir,
            engine_train_py,
            python,
            engine_path,
            engine_path.joinpath(*ENGINE_SCRIPT),
            root / "site-packages",
            files,
            versions,
        )
        try:
            (staging / RECORD_NAME).write_text(json.dumps(done.record(), indent=1), encoding="utf-8")
        except OSError as error:
            raise _cannot_write(root, error) from None
        _replace_owned(root, staging)
    finally:
        _remove_quietly(staging)
    return done


def uninstall(project: Path) -> list[Path]:
    """Remove the files ``install.json`` lists and the bytecode runs wrote beside them, as one transaction
    (anything else in ``LaTrainer`` stays; the folder goes when nothing is left). Returns what was removed."""
    root = project.resolve() / INSTALL_FOLDER
    recorded = _recorded_files(root)
    if recorded is None:
        raise LaunchError(
            f"nothing to undo: {root / RECORD_NAME} is missing or unreadable (install-engine writes it; "
            "without it nothing is removed)."
        )
    _clean_leftovers(project)
    removed = [root / f for f in _owned_files(root) if f in recorded or _is_bytecode(f)]
    try:
        staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=root))
    except OSError as error:
        raise _cannot_write(root, error) from None
    try:
        _replace_owned(root, staging)
    finally:
        _remove_quietly(staging)
    try:
        root.rmdir()  # only when empty: the user's files and undeletable leftovers keep it
    except OSError:
        pass
    return removed


def _leftover_lines(project: Path) -> list[str]:
    stuck = leftovers(project)
    if not stuck:
        return []
    return [
        f"Could not delete yet: {', '.join(str(p) for p in stuck)} (a file in it is in use, e.g. by a running "
        "trainer). Nothing uses it; the next install-engine run removes it, or delete it once the editor is closed."
    ]


def _report(done: Installation) -> list[str]:
    switch = f'-LearningAgentsEnginePath="{done.engine_path}"'
    versions = ", ".join(f"{k} {v}" for k, v in done.versions.items())
    return [
        f"Installed la-trainer {__version__} for {done.project}:",
        f"  {done.site_packages}  (la-trainer, msgpack, click at the versions CI tests; installed with "
        "--no-deps: the engine's torch and numpy are used as they are)",
        f"  {done.shim}  (the train.py the engine will run; runs the engine's own {done.engine_train_py} for "
        "other trainers, and if la-trainer cannot start)",
        f"  {done.project / INSTALL_FOLDER / RECORD_NAME}  (what was written, for --undo)",
        f"The engine's Python {done.python}: {versions}",
        "Nothing in the engine or in Intermediate/PipInstall was changed. To use it, either:",
        f"  - add {switch} to the editor's (or game's) command line: every trainer of this project then",
        "    starts la-trainer, which hands BehaviorCloning and PPO runs to the engine's own train.py; or",
        "  - set EditorEngineRelativePath (NonEditorEngineRelativePath in a packaged game) in the process",
        f"    settings of the flow-matching call site to {done.engine_path} (only that call site). Type",
        "    that absolute path into the field: the folder picker stores a path relative to the editor's",
        "    executable, which points elsewhere once the project is opened by an engine in another folder.",
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
            f"Removed {len(removed)} files that la-trainer install-engine wrote (or runs compiled) under "
            f"{project / INSTALL_FOLDER}."
        )
        click.echo(
            "Also remove -LearningAgentsEnginePath from the editor's command line, or set the call site's "
            "EditorEngineRelativePath/NonEditorEngineRelativePath back to the engine folder."
        )
        for line in _leftover_lines(project):
            click.echo(line)
        return
    done = install(project, engine_dir=engine_dir, python=python, pip=pip_install)
    for line in (*_report(done), *_leftover_lines(project)):
        click.echo(line)
    problems = [f"{k} ({v})" for k, v in done.versions.items() if v.startswith("missing")]
    if problems:
        raise LaunchError(
            "the engine's Python cannot import " + ", ".join(problems) + "; la-trainer will not start there "
            "until that is fixed (the shim then runs the engine's own train.py)."
        )
