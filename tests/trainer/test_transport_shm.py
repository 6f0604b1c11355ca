"""Shared-memory regions: who creates, who unlinks, and what a bad region looks like (spec §2.1, §2.5)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from trainer.errors import LaunchError
from trainer.session.transport.shm import SharedRegion, region_exists

posix_ipc = pytest.importorskip("posix_ipc")

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX shared memory")

REPO = Path(__file__).resolve().parents[2]
DEV_SHM = Path("/dev/shm")


def on_disk(name: str) -> bool:
    """Whether the OS object exists (Linux shows POSIX shm under /dev/shm; elsewhere ask the API)."""
    if DEV_SHM.is_dir():
        return (DEV_SHM / name.lstrip("/")).exists()
    return region_exists(name)


@pytest.fixture
def shm_name() -> Iterator[str]:
    """A unique ``/{GUID}`` name per test, unlinked afterwards whatever the test did."""
    name = "/{" + str(uuid.uuid4()).upper() + "}"
    yield name
    try:
        posix_ipc.unlink_shared_memory(name)
    except posix_ipc.ExistentialError:
        pass


def engine_region(name: str, size: int, fill: bytes = b"") -> None:
    """Create a region the way the engine does (O_CREAT, page-rounded ftruncate), left for the test."""
    shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=size)
    if fill:
        os.pwrite(shm.fd, fill, 0)
    shm.close_fd()


def test_open_maps_exactly_size_bytes_and_shares_memory(shm_name: str) -> None:
    engine_region(shm_name, 4096, fill=b"\x01\x02\x03")
    with SharedRegion.open(shm_name, 100, label="network 0") as a, SharedRegion.open(shm_name, 100) as b:
        assert len(a.buf) == 100
        assert bytes(a.buf[:3]) == b"\x01\x02\x03"
        a.buf[50:54] = b"ABCD"
        assert bytes(b.buf[50:54]) == b"ABCD"
        assert not a.created


def test_engine_region_survives_our_close(shm_name: str) -> None:
    engine_region(shm_name, 64)
    region = SharedRegion.open(shm_name, 64)
    region.close()
    assert on_disk(shm_name)
    assert region_exists(shm_name)
    assert region.closed


def test_open_missing_region_names_the_guid(shm_name: str) -> None:
    with pytest.raises(LaunchError) as info:
        SharedRegion.open(shm_name, 40, label="control block")
    message = str(info.value)
    assert shm_name in message
    assert "control block" in message
    assert "game is running" in message


def test_open_too_small_region_names_expected_and_actual(shm_name: str) -> None:
    engine_region(shm_name, 4096)
    with pytest.raises(LaunchError) as info:
        SharedRegion.open(shm_name, 4097, label="network 2")
    message = str(info.value)
    assert "network 2" in message and "4096" in message and "4097" in message


@pytest.mark.parametrize("size", [0, -1])
def test_non_positive_size_is_refused(shm_name: str, size: int) -> None:
    with pytest.raises(LaunchError):
        SharedRegion.create(shm_name, size)
    assert not on_disk(shm_name)


def test_created_region_is_zeroed_page_rounded_and_unlinked_on_close(shm_name: str) -> None:
    region = SharedRegion.create(shm_name, 40)
    assert region.created
    assert len(region.buf) == 40
    assert bytes(region.buf) == bytes(40)
    assert on_disk(shm_name)
    if DEV_SHM.is_dir():
        assert (DEV_SHM / shm_name.lstrip("/")).stat().st_size % os.sysconf("SC_PAGE_SIZE") == 0
    region.close()
    assert not on_disk(shm_name)
    region.close()  # idempotent
    with pytest.raises(ValueError):
        _ = region.buf


def test_created_region_is_unlinked_when_an_exception_leaves_the_block(shm_name: str) -> None:
    with pytest.raises(RuntimeError), SharedRegion.create(shm_name, 40):
        assert on_disk(shm_name)
        raise RuntimeError("boom")
    assert not on_disk(shm_name)


def test_stale_region_is_reused_zeroed_with_a_warning(
    shm_name: str, capfd: pytest.CaptureFixture[str]
) -> None:
    engine_region(shm_name, 40, fill=b"\xff" * 40)
    with SharedRegion.create(shm_name, 40) as region:
        assert bytes(region.buf) == bytes(40)
    assert "stale" in capfd.readouterr().err
    assert not on_disk(shm_name)


def test_close_with_a_live_numpy_view_still_unlinks(shm_name: str) -> None:
    region = SharedRegion.create(shm_name, 40)
    view = np.frombuffer(region.buf, dtype=np.int32)
    view[:] = 7
    region.close()  # must not raise although `view` pins the mapping
    assert not on_disk(shm_name)
    assert int(view.sum()) == 70  # the memory stays valid while mapped
    del view


def _run_child(code: str, *, wait_ready: bool) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    if wait_ready:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "ready", proc.stderr.read() if proc.stderr else ""
    return proc


def test_sigterm_unlinks_our_region(shm_name: str) -> None:
    proc = _run_child(
        f"""
        import time
        from trainer.session.transport.shm import SharedRegion
        region = SharedRegion.create({shm_name!r}, 40)
        print("ready", flush=True)
        time.sleep(30)
        """,
        wait_ready=True,
    )
    assert on_disk(shm_name)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == -signal.SIGTERM  # still dies of SIGTERM, as the default would
    assert not on_disk(shm_name)


@pytest.mark.parametrize("ending", ["pass", "raise SystemExit(3)", "raise RuntimeError('crash')"])
def test_process_exit_without_close_unlinks_our_region(shm_name: str, ending: str) -> None:
    proc = _run_child(
        f"""
        from trainer.session.transport.shm import SharedRegion
        region = SharedRegion.create({shm_name!r}, 40)
        {ending}
        """,
        wait_ready=False,
    )
    proc.communicate(timeout=20)
    assert not on_disk(shm_name)


def test_region_exists(shm_name: str) -> None:
    assert not region_exists(shm_name)
    engine_region(shm_name, 40)
    assert region_exists(shm_name)
