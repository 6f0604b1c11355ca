"""Engine configuration JSON (spec §2.6, §3, §4, §5.5): parse, defaults, warnings, errors, encoders."""

from __future__ import annotations

import codecs
import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.config import (
    MAX_JSON_DEPTH,
    FlowMatchingSettings,
    FlowMatchingTrainingSettings,
    NetworkConfig,
    ReplayBufferGuids,
    SessionConfig,
    SharedMemoryConfig,
    StreamConfig,
    TrainerConfig,
    check_shared_memory_config,
    data_config_to_json,
    dump_json,
    engine_json_bytes,
    model_config_to_json,
    parse_data_config,
    parse_json,
    parse_model_config,
    parse_shared_memory_config,
    parse_trainer_config,
    session_from_files,
    session_from_shared_memory,
    session_from_socket,
    shared_memory_config_to_json,
    socket_config_to_json,
    trainer_config_to_json,
)
from protocol.errors import ConfigError, ProtocolError
from protocol.schema import parse_schema
from tests.support.configs import DATA, MODEL, TRAINER
from tests.support.schemas import OBSERVATION_SCHEMA

# --------------------------------------------------------------------------------------------------
# Engine-shaped JSON (numbers as the engine writes them: whole doubles without a decimal point)


GUID = "{0A1B2C3D-0000-1111-2222-333344445555}"
ZERO_GUID = "{00000000-0000-0000-0000-000000000000}"
SHARED_MEMORY: dict[str, Any] = {
    "NetworkGuids": [{"NetworkId": i, "Guid": GUID.replace("0A1B", f"000{i}")} for i in range(3)],
    "ReplayBuffers": [
        {
            "EpisodeStartsGuid": GUID.replace("0A1B", "A000"),
            "EpisodeLengthsGuid": GUID.replace("0A1B", "A001"),
            "EpisodeCompletionModesGuid": ZERO_GUID,
            "EpisodeFinalObservationsGuids": [],
            "EpisodeFinalMemoryStatesGuids": [],
            "ObservationsGuids": [GUID.replace("0A1B", "B000")],
            "ActionsGuids": [GUID.replace("0A1B", "C000")],
            "ActionModifiersGuids": [],
            "MemoryStatesGuids": [],
            "RewardsGuids": [],
        }
    ],
}


def socket_obj() -> dict[str, Any]:
    trainer = {k: copy.deepcopy(v) for k, v in TRAINER.items() if k != "TempDirectory"}
    return {**copy.deepcopy(DATA), **copy.deepcopy(MODEL), "TrainerSettings": trainer}


def shm_session() -> SessionConfig:
    return session_from_shared_memory(copy.deepcopy(TRAINER), {**copy.deepcopy(DATA), **copy.deepcopy(MODEL)})


# --------------------------------------------------------------------------------------------------
# The three assemblies


def test_shared_memory_assembly() -> None:
    session = shm_session()
    assert session.warnings == ()
    assert session.trainer == TrainerConfig(
        trainer_method="FlowMatching",
        time_stamp="2026-05-09_12-30-417",
        training=FlowMatchingTrainingSettings(20000, 0.0003, 0.0001, 512, 0.05, True, 77, False, 500),
        embed_normalizations_in_weights=True,
        device="CPU",
        use_tensorboard=True,
        use_mlflow=False,
        mlflow_tracking_uri="",
        temp_directory="C:/Projects/Racer/Intermediate/LearningCore",
    )
    assert session.model.networks[1] == NetworkConfig(1, "FM_Encoder", 1600, 0, None)
    assert session.model.flow_matching == FlowMatchingSettings(4, 2, 256, "GELU")
    rb = session.replay_buffer(0)
    assert (rb.max_episode_num, rb.max_step_num, rb.has_completions) == (12, 3400, False)
    assert rb.observations == (StreamConfig(0, "Observations", 0, 22),)
    assert session.observation_dim == 22 and session.action_dim == 6
    assert session.action_chunk_size == 4 and session.denoiser_action_dim == 24
    assert session.observation_schema.schema == parse_schema(OBSERVATION_SCHEMA, "observation")
    assert session.action_schema.name == "Default"
    assert session.network(2).name == "FM_Decoder"


