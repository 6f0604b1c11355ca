"""trainer.system.atomic.replace_file: the Windows retry around ``os.replace`` (a reader holding the
target open makes the rename fail briefly) behind its platform seam, and no retry on POSIX."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from trainer.system.atomic import replace_file


class FlakyReplace:
    """``os.replace`` that fails ``failures`` times with PermissionError (the reader still holds the file)."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def __call__(self, source: Path, target: Path) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise PermissionError(13, "The process cannot access the file", str(target))
        source.replace(target)


def test_windows_retries_until_the_reader_lets_go(tmp_path: Path) -> None:
    source, target = tmp_path / "new", tmp_path / "status"
    source.write_bytes(b"new")
    target.write_bytes(b"old")
    flaky = FlakyReplace(failures=3)
    replace_file(source, target, platform="win32", replace=flaky)
    assert flaky.calls == 4
    assert target.read_bytes() == b"new" and not source.exists()


def test_windows_gives_up_after_the_retry_bound(tmp_path: Path) -> None:
    source, target = tmp_path / "new", tmp_path / "status"
    source.write_bytes(b"new")
    flaky = FlakyReplace(failures=10**9)
    started = time.monotonic()
    with pytest.raises(PermissionError):
        replace_file(source, target, platform="win32", replace=flaky, retry_s=0.1)
    assert 0.1 <= time.monotonic() - started < 5.0
    assert flaky.calls >= 2 and source.read_bytes() == b"new"


def test_posix_raises_at_once(tmp_path: Path) -> None:
    source, target = tmp_path / "new", tmp_path / "status"
    source.write_bytes(b"new")
    flaky = FlakyReplace(failures=1)
    with pytest.raises(PermissionError):
        replace_file(source, target, platform="linux", replace=flaky)
    assert flaky.calls == 1


def test_the_real_rename_replaces(tmp_path: Path) -> None:
    source, target = tmp_path / "new", tmp_path / "status"
    source.write_bytes(b"new")
    target.write_bytes(b"old")
    replace_file(source, target)
    assert target.read_bytes() == b"new"
