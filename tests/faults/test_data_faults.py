"""Data and snapshots the trainer must not train on blindly (spec §5.3, §6.1, §8, §10 item 6).

In-process (``run_with_link`` against the emulator's shared-memory engine). Facts: non-finite values,
dimensions that disagree with the schema, an empty recording and damaged initial snapshots end the run
with BAD_DATA and a message naming the field, before any training or file; recordings that are odd but
valid (zero-length episodes, episodes shorter than ActionChunkSize, constant features) train to Complete
with finite, loadable networks of the received size.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from emulator.game import Completed
from protocol.replay import ReplayBuffer
from protocol.snapshot import HEADER_BYTES, read_snapshot
from tests.support.faults import (
    TINY,
    assert_no_traceback,
    play_rounds,
    send_all,
    shm_in_process,
    small_task,
)
from trainer.exitcodes import ExitCode

TASK = small_task()
RB = TASK.replay_buffer


def with_arrays(**changes: Any) -> ReplayBuffer:
    return dataclasses.replace(RB, **changes)


def obs_with(value: float, row: int = 3, col: int = 1) -> ReplayBuffer:
    obs = RB.observations[0].copy()
    obs[row, col] = value
    return with_arrays(observations=(obs,))


def act_with(value: float, row: int = 7, col: int = 0) -> ReplayBuffer:
    act = RB.actions[0].copy()
    act[row, col] = value
    return with_arrays(actions=(act,))


def check_bad(result: Any, *words: str) -> None:
    assert result.run.game_error is None, f"the game script failed: {result.run.game_error!r}"
    assert result.code == int(ExitCode.BAD_DATA), result.output
    assert_no_traceback(result.output)
    for word in words:
        assert word in result.output, f"the message does not name {word!r}:\n{result.output}"
    snapshots = result.task_dir / "Snapshots"
    assert not snapshots.exists() or not any(snapshots.iterdir()), "files written from bad data"


def session_with(replay: ReplayBuffer) -> Callable[[Any, Any, Any], None]:
    def script(game: Any, config: Any, blobs: Any) -> None:
        send_all(game, config, blobs, replay)

    return script


# -- data ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("replay", "words"),
    [
        (obs_with(np.nan), ("non-finite", "Observations")),
        (obs_with(np.inf), ("non-finite", "Observations")),
        (act_with(-np.inf), ("non-finite", "Actions")),
        (act_with(np.nan, row=47, col=1), ("non-finite", "Actions")),
    ],
    ids=["nan-observation", "inf-observation", "minus-inf-action", "nan-last-action"],
)
def test_non_finite_values_are_bad_data(
    replay: ReplayBuffer, words: tuple[str, ...], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    check_bad(shm_in_process(tmp_path, session_with(replay), capfd), *words)


def test_empty_recording_is_bad_data(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """E = S = 0 in the control block (the engine refuses an empty recording itself, spec §7.1 step 1;
    a broken or foreign engine may still post one)."""

    def script(game: Any, config: Any, blobs: Any) -> None:
        game.begin(config)
        for network_id, blob in enumerate(blobs):
            game.send_network(network_id, blob)
        game.controls.post_experience(0, 0, 0)

    check_bad(shm_in_process(tmp_path, script, capfd), "no episode with at least one step")


def _dimension(key: str, value: int) -> Callable[[Path], None]:
    def tamper(config_dir: Path) -> None:
        path = config_dir / "data-config.json"
        obj = json.loads(path.read_bytes())
        obj["ReplayBuffers"][0][key][0]["VectorDimensionNum"] = value
        path.write_text(json.dumps(obj))

    return tamper


@pytest.mark.parametrize(
    ("key", "value"), [("Observations", 3), ("Actions", 1)], ids=["observation-dim", "action-dim"]
)
def test_dimensions_that_disagree_with_the_schema_are_bad_data(
    key: str, value: int, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    def script(game: Any, config: Any, blobs: Any) -> None:
        game.begin(config, before_signal=_dimension(key, value))

    check_bad(shm_in_process(tmp_path, script, capfd), "VectorDimensionNum")


def trains_to_complete(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], replay: ReplayBuffer, **settings: Any
) -> list[Any]:
    got: list[Any] = []

    def script(game: Any, config: Any, blobs: Any) -> None:
        send_all(game, config, blobs, replay)
        got.extend(play_rounds(game))

    result = shm_in_process(tmp_path, script, capfd, settings=replace(TINY, iteration_num=20, **settings))
    assert result.run.game_error is None, result.run.game_error
    assert result.code == int(ExitCode.OK), result.output
    assert isinstance(got[-1], Completed)
    for network in got[-2]:
        snapshot = read_snapshot(network.data)
        assert len(network.data) == len(result.blobs[network.network_id])
        for layer_bytes in (network.data[HEADER_BYTES:],):
            floats = np.frombuffer(layer_bytes[: len(layer_bytes) // 4 * 4], dtype="<f4")
            assert np.isfinite(floats).all(), f"network {network.network_id} holds non-finite values"
        assert snapshot.header == read_snapshot(result.blobs[network.network_id]).header
    return got


def test_zero_length_episodes_are_skipped(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Episodes 0..9 emptied (lengths 0): the other 38 one-step episodes train."""
    lengths = RB.episode_lengths.copy()
    lengths[:10] = 0
    trains_to_complete(tmp_path, capfd, with_arrays(episode_lengths=lengths))


