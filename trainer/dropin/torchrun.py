"""``python -m trainer.dropin.torchrun TORCHRUN_ARGS...``: torchrun in this process, ending with the
documented exit code of the ranks instead of torchrun's own 1 and traceback.

The engine-spawned scale-out (:func:`trainer.dropin.reexec_under_torchrun`) becomes this module. torchrun
(``torch.distributed.run``) reports any failed rank as exit code 1 with a ``ChildFailedError`` traceback,
so a rank's "bad settings" (2) or "the engine went away" (5) would reach the user as an internal error.
Here every rank writes its exit code into a folder made for this job (:data:`ENV_EXIT_DIR`,
:func:`record_exit`, called by :func:`trainer.distributed.launch.main`); when the job fails, the first
failure recorded is the job's exit code. The ranks have already said why on the shared output; a rank
that died without recording anything is reported in one line.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["ENV_EXIT_DIR", "job_exit_code", "main", "record_exit"]

ENV_EXIT_DIR = "LA_TRAINER_EXIT_DIR"
"""The folder each rank writes ``rank-<RANK>.txt`` (its exit code) into."""
_INTERNAL = 1
"""ExitCode.INTERNAL, when no rank recorded a failure (a crash, a kill)."""


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
            print(
                f"la-trainer: a scale-out process ended without reporting why ({exits}); see its output above.",
                file=sys.stderr,
                flush=True,
            )
            return _INTERNAL
        return job_exit_code(folder) or 0
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