def test_socket_assembly_equals_shared_memory_but_for_temp_directory() -> None:
    session = session_from_socket(socket_obj())
    assert session.warnings == ()
    assert session.trainer.temp_directory is None
    shm = shm_session()
    assert session.data == shm.data and session.model == shm.model
    assert session.trainer.training == shm.trainer.training


def test_files_assembly() -> None:
    session = session_from_files(copy.deepcopy(TRAINER), copy.deepcopy(DATA), copy.deepcopy(MODEL))
    assert session.warnings == ()
    assert session == shm_session()


def test_lookups_fail_with_config_error() -> None:
    session = shm_session()
    with pytest.raises(ConfigError):
        session.network(3)
    with pytest.raises(ConfigError):
        session.replay_buffer(1)
    with pytest.raises(ConfigError):
        session.data.action_schema(5)


# --------------------------------------------------------------------------------------------------
# Encoders: round trips


def test_encoders_round_trip() -> None:
    session = shm_session()
    assert trainer_config_to_json(session.trainer) == TRAINER
    assert data_config_to_json(session.data) == DATA
    assert model_config_to_json(session.model) == MODEL
    assert data_config_to_json(session.data, session.model) == {**DATA, **MODEL}
    assert socket_config_to_json(session) == socket_obj()
    assert session_from_socket(socket_config_to_json(session)).data == session.data
    again = session_from_shared_memory(
        parse_json(dump_json(trainer_config_to_json(session.trainer)), "t"),
        parse_json(dump_json(data_config_to_json(session.data, session.model)), "d"),
    )
    assert again == session


def test_whole_floats_are_written_as_integers() -> None:
    out = trainer_config_to_json(
        TrainerConfig(training=FlowMatchingTrainingSettings(observation_noise_scale=0.0))
    )
    assert json.dumps(out["FlowMatchingTrainingSettings"]).count("0.0001") == 2
    assert '"ObservationNoiseScale": 0,' in json.dumps(out["FlowMatchingTrainingSettings"])
    assert "TempDirectory" not in out


def test_defaults_encode_and_parse_back() -> None:
    cfg = TrainerConfig(temp_directory="/tmp/x")
    assert parse_trainer_config(trainer_config_to_json(cfg)) == cfg
    assert "TempDirectory" not in trainer_config_to_json(cfg, include_temp_directory=False)


# --------------------------------------------------------------------------------------------------
# Defaults and warnings


def test_missing_optional_keys_take_engine_defaults_with_warnings() -> None:
    warnings: list[str] = []
    cfg = parse_trainer_config({}, warnings)
    assert cfg == TrainerConfig()
    assert cfg.training == FlowMatchingTrainingSettings(
        1000000, 1e-4, 1e-4, 256, 0.0, False, 1234, True, 1000
    )
    assert (
        "trainer-config.json: TrainerMethod is missing; using the engine default 'FlowMatching'" in warnings
    )
    assert any("FlowMatchingTrainingSettings is missing" in w for w in warnings)
    assert any("TempDirectory is missing" in w for w in warnings)


def test_missing_nested_key_names_its_path() -> None:
    trainer = copy.deepcopy(TRAINER)
    del trainer["FlowMatchingTrainingSettings"]["BatchSize"]
    warnings: list[str] = []
    cfg = parse_trainer_config(trainer, warnings)
    assert cfg.training.batch_size == 256
    assert warnings == [
        "trainer-config.json: FlowMatchingTrainingSettings.BatchSize is missing; using the engine default 256"
    ]


