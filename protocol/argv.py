"""The engine's launch command line for ``train.py`` (spec §1.2-1.4): parse it, and write it as the engine does.

Grammar (5.8; 5.6/5.7 is the same without ``--nne-cpu-path``), ``argv`` without the script path::

    TASK_NAME [-p DIR] [-m MODULE] [-l] [--nne-cpu-path DIR]
        SharedMemory TASK_DIR [-g GUID] [-c] [-d] [-n N]
      | Socket HOST:PORT TEMP_DIRECTORY [-n N] [--min-batch-size N] [--max-batch-size N]

Long spellings: ``--trainer-path``, ``--trainer-module``, ``--log``, ``--controls-guid``, ``--create-mem``,
``--make-task-dir``, ``--num-processes``; a long option may also be written ``--name=value``.
As with the Python ``argparse`` grammar the engine targets, the top-level options come before the
sub-command and the sub-command's options after it; positionals and options may interleave inside a
section, and ``--`` ends option processing.

The engine writes (5.8, spawned process)::

    TASK -p DIR -m MODULE (-l | "") --nne-cpu-path DIR SharedMemory TASK_DIR -g GUID
    TASK -p DIR -m MODULE (-l | "") --nne-cpu-path DIR Socket IP:PORT TEMP_DIR

The parser is hand-written because ``argparse`` prints and calls ``sys.exit`` on errors; this module is pure
and raises :class:`~protocol.errors.ArgvError` naming the switch or positional to fix, with the grammar.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

from protocol.errors import ArgvError, GuidError
from protocol.guid import parse_guid

__all__ = [
    "DEFAULT_MAX_BATCH_SIZE",
    "DEFAULT_MIN_BATCH_SIZE",
    "DEFAULT_NUM_PROCESSES",
    "SHARED_MEMORY",
    "SOCKET",
    "USAGE",
    "LaunchArgs",
    "SharedMemoryArgs",
    "SocketArgs",
    "format_address",
    "format_launch_argv",
    "parse_address",
    "parse_launch_argv",
]

SHARED_MEMORY: Final = "SharedMemory"
"""Sub-command name of the shared-memory transport (spec §1.2)."""
SOCKET: Final = "Socket"
"""Sub-command name of the socket transport (spec §1.3)."""

DEFAULT_NUM_PROCESSES: Final = 1
"""``-n/--num-processes`` default in both sub-commands (spec §1.4)."""
DEFAULT_MIN_BATCH_SIZE: Final = 1
"""``--min-batch-size`` default (PPO only; spec §1.4)."""
DEFAULT_MAX_BATCH_SIZE: Final = 256
"""``--max-batch-size`` default (PPO only; spec §1.4)."""

_INT32_MAX: Final = 2**31 - 1
_PORT_MAX: Final = 65535

USAGE: Final = (
    "usage: train.py TASK_NAME [-p DIR] [-m MODULE] [-l] [--nne-cpu-path DIR]\n"
    "           SharedMemory TASK_DIR [-g GUID] [-c] [-d] [-n N]\n"
    "         | Socket HOST:PORT TEMP_DIRECTORY [-n N] [--min-batch-size N] [--max-batch-size N]"
)
"""The grammar every :class:`ArgvError` from this module ends with."""


def _error(field: str, problem: str, *, expected: object = None, actual: object = None) -> ArgvError:
    # The usage goes into the message; expected/actual are kept as attributes for callers and tests but
    # not appended to the text, where they would land after the multi-line grammar.
    error = ArgvError(f"{problem}\n{USAGE}", field=field)
    error.expected = expected
    error.actual = actual
    return error


# ---------------------------------------------------------------------------------------------------------
# Values


@dataclass(frozen=True, slots=True)
class SharedMemoryArgs:
    """``SharedMemory TASK_DIR [-g GUID] [-c] [-d] [-n N]`` (spec §1.2, §2.5)."""

    task_dir: str
    """Absolute task directory; its ``Configs`` sub-folder holds the engine's config JSONs."""
    controls_guid: str | None
    """``-g``: the controls region's GUID string exactly as given (any FGuid::Parse format)."""
    create_mem: bool = False
    """``-c``: the trainer creates the controls region itself (attach mode, §2.5)."""
    make_task_dir: bool = False
    """``-d``: create ``task_dir`` if it is missing."""
    num_processes: int = DEFAULT_NUM_PROCESSES
    """``-n``: legacy multi-process count (5.4); always 1 since 5.6."""

    def __post_init__(self) -> None:
        _check_positional("TASK_DIR", self.task_dir)
        if self.controls_guid is not None:
            _check_value("-g/--controls-guid", self.controls_guid)
            try:
                parse_guid(self.controls_guid)
            except GuidError as exc:
                raise _error(
                    "-g/--controls-guid", f"-g/--controls-guid: {exc.message}", actual=self.controls_guid
                ) from None
        _check_flag("-c/--create-mem", self.create_mem)
        _check_flag("-d/--make-task-dir", self.make_task_dir)
        _check_int("-n/--num-processes", self.num_processes, 1, _INT32_MAX)


