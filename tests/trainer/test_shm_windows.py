"""The Windows branch of trainer.session.transport.shm, through its seams (nothing here runs on Windows): the
engine's bare ``{GUID}`` mapping name first, ``Global\\{GUID}`` as the fallback, never a silent creation
when opening (spec §2.1, §11 item 8)."""

from __future__ import annotations

import ctypes
import mmap

import pytest

import trainer.session.transport.shm as shm
from protocol.guid import os_shm_name
from tests.support.fake_kernel32 import FakeKernel32, Process
from trainer.errors import LaunchError
from trainer.session.transport.mappers import HandleCountWatch
from trainer.system import win32

GUID = "{6B29FC40-CA47-1067-B31D-00DD010662DA}"


@pytest.fixture
def windows(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Windows seams: ``existing`` mapping names, and the names ``mmap`` was asked to map."""
    seen: dict[str, list[str]] = {"existing": [], "mapped": []}

    def fake_map(name: str, size: int) -> mmap.mmap:
        seen["mapped"].append(name)
        return mmap.mmap(-1, size)  # anonymous: the buffer a tag-name mapping would give

    monkeypatch.setattr(shm, "_WINDOWS", True)
    monkeypatch.setattr(shm, "_windows_mapping_exists", lambda name: name in seen["existing"])
    monkeypatch.setattr(shm, "_windows_map", fake_map)
    return seen


def test_the_engine_name_is_the_bare_braced_guid() -> None:
    assert os_shm_name(GUID, "win32") == GUID


def test_open_maps_the_bare_name(windows: dict[str, list[str]]) -> None:
    windows["existing"].append(GUID)
    with shm.SharedRegion.open(GUID, 40) as region:
        assert region.name == GUID and not region.created and len(region.buf) == 40
    assert windows["mapped"] == [GUID]


def test_open_falls_back_to_the_global_namespace(windows: dict[str, list[str]]) -> None:
    windows["existing"].append("Global\\" + GUID)
    with shm.SharedRegion.open(GUID, 40) as region:
        assert region.name == "Global\\" + GUID
    assert windows["mapped"] == ["Global\\" + GUID]


def test_open_never_creates_a_missing_mapping(windows: dict[str, list[str]]) -> None:
    with pytest.raises(LaunchError) as info:
        shm.SharedRegion.open(GUID, 40, label="control block")
    assert GUID in str(info.value) and "Global" in str(info.value)
    assert windows["mapped"] == []  # mmap with a tag name would have created it


def test_create_maps_zeroed_and_nothing_is_unlinked(
    windows: dict[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shm, "posix_ipc", None, raising=False)  # any POSIX call would fail loudly
    with shm.SharedRegion.create(GUID, 40) as region:
        assert region.created and bytes(region.buf) == bytes(40)
        region.buf[0] = 7
    assert windows["mapped"] == [GUID]  # closed without a posix_ipc unlink (it would have raised)


def test_region_exists_asks_windows(windows: dict[str, list[str]]) -> None:
    assert not shm.region_exists(GUID)
    windows["existing"].append(GUID)
    assert shm.region_exists(GUID)


# --- the existence check itself, through the declared prototypes on a kernel32 that marshals like ctypes --


def mapping_exists(fake: FakeKernel32, name: str) -> bool:
    return shm._windows_mapping_exists(
        name, kernel32=win32.Library("kernel32", lambda: fake), last_error=lambda: fake.last_error
    )


def test_mapping_exists_opens_and_closes_a_64_bit_handle() -> None:
    fake = FakeKernel32([], own=Process(70, 1, "python.exe", 1), mappings={GUID: True})
    assert mapping_exists(fake, GUID)
    assert fake.calls == ["OpenFileMappingW", "CloseHandle"] and fake.handles == {}  # closed, not leaked
    assert not mapping_exists(fake, "Global\\" + GUID)


def test_a_mapping_that_refuses_us_still_exists() -> None:
    """ERROR_ACCESS_DENIED (another user's or a higher integrity level's mapping): the engine has not
    unlinked it, so it is not reported gone."""
    fake = FakeKernel32([], own=Process(70, 1, "python.exe", 1), mappings={GUID: False})
    assert mapping_exists(fake, GUID)


# --- attach mode: the game's liveness through the handle count of our mapping (trainer/session/transport/mappers) --


def handle_watch(fake: FakeKernel32) -> HandleCountWatch:
    return HandleCountWatch(
        GUID, kernel32=win32.Library("kernel32", lambda: fake), ntdll=win32.Library("ntdll", lambda: fake)
    )


def test_the_game_is_followed_while_it_holds_a_handle_to_the_block() -> None:
    """The baseline is this trainer's own handles, taken before any game; the game's handle (the engine
    keeps it until it unmaps the block) lifts the count; when the game is killed the kernel closes it."""
    fake = FakeKernel32([], own=Process(70, 1, "python.exe", 1), mappings={GUID: True})
    fake.other_handles[GUID] = 1  # the trainer's own mmap of the block it created
    watch = handle_watch(fake)
    assert watch.baseline == 2  # the mmap's handle and the watch's own
    assert not watch.attach() and watch.alive()  # no game yet: cannot tell, the bound stays
    fake.other_handles[GUID] = 2  # the game opened the block
    assert watch.attach() and watch.watching and watch.alive()
    assert "holds 1 handle" in watch.describe()
    fake.other_handles[GUID] = 1  # the game died: its handle is closed
    assert not watch.alive()
    watch.close()
    assert fake.handles == {}  # the watch's handle is not leaked


def test_a_count_that_cannot_be_read_never_judges_the_game_gone() -> None:
    fake = FakeKernel32([], own=Process(70, 1, "python.exe", 1), mappings={GUID: False})  # access denied
    watch = handle_watch(fake)
    assert watch.baseline is None and not watch.attach() and watch.alive()
    fake = FakeKernel32([], own=Process(70, 1, "python.exe", 1), mappings={GUID: True})
    watch = handle_watch(fake)
    fake.other_handles[GUID] = 3
    assert watch.attach()
    fake.handles.clear()  # the handle went bad: NtQueryObject fails (STATUS_INVALID_HANDLE)
    assert watch.handle_count() is None and watch.alive()


def test_the_handle_count_query_needs_its_prototype() -> None:
    """The watch's 64-bit handle passes NtQueryObject only through the declared prototype: without it the
    call fails as on 64-bit Windows (issue 22's class of error)."""
    fake = FakeKernel32([], own=Process(70, 1, "python.exe", 1), mappings={GUID: True})
    watch = handle_watch(fake)
    assert watch.handle_count() == 1
    raw = fake["NtQueryObject"]  # no argtypes: arguments pass as C ints
    info = win32.PUBLIC_OBJECT_BASIC_INFORMATION()
    with pytest.raises(ctypes.ArgumentError):
        raw(watch._handle, 0, ctypes.byref(info), ctypes.sizeof(info), None)