def test_model_defaults() -> None:
    model = copy.deepcopy(MODEL)
    del model["FlowMatchingSettings"]
    warnings: list[str] = []
    assert parse_model_config(model, warnings).flow_matching == FlowMatchingSettings(1, 1, 128, "ELU")
    assert warnings == [
        "model-config.json: FlowMatchingSettings is missing; using the engine defaults for all its keys"
    ]


def test_unknown_keys_are_reported_not_dropped_silently() -> None:
    obj = socket_obj()
    obj["NewTopLevel"] = 1
    obj["TrainerSettings"]["FlowMatchingTrainingSettings"]["Warmup"] = 10
    obj["ReplayBuffers"][0]["Observations"][0]["Extra"] = True
    obj["Networks"][0]["Flavour"] = "x"
    session = session_from_socket(obj)
    assert session.warnings == (
        "socket config: NewTopLevel is not a known key; ignored",
        "socket config: TrainerSettings.FlowMatchingTrainingSettings.Warmup is not a known key; ignored",
        "socket config: ReplayBuffers[0].Observations[0].Extra is not a known key; ignored",
        "socket config: Networks[0].Flavour is not a known key; ignored",
    )


def test_model_keys_in_a_data_config_are_not_unknown() -> None:
    warnings: list[str] = []
    parse_data_config({**DATA, **MODEL}, warnings)
    parse_model_config({**DATA, **MODEL}, warnings)
    assert warnings == []


def test_unknown_enum_strings_are_kept_with_a_warning() -> None:
    trainer = copy.deepcopy(TRAINER)
    trainer["Device"] = "TPU"
    trainer["TrainerMethod"] = "PPO"
    model = copy.deepcopy(MODEL)
    model["FlowMatchingSettings"]["ActivationFunction"] = "Swish"
    session = session_from_files(trainer, copy.deepcopy(DATA), model)
    assert session.trainer.device == "TPU" and session.trainer.trainer_method == "PPO"
    assert len(session.warnings) == 2


def test_optional_replay_buffer_keys() -> None:
    data = copy.deepcopy(DATA)
    for key in ("HasCompletions", "ActionModifiers", "Rewards"):
        del data["ReplayBuffers"][0][key]
    warnings: list[str] = []
    rb = parse_data_config(data, warnings).replay_buffers[0]
    assert rb.has_completions is False and rb.rewards == () and rb.action_modifiers == ()
    assert len(warnings) == 3 and all(w.startswith("data-config.json: ReplayBuffers[0].") for w in warnings)


# --------------------------------------------------------------------------------------------------
# Errors name the key path, the expected type and the actual value


