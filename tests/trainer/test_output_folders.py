"""trainer.records.runrecord.check_output_folder: the one check of every folder a command writes into (issue 24
item 2). CI runs as root, which passes every permission bit, so "not writable" is shown two ways that
refuse root too: a regular file where a parent folder should be, and the ``os.access`` seam."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainer.errors import LaunchError
from trainer.exitcodes import ExitCode
from trainer.records.runrecord import check_output_folder


def test_a_missing_folder_is_created_with_its_parents(tmp_path: Path) -> None:
    target = tmp_path / "runs" / "seed3"
    assert check_output_folder(target, "--out") == target
    assert target.is_dir()
    assert not list(target.iterdir())  # the write probe leaves nothing behind


def test_a_file_in_the_path_is_named(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x", encoding="utf-8")
    with pytest.raises(LaunchError) as caught:
        check_output_folder(tmp_path / "afile" / "sub", "--temp-dir")
    text = str(caught.value)
    assert f"{str(tmp_path / 'afile')!r} is a file, not a folder" in text
    assert "(--temp-dir)" in text and "choose another folder with --temp-dir" in text
    assert caught.value.exit_code == ExitCode.USAGE


def test_the_folder_itself_being_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out").write_text("x", encoding="utf-8")
    with pytest.raises(LaunchError, match="is a file, not a folder"):
        check_output_folder(tmp_path / "out", "TASK_DIR")


def test_a_folder_this_user_may_not_write_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    denied = tmp_path / "readonly"
    denied.mkdir()
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda path, mode, **kw: Path(path) != denied and real_access(path, mode)
    )
    with pytest.raises(LaunchError) as caught:
        check_output_folder(denied, "--out")
    assert "this user may not write there" in str(caught.value)
    assert "Give this user write permission there" in str(caught.value)


def test_a_folder_that_refuses_a_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only mount passes os.access for root on some systems; the probe file is the real test."""
    real_write = Path.write_bytes

    def refuse(self: Path, data: bytes) -> int:
        if self.parent == tmp_path:
            raise OSError(30, "Read-only file system")
        return real_write(self, data)

    monkeypatch.setattr(Path, "write_bytes", refuse)
    with pytest.raises(LaunchError, match="a file cannot be written there \\(Read-only file system\\)"):
        check_output_folder(tmp_path, "--out")


def test_a_folder_that_cannot_be_created_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: Path, *args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(LaunchError, match="it cannot be created \\(Permission denied\\)"):
        check_output_folder(tmp_path / "new", "--out")
