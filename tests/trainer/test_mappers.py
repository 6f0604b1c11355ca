"""Who maps a shared-memory region (trainer/session/transport/mappers.py): the liveness of an attached game.

Facts (Linux): a process that maps the region is found, and stops being found once it is SIGKILLed;
this process and its descendants (which inherit its mappings) are never counted; a watch that found
nobody cannot tell and reports alive (the caller keeps its bound).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from protocol.guid import os_shm_name
from trainer.session.transport.mappers import MapperWatch, find_mappers, mapper_scan_available
from trainer.session.transport.shm import SharedRegion

pytestmark = pytest.mark.skipif(not mapper_scan_available(), reason="needs /proc and /dev/shm (Linux)")
posix_ipc = pytest.importorskip("posix_ipc")

MAP_AND_WAIT = (
    "import sys, time; from trainer.session.transport.shm import SharedRegion; "
    "r = SharedRegion.open(sys.argv[1], 40, label='test'); print('mapped', flush=True); time.sleep(120)"
)


def _region() -> SharedRegion:
    return SharedRegion.create(
        os_shm_name("{" + str(uuid.uuid4()).upper() + "}", sys.platform), 40, label="test"
    )


def _mapper(name: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", MAP_AND_WAIT, name], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "mapped"
    return proc


def test_another_process_is_found_until_it_is_killed() -> None:
    region = _region()
    try:
        assert find_mappers(region.name) == set()  # only we map it
        game = _mapper(region.name)
        try:
            # The child is our descendant (it could have inherited our mapping): never counted.
            assert find_mappers(region.name) == set()
            watch = MapperWatch(region.name)
            watch.pids = {game.pid}  # as attach() would find it from a trainer that did not start it
            watch.watching = True
            assert watch.alive()
            game.send_signal(signal.SIGKILL)
            game.wait(10)
            deadline = time.monotonic() + 10
            while watch.alive() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert not watch.alive()
        finally:
            if game.poll() is None:
                game.kill()
                game.wait(10)
    finally:
        region.close()


def test_a_process_that_is_not_our_descendant_is_found() -> None:
    """The trainer's view: the game was not started by it (seen here from an unrelated process)."""
    region = _region()
    try:
        game = _mapper(region.name)
        try:
            unrelated = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            try:
                assert game.pid in find_mappers(region.name, exclude_pid=unrelated.pid)
            finally:
                unrelated.kill()
                unrelated.wait(10)
        finally:
            game.kill()
            game.wait(10)
    finally:
        region.close()


def test_a_watch_that_found_nobody_cannot_tell() -> None:
    region = _region()
    try:
        watch = MapperWatch(region.name)
        assert watch.attach() is False
        assert watch.alive() is True  # no evidence either way: the caller's bound applies
    finally:
        region.close()