@dataclass(frozen=True, slots=True)
class SocketArgs:
    """``Socket HOST:PORT TEMP_DIRECTORY [-n N] [--min-batch-size N] [--max-batch-size N]`` (spec §1.3)."""

    host: str
    """IP address or host name the trainer listens on; IPv6 without brackets (``::1``)."""
    port: int
    """TCP port, 1..65535."""
    temp_directory: str
    """Absolute ``<Project>/Intermediate/LearningCore``: the trainer's temp directory."""
    num_processes: int = DEFAULT_NUM_PROCESSES
    """``-n``: legacy multi-process count; always 1."""
    min_batch_size: int = DEFAULT_MIN_BATCH_SIZE
    """``--min-batch-size`` (PPO)."""
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    """``--max-batch-size`` (PPO)."""

    def __post_init__(self) -> None:
        _check_host(self.host)
        _check_int("HOST:PORT port", self.port, 1, _PORT_MAX)
        _check_positional("TEMP_DIRECTORY", self.temp_directory)
        _check_int("-n/--num-processes", self.num_processes, 1, _INT32_MAX)
        _check_int("--min-batch-size", self.min_batch_size, 1, _INT32_MAX)
        _check_int("--max-batch-size", self.max_batch_size, 1, _INT32_MAX)
        if self.min_batch_size > self.max_batch_size:
            raise _error(
                "--min-batch-size",
                f"--min-batch-size {self.min_batch_size} is larger than --max-batch-size {self.max_batch_size}",
                expected=f"<= {self.max_batch_size}",
                actual=self.min_batch_size,
            )


TransportArgs: TypeAlias = SharedMemoryArgs | SocketArgs


@dataclass(frozen=True, slots=True)
class LaunchArgs:
    """Everything on the ``train.py`` command line (spec §1.4)."""

    task_name: str
    """Positional task name (e.g. ``Training``)."""
    trainer_path: str | None
    """``-p``: custom trainer search path (the engine always passes one)."""
    trainer_module: str | None
    """``-m``: Python module name; informational here (the method comes from ``TrainerMethod``, §1.6)."""
    log: bool
    """``-l``: verbose logging (the engine passes ``""`` instead when logging is silent)."""
    nne_cpu_path: str | None
    """``--nne-cpu-path`` (5.6+; absent from older grammars)."""
    mode: TransportArgs
    """The sub-command and its arguments."""

    def __post_init__(self) -> None:
        _check_positional("TASK_NAME", self.task_name)
        if self.trainer_path is not None:
            _check_value("-p/--trainer-path", self.trainer_path)
        if self.trainer_module is not None:
            _check_value("-m/--trainer-module", self.trainer_module)
        _check_flag("-l/--log", self.log)
        if self.nne_cpu_path is not None:
            _check_value("--nne-cpu-path", self.nne_cpu_path)
        if not isinstance(self.mode, SharedMemoryArgs | SocketArgs):
            raise _error("sub-command", "the sub-command must be SharedMemory or Socket", actual=self.mode)


# ---------------------------------------------------------------------------------------------------------
# Option table: one row per switch, per section. ``kind`` says how the value is read.

