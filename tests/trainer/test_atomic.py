"""The one atomic file writer (trainer/system/atomic.py) and the files written through it.

Facts: the target holds the old bytes or the new ones, never a mix, and no temporary file is left behind
whatever fails; data is fsynced before the rename and the folder after it; ``before_replace`` runs between
the two; a new file gets the permissions ``open(path, "w")`` would give under the current umask (status,
snapshot and network files alike; the checkpoint's test is in test_checkpoint.py).
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from trainer.records.progress import Status, write_status
from trainer.session.snapshots import SnapshotWriter
from trainer.session.transport.files import network_path, write_network_files
from trainer.system.atomic import atomic_file, atomic_write, stale_temp_files

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="POSIX permission bits")


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# --- replacing ----------------------------------------------------------------------------------------------


def test_atomic_write_replaces_content_and_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "network_0.bin"
    target.write_bytes(b"old")
    atomic_write(target, b"new bytes")
    assert target.read_bytes() == b"new bytes"
    atomic_write(target, memoryview(bytearray(b"view")))
    assert target.read_bytes() == b"view"
    assert names(tmp_path) == ["network_0.bin"]


def test_atomic_write_failure_keeps_the_old_file_and_removes_the_temp(tmp_path: Path) -> None:
    target = tmp_path / "x.bin"
    target.write_bytes(b"old")

    class Unwritable:
        """Not a buffer: the write fails after the temp file exists."""

    with pytest.raises(TypeError):
        atomic_write(target, Unwritable())  # type: ignore[arg-type]
    assert target.read_bytes() == b"old"
    assert names(tmp_path) == ["x.bin"]


def test_an_exception_in_the_block_keeps_the_old_file_and_removes_the_temp(tmp_path: Path) -> None:
    target = tmp_path / "x.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="mid-write"), atomic_file(target) as handle:
        handle.write(b"half of the new")
        raise RuntimeError("mid-write")
    assert target.read_bytes() == b"old"
    assert names(tmp_path) == ["x.bin"]


def test_a_failing_fsync_keeps_the_old_file_and_removes_the_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "x.bin"
    target.write_bytes(b"old")

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space"):
        atomic_write(target, b"new")
    assert target.read_bytes() == b"old"
    assert names(tmp_path) == ["x.bin"]


def test_atomic_write_to_missing_folder_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        atomic_write(tmp_path / "missing" / "x.bin", b"1")


def test_order_data_fsync_then_hook_then_rename_then_folder_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "x.bin"
    target.write_bytes(b"old")
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append("fsync folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync data")
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        calls.append(f"replace -> {Path(dst).name}")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    with atomic_file(target, before_replace=lambda: calls.append("hook")) as handle:
        handle.write(b"new")
    expected = ["fsync data", "hook", "replace -> x.bin"]
    if os.name != "nt":
        expected.append("fsync folder")
    assert calls == expected
    assert target.read_bytes() == b"new"


def test_a_failing_hook_keeps_the_old_file_and_removes_the_temp(tmp_path: Path) -> None:
    target = tmp_path / "x.bin"
    target.write_bytes(b"old")

    def refuse() -> None:
        raise PermissionError("no rotation")

    with pytest.raises(PermissionError), atomic_file(target, before_replace=refuse) as handle:
        handle.write(b"new")
    assert target.read_bytes() == b"old"
    assert names(tmp_path) == ["x.bin"]


def test_not_durable_writes_never_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fsyncs: list[int] = []
    monkeypatch.setattr(os, "fsync", fsyncs.append)
    atomic_write(tmp_path / "status", b"x", durable=False)
    assert fsyncs == []
    assert (tmp_path / "status").read_bytes() == b"x"


def test_stale_temp_files_finds_only_the_temps_of_that_target(tmp_path: Path) -> None:
    target = tmp_path / "la-trainer-checkpoint.pt"
    left = tmp_path / ".la-trainer-checkpoint.pt.1a2b3c4d.tmp"
    left.write_bytes(b"partial")
    (tmp_path / ".other.bin.1a2b3c4d.tmp").write_bytes(b"someone else's")
    (tmp_path / "la-trainer-checkpoint.pt").write_bytes(b"current")
    assert stale_temp_files(target) == [left]
    assert stale_temp_files(tmp_path / "missing" / "x.bin") == []


def test_the_temp_file_lies_beside_the_target_and_is_hidden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Path] = []
    real_replace = os.replace

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        seen.append(Path(src))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    target = tmp_path / "network_0.bin"
    atomic_write(target, b"x")
    (temp,) = seen
    assert temp.parent == tmp_path and temp.name.startswith(".network_0.bin.") and temp.suffix == ".tmp"
    assert stale_temp_files(target) == []


# --- permissions --------------------------------------------------------------------------------------------


@pytest.fixture(params=[0o022, 0o077, 0o002], ids=["umask022", "umask077", "umask002"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _open_mode(folder: Path) -> int:
    """What a plain ``open(path, "w")`` gives here, now."""
    reference = folder / "reference"
    with open(reference, "w"):
        pass
    mode = _mode(reference)
    reference.unlink()
    return mode


def _write_bytes(folder: Path) -> Path:
    atomic_write(folder / "x.bin", b"x")
    return folder / "x.bin"


def _write_status(folder: Path) -> Path:
    write_status(folder / "status", Status(phase="training"))
    return folder / "status"


def _write_snapshot(folder: Path) -> Path:
    return SnapshotWriter(folder, {0: "Denoiser"}).write(7, {0: b"snapshot"})[0]


def _write_network(folder: Path) -> Path:
    write_network_files(folder, {0: b"net"})
    return network_path(folder, 0)


WRITERS: dict[str, Callable[[Path], Path]] = {
    "atomic_write": _write_bytes,
    "status": _write_status,
    "snapshot": _write_snapshot,
    "network": _write_network,
}


@posix_only
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_new_file_has_the_mode_open_gives(tmp_path: Path, umask: int, writer: str) -> None:
    expected = _open_mode(tmp_path)
    assert expected == 0o666 & ~umask  # no default ACL on the test folder
    path = WRITERS[writer](tmp_path)
    assert _mode(path) == expected


@posix_only
def test_a_replaced_file_is_a_new_file_with_the_new_file_mode(tmp_path: Path, umask: int) -> None:
    """The rename puts a new file in place: it does not inherit the replaced file's mode."""
    target = tmp_path / "x.bin"
    target.write_bytes(b"old")
    target.chmod(0o600)
    atomic_write(target, b"new")
    assert _mode(target) == 0o666 & ~umask


def test_no_umask_is_read_by_setting_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading the umask means setting it for a moment, which races with other threads creating files."""

    def forbidden(mask: int) -> int:
        raise AssertionError("os.umask called")

    monkeypatch.setattr(os, "umask", forbidden)
    atomic_write(tmp_path / "x.bin", b"x")
