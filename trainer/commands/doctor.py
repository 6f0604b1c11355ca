"""``la-trainer doctor``: is this machine (and the engine's Python) ready to train? One screen.

Each line is one check with ``ok``, ``note`` (works, but worth knowing: a CPU-only torch, a small
/dev/shm) or ``FAIL`` (something a run needs is missing), and the fix where there is one. The exit code is
0 unless a check failed (then 2), so a set-up script can run it.

With ``--project DIR`` (or ``--engine-python PATH``) it also looks into the engine's Python, the one the
editor spawns the trainer with (spec §1.1, §11 item 1: ``<Project>/Intermediate/PipInstall``, Python 3.11
with the engine's torch), in a subprocess with a time limit.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from trainer import __version__
from trainer.exitcodes import ExitCode
from trainer.training.device import CUDA_HINT

__all__ = ["Check", "doctor_command", "engine_python", "run_checks"]

OK, NOTE, FAIL = "ok", "note", "FAIL"

SHM_RECOMMENDED_BYTES = 2 << 30
"""Below this much free space in /dev/shm a note is shown: the engine's replay buffer lives there in
shared-memory mode (a container's default 64 MiB holds only small recordings: ``--shm-size``)."""

ENGINE_PROBE_TIMEOUT_S = 120.0
"""Bound of the engine-Python probe (it imports torch, which takes 1 to 5 s warm and can take a minute
cold on a slow disk); past it the check fails instead of hanging."""


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    verdict: str
    detail: str
    fix: str = ""


def _version(module: str, distributions: tuple[str, ...] = ()) -> str | None:
    """The installed version of ``module`` (None: not installed), without importing it (mlflow and
    tensorboard take seconds to import)."""
    if importlib.util.find_spec(module) is None:
        return None
    for name in distributions or (module,):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "installed"


def _python() -> Check:
    version = platform.python_version()
    verdict = OK if sys.version_info >= (3, 11) else FAIL
    return Check("python", verdict, f"{version} ({sys.executable})", "la-trainer needs Python 3.11 or newer")


def _torch() -> list[Check]:
    try:
        import torch
    except Exception as error:
        return [Check("torch", FAIL, f"cannot be imported: {error}", "pip install torch")]
    cuda_build = torch.version.cuda
    checks = [
        Check(
            "torch",
            OK if cuda_build else NOTE,
            f"{torch.__version__} ({'CUDA ' + cuda_build + ' build' if cuda_build else 'CPU-only build'})",
            "" if cuda_build else CUDA_HINT,
        )
    ]
    if torch.cuda.is_available():
        names = []
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            names.append(f"cuda:{index} {props.name} ({props.total_memory / 2**30:.0f} GiB)")
        checks.append(Check("gpu", OK, "; ".join(names)))
    else:
        why = "no CUDA device visible" if cuda_build else "this torch cannot use one (see above)"
        fix = (
            "check the NVIDIA driver (nvidia-smi); in a container: docker run --gpus all"
            if cuda_build
            else ""
        )
        checks.append(Check("gpu", NOTE, f"none: {why}; training runs on the CPU", fix))
    threads = torch.get_num_threads()
    checks.append(
        Check("cpu", OK, f"{os.cpu_count()} cores; torch uses {threads} intra-op threads by default")
    )
    return checks


def _shared_memory() -> Check:
    if sys.platform == "win32":
        return Check("shared memory", OK, "named file mappings (backed by the paging file)")
    try:
        import posix_ipc  # noqa: F401  (the trainer maps the engine's regions with it)
    except ImportError:
        return Check("shared memory", FAIL, "posix_ipc is not installed", "pip install posix_ipc")
    root = Path("/dev/shm")
    if not root.is_dir():
        return Check("shared memory", OK, "POSIX shared memory (no /dev/shm folder on this system)")
    usage = shutil.disk_usage(root)
    detail = f"/dev/shm {usage.free / 2**30:.1f} GiB free of {usage.total / 2**30:.1f} GiB"
    if usage.free < SHM_RECOMMENDED_BYTES:
        return Check(
            "shared memory",
            NOTE,
            detail,
            "the replay buffer is shared there: in a container add --shm-size=8g (docker run)",
        )
    return Check("shared memory", OK, detail)


def _packages() -> list[Check]:
    checks = []
    for module, needed in (("numpy", True), ("msgpack", True), ("click", True)):
        version = _version(module)
        checks.append(
            Check(
                module,
                OK if version else FAIL if needed else NOTE,
                version or "missing",
                f"pip install {module}",
            )
        )
    extras = {
        "tensorboard": ("tensorboard", "pip install tensorboard (UseTensorBoard / --tensorboard)"),
        "mlflow": ("mlflow", "pip install mlflow-skinny (UseMLflow / --mlflow)"),
        "matplotlib": ("matplotlib", "pip install matplotlib (demo and report pictures)"),
    }
    present, missing = [], []
    for name, (module, hint) in extras.items():
        version = _version(module, ("mlflow", "mlflow-skinny") if module == "mlflow" else ())
        if version:
            present.append(f"{name} {version}")
        else:
            missing.append(hint)
    checks.append(
        Check(
            "extras",
            OK if not missing else NOTE,
            ", ".join(present) if present else "none installed",
            "; ".join(missing),
        )
    )
    return checks


def engine_python(project: Path) -> Path:
    """The engine's Python for a project (spec §1.1): ``Intermediate/PipInstall/Scripts/python.exe`` on
    Windows, ``Intermediate/PipInstall/bin/python3`` elsewhere."""
    venv = project / "Intermediate" / "PipInstall"
    return venv / "Scripts" / "python.exe" if sys.platform == "win32" else venv / "bin" / "python3"


_PROBE = """
import json, sys
out = {"python": sys.version.split()[0]}
for name in ("torch", "numpy", "trainer"):
    try:
        module = __import__(name)
        out[name] = getattr(module, "__version__", "installed")
        if name == "torch":
            out["cuda_build"] = module.version.cuda
            out["cuda"] = bool(module.cuda.is_available())
    except Exception as error:
        out[name] = None
        out[name + "_error"] = str(error)[:200]
print(json.dumps(out))
"""


def _engine(python: Path, run: Callable[..., Any] = subprocess.run) -> list[Check]:
    if not python.is_file():
        return [
            Check(
                "engine python",
                FAIL,
                f"{python} does not exist",
                "open the project in the editor once with the Learning Agents plugins enabled (it creates "
                "this environment), or pass --engine-python",
            )
        ]
    try:
        # The engine starts its Python without our PYTHONPATH/PYTHONHOME: probe it the same way.
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        done = run(
            [str(python), "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=ENGINE_PROBE_TIMEOUT_S,
            env=env,
            cwd=python.parent,
        )
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired) as error:
        return [Check("engine python", FAIL, f"{python} did not answer: {error}")]
    torch_text = (
        f"torch {found['torch']} ({'CUDA ' + str(found.get('cuda_build')) if found.get('cuda_build') else 'CPU-only'}"
        f"{', GPU visible' if found.get('cuda') else ''})"
        if found.get("torch")
        else "no torch"
    )
    detail = f"{found['python']} at {python}; {torch_text}; numpy {found.get('numpy') or 'missing'}"
    # The trainer the engine spawns imports both in that Python: without either, every run ends at once.
    missing = [name for name in ("torch", "numpy") if not found.get(name)]
    if missing:
        errors = "; ".join(f"{name}: {found.get(name + '_error') or 'not found'}" for name in missing)
        return [
            Check(
                "engine python",
                FAIL,
                f"{detail} ({' and '.join(missing)} cannot be imported there: {errors})",
                "let the editor finish setting up its Python (Learning Agents plugins enabled, editor restarted "
                f"once), or install them into it: {python} -m pip install {' '.join(missing)}",
            )
        ]
    checks = [Check("engine python", OK, detail)]
    if found.get("trainer"):
        checks.append(Check("engine la-trainer", OK, f"{found['trainer']} importable in the engine's Python"))
    else:
        checks.append(
            Check(
                "engine la-trainer",
                NOTE,
                "not importable in the engine's Python itself",
                "la-trainer install-engine <Project> installs it beside the project (docs/unreal-install.md)",
            )
        )
    return checks


def run_checks(engine: Path | None = None) -> list[Check]:
    """Every check, in screen order."""
    checks = [Check("la-trainer", OK, f"{__version__} ({Path(__file__).resolve().parent})"), _python()]
    checks += _torch()
    checks.append(_shared_memory())
    checks += _packages()
    if engine is not None:
        checks += _engine(engine)
    return checks


@click.command("doctor")
@click.option(
    "--project",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="An Unreal project folder: also check the engine's Python in <Project>/Intermediate/PipInstall.",
)
@click.option(
    "--engine-python",
    "engine_python_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The engine's Python executable, when it is not in the project's Intermediate/PipInstall.",
)
def doctor_command(project: Path | None, engine_python_path: Path | None) -> None:
    """Check this machine: Python, torch and its CUDA build, the GPU, shared memory, optional packages
    and, with --project, the engine's Python. Exit code 0 unless a check failed.

    \b
    Examples:
      la-trainer doctor
      la-trainer doctor --project C:/Projects/MyGame
    """
    engine = engine_python_path
    if engine is None and project is not None:
        engine = engine_python(project)
    checks = run_checks(engine)
    width = max(len(c.name) for c in checks)
    for check in checks:
        click.echo(f"{check.name:<{width}}  {check.verdict:<4}  {check.detail}")
        if check.fix and check.verdict != OK:
            click.echo(f"{'':<{width}}        -> {check.fix}")
    failed = [c.name for c in checks if c.verdict == FAIL]
    if failed:
        click.echo(f"\nNot ready: {', '.join(failed)}.")
        sys.exit(int(ExitCode.USAGE))
    click.echo("\nReady to train.")
