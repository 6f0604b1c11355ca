"""Shared memory the trainer cannot trust (spec §2): GUIDs, regions, config files, control-block values.

In-process (``run_with_link`` against the emulator's engine). Facts per case: the documented exit code
(USAGE for launch input: GUIDs, missing files or regions; BAD_DATA for readable but wrong files and data;
PROTOCOL for control-block values that break a handshake), one paragraph naming the culprit, no
traceback, the engine's regions left alone, nothing written to the snapshot folder.
"""

from __future__ import annotations

import json
import os
import struct
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from emulator.game import Completed
from protocol.controls import CONTROL_BLOCK_BYTES, Control
from protocol.guid import os_shm_name
from tests.support.faults import (
    assert_no_traceback,
    play_rounds,
    send_all,
    shm_in_process,
    small_task,
)
from trainer.exitcodes import ExitCode
from trainer.session.transport.shm import region_exists

posix_ipc = pytest.importorskip("posix_ipc")


def fresh_guid() -> str:
    return "{" + str(uuid.uuid4()).upper() + "}"


def set_control(game: Any, control: Control, value: int) -> None:
    """Store ``value`` in the control block as the engine does (no state machine in the way)."""
    struct.pack_into("<i", game.controls_region.buf, 4 * int(control), value)


def check_failed(result: Any, expected: ExitCode, *words: str) -> None:
    assert result.run.game_error is None, f"the game script failed: {result.run.game_error!r}"
    assert result.code == int(expected), f"expected {expected.name}:\n{result.output}"
    assert_no_traceback(result.output)
    for word in words:
        assert word in result.output, f"the message does not name {word!r}:\n{result.output}"
    snapshots = result.task_dir / "Snapshots"
    assert not snapshots.exists() or not any(snapshots.iterdir()), "files written by a failed start"
    missing = [name for name, present in result.regions_present.items() if not present]
    assert missing == [], f"engine regions gone: {missing}"


def begin_only(game: Any, config: Any, blobs: Any) -> None:
    game.begin(config)


