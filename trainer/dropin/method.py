"""Which trainer a spawned run is for, decided before la-trainer's own dependencies are needed.

The engine runs one ``train.py`` for BehaviorCloning, PPO and FlowMatching; only ``TrainerMethod`` in the
trainer config tells them apart (spec §1.6, §11 item 3). The ordinary path reads it through the trainer
link (:meth:`trainer.session.links.ShmTrainerLink.peek_trainer_method`). Two launches must decide without that
link, with nothing but the standard library, :mod:`protocol.argv` and :mod:`protocol.names`:

* **a half install** (:func:`missing_requirements`): the engine's Python cannot load what FlowMatching
  needs (torch, numpy, msgpack, posix_ipc: a changed engine Python, a partial ``install-engine``). A run
  of another method still goes to the engine's own script; a FlowMatching run ends with one line that
  names what is missing and the fix.
* **scale-out** (``LA_TRAINER_NPROC_PER_NODE``): only FlowMatching runs become torchrun; the others are
  handed over from this one process. The link cannot be opened here (rank 0 must be the one holding the
  control block's lock), so the method comes from the config file itself.

Shared memory (spawned): the engine writes ``trainer-config.json`` into ``<task dir>/Configs`` (a folder new
for this run) and raises ConfigSignal after it (spec §2.4): a file that parses is this run's whole config.
"""

from __future__ import annotations

import codecs
import importlib
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "CONFIG_POLL_S",
    "Requirement",
    "method_from_config",
    "missing_requirements",
    "wait_for_method",
]

CONFIG_POLL_S = 0.05
"""How often the config folder is looked at while the game has not posted its config."""
_CONFIG_LIMIT = 16 << 20
"""A trainer-config.json larger than this is not the engine's (it writes a few hundred bytes)."""


class Requirement:
    """One module FlowMatching training needs and how it is checked."""

    def __init__(self, name: str, *, import_it: bool) -> None:
        self.name = name
        self.import_it = import_it
        """Import for real (small modules; a binary built for another Python fails only then); else only
        look it up (torch: importing it takes seconds, and the link must open first, spec §2.4)."""

    def problem(self) -> str | None:
        """None when the module is there, else what is wrong with it (one line)."""
        try:
            if self.import_it:
                importlib.import_module(self.name)
                return None
            if importlib.util.find_spec(self.name) is None:
                return f"{self.name} (not installed)"
            return None
        except Exception as error:  # any failure to load: ImportError, a broken binary, a bad install
            return f"{self.name} ({type(error).__name__}: {error})"


def requirements(platform: str | None = None) -> tuple[Requirement, ...]:
    """What training a FlowMatching run loads, in this Python (posix_ipc only on POSIX)."""
    found = [
        Requirement("numpy", import_it=True),
        Requirement("msgpack", import_it=True),
        Requirement("torch", import_it=False),
    ]
    if (platform or sys.platform) != "win32":
        found.insert(2, Requirement("posix_ipc", import_it=True))
    return tuple(found)


def missing_requirements(platform: str | None = None) -> list[str]:
    """One line per requirement this Python cannot load (empty: FlowMatching can train here)."""
    return [p for p in (r.problem() for r in requirements(platform)) if p is not None]


def method_from_config(raw: bytes) -> str | None:
    """``TrainerMethod`` of a trainer-config.json (FlowMatching when the key is absent, as the engine's
    default); None while the bytes are not one whole JSON object (the engine is still writing it)."""
    from protocol.names import FLOW_MATCHING, trainer_method

    try:
        if raw.startswith(codecs.BOM_UTF8):
            text = raw[len(codecs.BOM_UTF8) :].decode("utf-8")
        elif raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
            text = raw.decode("utf-16")  # a UE string writer with non-ASCII paths (protocol.config)
        else:
            text = raw.decode("utf-8")
        obj = json.loads(text)
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(obj, dict):
        return None
    method = trainer_method(obj)
    return FLOW_MATCHING if method is None else method


def wait_for_method(
    config_dir: Path,
    *,
    engine_alive: Callable[[], bool],
    poll_s: float = CONFIG_POLL_S,
) -> str | None:
    """Wait for ``config_dir/trainer-config.json`` to hold a whole config; its method, or None once the
    engine is gone. No bound: a spawning engine that lives may post its config at any time (a paused
    editor, a game that begins training late); SIGINT/SIGTERM end the wait as they end the process."""
    path = config_dir / "trainer-config.json"
    while True:
        try:
            if path.stat().st_size <= _CONFIG_LIMIT:
                method = method_from_config(path.read_bytes())
                if method is not None:
                    return method
        except OSError:
            pass  # not written yet
        if not engine_alive():
            return None
        time.sleep(poll_s)


def engine_watch() -> Callable[[], bool]:
    """True while the engine that spawned us runs (:func:`trainer.system.liveness.parent_watch`; with
    only the standard library at hand on POSIX, our parent id unchanged)."""
    try:
        from trainer.system.liveness import parent_watch

        return parent_watch()
    except ImportError:  # the transport package needs posix_ipc, which may be what is missing
        initial = os.getppid()
        return lambda: os.getppid() == initial