_Section: TypeAlias = Literal["top", "SharedMemory", "Socket"]
_Kind: TypeAlias = Literal["flag", "text", "int"]


@dataclass(frozen=True, slots=True)
class _Option:
    dest: str
    kind: _Kind
    names: tuple[str, ...]

    @property
    def label(self) -> str:
        return "/".join(self.names)


_OPTIONS: Final[dict[_Section, tuple[_Option, ...]]] = {
    "top": (
        _Option("trainer_path", "text", ("-p", "--trainer-path")),
        _Option("trainer_module", "text", ("-m", "--trainer-module")),
        _Option("log", "flag", ("-l", "--log")),
        _Option("nne_cpu_path", "text", ("--nne-cpu-path",)),
    ),
    "SharedMemory": (
        _Option("controls_guid", "text", ("-g", "--controls-guid")),
        _Option("create_mem", "flag", ("-c", "--create-mem")),
        _Option("make_task_dir", "flag", ("-d", "--make-task-dir")),
        _Option("num_processes", "int", ("-n", "--num-processes")),
    ),
    "Socket": (
        _Option("num_processes", "int", ("-n", "--num-processes")),
        _Option("min_batch_size", "int", ("--min-batch-size",)),
        _Option("max_batch_size", "int", ("--max-batch-size",)),
    ),
}
_BY_NAME: Final[dict[_Section, dict[str, _Option]]] = {
    section: {name: option for option in options for name in option.names}
    for section, options in _OPTIONS.items()
}
_ALL_NAMES: Final = frozenset(name for table in _BY_NAME.values() for name in table)
_SECTION_LABEL: Final[dict[_Section, str]] = {
    "top": "before the sub-command",
    "SharedMemory": "after SharedMemory",
    "Socket": "after Socket",
}


# ---------------------------------------------------------------------------------------------------------
# Field checks shared by parsing and construction (so every LaunchArgs that exists formats and parses back).


