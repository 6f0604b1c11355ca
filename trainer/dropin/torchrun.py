"""``python -m trainer.dropin.torchrun TORCHRUN_ARGS...``: torchrun in this process, ending with the
documented exit code of the ranks instead of torchrun's own 1 and traceback; and how the drop-in becomes
it (:func:`reexec_under_torchrun`, :func:`torchrun_command`).

The engine-spawned scale-out (:func:`reexec_under_torchrun`) becomes this module. torchrun
(``torch.distributed.run``) reports any failed rank as exit code 1 with a ``ChildFailedError`` traceback,
so a rank's "bad settings" (2) or "the engine went away" (5) would reach the user as an internal error.
Here every rank writes its exit code into a folder made for this job (``LA_TRAINER_EXIT_DIR``,
:func:`record_exit`, called by :func:`trainer.dropin.scale_out.main`); when the job fails, the first
failure recorded is the job's exit code. The ranks have already said why on the shared output; a rank
that died without recording anything is reported in one line.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from trainer.settings.environment import ENV_ENGINE_PID, ENV_EXIT_DIR, ENV_TORCHRUN_ARGS
from trainer.system.console import log_error

__all__ = ["job_exit_code", "main", "record_exit", "reexec_under_torchrun", "torchrun_command"]

_INTERNAL = 1
"""ExitCode.INTERNAL, when no rank recorded a failure (a crash, a kill)."""


def torchrun_command(argv: Sequence[str], nproc: int, extra: Sequence[str] = ()) -> list[str]:
    """``python -m trainer.dropin.torchrun [EXTRA | --standalone] --nproc-per-node N -m trainer.distributed
    ARGV``: torchrun's own arguments, run by :mod:`trainer.dropin.torchrun`, which ends with the ranks'
    documented exit code (torchrun alone ends every failure with 1 and a traceback)."""
    launch = list(extra) if extra else ["--standalone"]
    torchrun = [sys.executable, "-m", "trainer.dropin.torchrun", *launch, "--nproc-per-node", str(nproc)]
    return [*torchrun, "-m", "trainer.distributed", *argv]


def reexec_under_torchrun(argv: Sequence[str], nproc: int) -> int:
    """Engine-spawned scale-out: become torchrun with ``nproc`` processes, before torch is imported here.

    POSIX: ``os.execve``, so the engine's process handle and output pipe still name this process. Windows
    has no such exec: torchrun runs as our child and we return its exit code. Either way a small pinger
    (:mod:`trainer.dropin.pinger`) keeps a waiting engine's clock running until rank 0 holds the control
    block (shared memory; over a socket the engine retries its connection for its own timeout).
    """
    command = torchrun_command(argv, nproc, shlex.split(os.environ.get(ENV_TORCHRUN_ARGS, "")))
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # the package root: trainer/dropin/torchrun.py
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env[ENV_ENGINE_PID] = str(os.getppid())
    from trainer.dropin.pinger import start_pinger

    pinger = start_pinger(argv, env, lock=True, engine_pid=os.getppid())
    sys.stdout.flush()
    if os.name == "nt":  # pragma: no cover - no exec on Windows
        import subprocess

        try:
            return subprocess.call(command, env=env)
        finally:
            if pinger is not None:
                pinger.kill()
    os.execve(sys.executable, command, env)
    raise AssertionError("os.execve returned")  # pragma: no cover


def record_exit(code: int, environ: Mapping[str, str] | None = None) -> None:
    """Called by every rank on its way out: its exit code for the launcher (no-op outside this job)."""
    env = os.environ if environ is None else environ
    folder, rank = env.get(ENV_EXIT_DIR), env.get("RANK", "")
    if not folder or not rank.isdigit():
        return
    try:
        Path(folder, f"rank-{int(rank)}.txt").write_text(str(int(code)), encoding="ascii")
    except OSError:
        pass  # the launcher falls back to 1


def job_exit_code(folder: Path) -> int | None:
    """The job's exit code from the ranks' records: the first failure recorded (once one rank fails,
    torchrun stops the others, which then record their own "interrupted"); None when no rank failed."""
    failures: list[tuple[int, int, int]] = []  # (when, rank, code)
    for file in folder.glob("rank-*.txt"):
        rank = file.stem.removeprefix("rank-")
        try:
            text, when = file.read_text(encoding="ascii").strip(), file.stat().st_mtime_ns
        except (OSError, ValueError):
            continue
        if rank.isdigit() and text.lstrip("-").isdigit() and int(text) != 0:
            failures.append((when, int(rank), int(text)))
    return min(failures)[2] if failures else None


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    folder = Path(tempfile.mkdtemp(prefix="la-trainer-exit-"))
    os.environ[ENV_EXIT_DIR] = str(folder)  # torchrun's workers inherit this environment
    try:
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import parse_args, run

        # The ranks say what went wrong; torchrun's agent would add its own error report per failure.
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
        try:
            run(parse_args(args))  # type: ignore[no-untyped-call]  # torch leaves both unannotated
        except ChildFailedError as failed:
            code = job_exit_code(folder)
            if code is not None:
                return code
            exits = ", ".join(
                f"rank {rank} exit code {failure.exitcode}"
                for rank, failure in sorted(failed.failures.items())
            )
            log_error(
                f"la-trainer: a scale-out process ended without reporting why ({exits}); see its output above."
            )
            return _INTERNAL
        return job_exit_code(folder) or 0
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