# -- GUIDs ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "guid",
    ["{nonsense}", "", "{XXXXXXXX-XXXX-XXXX-XXXX-XXXXXXXXXXXX}", "1234"],
    ids=["word", "empty", "hex", "short"],
)
def test_malformed_controls_guid_is_a_usage_error(
    guid: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    result = shm_in_process(tmp_path, lambda *a: None, capfd, guid=guid)
    check_failed(result, ExitCode.USAGE, "GUID")


def test_wrong_controls_guid_names_the_region(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    guid = fresh_guid()  # well-formed, but the engine never created it
    result = shm_in_process(tmp_path, lambda *a: None, capfd, guid=guid)
    check_failed(result, ExitCode.USAGE, guid)


def test_lower_case_spelling_of_the_engines_guid_is_another_region(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """POSIX names are case-sensitive (spec §2.1): in spawned mode the string is used byte for byte."""
    holder: list[str] = []

    def script(game: Any, config: Any, blobs: Any) -> None:
        holder.append(game.controls_guid)

    from emulator.game import ShmGame

    probe = ShmGame.create(tmp_path / "probe", timeout=1.0)
    try:
        lower = probe.controls_guid.lower()
        result = shm_in_process(tmp_path, script, capfd, guid=lower)
    finally:
        probe.close()
    check_failed(result, ExitCode.USAGE, lower)


# -- regions -------------------------------------------------------------------------------------------------


def _edit_json(name: str, edit: Callable[[Any], None]) -> Callable[[Path], None]:
    def tamper(config_dir: Path) -> None:
        path = config_dir / name
        if name == "shared-memory":
            path = next(config_dir.glob("shared-memory-*.json"))
        obj = json.loads(path.read_bytes())
        edit(obj)
        path.write_text(json.dumps(obj))

    return tamper


def _set_max_byte_num(obj: Any) -> None:
    obj["Networks"][0]["MaxByteNum"] = 1 << 20  # the engine's region holds a few hundred bytes (one page)


def _set_max_steps(obj: Any) -> None:
    obj["ReplayBuffers"][0]["MaxStepNum"] = 100_000


@pytest.mark.parametrize(
    ("tamper", "words"),
    [(_set_max_byte_num, ("network 0", "1048576")), (_set_max_steps, ("Observations",))],
    ids=["network-region", "replay-region"],
)
def test_region_smaller_than_its_config_is_refused(
    tamper: Callable[[Any], None], words: tuple[str, ...], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    def script(game: Any, config: Any, blobs: Any) -> None:
        game.begin(config, before_signal=_edit_json("data-config.json", tamper))

    result = shm_in_process(tmp_path, script, capfd)
    check_failed(result, ExitCode.USAGE, *words)


def test_stale_control_block_from_a_crashed_run_is_reinitialised(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Attach mode: a SIGKILLed trainer left its block behind, every signal set. A new trainer under the
    same GUID must zero it before waiting (else it would read configs that were never written)."""
    guid = fresh_guid()
    name = os_shm_name(guid, "linux")
    stale = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, size=CONTROL_BLOCK_BYTES)
    try:
        os.write(stale.fd, struct.pack("<10i", *([1] * 8), 5, 5))
    finally:
        stale.close_fd()
    rounds: list[Any] = []

    def script(game: Any, config: Any, blobs: Any) -> None:
        send_all(game, config, blobs)
        rounds.extend(play_rounds(game))

    result = shm_in_process(tmp_path, script, capfd, guid=guid, create=True)
    assert result.run.game_error is None, result.run.game_error
    assert result.code == int(ExitCode.OK), result.output
    assert "stale" in result.output
    assert isinstance(rounds[-1], Completed)
    assert not region_exists(name), "the trainer did not unlink the block it took over"


# -- config files ----------------------------------------------------------------------------------------------


def _remove(name: str) -> Callable[[Path], None]:
    return lambda config_dir: (config_dir / name).unlink()


def _truncate(name: str) -> Callable[[Path], None]:
    def tamper(config_dir: Path) -> None:
        path = config_dir / name
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])

    return tamper


def _garbage_shm_json(config_dir: Path) -> None:
    next(config_dir.glob("shared-memory-*.json")).write_bytes(b"\x00\xff{{{ not json")


def _guid_in_shm_json(guid: str) -> Callable[[Path], None]:
    def edit(obj: Any) -> None:
        obj["NetworkGuids"][1]["Guid"] = guid

    return _edit_json("shared-memory", edit)


def _unknown_schema(obj: Any) -> None:
    obj["ReplayBuffers"][0]["Observations"][0]["SchemaId"] = 7


@pytest.mark.parametrize(
    ("tamper", "expected", "words"),
    [
        (_remove("data-config.json"), ExitCode.USAGE, ("data-config.json",)),
        (_remove("trainer-config.json"), ExitCode.USAGE, ("trainer-config.json",)),
        (_truncate("trainer-config.json"), ExitCode.BAD_DATA, ("trainer-config.json",)),
        (_truncate("data-config.json"), ExitCode.BAD_DATA, ("data-config.json",)),
        (_garbage_shm_json, ExitCode.BAD_DATA, ("shared-memory-",)),
        (_guid_in_shm_json(fresh_guid()), ExitCode.USAGE, ("network 1",)),
        (_guid_in_shm_json("{not-a-guid}"), ExitCode.USAGE, ("not-a-guid",)),
        (_edit_json("data-config.json", _unknown_schema), ExitCode.BAD_DATA, ("SchemaId",)),
    ],
    ids=[
        "missing-data-config",
        "missing-trainer-config",
        "truncated-trainer-config",
        "truncated-data-config",
        "invalid-shm-json",
        "unknown-network-guid",
        "malformed-network-guid",
        "unknown-schema-id",
    ],
)
def test_bad_config_files(
    tamper: Callable[[Path], None],
    expected: ExitCode,
    words: tuple[str, ...],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    result = shm_in_process(
        tmp_path, lambda game, config, blobs: game.begin(config, before_signal=tamper), capfd
    )
    check_failed(result, expected, *words)


# -- control-block values ------------------------------------------------------------------------------------


def post_raw_experience(
    game: Any,
    config: Any,
    blobs: Any,
    *,
    episodes: int,
    steps: int,
    buffer_id: int = 0,
    starts: Any = None,
    lengths: Any = None,
) -> None:
    """BeginTraining with a hand-written experience post: arrays into the regions, then E, S, id, signal."""
    game.begin(config)
    for network_id, blob in enumerate(blobs):
        game.send_network(network_id, blob)
    rb = small_task().replay_buffer
    arrays = {
        "EpisodeStarts": rb.episode_starts if starts is None else np.asarray(starts, np.int32),
        "EpisodeLengths": rb.episode_lengths if lengths is None else np.asarray(lengths, np.int32),
        **dict(rb.float_streams()),
    }
    for name, region in game.replay_regions.items():
        raw = np.ascontiguousarray(arrays[name]).reshape(-1).view(np.uint8)
        region.buf[: raw.nbytes] = raw.tobytes()
    set_control(game, Control.EXPERIENCE_EPISODE_NUM, episodes)
    set_control(game, Control.EXPERIENCE_STEP_NUM, steps)
    set_control(game, Control.REPLAY_BUFFER_ID, buffer_id)
    set_control(game, Control.EXPERIENCE_SIGNAL, 1)


E = S = 48  # small_task(): 48 one-step episodes


@pytest.mark.parametrize(
    ("counts", "expected", "words"),
    [
        ({"episodes": E + 1, "steps": S}, ExitCode.BAD_DATA, ("EpisodeNum",)),
        ({"episodes": E, "steps": S + 1}, ExitCode.BAD_DATA, ("StepNum",)),
        ({"episodes": -1, "steps": S}, ExitCode.PROTOCOL, ("EXPERIENCE_EPISODE_NUM",)),
        ({"episodes": E, "steps": -(2**31)}, ExitCode.PROTOCOL, ("EXPERIENCE_STEP_NUM",)),
        ({"episodes": E, "steps": S, "buffer_id": 3}, ExitCode.PROTOCOL, ("ReplayBufferId 3",)),
        (
            {"episodes": 2, "steps": S, "starts": [0, 47] + [0] * 46, "lengths": [1, 2] + [1] * 46},
            ExitCode.BAD_DATA,
            ("episode 1",),
        ),
        ({"episodes": 2, "steps": S, "starts": [-3] + [0] * 47}, ExitCode.BAD_DATA, ("EpisodeStarts[0]",)),
        (
            {"episodes": 2, "steps": S, "lengths": [1, -1] + [1] * 46},
            ExitCode.BAD_DATA,
            ("EpisodeLengths[1]",),
        ),
    ],
    ids=[
        "episodes-over-max",
        "steps-over-max",
        "negative-episodes",
        "int32-min-steps",
        "replay-buffer-id",
        "episode-past-the-end",
        "negative-start",
        "negative-length",
    ],
)
def test_experience_counts_and_episodes_out_of_range(
    counts: dict[str, Any],
    expected: ExitCode,
    words: tuple[str, ...],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    result = shm_in_process(tmp_path, lambda g, c, b: post_raw_experience(g, c, b, **counts), capfd)
    check_failed(result, expected, *words)


def test_network_id_mismatch_is_a_protocol_error(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    def script(game: Any, config: Any, blobs: Any) -> None:
        game.begin(config)
        game.send_network(0, blobs[0])
        # Answer the request for network 1 with NetworkId 2 (the engine asserts on this, spec §2.4).
        deadline = 100_000
        while not game.controls.network_requested() and deadline:
            deadline -= 1
            os.sched_yield()
        game.network_regions[1].buf[:] = blobs[1]
        set_control(game, Control.NETWORK_ID, 2)
        set_control(game, Control.NETWORK_SIGNAL, 0)

    result = shm_in_process(tmp_path, script, capfd)
    check_failed(result, ExitCode.PROTOCOL, "NETWORK_ID is 2")


def test_a_region_that_vanishes_after_mapping_does_not_crash(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The engine unlinks its regions at DoneTraining (spec §2.4); a mapped region stays valid (POSIX)."""

    def script(game: Any, config: Any, blobs: Any) -> None:
        send_all(game, config, blobs)
        for region in game.replay_regions.values():
            posix_ipc.unlink_shared_memory(region.name)  # gone from /dev/shm, still mapped by both
        play_rounds(game)

    result = shm_in_process(tmp_path, script, capfd)
    assert result.code == int(ExitCode.OK), result.output


def test_control_block_smaller_than_40_bytes_is_refused(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A 16-byte region under the controls GUID (another program's, or a truncated one): a clear launch
    error naming both sizes, never a SIGBUS on the first access past its end."""
    guid = fresh_guid()
    name = os_shm_name(guid, "linux")
    posix_ipc.SharedMemory(name, posix_ipc.O_CREX, size=16).close_fd()
    try:
        result = shm_in_process(tmp_path, lambda *a: None, capfd, guid=guid)
        check_failed(result, ExitCode.USAGE, "16 bytes", "40 bytes")
        assert region_exists(name), "the trainer unlinked a region it did not create"
    finally:
        posix_ipc.unlink_shared_memory(name)
