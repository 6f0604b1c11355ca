"""A full disk: which write errors mean it, how much space is left, and how a run says so.

A run writes two kinds of files. Most it can do without for a while (snapshots, checkpoints, the run
record, the status file: :class:`OptionalWrite`): a full disk while writing one is one warning, the last
good file stays (every write is atomic, :mod:`trainer.system.atomic`), the next write of that kind tries
again and says when it works again, and training goes on. The networks an offline run exists to produce
are not optional: when they cannot be written the run ends with exit code 14 (NO_SPACE,
:class:`trainer.errors.NoSpace`) and
:func:`no_space_paragraph` (the folder, the free space, the fix).

"Full" is any of the errors a write gets when the disk cannot take the bytes: ENOSPC (no space), EDQUOT
(the user's quota) and EIO (the device failed the write: a dying disk, a network or removable drive gone,
a thin-provisioned volume out of space). Other errors (a permission, a missing folder) are not this
module's: callers raise them as before.
"""

from __future__ import annotations

import errno
import shutil
from dataclasses import dataclass
from pathlib import Path

from trainer.system.console import log, warn

__all__ = [
    "NO_SPACE_ERRNOS",
    "OptionalWrite",
    "describe_no_space",
    "free_space",
    "is_no_space",
    "no_space_cause",
    "no_space_paragraph",
]

NO_SPACE_ERRNOS: frozenset[int] = frozenset(
    code for code in (errno.ENOSPC, getattr(errno, "EDQUOT", None), errno.EIO) if code is not None
)
"""The errno values of a write the disk could not take (EDQUOT does not exist on Windows)."""

_REASONS = {errno.ENOSPC: "the disk is full", errno.EIO: "the disk failed the write (input/output error)"}


def no_space_cause(error: BaseException) -> OSError | None:
    """The write error the disk could not take (:data:`NO_SPACE_ERRNOS`): ``error`` itself, or what it was
    raised from or while handling (torch.save turns the OSError of a full disk into a RuntimeError about
    its zip file); None when there is none."""
    seen: BaseException | None = error
    for _ in range(10):  # a chain is short; a loop in it must not hang the caller
        if seen is None:
            return None
        if isinstance(seen, OSError) and seen.errno in NO_SPACE_ERRNOS:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def is_no_space(error: BaseException) -> bool:
    """``error`` is, or comes from, a write that the disk could not take (:func:`no_space_cause`)."""
    return no_space_cause(error) is not None


def free_space(folder: Path) -> str:
    """``"12.0 KiB free"`` on the disk holding ``folder`` (or its nearest existing parent); ``"free space
    unknown"`` when the operating system does not say."""
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    try:
        free = shutil.disk_usage(existing if existing is not None else Path.cwd()).free
    except OSError:
        return "free space unknown"
    size = float(free)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit} free" if unit == "bytes" else f"{size:.1f} {unit} free"
        size /= 1024
    return f"{size:.1f} GiB free"  # pragma: no cover - the loop returns


def describe_no_space(error: OSError, folder: Path) -> str:
    """Why, in words, with the system's own message and the free space: ``"the disk is full (No space left
    on device; 0 bytes free there)"``."""
    reason = _REASONS.get(error.errno or 0, "the disk quota is used up")
    return f"{reason} ({error.strerror or error}; {free_space(folder)} there)"


def no_space_paragraph(what: str, folder: Path, error: OSError, kept: str) -> str:
    """The paragraph of a run that ends because ``what`` could not be written into ``folder``; ``kept``:
    what the user still has (a sentence)."""
    return (
        f"{what} could not be written to {folder}: {describe_no_space(error, folder)}. {kept} Free space on "
        "that disk (old runs' Snapshots/ and runs/ folders hold the largest files) or give the run an output "
        "folder on another disk (--out), then run again (--resume continues from the newest checkpoint)."
    )


@dataclass
class OptionalWrite:
    """One kind of file a run can do without for a while (``what``: "snapshots", "the checkpoint", ...).

    :meth:`failed` decides whether a write error is a full disk (then it warns, once per outage, and the
    caller goes on without the file, keeping the last good one) or not (the caller raises it);
    :meth:`written` after a write that worked ends the outage with one line.
    """

    what: str
    retry: str
    """When the next attempt comes, for the warning ("at the next snapshot")."""
    failing: bool = False

    def failed(self, folder: Path, error: BaseException) -> bool:
        """True: ``error`` is a full disk, warned about (once per outage); False: it is not, raise it."""
        cause = no_space_cause(error)
        if cause is None:
            return False
        if not self.failing:
            self.failing = True
            warn(
                f"cannot write {self.what} in {folder}: {describe_no_space(cause, folder)}. Training goes on; "
                f"the files written before stay as they were; trying again {self.retry}. Free space on that "
                "disk to have them back."
            )
        return True

    def written(self) -> None:
        """A write of this kind worked: after an outage, say that the files are written again."""
        if self.failing:
            self.failing = False
            log(f"la-trainer: {self.what}: written again.")