def _raises(fn: Any, *args: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        fn(*args)
    return info.value


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.pop("ReplayBuffers"), "ReplayBuffers"),
        (lambda d: d.pop("Schemas"), "Schemas"),
        (lambda d: d.pop("Networks"), "Networks"),
        (lambda d: d["Networks"][1].pop("MaxByteNum"), "Networks[1].MaxByteNum"),
        (lambda d: d["Networks"][1].pop("Id"), "Networks[1].Id"),
        (lambda d: d["ReplayBuffers"][0].pop("MaxStepNum"), "ReplayBuffers[0].MaxStepNum"),
        (lambda d: d["ReplayBuffers"][0].pop("Actions"), "ReplayBuffers[0].Actions"),
        (
            lambda d: d["ReplayBuffers"][0]["Actions"][0].pop("SchemaId"),
            "ReplayBuffers[0].Actions[0].SchemaId",
        ),
        (lambda d: d["Schemas"].pop("Actions"), "Schemas.Actions"),
        (lambda d: d["Schemas"]["Observations"][0].pop("Schema"), "Schemas.Observations[0].Schema"),
        (
            lambda d: d["Schemas"]["Observations"][0]["Schema"]["Elements"]["Speed"].update(VectorSize=2),
            "Schemas.Observations[0].Schema.Elements.Speed.VectorSize",
        ),
        (lambda d: d["ReplayBuffers"][0].update(MaxEpisodeNum=-1), "ReplayBuffers[0].MaxEpisodeNum"),
        (lambda d: d["ReplayBuffers"][0].update(MaxEpisodeNum=2**31), "ReplayBuffers[0].MaxEpisodeNum"),
        (lambda d: d["ReplayBuffers"][0].update(HasCompletions=0), "ReplayBuffers[0].HasCompletions"),
        (lambda d: d["ReplayBuffers"].append(copy.deepcopy(d["ReplayBuffers"][0])), "ReplayBuffers"),
        (lambda d: d["Networks"][2].update(Id=1), "Networks"),
        (
            lambda d: d["FlowMatchingSettings"].update(ActionChunkSize=0),
            "FlowMatchingSettings.ActionChunkSize",
        ),
        (lambda d: d["TrainerSettings"].update(Device=1), "TrainerSettings.Device"),
        (
            lambda d: d["TrainerSettings"]["FlowMatchingTrainingSettings"].update(BatchSize="256"),
            "TrainerSettings.FlowMatchingTrainingSettings.BatchSize",
        ),
        (
            lambda d: d["TrainerSettings"]["FlowMatchingTrainingSettings"].update(IterationsPerSnapshot=0),
            "TrainerSettings.FlowMatchingTrainingSettings.IterationsPerSnapshot",
        ),
        (
            lambda d: d["TrainerSettings"]["FlowMatchingTrainingSettings"].update(LearningRate=-1),
            "TrainerSettings.FlowMatchingTrainingSettings.LearningRate",
        ),
        (lambda d: d.update(TrainerSettings=[]), "TrainerSettings"),
    ],
)
def test_errors_name_the_field(mutate: Any, field: str) -> None:
    obj = socket_obj()
    mutate(obj)
    err = _raises(session_from_socket, obj)
    assert err.field == field
    assert str(err).startswith("socket config: ")
    assert field in str(err)


@pytest.mark.parametrize(
    ("value", "ok"), [(256, True), (256.0, True), (256.5, False), (True, False), (None, False)]
)
def test_integers_arrive_as_doubles(value: object, ok: bool) -> None:
    trainer = copy.deepcopy(TRAINER)
    trainer["FlowMatchingTrainingSettings"]["BatchSize"] = value
    if ok:
        assert parse_trainer_config(trainer).training.batch_size == 256
    else:
        err = _raises(parse_trainer_config, trainer)
        assert err.field == "FlowMatchingTrainingSettings.BatchSize" and err.actual == value
        assert err.expected == "integer"


def test_stream_width_must_match_its_schema() -> None:
    data = copy.deepcopy(DATA)
    data["ReplayBuffers"][0]["Actions"][0]["VectorDimensionNum"] = 7
    err = _raises(session_from_files, copy.deepcopy(TRAINER), data, copy.deepcopy(MODEL))
    assert (
        "ReplayBuffers[0].Actions[0].VectorDimensionNum is 7 but the action schema 'Default' has VectorSize 6"
        in str(err)
    )
    assert str(err).startswith("ReplayBuffers/data-config.json: ")
    assert (err.expected, err.actual) == (6, 7)


def test_stream_schema_id_must_exist() -> None:
    data = copy.deepcopy(DATA)
    data["ReplayBuffers"][0]["Observations"][0]["SchemaId"] = 3
    err = _raises(session_from_files, copy.deepcopy(TRAINER), data, copy.deepcopy(MODEL))
    assert err.field == "ReplayBuffers[0].Observations[0].SchemaId"


@pytest.mark.parametrize(("key", "value"), [("InputSchemaId", 4), ("OutputSchemaId", 4)])
def test_network_schema_ids_must_exist(key: str, value: int) -> None:
    model = copy.deepcopy(MODEL)
    model["Networks"][1 if key == "InputSchemaId" else 2][key] = value
    err = _raises(session_from_files, copy.deepcopy(TRAINER), copy.deepcopy(DATA), model)
    assert err.field is not None and err.field.endswith(key)


