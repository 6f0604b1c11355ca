"""The train.py launch grammar (spec §1.2-1.4): the engine's exact argv both ways, long forms, errors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.argv import (
    USAGE,
    LaunchArgs,
    SharedMemoryArgs,
    SocketArgs,
    format_launch_argv,
    parse_address,
    parse_launch_argv,
)
from protocol.errors import ArgvError

GUID = "{6F9619FF-8B86-D011-B42D-00C04FC964FF}"

# (argv exactly as the 5.8 engine writes it after the script path, parsed value)
ENGINE_CASES: list[tuple[list[str], LaunchArgs]] = [
    (
        [
            "Training",
            "-p",
            "/Game/Binaries/Linux",
            "-m",
            "learning_core.train_flow_matching",
            "-l",
            "--nne-cpu-path",
            "/Engine/Plugins/Experimental/NNERuntimeBasicCpu/Content/Python",
            "SharedMemory",
            "/Game/Intermediate/LearningCore/Training0",
            "-g",
            GUID,
        ],
        LaunchArgs(
            task_name="Training",
            trainer_path="/Game/Binaries/Linux",
            trainer_module="learning_core.train_flow_matching",
            log=True,
            nne_cpu_path="/Engine/Plugins/Experimental/NNERuntimeBasicCpu/Content/Python",
            mode=SharedMemoryArgs(
                task_dir="/Game/Intermediate/LearningCore/Training0", controls_guid=GUID, create_mem=False
            ),
        ),
    ),
    (
        # Silent logging: the engine writes "" where -l would be.
        [
            "Training",
            "-p",
            "C:/Game/Binaries/Win64",
            "-m",
            "learning_core.train_behavior_cloning",
            "",
            "--nne-cpu-path",
            "C:/Engine/NNE",
            "Socket",
            "127.0.0.1:48491",
            "C:/Game/Intermediate/LearningCore",
        ],
        LaunchArgs(
            task_name="Training",
            trainer_path="C:/Game/Binaries/Win64",
            trainer_module="learning_core.train_behavior_cloning",
            log=False,
            nne_cpu_path="C:/Engine/NNE",
            mode=SocketArgs(host="127.0.0.1", port=48491, temp_directory="C:/Game/Intermediate/LearningCore"),
        ),
    ),
    (
        # Mac Short GUID, silent logging, shared memory.
        [
            "Task",
            "-p",
            "/p",
            "-m",
            "m",
            "",
            "--nne-cpu-path",
            "/n",
            "SharedMemory",
            "/t",
            "-g",
            "ASNFZ4mrze_-3LqYdlQyEA",
        ],
        LaunchArgs("Task", "/p", "m", False, "/n", SharedMemoryArgs("/t", "ASNFZ4mrze_-3LqYdlQyEA")),
    ),
]


@pytest.mark.parametrize(("argv", "expected"), ENGINE_CASES)
def test_engine_argv_both_ways(argv: list[str], expected: LaunchArgs) -> None:
    assert parse_launch_argv(argv) == expected
    assert format_launch_argv(expected) == argv


def test_5_6_grammar_without_nne_cpu_path() -> None:
    args = parse_launch_argv(
        ["Training", "-p", "/p", "-m", "train_ppo", "-l", "SharedMemory", "/t", "-g", GUID]
    )
    assert args.nne_cpu_path is None
    assert args.trainer_module == "train_ppo"
    assert isinstance(args.mode, SharedMemoryArgs)


def test_long_options_and_equals_form() -> None:
    args = parse_launch_argv(
        [
            "T",
            "--trainer-path=/p",
            "--trainer-module",
            "mod",
            "--log",
            "--nne-cpu-path=/n",
            "SharedMemory",
            "--controls-guid",
            GUID,
            "--create-mem",
            "--make-task-dir",
            "--num-processes=1",
            "/task",
        ]
    )
    assert args == LaunchArgs(
        "T", "/p", "mod", True, "/n", SharedMemoryArgs("/task", GUID, create_mem=True, make_task_dir=True)
    )


def test_attach_mode_short_switches() -> None:
    args = parse_launch_argv(["T", "SharedMemory", "/task", "-g", GUID, "-c", "-d", "-n", "1"])
    assert args.mode == SharedMemoryArgs("/task", GUID, create_mem=True, make_task_dir=True, num_processes=1)
    assert (args.trainer_path, args.trainer_module, args.log, args.nne_cpu_path) == (None, None, False, None)


def test_socket_options_and_ipv6() -> None:
    args = parse_launch_argv(
        ["T", "Socket", "[::1]:9000", "/tmp", "-n", "2", "--min-batch-size", "8", "--max-batch-size=512"]
    )
    assert args.mode == SocketArgs("::1", 9000, "/tmp", num_processes=2, min_batch_size=8, max_batch_size=512)
    assert format_launch_argv(args)[-8:] == [
        "[::1]:9000",
        "/tmp",
        "-n",
        "2",
        "--min-batch-size",
        "8",
        "--max-batch-size",
        "512",
    ]


def test_empty_items_are_ignored_but_an_empty_option_value_is_kept() -> None:
    # [INF] decision: a stand-alone "" is the silent-log placeholder; after -p it is -p's value.
    args = parse_launch_argv(["", "T", "", "-p", "", "-m", "", "", "SharedMemory", "", "/t", ""])
    assert args.trainer_path == ""
    assert args.trainer_module == ""
    assert format_launch_argv(args) == ["T", "-p", "", "-m", "", "", "SharedMemory", "/t"]


def test_double_dash_ends_options() -> None:
    args = parse_launch_argv(["T", "SharedMemory", "--", "/t"])
    assert args.mode == SharedMemoryArgs("/t", None)


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [
        ("127.0.0.1:48491", "127.0.0.1", 48491),
        ("localhost:1", "localhost", 1),
        ("[::1]:65535", "::1", 65535),
        ("[fe80::1%eth0]:80", "fe80::1%eth0", 80),
        ("h:0080", "h", 80),
    ],
)
def test_addresses(text: str, host: str, port: int) -> None:
    assert parse_address(text) == (host, port)


ERRORS: list[tuple[list[str], str]] = [
    ([], "TASK_NAME"),
    (["T"], "sub-command"),
    (["T", "Other", "/t"], "sub-command"),
    (["T", "SharedMemory"], "TASK_DIR"),
    (["T", "SharedMemory", "/a", "/b"], "TASK_DIR"),
    (["T", "Socket", "127.0.0.1:1"], "TEMP_DIRECTORY"),
    (["T", "Socket"], "HOST:PORT"),
    (["T", "Socket", "h:1", "/t", "/extra"], "TEMP_DIRECTORY"),
    (["T", "--bogus", "SharedMemory", "/t"], "--bogus"),
    (["T", "SharedMemory", "/t", "-x"], "-x"),
    (["T", "-p"], "-p/--trainer-path"),
    (["T", "-p", "-m", "mod", "SharedMemory", "/t"], "-p/--trainer-path"),
    (["T", "-l=yes", "SharedMemory", "/t"], "unknown option -l=yes"),
    (["T", "--log=1", "SharedMemory", "/t"], "-l/--log"),
    (["T", "-l", "-l", "SharedMemory", "/t"], "given twice"),
    (["T", "-g", GUID, "SharedMemory", "/t"], "belongs after SharedMemory"),
    (["T", "SharedMemory", "/t", "-l"], "belongs before the sub-command"),
    (["T", "Socket", "h:1", "/t", "-g", GUID], "-g"),
    (["T", "SharedMemory", "/t", "-g", "not-a-guid"], "-g/--controls-guid"),
    (["T", "SharedMemory", "/t", "-n", "0"], "-n/--num-processes"),
    (["T", "SharedMemory", "/t", "-n", "-1"], "-n/--num-processes"),
    (["T", "SharedMemory", "/t", "-n", "2147483648"], "-n/--num-processes"),
    (["T", "SharedMemory", "/t", "-n", "1_0"], "-n/--num-processes"),
    (["T", "SharedMemory", "/t", "-n", "\u0663"], "-n/--num-processes"),
    (["T", "Socket", "h:0", "/t"], "port 0"),
    (["T", "Socket", "h:65536", "/t"], "port 65536"),
    (["T", "Socket", "h:-1", "/t"], "digits"),
    (["T", "Socket", "h:http", "/t"], "digits"),
    (["T", "Socket", "h", "/t"], "no ':PORT'"),
    (["T", "Socket", ":80", "/t"], "host"),
    (["T", "Socket", "::1:80", "/t"], "brackets"),
    (["T", "Socket", "[::1]80", "/t"], "[IPv6]:PORT"),
    (["T", "Socket", "h:1", "/t", "--min-batch-size", "9", "--max-batch-size", "8"], "--min-batch-size"),
    (["T", "Socket", "h:1", "/t", "--max-batch-size", "0"], "--max-batch-size"),
]


@pytest.mark.parametrize(("argv", "named"), ERRORS)
def test_errors_name_the_switch_and_show_the_grammar(argv: list[str], named: str) -> None:
    with pytest.raises(ArgvError) as info:
        parse_launch_argv(argv)
    text = str(info.value)
    assert named in text
    assert USAGE in text


def test_argv_must_be_a_sequence_of_strings() -> None:
    with pytest.raises(ArgvError):
        parse_launch_argv("Training SharedMemory /t")
    with pytest.raises(ArgvError):
        parse_launch_argv(["T", 1])  # type: ignore[list-item]


def test_construction_validates_so_every_value_formats_and_parses_back() -> None:
    with pytest.raises(ArgvError, match="TASK_NAME"):
        LaunchArgs("-T", None, None, False, None, SharedMemoryArgs("/t", None))
    with pytest.raises(ArgvError, match="-p/--trainer-path"):
        LaunchArgs("T", "-m", None, False, None, SharedMemoryArgs("/t", None))
    with pytest.raises(ArgvError, match="TASK_DIR"):
        SharedMemoryArgs("", None)
    with pytest.raises(ArgvError, match="host"):
        SocketArgs("bad host", 1, "/t")
    with pytest.raises(ArgvError, match="port"):
        SocketArgs("h", 70000, "/t")
    with pytest.raises(ArgvError, match="-l/--log"):
        LaunchArgs("T", None, None, 1, None, SharedMemoryArgs("/t", None))  # type: ignore[arg-type]


# -- properties -----------------------------------------------------------------------------------------

_safe_text = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), min_size=0, max_size=12
)
_positional = _safe_text.filter(lambda s: s != "" and not s.startswith("-"))
_value = _safe_text.filter(lambda s: not s.startswith("-"))
_guid_text = st.sampled_from([GUID, "ASNFZ4mrze_-3LqYdlQyEA", "6f9619ff8b86d011b42d00c04fc964ff"])
_count = st.integers(min_value=1, max_value=2**31 - 1)
_host = st.one_of(
    st.sampled_from(["127.0.0.1", "localhost", "::1", "fe80::1"]),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789.-", min_size=1, max_size=10).filter(
        lambda s: not s.startswith("-")
    ),
)
_shm = st.builds(
    SharedMemoryArgs,
    task_dir=_positional,
    controls_guid=st.none() | _guid_text,
    create_mem=st.booleans(),
    make_task_dir=st.booleans(),
    num_processes=_count,
)


@st.composite
def _socket(draw: st.DrawFn) -> SocketArgs:
    low = draw(_count)
    high = draw(st.integers(min_value=low, max_value=2**31 - 1))
    return SocketArgs(
        host=draw(_host),
        port=draw(st.integers(min_value=1, max_value=65535)),
        temp_directory=draw(_positional),
        num_processes=draw(_count),
        min_batch_size=low,
        max_batch_size=high,
    )


_launch = st.builds(
    LaunchArgs,
    task_name=_positional,
    trainer_path=st.none() | _value,
    trainer_module=st.none() | _value,
    log=st.booleans(),
    nne_cpu_path=st.none() | _value,
    mode=st.one_of(_shm, _socket()),
)


@given(_launch)
@settings(max_examples=300)
def test_round_trip(args: LaunchArgs) -> None:
    """parse(format(x)) == x for every constructible LaunchArgs."""
    assert parse_launch_argv(format_launch_argv(args)) == args


_tokens = st.lists(
    st.one_of(
        st.sampled_from(
            [
                "",
                "-p",
                "-m",
                "-l",
                "--nne-cpu-path",
                "SharedMemory",
                "Socket",
                "-g",
                "-c",
                "-d",
                "-n",
                "--",
                "--min-batch-size",
                "--max-batch-size",
                "h:1",
                "[::1]:2",
                "1",
                "0",
                "-1",
                GUID,
                "/x",
                "--log=1",
            ]
        ),
        _safe_text,
    ),
    max_size=14,
)


@given(_tokens)
@settings(max_examples=300)
def test_fuzz(argv: list[str]) -> None:
    """Any list of strings either parses to LaunchArgs that round-trips, or raises ArgvError; nothing else."""
    try:
        args = parse_launch_argv(argv)
    except ArgvError:
        return
    assert parse_launch_argv(format_launch_argv(args)) == args
