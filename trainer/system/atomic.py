"""Atomic file replacement: readers see the old file or the new one, never a mix.

Every file the trainer publishes goes through :func:`atomic_file` (or :func:`atomic_write` for bytes at
hand): trained networks in an export folder, snapshots, checkpoints, the status file. The engine does the
same for its exports (``<name>.tmp``, then a rename, spec §5.5); we also fsync, so a crash or a power cut
never leaves a half-written network where the engine, ``--resume`` or a user would pick it up.

Steps:

1. A temporary file in the target's own folder (``os.replace`` is atomic only within one file system),
   named ``.<target name>.<random hex>.tmp`` (hidden; :func:`stale_temp_files` finds what a killed
   writer left). It is created with ``O_CREAT | O_EXCL`` and mode 0o666, so the kernel applies the umask
   (and a default ACL) exactly as for ``open(path, "w")``. ``tempfile.mkstemp`` would create it 0600:
   snapshots and networks the engine or another user cannot read, and fixing that afterwards needs the
   umask, which can only be read by setting it (racy with other threads).
2. Written, flushed and fsynced.
3. ``before_replace`` runs (the checkpoint rotates its previous file here), then the temp file is
   renamed over the target, then the folder is fsynced so the rename itself survives a power cut.

On any failure the temporary file is removed and the target is left as it was.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import secrets
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "REPLACE_RETRY_S",
    "atomic_file",
    "atomic_write",
    "atomic_write_all",
    "fsync_directory",
    "replace_file",
    "rewrite_in_place",
    "stale_temp_files",
]

_TEMP_SUFFIX = ".tmp"
_NAME_ATTEMPTS = 100
"""Random names tried before giving up (as ``tempfile``'s TMP_MAX); a collision needs a stale twin."""
_CREATE_FLAGS = (
    os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | getattr(os, "O_NOFOLLOW", 0)
)
_CREATE_MODE = 0o666
"""The mode ``open(path, "w")`` asks for; the kernel subtracts the umask."""
REPLACE_RETRY_S = 1.0
"""Windows: how long a rename over a file that a reader holds open is retried (seconds)."""
_REPLACE_PAUSE_S = 0.02


def _temp_prefix(target: Path) -> str:
    return f".{target.name}."


@contextlib.contextmanager
def atomic_file(
    path: str | os.PathLike[str],
    *,
    before_replace: Callable[[], None] | None = None,
    durable: bool = True,
) -> Iterator[BinaryIO]:
    """A binary file handle whose content replaces ``path`` when the block ends without an exception.

    Args:
        path: the file to replace; its folder must exist.
        before_replace: called after the data is on disk, right before the rename (e.g. to rotate the
            current file to a backup name); an exception from it leaves the target untouched.
        durable: fsync the data and the folder (off only for files rewritten every few seconds whose
            loss in a power cut costs nothing, where an fsync could stall the caller).

    Raises:
        FileNotFoundError: the folder does not exist. Any error from the block, ``before_replace``, the
            write or the rename propagates after the temporary file has been removed.
    """
    target = Path(path)
    tmp, fd = _create_temp(target)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        if before_replace is not None:
            before_replace()
        replace_file(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_directory(target.parent)


def atomic_write(
    path: str | os.PathLike[str], data: bytes | bytearray | memoryview, *, durable: bool = True
) -> None:
    """Replace ``path`` with ``data`` (see :func:`atomic_file`)."""
    with atomic_file(path, durable=durable) as handle:
        handle.write(data)


def atomic_write_all(files: Mapping[Path, bytes | bytearray | memoryview], *, durable: bool = True) -> None:
    """Replace several files as one set (a snapshot's networks, an offline run's outputs): every file is
    written (and fsynced) to its temporary file first and only then are they renamed, so a failed write (a
    full disk) replaces none of them and a reader never finds a set that mixes two versions. (A crash
    between two of the renames still can; each file is whole either way.)"""
    with contextlib.ExitStack() as stack:
        for path, data in files.items():
            handle = stack.enter_context(atomic_file(path, durable=durable))
            handle.write(data)
            handle.flush()  # here, not in the renames: a full disk must fail before any file is replaced
            if durable:
                os.fsync(handle.fileno())


def rewrite_in_place(path: str | os.PathLike[str], data: bytes | bytearray | memoryview) -> None:
    """Overwrite the existing file ``path`` with ``data`` in place: NOT atomic (a reader may see it half
    written, a crash may tear it). Only for the last word of a small file on a full disk, where an atomic
    write cannot get the space for its temporary file but the file's own blocks can take a page of text
    (the status file's and run.json's end: without it a finished run would look killed).

    Raises:
        OSError: the file does not exist, or the write failed.
    """
    with open(path, "r+b") as handle:
        handle.write(data)
        handle.truncate()
        handle.flush()


def replace_file(
    source: Path,
    target: Path,
    *,
    platform: str | None = None,
    retry_s: float = REPLACE_RETRY_S,
    replace: Callable[[Path, Path], None] | None = None,
) -> None:
    """``os.replace(source, target)``; on Windows retried briefly while the target is held open.

    Windows refuses to rename over a file that another process has open without ``FILE_SHARE_DELETE``
    (``la-trainer watch``, an editor or a virus scanner reading the status file or a snapshot): a
    ``PermissionError`` that lasts as long as the reader's read. POSIX renames never fail that way, so a
    PermissionError there is real and raised at once. ``platform`` and ``replace`` are seams for tests.
    """
    rename = replace if replace is not None else os.replace  # looked up now: tests patch os.replace
    if (platform or sys.platform) != "win32":
        rename(source, target)
        return
    deadline = time.monotonic() + retry_s
    while True:
        try:
            rename(source, target)
            return
        except PermissionError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(_REPLACE_PAUSE_S)


def stale_temp_files(path: str | os.PathLike[str]) -> list[Path]:
    """Temporary files that a killed writer of ``path`` left in its folder (sorted by name)."""
    target = Path(path)
    pattern = f"{glob.escape(_temp_prefix(target))}*{_TEMP_SUFFIX}"
    return sorted(target.parent.glob(pattern)) if target.parent.is_dir() else []


def fsync_directory(directory: str | os.PathLike[str]) -> None:
    """Make a rename inside ``directory`` durable (POSIX); a no-op on Windows."""
    # Directories cannot be opened for fsync on Windows; the rename is still atomic there.
    if os.name == "nt":  # pragma: no cover
        return
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _create_temp(target: Path) -> tuple[Path, int]:
    """A new, empty temporary file beside ``target`` and its open descriptor."""
    prefix = _temp_prefix(target)
    for _ in range(_NAME_ATTEMPTS):
        tmp = target.parent / f"{prefix}{secrets.token_hex(4)}{_TEMP_SUFFIX}"
        try:
            return tmp, os.open(tmp, _CREATE_FLAGS, _CREATE_MODE)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"no free temporary file name for {target.name}", str(target.parent))