def test_flow_matching_needs_networks_0_1_2() -> None:
    model = copy.deepcopy(MODEL)
    del model["Networks"][2]
    err = _raises(session_from_files, copy.deepcopy(TRAINER), copy.deepcopy(DATA), model)
    assert err.field == "Networks" and "[2]" in str(err)
    # Another method is recorded as given: what is supported is the caller's decision.
    trainer = {**copy.deepcopy(TRAINER), "TrainerMethod": "BehaviorCloning"}
    assert session_from_files(trainer, copy.deepcopy(DATA), model).trainer.trainer_method == "BehaviorCloning"


def test_flow_matching_needs_one_observation_and_one_action_stream() -> None:
    data = copy.deepcopy(DATA)
    data["ReplayBuffers"][0]["Actions"].append(
        {"Id": 1, "Name": "More", "SchemaId": 0, "VectorDimensionNum": 6}
    )
    err = _raises(session_from_files, copy.deepcopy(TRAINER), data, copy.deepcopy(MODEL))
    assert err.field == "ReplayBuffers[0].Actions" and (err.expected, err.actual) == (1, 2)


@pytest.mark.parametrize(
    ("size", "ok"), [(24, False), (25, True), (2**31 - 1, True), (2**31, False), (0, False)]
)
def test_max_byte_num_bounds(size: int, ok: bool) -> None:
    model = copy.deepcopy(MODEL)
    model["Networks"][0]["MaxByteNum"] = size
    if ok:
        assert parse_model_config(model).networks[0].max_byte_num == size
    else:
        assert _raises(parse_model_config, model).field == "Networks[0].MaxByteNum"


# --------------------------------------------------------------------------------------------------
# parse_json


def test_parse_json_plain_and_with_boms() -> None:
    text = json.dumps({"Path": "C:/Users/Zoë/Intermediate"})
    expected = {"Path": "C:/Users/Zoë/Intermediate"}
    assert parse_json(text.encode(), "x") == expected
    assert parse_json(codecs.BOM_UTF8 + text.encode(), "x") == expected
    assert parse_json(text.encode("utf-16"), "x") == expected  # BOM + UTF-16 (UE's non-ASCII file writer)
    assert parse_json(memoryview(bytearray(text.encode())), "x") == expected


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b'{"a": 1,\n "b": }', "line 2 column 7"),
        (b'{"a": NaN}', "NaN"),
        (b'{"a": -Infinity}', "-Infinity"),
        (b'{"a": 1, "a": 2}', "duplicate key 'a'"),
        (b"\xff\xfe\xfd", "not valid text"),
        (b'{"a": "\xc3"}', "not valid text at byte 7"),
        (b"", "line 1 column 1"),
        (b"1" * 5000, "invalid JSON"),
    ],
)
def test_parse_json_errors_name_source_and_position(raw: bytes, needle: str) -> None:
    err = _raises(parse_json, raw, "data-config.json")
    assert str(err).startswith("data-config.json: ")
    assert needle in str(err)


def test_parse_json_depth_limit() -> None:
    assert parse_json(b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH, "x") is not None
    deeper = b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1)
    assert "deeper" in str(_raises(parse_json, deeper, "x"))
    very_deep = b"[" * 100000 + b"]" * 100000
    assert "deeper" in str(_raises(parse_json, very_deep, "x"))


def test_engine_json_is_tab_indented_and_files_are_ascii_or_utf16_with_bom() -> None:
    assert dump_json({"a": 1}) == engine_json_bytes({"a": 1}) == b'{\n\t"a": 1\n}'
    path = {"TempDirectory": "C:/Projekt/Überall"}
    assert dump_json(path) == '{\n\t"TempDirectory": "C:/Projekt/Überall"\n}'.encode()  # the socket: UTF-8
    raw = engine_json_bytes(path)  # a file: UE's writer falls back to UTF-16LE with a BOM
    assert raw.startswith(codecs.BOM_UTF16_LE)
    assert parse_json(raw, "trainer-config.json") == parse_json(dump_json(path), "socket") == path


