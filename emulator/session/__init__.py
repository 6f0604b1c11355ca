"""A whole engine session against a real trainer process, recorded for assertions (spec §7.1).

:func:`run_engine_session` (:mod:`emulator.session.run`) plays one session in a :class:`Mode` and returns a
:class:`SessionRecord` (:mod:`emulator.session.results`). What it is set up with, the :class:`EngineTask`,
the :class:`SessionSettings` and the engine's configs (:func:`build_session_config`), is
:mod:`emulator.session.settings`; what it asks of the host (a free port, leaked ``/dev/shm`` entries) is
:mod:`emulator.session.host`. This module only re-exports the public names.
"""

from emulator.session.host import free_tcp_port, shm_entries
from emulator.session.results import Mode, RoundRecord, SessionRecord
from emulator.session.run import run_engine_session
from emulator.session.settings import EngineTask, SessionSettings, build_session_config

__all__ = [
    "EngineTask",
    "Mode",
    "RoundRecord",
    "SessionRecord",
    "SessionSettings",
    "build_session_config",
    "free_tcp_port",
    "run_engine_session",
    "shm_entries",
]
