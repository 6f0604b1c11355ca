"""Hypothesis fuzzing of every decoder at the trainer's boundary, counting inputs tried and faults survived.

Each test mutates a *valid* encoding (byte edits, int32 edits with limit values, truncation, insertion) so
that most inputs get deep into the decoder, and states its invariant in the first line of its docstring:
the input either decodes or raises the decoder's documented error; nothing else escapes, nothing hangs.

Examples per decoder: ``LA_TRAINER_FUZZ_EXAMPLES`` (default 150, the CI run); e.g.
``LA_TRAINER_FUZZ_EXAMPLES=20000 pytest tests/faults/test_fuzz.py`` for the long run. The numbers (inputs
tried, inputs rejected with the documented error = faults survived, inputs decoded) are printed in the
terminal summary.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emulator.launch import EngineLayout, shared_memory_command, socket_command
from emulator.session import build_session_config
from protocol.argv import parse_launch_argv
from protocol.config import (
    ReplayBufferGuids,
    SharedMemoryConfig,
    data_config_to_json,
    parse_json,
    parse_shared_memory_config,
    session_from_shared_memory,
    session_from_socket,
    shared_memory_config_to_json,
    socket_config_to_json,
    trainer_config_to_json,
)
from protocol.controls import CONTROL_BLOCK_BYTES, TrainerControls
from protocol.errors import (
    ArgvError,
    ConfigError,
    ControlError,
    GuidError,
    ProtocolError,
    RecordError,
    ReplayError,
    SnapshotError,
    StreamError,
)
from protocol.guid import parse_guid
from protocol.record import Record, read_records, write_records
from protocol.replay import ReplayLayout
from protocol.snapshot import read_snapshot
from protocol.stream import (
    NEED_DATA,
    GameStreamDecoder,
    Signal,
    TrainerStreamDecoder,
    encode_complete,
    encode_config,
    encode_network_to_game,
    encode_network_to_trainer,
    encode_ping,
    encode_stop,
)
from tests.support.faults import FUZZ_STATS, SETTINGS, small_task

FUZZ_EXAMPLES = int(os.environ.get("LA_TRAINER_FUZZ_EXAMPLES", "150") or "150")
FUZZ = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)

TASK = small_task(size=6)
SMALL = replace(SETTINGS, hidden_layer_size=4)
CONFIG, BLOBS = build_session_config(TASK, SMALL, "/tmp/la-trainer-fuzz")
LAYOUT = ReplayLayout.from_config(CONFIG.replay_buffer(0))
LIMITS = [0, 1, -1, 2**31 - 1, -(2**31), 24, 64, 0x1E9B0C80, 0x0BA51C01]
"""int32 values that sit on decoder bounds (zero, sign bit, int32 max, header sizes, magics)."""


def mutations(valid: bytes) -> st.SearchStrategy[bytes]:
    """``valid`` with up to 6 byte edits, up to 3 aligned int32 edits (limit values), an optional insertion
    and an optional truncation: most inputs stay plausible enough to reach deep into the decoder."""
    size = max(len(valid), 1)
    byte_edits = st.lists(st.tuples(st.integers(0, size - 1), st.integers(0, 255)), max_size=6)
    word_edits = st.lists(
        st.tuples(
            st.integers(0, max(size // 4 - 1, 0)), st.sampled_from(LIMITS) | st.integers(-(2**31), 2**31 - 1)
        ),
        max_size=3,
    )
    insert = st.none() | st.tuples(st.integers(0, size), st.binary(min_size=1, max_size=16))
    cut = st.none() | st.integers(0, size)

    def apply(
        edits: list[tuple[int, int]],
        words: list[tuple[int, int]],
        ins: tuple[int, bytes] | None,
        end: int | None,
    ) -> bytes:
        data = bytearray(valid)
        for at, value in edits:
            if at < len(data):
                data[at] = value
        for index, value in words:
            if 4 * index + 4 <= len(data):
                struct.pack_into("<i", data, 4 * index, value)
        if ins is not None:
            data[ins[0] : ins[0]] = ins[1]
        return bytes(data[:end] if end is not None else data)

    return st.builds(apply, byte_edits, word_edits, insert, cut) | st.binary(max_size=2 * size)


def count(name: str, call: Callable[[], object], errors: tuple[type[BaseException], ...]) -> None:
    """Run one input: it decodes, or raises one of ``errors``; anything else fails the test."""
    stats = FUZZ_STATS.setdefault(name, [0, 0, 0])
    stats[0] += 1
    try:
        call()
    except errors:
        stats[1] += 1
        return
    stats[2] += 1


# -- snapshots and models --------------------------------------------------------------------------------------


@FUZZ
@given(data=st.sampled_from(BLOBS).flatmap(mutations))
def test_fuzz_received_snapshot(data: bytes) -> None:
    """Invariant: any snapshot bytes decode or raise SnapshotError (NNEError included), never anything else."""
    count("snapshot (read_snapshot)", lambda: read_snapshot(data), (SnapshotError,))


# -- the socket stream, both directions ------------------------------------------------------------------------


def _session_stream() -> bytes:
    raw = json.dumps(socket_config_to_json(CONFIG)).encode()
    parts = [b"".join(encode_config(raw))]
    parts += [b"".join(encode_network_to_trainer(i, blob)) for i, blob in enumerate(BLOBS)]
    parts.append(bytes([Signal.SEND_EXPERIENCE]) + LAYOUT.encode_socket(TASK.replay_buffer, -1))
    parts.append(encode_stop())
    return b"".join(parts)


SESSION_STREAM = _session_stream()


def _drain_trainer_stream(data: bytes, chunk: int) -> None:
    decoder = TrainerStreamDecoder()
    configured = False
    for start in range(0, len(data), chunk):
        decoder.feed(data[start : start + chunk])
        while (event := decoder.next_event()) is not NEED_DATA:
            if not configured and type(event).__name__ == "ConfigMessage":
                session = session_from_socket(parse_json(event.raw_json, "socket config"))  # type: ignore[union-attr]
                decoder.configure(
                    {net.id: net.max_byte_num for net in session.model.networks},
                    {rb.id: ReplayLayout.from_config(rb) for rb in session.data.replay_buffers},
                )
                configured = True
    decoder.eof()


@FUZZ
@given(data=mutations(SESSION_STREAM), chunk=st.integers(1, 4096))
def test_fuzz_trainer_stream(data: bytes, chunk: int) -> None:
    """Invariant: any byte stream from a game, fed in any chunking, yields messages or a ProtocolError
    (StreamError for framing, ConfigError/ReplayError for bodies), never anything else."""
    count("socket stream, game -> trainer", lambda: _drain_trainer_stream(data, chunk), (ProtocolError,))


GAME_STREAM = b"".join(
    [encode_ping()]
    + [b"".join(encode_network_to_game(i, 3, blob)) for i, blob in enumerate(BLOBS)]
    + [encode_ping(), encode_complete()]
)


def _drain_game_stream(data: bytes, chunk: int) -> None:
    decoder = GameStreamDecoder({net.id: net.max_byte_num for net in CONFIG.model.networks})
    for start in range(0, len(data), chunk):
        decoder.feed(data[start : start + chunk])
        while decoder.next_event() is not NEED_DATA:
            pass
    decoder.eof()


@FUZZ
@given(data=mutations(GAME_STREAM), chunk=st.integers(1, 4096))
def test_fuzz_game_stream(data: bytes, chunk: int) -> None:
    """Invariant: any byte stream from a trainer decodes on the game side or raises StreamError."""
    count("socket stream, trainer -> game", lambda: _drain_game_stream(data, chunk), (StreamError,))


# -- config files ----------------------------------------------------------------------------------------------

SOCKET_JSON = json.dumps(socket_config_to_json(CONFIG), indent="\t").encode()
TRAINER_JSON = json.dumps(trainer_config_to_json(CONFIG.trainer, True)).encode()
DATA_JSON = json.dumps(data_config_to_json(CONFIG.data, CONFIG.model)).encode()
SHM_JSON = json.dumps(
    shared_memory_config_to_json(
        SharedMemoryConfig(
            network_guids=tuple((i, "{" + f"{i:08X}-0000-0000-0000-000000000000" + "}") for i in range(3)),
            replay_buffers=(
                ReplayBufferGuids(
                    "{00000000-0000-0000-0000-00000000000A}",
                    "{00000000-0000-0000-0000-00000000000B}",
                    observations_guids=("{00000000-0000-0000-0000-00000000000C}",),
                    actions_guids=("{00000000-0000-0000-0000-00000000000D}",),
                ),
            ),
        )
    )
).encode()


@FUZZ
@given(data=mutations(SOCKET_JSON))
def test_fuzz_socket_config(data: bytes) -> None:
    """Invariant: any socket config bytes give a SessionConfig or a ConfigError."""
    count(
        "socket config JSON", lambda: session_from_socket(parse_json(data, "socket config")), (ConfigError,)
    )


@FUZZ
@given(trainer=mutations(TRAINER_JSON), data=mutations(DATA_JSON), shm=mutations(SHM_JSON))
def test_fuzz_shared_memory_configs(trainer: bytes, data: bytes, shm: bytes) -> None:
    """Invariant: any three config files give a SessionConfig and region table, or a ConfigError."""

    def decode() -> None:
        session_from_shared_memory(
            parse_json(trainer, "trainer-config.json"), parse_json(data, "data-config.json")
        )
        parse_shared_memory_config(parse_json(shm, "shared-memory.json"), source="shared-memory.json")

    count("shared-memory config files", decode, (ConfigError,))


# -- replay buffers, records ------------------------------------------------------------------------------------

REPLAY_FILE = LAYOUT.encode_file(TASK.replay_buffer)


@FUZZ
@given(data=mutations(REPLAY_FILE))
def test_fuzz_replay_file(data: bytes) -> None:
    """Invariant: any replaybuffer_<id>.bin decodes or raises ReplayError."""
    count("replay buffer file", lambda: LAYOUT.decode_file(data), (ReplayError,))


SOCKET_BODY = LAYOUT.encode_socket(TASK.replay_buffer, -1)[16:]


@FUZZ
@given(
    data=mutations(SOCKET_BODY),
    e=st.sampled_from([0, 1, 5, 6, 7, -1, 2**31 - 1]),
    s=st.sampled_from([0, 1, 6, 7, -1, 2**31 - 1]),
)
def test_fuzz_replay_socket_body(data: bytes, e: int, s: int) -> None:
    """Invariant: any SendExperience body with any counts decodes or raises ReplayError."""
    count("replay buffer socket body", lambda: LAYOUT.decode_socket_body(data, e, s, 0), (ReplayError,))


RECORD_FILE = write_records(
    [
        Record(3, 2, 2, 11, -12, TASK.replay_buffer.observations[0][:3], TASK.replay_buffer.actions[0][:3]),
        Record(1, 2, 2, 11, -12, TASK.replay_buffer.observations[0][3:4], TASK.replay_buffer.actions[0][3:4]),
    ]
)


@FUZZ
@given(data=mutations(RECORD_FILE))
def test_fuzz_record_file(data: bytes) -> None:
    """Invariant: any .record bytes decode or raise RecordError."""
    count(".record file", lambda: read_records(data), (RecordError,))


# -- control block, launch input ---------------------------------------------------------------------------------


@FUZZ
@given(values=st.lists(st.sampled_from(LIMITS) | st.integers(-3, 3), min_size=10, max_size=10))
def test_fuzz_control_block(values: list[int]) -> None:
    """Invariant: the trainer's half of every handshake, on any control-block contents, either proceeds
    or raises ControlError (never IndexError, never an assert)."""
    buf = bytearray(struct.pack("<10i", *values))
    assert len(buf) == CONTROL_BLOCK_BYTES

    def drive() -> None:
        controls = TrainerControls(buf, network_num=3)
        if controls.config_ready():
            controls.ack_config()
        controls.stop_requested()
        controls.request_network(0)
        if controls.network_received(0):
            info = controls.experience_ready()
            if info is not None:
                controls.ack_experience()
                if controls.can_send_network():
                    controls.post_network(0)
        controls.ping()

    count("control block (trainer half)", drive, (ControlError,))


_ENGINE = EngineLayout(
    root=Path("/r"),
    engine_dir=Path("/r/Engine"),
    project_dir=Path("/r/P"),
    intermediate_dir=Path("/r/P/Intermediate/LearningCore"),
    nne_cpu_path=Path("/r/Engine/NNE"),
    custom_trainer_path=Path("/r/Engine/Bin"),
)
ARGVS = [
    shared_memory_command(
        _ENGINE,
        "Training",
        Path("/r/P/Intermediate/LearningCore/Training0"),
        "{0A1B2C3D-0000-4000-8000-000000000001}",
    )[2:],
    socket_command(_ENGINE, "Training", "127.0.0.1", 48491)[2:],
]
TOKENS = st.sampled_from(
    [
        "",
        "-g",
        "-c",
        "-d",
        "-n",
        "0",
        "-1",
        "SharedMemory",
        "Socket",
        "127.0.0.1:99999",
        ":",
        "--nne-cpu-path",
        "-m",
        "{}",
    ]
)


@FUZZ
@given(
    base=st.sampled_from(ARGVS),
    edits=st.lists(st.tuples(st.integers(0, 20), TOKENS | st.text(max_size=12)), max_size=4),
    cut=st.none() | st.integers(0, 20),
)
def test_fuzz_launch_argv(base: list[str], edits: list[tuple[int, str]], cut: int | None) -> None:
    """Invariant: any engine-like command line parses or raises ArgvError."""
    argv = list(base)
    for at, token in edits:
        if at < len(argv):
            argv[at] = token
        else:
            argv.append(token)
    argv = argv[:cut] if cut is not None else argv
    count("launch argv", lambda: parse_launch_argv(argv), (ArgvError,))


@FUZZ
@given(
    text=st.sampled_from(
        [
            "{0A1B2C3D-4E5F-4000-8000-00000000ABCD}",
            "0A1B2C3D4E5F4000800000000000ABCD",
            "ChrfwL-5SEGAAIAAAAAqzQ",
        ]
    ).flatmap(
        lambda g: st.builds(
            lambda edits, end: "".join(
                c if i not in dict(edits) else dict(edits)[i] for i, c in enumerate(g)
            )[:end],
            st.lists(st.tuples(st.integers(0, len(g) - 1), st.characters()), max_size=3),
            st.none() | st.integers(0, len(g)),
        )
    )
)
def test_fuzz_guid(text: str) -> None:
    """Invariant: any GUID-like text parses or raises GuidError."""
    count("GUID text", lambda: parse_guid(text), (GuidError,))


# -- checkpoints (our own files: still never trusted) ------------------------------------------------------------


def _valid_checkpoint() -> bytes:
    import tempfile

    import torch

    from trainer.training.checkpoint import Fingerprint, TrainingState, save_checkpoint

    state = TrainingState(
        iteration=3,
        model={"w": torch.arange(6, dtype=torch.float32)},
        optimizer={"state": {}, "param_groups": [{"lr": 0.1, "params": [0]}]},
        generator=torch.Generator().get_state(),
        generator_device="cpu",
        smoothed_loss=0.5,
        fingerprint=Fingerprint((("k", "v"),)),
    )
    with tempfile.TemporaryDirectory() as folder:
        return save_checkpoint(folder, state).read_bytes()


CHECKPOINT_BYTES = _valid_checkpoint()


@FUZZ
@given(data=mutations(CHECKPOINT_BYTES))
def test_fuzz_checkpoint_file(data: bytes, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Invariant: any checkpoint file loads (only if its checksum holds) or raises CheckpointError."""
    from trainer.training.checkpoint import CheckpointError, load_checkpoint

    path = tmp_path_factory.mktemp("fuzz") / "checkpoint.pt"
    path.write_bytes(data)
    count("checkpoint file", lambda: load_checkpoint(path), (CheckpointError,))