def test_episodes_shorter_than_the_action_chunk(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """One-step episodes with ActionChunkSize 4: chunks are padded with the last action (design.md)."""
    trains_to_complete(tmp_path, capfd, RB, action_chunk_size=4)


def test_constant_features(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A constant observation and a constant action column: std 0 is replaced by 1, nothing divides by 0."""
    obs = RB.observations[0].copy()
    obs[:, 0] = 3.0
    act = RB.actions[0].copy()
    act[:, 1] = -2.0
    trains_to_complete(tmp_path, capfd, with_arrays(observations=(obs,), actions=(act,)))


def test_constant_features_with_embedded_normalisation(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    obs = np.full_like(RB.observations[0], 0.5)
    trains_to_complete(
        tmp_path, capfd, with_arrays(observations=(obs,)), embed_normalizations_in_weights=True
    )


# -- received snapshots ----------------------------------------------------------------------------------------


def damaged(blob: bytes, offset: int, value: int) -> bytes:
    data = bytearray(blob)
    struct.pack_into("<i", data, offset, value)
    return bytes(data)


def truncated_layers(blob: bytes) -> bytes:
    """Header intact, FileData cut after its first 40 bytes and zero-filled to the same size."""
    keep = HEADER_BYTES + 40
    return blob[:keep] + bytes(len(blob) - keep)


def huge_layer_count(blob: bytes) -> bytes:
    """The root Sequence claims 2^31-1 layers (must be refused before anything is allocated)."""
    return damaged(blob, HEADER_BYTES + 12, 2**31 - 1)


@pytest.mark.parametrize(
    ("network_id", "damage", "words"),
    [
        (0, lambda b: damaged(b, 0, 0x12345678), ("magic",)),
        (1, lambda b: damaged(b, 4, 2), ("version",)),
        (2, lambda b: damaged(b, 20, len(b) - HEADER_BYTES + 64), ("FileDataSize",)),
        (0, lambda b: damaged(b, 20, -1), ("FileDataSize",)),
        (0, truncated_layers, ("network 0",)),
        (0, lambda b: damaged(b, HEADER_BYTES, 0x0BADF00D), ("network 0",)),
        (1, huge_layer_count, ("network 1",)),
    ],
    ids=[
        "magic",
        "version",
        "size",
        "negative-size",
        "truncated-layers",
        "model-magic",
        "layer-count-2^31-1",
    ],
)
def test_damaged_initial_snapshots_are_bad_data(
    network_id: int,
    damage: Callable[[bytes], bytes],
    words: tuple[str, ...],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    def script(game: Any, config: Any, blobs: Any) -> None:
        game.begin(config)
        for nid, blob in enumerate(blobs):
            game.send_network(nid, damage(blob) if nid == network_id else blob)
            if nid == network_id:
                return  # the trainer refuses it on receipt and asks for nothing more

    check_bad(shm_in_process(tmp_path, script, capfd), *words)
