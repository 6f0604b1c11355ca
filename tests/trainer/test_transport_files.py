"""Export folders (spec §5.5): TrainingMaterials discovery, reading an export back, writing networks."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from protocol.config import session_from_files
from tests.support.configs import MODEL, TRAINER, sample_networks, sample_replay, small_data, write_export
from trainer.errors import BadData, LaunchError
from trainer.session.transport.files import (
    find_training_materials,
    network_path,
    read_training_materials,
    replay_buffer_path,
    write_network_files,
)

# --- trained networks -----------------------------------------------------------------------------------


def test_write_network_files(tmp_path: Path) -> None:
    write_network_files(tmp_path, {2: b"two", 0: b"zero"})
    assert network_path(tmp_path, 0).read_bytes() == b"zero"
    assert network_path(tmp_path, 2).read_bytes() == b"two"
    assert sorted(p.name for p in (tmp_path / "Networks").iterdir()) == ["network_0.bin", "network_2.bin"]


# --- discovery ------------------------------------------------------------------------------------------


def test_find_accepts_a_stamp_folder(tmp_path: Path) -> None:
    stamp = write_export(tmp_path / "20250101120000")
    assert find_training_materials(stamp) == stamp


def test_find_picks_the_newest_stamp(tmp_path: Path) -> None:
    materials = tmp_path / "TrainingMaterials"
    write_export(materials / "20240101120000")
    newest = write_export(materials / "20250102030405")
    (materials / "notes").mkdir()
    (materials / "2025").mkdir()  # not a stamp
    assert find_training_materials(materials) == newest
    assert find_training_materials(tmp_path) == newest  # the IntermediatePath above it


def test_find_without_exports_explains(tmp_path: Path) -> None:
    with pytest.raises(LaunchError) as info:
        find_training_materials(tmp_path)
    assert "YYYYmmddHHMMSS" in str(info.value)


def test_find_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(LaunchError):
        find_training_materials(tmp_path / "nope")


def test_find_lists_every_missing_part(tmp_path: Path) -> None:
    stamp = write_export(
        tmp_path / "20250101120000",
        skip=(
            "trainer-config.json",
            "Networks/network_0.bin",
            "Networks/network_1.bin",
            "Networks/network_2.bin",
        ),
    )
    with pytest.raises(LaunchError) as info:
        find_training_materials(stamp)
    message = str(info.value)
    assert "trainer-config.json" in message
    assert "Networks/network_<id>.bin" in message
    assert "data-config.json" not in message


# --- reading --------------------------------------------------------------------------------------------


def test_read_training_materials_round_trip(tmp_path: Path) -> None:
    stamp = write_export(tmp_path / "20250101120000")
    materials = read_training_materials(stamp)
    config, networks, replay_buffers = materials  # a named tuple unpacks like the plain one
    assert config == session_from_files(TRAINER, small_data(), MODEL)
    assert networks == sample_networks()
    (rb,) = replay_buffers
    expected = sample_replay()
    np.testing.assert_array_equal(rb.episode_starts, expected.episode_starts)
    np.testing.assert_array_equal(rb.episode_lengths, expected.episode_lengths)
    np.testing.assert_array_equal(rb.observations[0], expected.observations[0])
    np.testing.assert_array_equal(rb.actions[0], expected.actions[0])
    assert rb.observations[0].flags.writeable


def test_network_file_of_the_wrong_size_is_bad_data(tmp_path: Path) -> None:
    stamp = write_export(tmp_path / "20250101120000")
    with open(network_path(stamp, 1), "ab") as handle:
        handle.write(b"\0")
    with pytest.raises(BadData) as info:
        read_training_materials(stamp)
    assert "network 1" in str(info.value) and "1601" in str(info.value)


def test_missing_replay_file_is_a_launch_error(tmp_path: Path) -> None:
    stamp = write_export(tmp_path / "20250101120000")
    os.unlink(replay_buffer_path(stamp, 0))
    with pytest.raises(LaunchError):
        read_training_materials(stamp)
