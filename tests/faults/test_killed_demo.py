"""A game side killed with SIGKILL (the demo: ``la-trainer demo``, the emulated engine) leaves no
shared-memory region and no scratch folder behind (issue 24 item 8).

A killed engine cannot unlink its regions (spec 2.1: the creator unlinks): the trainer it spawned sees
its parent gone, ends, and unlinks the engine's regions it maps (trainer/session/links/shm.py). The demo's scratch
folder carries its process id, and the next demo removes those of demos that are gone
(emulator/demo/run.py ``sweep_stale_work_folders``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emulator.demo.run import WORK_PREFIX, sweep_stale_work_folders

SHM_NAME = re.compile(r"/dev/shm/(\{[0-9A-F-]{36}\})")


def test_only_the_scratch_folders_of_gone_demos_are_swept(tmp_path: Path) -> None:
    for name in ("111-live", "222-dead", "old-style", f"{os.getpid()}-mine"):
        (tmp_path / f"{WORK_PREFIX}{name}").mkdir()
    (tmp_path / f"{WORK_PREFIX}333-a-file").write_text("", encoding="utf-8")
    removed = sweep_stale_work_folders(tmp_path, alive=lambda pid: pid == 111)
    assert removed == [tmp_path / f"{WORK_PREFIX}222-dead"]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(
        f"{WORK_PREFIX}{n}" for n in ("111-live", "333-a-file", "old-style", f"{os.getpid()}-mine")
    )


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"


def _wait_for(what: str, condition: object, bound_s: float) -> None:
    """Poll ``condition`` (a callable) until true; the bound only keeps a broken run from hanging."""
    end = time.monotonic() + bound_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < end, f"gave up waiting for {what}"
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="POSIX shared memory in /dev/shm")
def test_a_killed_demo_leaves_no_region_and_no_scratch_folder(tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LA_TRAINER_")} | {"TMPDIR": str(scratch)}
    argv = [
        sys.executable,
        "-m",
        "trainer",
        "demo",
        "--quick",
        "--iterations",
        "1000000",
        "--time-limit",
        "0",
    ]
    demo = subprocess.Popen(
        [*argv, "--out", str(tmp_path / "out")],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    trainer = 0
    try:
        mapped: set[str] = set()

        def training() -> bool:
            nonlocal trainer, mapped
            assert demo.poll() is None, f"the demo ended first (exit {demo.returncode})"
            for child in _children(demo.pid):
                try:
                    maps = Path(f"/proc/{child}/maps").read_text()
                except OSError:
                    continue
                if SHM_NAME.search(maps):
                    trainer, mapped = child, set(SHM_NAME.findall(maps))
            return len(mapped) >= 3  # the control block and the networks at least

        _wait_for("the trainer to map the engine's regions", training, 240)
        work = [p for p in scratch.iterdir() if p.name.startswith(WORK_PREFIX)]
        assert len(work) == 1, sorted(scratch.iterdir())

        demo.send_signal(signal.SIGKILL)
        demo.wait()
        _wait_for("the trainer to see its engine gone and end", lambda: not _alive(trainer), 120)

        left = sorted(name for name in mapped if (Path("/dev/shm") / name).exists())
        assert left == [], f"regions of the killed engine still in /dev/shm: {left}"
        # The demo could not remove its scratch folder itself; the trainer's own files (its lock) are gone.
        # (torch's compile cache, torchinductor_<user>, is meant to stay.)
        ours = sorted(p for p in scratch.iterdir() if p.name.startswith("la-trainer"))
        assert ours == work
        assert sweep_stale_work_folders(scratch) == work  # the next demo's first step
        assert not [p for p in scratch.iterdir() if p.name.startswith("la-trainer")]
    finally:
        # On a failure: the demo first, so that its trainer still ends by itself and unlinks the
        # regions (a trainer killed too would leave them); the trainer only if it does not end.
        if demo.poll() is None:
            demo.kill()
        demo.wait()
        end = time.monotonic() + 60
        while trainer and _alive(trainer) and time.monotonic() < end:
            time.sleep(0.2)
        if trainer and _alive(trainer):
            os.kill(trainer, signal.SIGKILL)
