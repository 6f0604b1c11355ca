"""Our own knobs: settings the engine does not send (cadences, time distribution, threads, distillation).

The engine's config decides *what* to train (spec §4). These options decide *how* this trainer runs it.
They come from, in increasing priority: defaults, the project-wide ``la-trainer.json`` (in the folder that
holds the run's task folder: ``<Project>/Intermediate/LearningCore`` for the engine's runs), the task
folder's own ``la-trainer.json`` (so an engine-spawned run can be tuned without touching the engine),
``LA_TRAINER_<NAME>`` environment variables, and explicit command-line options. One dataclass, parsed
once at the edge; the folders each mode reads are listed in :func:`load_options` and the README.

Every option's value domain is declared once, beside its field (:func:`_option`), and checked in
``TrainerOptions.__post_init__``: the command line, the environment, the settings file, the scale-out
broadcast and programmatic use all go through the same check, and every refusal is an
:class:`OptionError` that names the option, the value, where it came from, what is accepted and how to
fix it (exit code 2, README "Exit codes"). Nothing here imports torch, so a bad value is refused within
a fraction of a second of starting, before the trainer opens its link or the game sends anything.

Names: the settings-file key is the field name (``ode_steps``); the environment variable is
``LA_TRAINER_`` + the upper-case field name (``LA_TRAINER_ODE_STEPS``). Where the command-line option is
spelt differently (``--iterations`` for ``iteration_num``) that spelling is accepted as a documented
alias in both places (``LA_TRAINER_ITERATIONS``, ``"iterations"``). An unknown ``LA_TRAINER_*`` variable
is reported with a warning (and a "did you mean") instead of being ignored silently; an unknown key in
the settings file is an error, since that file exists only for us.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from trainer.errors import LaunchError
from trainer.settings.environment import ENV_PREFIX, NOT_OPTIONS
from trainer.settings.recipes import RECIPES
from trainer.settings.time_density import TimeDensity
from trainer.settings.timeouts import DEFAULT_CONFIG_WAIT_S, DEFAULT_WAIT_S
from trainer.system.console import warn as console_warn

__all__ = [
    "ALIASES",
    "DEFAULT_SOURCE",
    "MAX_THREADS",
    "SETTINGS_FILE_NAME",
    "LoadedOptions",
    "OptionError",
    "TrainerOptions",
    "check_command_value",
    "cli_flag",
    "env_name",
    "experimental_options",
    "load_options",
    "load_options_traced",
    "option_names",
    "options_json",
    "parse_option",
    "unknown_environment_names",
]

SETTINGS_FILE_NAME = "la-trainer.json"
ALIASES: dict[str, str] = {"iterations": "iteration_num"}
"""Documented second spellings (the command line's ``--iterations``), accepted as settings-file keys and as
``LA_TRAINER_<ALIAS>``. Giving both spellings in one place is refused (which one was meant?)."""


class OptionError(LaunchError):
    """An option value outside its domain. ``str()`` is the whole paragraph: value, source, what is
    accepted, how to fix it."""

    def __init__(self, name: str, value: object, expected: str, source: str, fix: str = "") -> None:
        self.name = name
        self.value = value
        self.expected = expected
        self.source = source
        shown = repr(value) if isinstance(value, str) else str(value)
        text = f"{source} sets option '{name}' to {shown}, but it must be {expected}."
        super().__init__(f"{text} {fix}".strip())


@dataclass(frozen=True, slots=True)
class _Domain:
    """What one option accepts: the Python type, a check on the converted value (None: any value of the
    type) and the sentence that describes it to a user ("a whole number >= 0 (0: automatic)")."""

    expected: str
    check: Callable[[Any], bool] | None = None
    normalize: Callable[[str], str] | None = None
    """Applied to string values before the check (e.g. lower-casing choices)."""
    experimental: bool = False
    """A research knob: off (or neutral) by default, measured only on the benchmark tasks, and free to
    change or go in a later version (README, "Trainer options"; ``--help``)."""


def _option(default: Any, expected: str, check: Callable[[Any], bool] | None = None, **kw: Any) -> Any:
    return field(default=default, metadata={"domain": _Domain(expected, check, **kw)})


def _at_least(low: float) -> Callable[[Any], bool]:
    return lambda v: math.isfinite(v) and v >= low


def _between(low: float, high: float) -> Callable[[Any], bool]:
    return lambda v: math.isfinite(v) and low <= v <= high


_DEVICE = re.compile(r"^(|cpu|gpu|cuda|cuda:\d+)$", re.IGNORECASE)

RECIPE_NAMES = tuple(recipe.name for recipe in RECIPES)

MAX_THREADS = 1024
"""Largest ``threads`` option: more than the largest machines' cores (2 x 192 with SMT is 768). torch hands
the count to OpenMP unchecked, and OpenMP crashed the process (exit 139) when it could not start 100,000
threads, so a count this large is a mistake, refused with the option's message (exit 2)."""


def _mlflow_ok(text: str) -> bool:
    return text == text.strip()


@dataclass(frozen=True, slots=True)
class TrainerOptions:
    """How to run a training job. Field names double as settings-file keys and env-var suffixes."""

    sync_every_iterations: int = _option(0, "a whole number >= 0 (0: sync by time only)", _at_least(0))
    """Send networks 0, 1, 2 back every N iterations (0: use ``sync_every_seconds`` only)."""
    sync_every_seconds: float = _option(
        2.0, "a number of seconds >= 0 (0: sync by iterations only)", _at_least(0)
    )
    """Send networks back at most this often (0: iterations only). The engine takes one round per tick."""
    progress_every_seconds: float = _option(
        5.0, "a number of seconds > 0", lambda v: math.isfinite(v) and v > 0
    )
    """One plain progress line on stdout at this period (the engine copies stdout into its log)."""
    time_distribution: TimeDensity = _option(  # noqa: RUF009  (a frozen value, shared safely)
        RECIPES[0].time_distribution,  # the standard recipe's (trainer/settings/recipes.py)
        "uniform, beta:A,B (A, B > 0), logit_normal or logit_normal:LOC,SCALE (SCALE > 0), or power:K (K > 0)",
    )
    """Training-time distribution of t: uniform | beta:a,b | logit_normal:m,s | power:k, parsed once
    (:class:`~trainer.settings.time_density.TimeDensity`; text given to the constructor is parsed there).

    Default chosen by the quality benchmark (benchmarks/quality.py, engine inference path, 3 seeds, 12k
    iterations): logit-normal(0, 1) beat uniform, Beta(1, 1.5) and U² at every step count ≥ 2 on B1
    (on-mode at 8 Euler steps 0.910 ± 0.007 against 0.898 ± 0.003 for uniform) and on B2 (success; see
    the flow-matching issue's closing note and README)."""
    ema_decay: float = _option(
        0.999, "a number from 0 (no EMA) up to but not including 1", lambda v: 0 <= v < 1
    )
    """Exponential moving average of the weights used for every export (0 disables)."""
    layer_lr: str = _option(
        "fan_in", "same or fan_in", lambda v: v in ("same", "fan_in"), normalize=lambda s: s.strip().lower()
    )
    """Per-layer learning rate: fan_in (each Linear layer at LearningRate * max(1, outputs / inputs);
    trainer/training/steps/autograd.py layer_lr_scale) or same (every weight at LearningRate, the engine's trainers).

    Default fan_in, chosen by the time-to-quality benchmark (docs/training.md; settings chosen on seeds
    100/101, reported on seeds 0/1/2, benchmarks/results/ttq/): at the engine-default network (1 x 128 ELU,
    batch 256, lr 1e-3) B1 on-mode at 5,000 iterations 0.84-0.87 against 0.20-0.28 with same, B2 success at
    10,000 iterations about 0.9 against about 0.6."""
    spread_start: float = _option(
        0.7, "a number from 0 up to but not including 1", lambda v: 0 <= v < 1, experimental=True
    )
    """Experimental. Time after which the training path's source widens (trainer/training/flow.py
    source_spread)."""
    spread_gain: float = _option(0.0, "a number >= 0 (0: off)", _at_least(0), experimental=True)
    """Experimental. How far the late-time source widens: its std is sqrt(1 + (gain * (t - spread_start) /
    (1 - spread_start))^2) past spread_start (0: the plain path)."""
    ode_steps: int = _option(
        0,
        "a whole number from 0 to 100 (the game's ODEStepsNum; 0: no few-step distillation)",
        # The upper bound is trainer.training.steps.distill.DistillSettings' (1 to 100 Euler steps).
        _between(0, 100),
    )
    """Euler step count the game uses (ODEStepsNum); > 0 enables few-step distillation for that count."""
    distill_fraction: float = _option(0.25, "a number from 0 up to but not including 1", lambda v: 0 <= v < 1)
    """Share of the run's time spent on distillation when ``ode_steps`` > 0: the last iterations distil, as
    many as the cost model (:attr:`trainer.training.steps.distill.DistillSettings.cost`, about 3
    flow-matching iterations each) fits into this share, so 0.25 distils about 10 % of IterationNum
    (:func:`trainer.training.steps.distill.distill_iterations`; the log names the iterations)."""
    draws_per_row: int = _option(1, "a whole number from 1 to 64", _between(1, 64), experimental=True)
    """Experimental. (x0, t) draws per batch row, stratified in t and antithetic in x0 (trainer/training/flow.py stratified_draws):
    each iteration trains BatchSize x draws_per_row samples of BatchSize rows (1: one independent draw)."""
    recipe: str = _option(
        "auto",
        "auto, " + ", ".join(RECIPE_NAMES[:-1]) + " or " + RECIPE_NAMES[-1],
        lambda v: v == "auto" or v in RECIPE_NAMES,
        normalize=lambda s: s.strip().lower(),
    )
    """The training recipe (time density and late source spread, trainer/training/recipes.py): auto tries
    standard, sharp and smooth side by side for the first 1,000 iterations and keeps the one with the best
    held-out selection score; a name trains that one. auto keeps your own time_distribution or spread_*
    when you set one, and trains standard without held-out episodes or in a run under 3,000 iterations."""
    compile: str = _option(
        "off", "on or off", lambda v: v in ("on", "off"), normalize=lambda s: s.strip().lower()
    )
    """torch.compile the fused training step: on | off (trainer/training/steps/compiled.py). Needs a C++ compiler
    (CPU) or Triton (CUDA) and a few seconds to compile; measured no faster on a 2-core CPU."""
    threads: int = _option(
        0,
        f"a whole number >= 0 and at most {MAX_THREADS} (0: choose automatically); more threads than the machine "
        "has cores only slow training, and OpenMP crashes the process when it cannot start that many",
        _between(0, MAX_THREADS),
    )
    """torch intra-op threads (0: choose automatically, 1 for small networks)."""
    device: str = _option(
        "",
        "cpu, cuda, cuda:N or gpu (empty: the config's Device; gpu falls back to the CPU without CUDA)",
        lambda v: bool(_DEVICE.match(v)),
        normalize=lambda s: s.strip().lower(),
    )
    """Override the config's Device ("cpu", "cuda", "cuda:1"); empty: follow the config."""
    iteration_num: int = _option(0, "a whole number >= 0 (0: the config's IterationNum)", _at_least(0))
    """Override IterationNum (0: follow the config). Alias: ``iterations`` (``--iterations``)."""
    status_file: bool = _option(True, "true or false")
    """Write <task_dir>/la-trainer-status.msgpack for ``la-trainer watch``."""
    checkpoint_every_seconds: float = _option(
        60.0, "a number of seconds >= 0 (0: only at the end)", _at_least(0)
    )
    """Write a resumable checkpoint at most this often (0: only at the end)."""
    resume: bool = _option(False, "true or false")
    """Resume from the last checkpoint in the snapshot folder."""
    wait: float = _option(DEFAULT_WAIT_S, "a number of seconds >= 0 (0: no bound)", _at_least(0))
    """Bound of a wait that cannot see whether the game is alive: attach mode (``-c``), a socket listener
    nobody has connected to (0: wait forever). Waits on a game the trainer can see (spawned by it, a
    connected socket) have no bound (trainer.settings.timeouts, docs/unreal-install.md "Waits")."""
    config_wait: float = _option(
        DEFAULT_CONFIG_WAIT_S, "a number of seconds >= 0 (0: no bound)", _at_least(0)
    )
    """Socket: bound from a connection's first byte to its complete config message; one that misses it is
    closed while other connections are served (0: no bound). A connection that has sent nothing is not
    timed (trainer.settings.timeouts, trainer.session.links.socket)."""
    run_record: bool = _option(True, "true or false")
    """Keep a run folder ``<task_dir>/runs/<run name>`` with the effective options, the engine's settings,
    a metrics log and the final networks (:mod:`trainer.records.runrecord`)."""
    tensorboard: bool = _option(False, "true or false")
    """Write TensorBoard logs, as the engine's ``UseTensorBoard`` does (either one switches them on)."""
    mlflow: str = _option(
        "",
        "an MLflow tracking URI (such as http://host:5000 or sqlite:///mlflow.db), 'default', or empty for off",
        _mlflow_ok,
    )
    """Log to MLflow at this tracking URI ("default": MLflow's own default); the engine's ``UseMLflow`` and
    ``MLflowTrackingUri`` switch it on too (this URI wins when both are given)."""

    heldout_share: float = _option(0.1, "a number from 0 (no hold-out) up to 0.5", lambda v: 0 <= v <= 0.5)
    """Share of the recorded episodes held out of training to measure imitation quality on
    (trainer/training/heldout.py; whole episodes, chosen by the config's Seed; 0: off). On by default so that every
    run with enough episodes shows its imitation quality: with 10 % held out, B1-B4's final quality stayed
    within evaluation noise of training on every episode (benchmarks/results/heldout-agreement.md)."""
    heldout_min_episodes: int = _option(
        100, "a whole number >= 2 (recordings with fewer episodes hold nothing out)", _at_least(2)
    )
    """Recordings with fewer episodes than this train on every episode: nothing is held out."""
    heldout_every_iterations: int = _option(
        1000, "a whole number >= 0 (0: only at the end of the run)", _at_least(0)
    )
    """Measure the held-out metrics every N iterations (and at the end)."""
    heldout_send_best: bool = _option(False, "true or false", experimental=True)
    """Experimental. At the end, send the networks of the measurement with the best held-out selection score instead of
    the last ones (off: on B1-B4 the best checkpoint was the last or no better, docs/training.md)."""

    def __post_init__(self) -> None:
        if isinstance(self.time_distribution, str):
            # Text from a program (replace(options, time_distribution="uniform")): parsed as a user's.
            value = parse_option("time_distribution", self.time_distribution, "TrainerOptions")
            object.__setattr__(self, "time_distribution", value)
        for f in fields(self):
            _validate(f.name, getattr(self, f.name), "TrainerOptions")


def check_command_value(flag: str, value: object, expected: str, check: Callable[[Any], bool]) -> None:
    """A command's own value that is not one of these options (``record --learning-rate``), checked in
    the same form: not finite, or refused by ``check``, is an :class:`OptionError` (exit code 2) that
    names the flag, the value and ``expected``, before any file is read or written.

    Raises:
        OptionError: the value is outside its domain.
    """
    finite = not isinstance(value, float) or math.isfinite(value)
    if not (finite and check(value)):
        raise OptionError(
            flag.lstrip("-").replace("-", "_"),
            value,
            expected,
            f"command-line option {flag}",
            "See 'la-trainer COMMAND --help'.",
        )


def option_names() -> tuple[str, ...]:
    """Every option's name (settings-file key), in declaration order."""
    return tuple(f.name for f in fields(TrainerOptions))


def experimental_options() -> tuple[str, ...]:
    """The research knobs (:attr:`_Domain.experimental`), in declaration order."""
    return tuple(name for name in option_names() if _domain(name).experimental)


def cli_flag(name: str) -> str:
    """The command-line spelling of an option: ``--ode-steps``; ``--iterations`` for ``iteration_num``."""
    spelt = {target: alias for alias, target in ALIASES.items()}.get(name, name)
    return "--" + spelt.replace("_", "-")


def env_name(name: str) -> str:
    """``LA_TRAINER_<NAME>`` for an option (or alias) name."""
    return ENV_PREFIX + name.upper()


def options_json(options: TrainerOptions) -> dict[str, object]:
    """Every option as a JSON value, by name (the run record's ``options.json``, scale-out's broadcast):
    what :func:`load_options` reads back as overrides."""
    return {
        f.name: str(value) if isinstance(value, TimeDensity) else value
        for f in fields(options)
        for value in (getattr(options, f.name),)
    }


_DEFAULTS = TrainerOptions.__dataclass_fields__


def _domain(name: str) -> _Domain:
    domain = _DEFAULTS[name].metadata.get("domain")
    if isinstance(domain, _Domain):
        return domain
    # A field added without _option(): its type alone, and numbers must be finite and >= 0 (every
    # numeric knob here is a count, a period or a fraction).
    default = _DEFAULTS[name].default
    if isinstance(default, bool) or isinstance(default, str):
        return _Domain("true or false" if isinstance(default, bool) else "text")
    return _Domain("a number >= 0", _at_least(0))


def _validate(name: str, value: object, source: str, fix: str = "") -> None:
    domain = _domain(name)
    default = _DEFAULTS[name].default
    wanted = type(default)
    expected = domain.expected
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    else:
        ok = isinstance(value, wanted)
    if ok and domain.check is not None:
        ok = bool(domain.check(value))
    if not ok:
        raise OptionError(name, value, expected, source, fix)


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def parse_option(name: str, raw: object, source: str = "a caller", fix: str = "") -> object:
    """``raw`` (text from the environment or the command line, or a JSON value) as the option's type,
    checked against its domain.

    Raises:
        OptionError: unknown name, unconvertible or out-of-domain value; the message names ``source``.
    """
    name = ALIASES.get(name, name)
    if name not in _DEFAULTS:
        raise LaunchError(f"{source}: unknown option '{name}'.{_did_you_mean(name, option_names())}")
    domain = _domain(name)
    default = _DEFAULTS[name].default
    value: object = raw
    failure = OptionError(name, raw, domain.expected, source, fix)
    if isinstance(raw, str):
        text = domain.normalize(raw) if domain.normalize is not None else raw
        if isinstance(default, bool):
            lowered = text.strip().lower()
            if lowered not in _TRUE + _FALSE:
                raise failure
            value = lowered in _TRUE
        elif isinstance(default, int):
            value = _whole_number(text, failure)
        elif isinstance(default, float):
            try:
                value = float(text.strip())
            except ValueError:
                raise failure from None
        elif isinstance(default, TimeDensity):
            try:
                value = TimeDensity.parse(text)
            except ValueError:
                raise failure from None
        else:
            value = text
    elif isinstance(default, int) and not isinstance(default, bool) and isinstance(raw, float):
        if not raw.is_integer():
            raise failure
        value = int(raw)
    elif isinstance(default, str) and not isinstance(raw, str):
        raise failure
    try:
        _validate(name, value, source, fix)
    except OptionError:
        raise failure from None  # name the value as the user wrote it ('nan', not nan)
    return value


def _whole_number(text: str, failure: OptionError) -> int:
    """``"12"``, ``"1_000"``, or a float spelling of a whole number (``"1e6"``)."""
    try:
        return int(text.strip())
    except ValueError:
        pass
    try:
        number = float(text.strip())
    except ValueError:
        raise failure from None
    if not math.isfinite(number) or not number.is_integer():
        raise failure
    return int(number)


def _did_you_mean(name: str, candidates: tuple[str, ...] | list[str]) -> str:
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f" Did you mean '{close[0]}'?" if close else ""


def _known_env_names() -> dict[str, str]:
    """Environment name -> option name, aliases included."""
    known = {env_name(n): n for n in option_names()}
    known |= {env_name(alias): target for alias, target in ALIASES.items()}
    return known


def unknown_environment_names(environ: Mapping[str, str]) -> list[str]:
    """One warning sentence per ``LA_TRAINER_*`` variable that nothing reads (a misspelt option, most
    likely), with the closest known name."""
    known = _known_env_names()
    names = sorted([*known, *NOT_OPTIONS])
    warnings = []
    for key in sorted(environ):
        if key.startswith(ENV_PREFIX) and key not in known and key not in NOT_OPTIONS:
            hint = _did_you_mean(key, names)
            warnings.append(
                f"environment variable {key} is not a la-trainer setting and is ignored.{hint} "
                "Every option and its LA_TRAINER_ name: README, 'Trainer options'."
            )
    return warnings


def _settings_file(path: Path) -> dict[str, object]:
    fix = f'Fix {path} (one JSON object such as {{"threads": 1}}) or remove it.'
    try:
        # utf-8-sig: Notepad and PowerShell 5 (Out-File, Set-Content -Encoding UTF8) start the file with
        # a byte-order mark, which plain utf-8 hands to the JSON parser as a stray character.
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as error:
        raise LaunchError(f"settings file {path} cannot be read: {error}. {fix}") from None
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError as error:
        raise LaunchError(
            f"settings file {path} is not valid JSON: line {error.lineno}, column {error.colno}: {error.msg}. {fix}"
        ) from None
    if not isinstance(loaded, dict):
        raise LaunchError(f"settings file {path} must hold a JSON object, not {type(loaded).__name__}. {fix}")
    return loaded


DEFAULT_SOURCE = "default"
"""The source of an option nobody set (:meth:`LoadedOptions.every_source`)."""


@dataclass(frozen=True, slots=True)
class LoadedOptions:
    """The options and where each came from (:func:`load_options_traced`)."""

    options: TrainerOptions
    sources: Mapping[str, str]
    """Option name -> where its value came from, for the options not at their default: ``settings file
    <path>``, ``environment variable LA_TRAINER_<NAME>`` or ``command-line option --<name>``."""
    looked_for: tuple[Path, ...]
    """The settings files looked for, project-wide first."""
    read: tuple[Path, ...]
    """Those that were there and read."""

    def every_source(self) -> dict[str, str]:
        """Every option -> its source, :data:`DEFAULT_SOURCE` for the ones nobody set (``option-sources.json``
        in the run record)."""
        return {name: self.sources.get(name, DEFAULT_SOURCE) for name in option_names()}

    def settings_line(self) -> str:
        """The log line that says which settings files were read and what each set; empty when no folder
        was looked in (a command that reads none)."""
        if not self.looked_for:
            return ""
        parts = []
        for path in self.looked_for:
            if path in self.read:
                names = [n for n, source in self.sources.items() if source == f"settings file {path}"]
                parts.append(
                    f"read {path} ({', '.join(names) or 'overridden by the environment or command line'})"
                )
            else:
                parts.append(f"none at {path}")
        return f"la-trainer: settings files: {'; '.join(parts)}"


def load_options(
    task_dir: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    warn: Callable[[str], None] | None = None,
    shared_dir: str | Path | None = None,
) -> TrainerOptions:
    """The options alone (:func:`load_options_traced` says where each came from)."""
    return load_options_traced(task_dir, overrides, environ, warn=warn, shared_dir=shared_dir).options


def load_options_traced(
    task_dir: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    warn: Callable[[str], None] | None = None,
    shared_dir: str | Path | None = None,
) -> LoadedOptions:
    """Defaults < ``<shared_dir>/la-trainer.json`` < ``<task_dir>/la-trainer.json`` < ``LA_TRAINER_*`` env
    vars < ``overrides``.

    ``shared_dir``: a folder whose settings file applies to every run under it, the project-wide file:
    the engine makes a new task folder for every run, so a settings file can only be placed above it in
    advance. The one lookup order, in every mode (README, "Trainer options")::

        mode                            shared_dir                              task_dir
        engine-spawned (shm, socket)    IntermediatePath (<Project>/Inter-      the engine's <TaskName><N>
                                        mediate/LearningCore)
        la-trainer shm TASK_DIR         TASK_DIR's parent                       TASK_DIR
        la-trainer socket --temp-dir D  D                                       D/External<N> (new)
        la-trainer offline EXPORT       the folder holding TrainingMaterials/   --out, or Offline<N> (new)
                                        (else the export's parent)
        la-trainer record --out D       D                                       D/Offline<N> (new)

    A ``la-trainer.json`` inside an export is not read (the export is the engine's, input only).
    The file may start with a UTF-8 byte-order mark; one that is a folder is refused.

    ``overrides``: command-line values by option name (None: not given). ``warn``: where the warnings
    about unknown ``LA_TRAINER_*`` variables go (default: one ``la-trainer: warning:`` line each on
    stderr, which the engine copies into its log).

    Raises:
        OptionError / LaunchError: a bad value or an unknown name, with the source named (exit code 2).
    """
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    folders = [Path(d) for d in (shared_dir, task_dir) if d is not None]
    looked_for = tuple(dict.fromkeys(folder / SETTINGS_FILE_NAME for folder in folders))
    read: list[Path] = []
    for path in looked_for:
        if path.is_dir():
            # Most likely made by mistake (mkdir instead of a file): ignoring it would drop settings silently.
            raise LaunchError(
                f"settings file {path} is a folder, not a file. Remove that folder, or put the settings "
                f'into a file of that name (one JSON object such as {{"threads": 1}}).'
            )
        if path.is_file():
            read.append(path)
            fix = f"Edit {path}."
            given: dict[str, str] = {}
            for key, raw in _settings_file(path).items():
                name = ALIASES.get(key, key)
                if name not in _DEFAULTS:
                    raise LaunchError(
                        f"settings file {path}: unknown option '{key}'.{_did_you_mean(key, [*option_names(), *ALIASES])} "
                        f"Known options: {', '.join(option_names())}."
                    )
                if name in given:
                    raise LaunchError(
                        f"settings file {path} sets option '{name}' twice, as '{given[name]}' and '{key}'. "
                        "Keep one."
                    )
                given[name] = key
                values[name] = parse_option(key, raw, f"settings file {path}", fix)
                sources[name] = f"settings file {path}"
    env = os.environ if environ is None else environ
    report = warn if warn is not None else console_warn
    for warning in unknown_environment_names(env):
        report(warning)
    from_env: dict[str, str] = {}
    for variable, name in _known_env_names().items():
        if variable not in env:
            continue
        if name in from_env:
            raise LaunchError(
                f"environment variables {from_env[name]} and {variable} both set option '{name}' "
                f"(to {env[from_env[name]]!r} and {env[variable]!r}). Unset one."
            )
        from_env[name] = variable
        values[name] = parse_option(
            name,
            env[variable],
            f"environment variable {variable}",
            f"Change or unset {variable} in the environment that starts the trainer.",
        )
        sources[name] = f"environment variable {variable}"
    for key, raw in (overrides or {}).items():
        if raw is None:
            continue
        name = ALIASES.get(key, key)
        if name not in _DEFAULTS:
            raise LaunchError(f"unknown option '{key}'.{_did_you_mean(key, option_names())}")
        values[name] = parse_option(
            name, raw, f"command-line option {cli_flag(name)}", "See 'la-trainer COMMAND --help'."
        )
        sources[name] = f"command-line option {cli_flag(name)}"
    options = replace(TrainerOptions(), **values)  # type: ignore[arg-type]
    return LoadedOptions(options, sources, looked_for, tuple(read))