def _check_positional(name: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise _error(name, f"{name} must be a non-empty string", actual=value)
    if value.startswith("-"):
        raise _error(name, f"{name} {value!r} starts with '-' and would read as an option", actual=value)
    if "\x00" in value:
        raise _error(name, f"{name} contains a NUL character", actual=value)


def _check_value(name: str, value: object) -> None:
    if not isinstance(value, str):
        raise _error(name, f"{name} must be a string", actual=value)
    if value in _ALL_NAMES:
        raise _error(name, f"{name} expects a value but got the switch {value!r}", actual=value)
    if "\x00" in value:
        raise _error(name, f"{name} contains a NUL character", actual=value)


def _check_flag(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise _error(name, f"{name} is a flag and must be True or False", actual=value)


def _check_int(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _error(name, f"{name} must be a whole number in {low}..{high}, got {value!r}", actual=value)


def _check_host(host: object) -> None:
    if not isinstance(host, str) or not host:
        raise _error("HOST:PORT host", "HOST:PORT needs a host before the colon", actual=host)
    if any(ch in host for ch in "[]/\x00") or any(ch.isspace() for ch in host):
        raise _error(
            "HOST:PORT host", f"host {host!r} contains '[', ']', '/', NUL or whitespace", actual=host
        )
    if host.startswith("-"):
        # No host name starts with '-', and HOST:PORT would then read as an option.
        raise _error("HOST:PORT host", f"host {host!r} starts with '-'", actual=host)


_DIGITS = re.compile(r"[+-]?[0-9]+")


def _parse_int(label: str, text: str) -> int:
    # ASCII digits only: int() would also accept "1_000", " 7" and non-ASCII digits.
    if _DIGITS.fullmatch(text) is None:
        raise _error(label, f"{label} expects a whole number, got {text!r}", actual=text)
    return int(text)


def parse_address(text: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6]:port"`` → ``(host, port)``; IPv6 must be bracketed (the colon is ambiguous)."""
    field = "HOST:PORT"
    if text.startswith("["):
        close = text.find("]")
        if close < 0 or text[close + 1 : close + 2] != ":":
            raise _error(field, f"HOST:PORT {text!r}: expected [IPv6]:PORT", actual=text)
        host, port_text = text[1:close], text[close + 2 :]
    else:
        host, colon, port_text = text.rpartition(":")
        if not colon:
            raise _error(field, f"HOST:PORT {text!r} has no ':PORT'", actual=text)
        if ":" in host:
            raise _error(
                field, f"HOST:PORT {text!r}: write an IPv6 host in brackets, [::1]:PORT", actual=text
            )
    if re.fullmatch(r"[0-9]+", port_text) is None:
        raise _error(field, f"HOST:PORT {text!r}: the port must be digits, got {port_text!r}", actual=text)
    port = int(port_text)
    if not 1 <= port <= _PORT_MAX:
        raise _error(
            field, f"HOST:PORT {text!r}: port {port} is outside 1..65535", expected="1..65535", actual=port
        )
    _check_host(host)
    return host, port


def format_address(host: str, port: int) -> str:
    """Inverse of :func:`parse_address` (IPv6 hosts get brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# ---------------------------------------------------------------------------------------------------------
# Parsing


def _find_option(section: _Section, token: str) -> _Option:
    option = _BY_NAME[section].get(token)
    if option is not None:
        return option
    for other, table in _BY_NAME.items():
        if token in table:
            raise _error(
                token,
                f"option {token} belongs {_SECTION_LABEL[other]}, not {_SECTION_LABEL[section]}",
                actual=token,
            )
    raise _error(token, f"unknown option {token}", actual=token)


def parse_launch_argv(argv: Sequence[str]) -> LaunchArgs:
    """Parse the ``train.py`` arguments (without the script path) into :class:`LaunchArgs`.

    [INF] Empty items: the engine passes ``""`` in place of ``-l`` when logging is silent (spec §1.2), and
    how the real ``train.py`` copes is unknown (``argparse`` would take ``""`` as a positional). A stand-alone
    empty item is therefore ignored. An empty item directly after a switch that takes a value is that
    switch's value (``-p ""``): dropping it first would make ``-p`` swallow the next switch.
    """
    if isinstance(argv, str) or not all(isinstance(token, str) for token in argv):
        raise _error("argv", "argv must be a sequence of strings", actual=type(argv).__name__)
    section: _Section = "top"
    values: dict[_Section, dict[str, object]] = {"top": {}, "SharedMemory": {}, "Socket": {}}
    positionals: dict[_Section, list[str]] = {"top": [], "SharedMemory": [], "Socket": []}
    options_done = False
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if token == "":
            continue  # the engine's silent-logging placeholder, see the docstring
        if not options_done and token == "--":
            options_done = True
            continue
        if not options_done and token.startswith("-") and token != "-":
            name, equals, attached = token.partition("=") if token.startswith("--") else (token, "", "")
            option = _find_option(section, name)
            value: object
            if option.kind == "flag":
                if equals:
                    raise _error(option.label, f"{option.label} is a flag and takes no value", actual=token)
                value = True
            else:
                if equals:
                    text = attached
                elif i < len(argv):
                    text = argv[i]
                    i += 1
                    if text in _ALL_NAMES:
                        raise _error(
                            option.label,
                            f"{option.label} expects a value but got the switch {text}",
                            actual=text,
                        )
                else:
                    raise _error(option.label, f"{option.label} expects a value after it")
                value = _parse_int(option.label, text) if option.kind == "int" else text
            if option.dest in values[section]:
                raise _error(option.label, f"{option.label} is given twice", actual=value)
            values[section][option.dest] = value
            continue
        if section == "top" and positionals["top"] and token in (SHARED_MEMORY, SOCKET):
            section = SHARED_MEMORY if token == SHARED_MEMORY else SOCKET
            continue
        positionals[section].append(token)

    top = positionals["top"]
    if not top:
        raise _error("TASK_NAME", "TASK_NAME is missing")
    if len(top) > 1:
        raise _error(
            "sub-command",
            f"expected the sub-command SharedMemory or Socket after TASK_NAME, got {top[1]!r}",
            expected=(SHARED_MEMORY, SOCKET),
            actual=top[1],
        )
    if section == "top":
        raise _error("sub-command", "the sub-command SharedMemory or Socket is missing")
    mode = _build_mode(section, positionals[section], values[section])
    flags = values["top"]
    return LaunchArgs(
        task_name=top[0],
        trainer_path=_optional_text(flags.get("trainer_path")),
        trainer_module=_optional_text(flags.get("trainer_module")),
        log=bool(flags.get("log", False)),
        nne_cpu_path=_optional_text(flags.get("nne_cpu_path")),
        mode=mode,
    )


def _optional_text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _int_value(values: dict[str, object], dest: str, default: int) -> int:
    value = values.get(dest, default)
    return value if isinstance(value, int) else default


def _build_mode(section: _Section, positionals: list[str], values: dict[str, object]) -> TransportArgs:
    if section == SHARED_MEMORY:
        if not positionals:
            raise _error("TASK_DIR", "SharedMemory needs TASK_DIR")
        if len(positionals) > 1:
            raise _error("TASK_DIR", f"SharedMemory takes one TASK_DIR, got also {positionals[1]!r}")
        return SharedMemoryArgs(
            task_dir=positionals[0],
            controls_guid=_optional_text(values.get("controls_guid")),
            create_mem=bool(values.get("create_mem", False)),
            make_task_dir=bool(values.get("make_task_dir", False)),
            num_processes=_int_value(values, "num_processes", DEFAULT_NUM_PROCESSES),
        )
    if len(positionals) < 2:
        missing = "HOST:PORT and TEMP_DIRECTORY" if not positionals else "TEMP_DIRECTORY"
        raise _error(missing.split()[-1], f"Socket needs {missing}")
    if len(positionals) > 2:
        raise _error(
            "TEMP_DIRECTORY", f"Socket takes HOST:PORT and TEMP_DIRECTORY, got also {positionals[2]!r}"
        )
    host, port = parse_address(positionals[0])
    return SocketArgs(
        host=host,
        port=port,
        temp_directory=positionals[1],
        num_processes=_int_value(values, "num_processes", DEFAULT_NUM_PROCESSES),
        min_batch_size=_int_value(values, "min_batch_size", DEFAULT_MIN_BATCH_SIZE),
        max_batch_size=_int_value(values, "max_batch_size", DEFAULT_MAX_BATCH_SIZE),
    )


# ---------------------------------------------------------------------------------------------------------
# Formatting


def format_launch_argv(args: LaunchArgs) -> list[str]:
    """The argv items (after the script path) in the engine's 5.8 order, for the game-side emulator.

    Like the engine, an empty ``""`` stands where ``-l`` would go when ``log`` is false. Switches the engine
    never writes (``-c``, ``-d``, ``-n``, batch sizes) follow the sub-command's positionals, only when they
    differ from their defaults, so that ``parse_launch_argv(format_launch_argv(x)) == x``.
    """
    out = [args.task_name]
    if args.trainer_path is not None:
        out += ["-p", args.trainer_path]
    if args.trainer_module is not None:
        out += ["-m", args.trainer_module]
    out.append("-l" if args.log else "")
    if args.nne_cpu_path is not None:
        out += ["--nne-cpu-path", args.nne_cpu_path]
    mode = args.mode
    if isinstance(mode, SharedMemoryArgs):
        out += [SHARED_MEMORY, mode.task_dir]
        if mode.controls_guid is not None:
            out += ["-g", mode.controls_guid]
        if mode.create_mem:
            out.append("-c")
        if mode.make_task_dir:
            out.append("-d")
        if mode.num_processes != DEFAULT_NUM_PROCESSES:
            out += ["-n", str(mode.num_processes)]
    else:
        out += [SOCKET, format_address(mode.host, mode.port), mode.temp_directory]
        if mode.num_processes != DEFAULT_NUM_PROCESSES:
            out += ["-n", str(mode.num_processes)]
        if mode.min_batch_size != DEFAULT_MIN_BATCH_SIZE:
            out += ["--min-batch-size", str(mode.min_batch_size)]
        if mode.max_batch_size != DEFAULT_MAX_BATCH_SIZE:
            out += ["--max-batch-size", str(mode.max_batch_size)]
    return out