@pytest.mark.parametrize("encode", [dump_json, engine_json_bytes])
def test_engine_json_encoders_refuse_what_the_engine_never_writes(encode: Any) -> None:
    with pytest.raises(ValueError):
        encode({"LearningRate": float("nan")})


# --------------------------------------------------------------------------------------------------
# shared-memory-<GUID>.json


def test_shared_memory_config_round_trip_and_region_names() -> None:
    warnings: list[str] = []
    cfg = parse_shared_memory_config(copy.deepcopy(SHARED_MEMORY), warnings)
    assert warnings == []
    assert cfg.network_guid(2) == "{00022C3D-0000-1111-2222-333344445555}"
    assert shared_memory_config_to_json(cfg) == SHARED_MEMORY
    names = cfg.replay_buffers[0].by_region_name()
    assert names["EpisodeStarts"].startswith("{A000") and names["Observations[0]"].startswith("{B000")
    assert names["EpisodeCompletionModes"] == ZERO_GUID
    assert "Rewards[0]" not in names
    check_shared_memory_config(shm_session(), cfg)


def test_shared_memory_config_errors() -> None:
    session = shm_session()
    short = SharedMemoryConfig(
        ((0, GUID), (1, GUID)), parse_shared_memory_config(SHARED_MEMORY).replay_buffers
    )
    assert _raises(check_shared_memory_config, session, short).field == "NetworkGuids"
    no_actions = SharedMemoryConfig(
        (*short.network_guids, (2, GUID)), (ReplayBufferGuids(GUID, GUID, ZERO_GUID, (), (), (GUID,), ()),)
    )
    assert _raises(check_shared_memory_config, session, no_actions).field == "ReplayBuffers[0].ActionsGuids"
    none = SharedMemoryConfig(no_actions.network_guids, ())
    assert _raises(check_shared_memory_config, session, none).field == "ReplayBuffers[0]"
    bad = copy.deepcopy(SHARED_MEMORY)
    bad["ReplayBuffers"][0]["ObservationsGuids"] = [7]
    assert _raises(parse_shared_memory_config, bad).field == "ReplayBuffers[0].ObservationsGuids[0]"
    bad = copy.deepcopy(SHARED_MEMORY)
    del bad["ReplayBuffers"][0]["EpisodeStartsGuid"]
    assert _raises(parse_shared_memory_config, bad).field == "ReplayBuffers[0].EpisodeStartsGuid"


# --------------------------------------------------------------------------------------------------
# Fuzz


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=64) | st.text(max_size=64).map(str.encode))
def test_fuzz_parse_json(raw: bytes) -> None:
    """Any bytes either decode to a JSON value or raise ConfigError; nothing else escapes."""
    try:
        parse_json(raw, "fuzz")
    except ProtocolError as exc:
        assert isinstance(exc, ConfigError)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


_SOCKET_PATHS = _paths(socket_obj())[1:]
_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**33), 2**33),
    st.floats(allow_nan=False),
    st.text(max_size=4),
    st.just([]),
    st.just({}),
)


@settings(max_examples=300, deadline=None)
@given(
    edits=st.lists(st.tuples(st.sampled_from(_SOCKET_PATHS), st.booleans(), _values), min_size=1, max_size=3)
)
def test_fuzz_socket_config_mutations(edits: list[tuple[tuple[Any, ...], bool, object]]) -> None:
    """Any edit of a valid socket config either parses into a SessionConfig or raises ConfigError."""
    obj: Any = socket_obj()
    for path, delete, value in edits:
        parent = obj
        try:
            for key in path[:-1]:
                parent = parent[key]
            if delete and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit removed this path
    try:
        session = session_from_socket(obj)
    except ProtocolError as exc:
        assert isinstance(exc, ConfigError)
        return
    assert isinstance(session, SessionConfig)
    assert session_from_socket(socket_config_to_json(session)).data == session.data
