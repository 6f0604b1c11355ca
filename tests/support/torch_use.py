"""Which test files use torch: the ones CI also runs on the engine's torch (scripts/test_engine_torch.sh).

A test file uses torch when importing it imports torch, or when it runs the trainer as a process (the
``integration`` marker says so: that process imports torch). "Importing it imports torch" is followed
through this repository's own packages (``trainer``, ``emulator``, ``benchmarks``, ``protocol``,
``tests``, ``scripts``): the test file's imports count wherever they stand (an ``import torch`` inside a
test runs under that test), an own module's only when they run at import time (module level, ``if``/
``try`` blocks included, ``if TYPE_CHECKING`` blocks not). A function-level import deep in the library
(``trainer.dropin.handover`` reaching ``trainer.session.run`` only when it hands a run over) would otherwise mark almost
every test, torch or not.

The walk reads source text (``ast``) and imports nothing, so it gives the same answer in every environment,
whether or not torch is installed there.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
OWN_PACKAGES = frozenset({"trainer", "emulator", "benchmarks", "protocol", "tests", "scripts"})
TORCH = "torch"


def _module_file(dotted: str, root: Path) -> Path | None:
    """The source file of an own module (``a.b`` → ``a/b.py`` or ``a/b/__init__.py``), or None."""
    base = root.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _package_of(path: Path, root: Path) -> list[str]:
    """The dotted package a source file lives in, as parts (``trainer/training/steps/fused.py`` → trainer, steps)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return parts[:-1]


def _runs_at_import(tree: ast.Module) -> list[ast.stmt]:
    """The statements of a module that run when it is imported (``if TYPE_CHECKING`` bodies excluded)."""
    pending: list[ast.stmt] = list(tree.body)
    out: list[ast.stmt] = []
    while pending:
        node = pending.pop()
        out.append(node)
        if isinstance(node, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(node.test):
                pending.extend(node.body)
            pending.extend(node.orelse)
        elif isinstance(node, ast.Try):
            pending.extend([*node.body, *node.orelse, *node.finalbody])
            for handler in node.handlers:
                pending.extend(handler.body)
        elif isinstance(node, ast.With):
            pending.extend(node.body)
    return out


def _imported_names(path: Path, root: Path, *, anywhere: bool) -> set[str]:
    """The dotted module names the file imports (each ``from a import b`` also names ``a.b``): every import
    statement when ``anywhere``, else those that run at import time."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    statements = list(ast.walk(tree)) if anywhere else _runs_at_import(tree)
    names: set[str] = set()
    for node in statements:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = _package_of(path, root)
                anchor = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


@cache
def _closure(path: Path, root: Path) -> frozenset[str]:
    """Top-level names of the outside modules that importing the file at ``path`` (resolved) imports."""
    outside: set[str] = set()
    seen: set[Path] = set()
    pending = [path]
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        for name in _imported_names(current, root, anywhere=current == path):
            top = name.split(".")[0]
            if top not in OWN_PACKAGES:
                outside.add(top)
                continue
            parts = name.split(".")
            # Importing a.b.c runs a/__init__.py and a/b/__init__.py first.
            for depth in range(1, len(parts) + 1):
                found = _module_file(".".join(parts[:depth]), root)
                if found is not None and found not in seen:
                    pending.append(found)
    return frozenset(outside)


def imports_torch(path: Path, root: Path = REPO_ROOT) -> bool:
    """Whether importing the test file at ``path`` imports torch (``root``: the repository it belongs to)."""
    return TORCH in _closure(path.resolve(), root.resolve())


_SESSIONS = (
    "the sessions of tests/integration/test_modes.py and test_real_install.py run the same trainer code"
)
KEPT_OFF_ENGINE_TORCH: dict[str, str] = {
    # Wall-clock waits, not torch: a game paused for PAUSE_S, a BeginTraining LATE_START_S late.
    "tests/integration/test_real_install.py::test_a_game_paused_after_the_first_round_still_gets_the_final_"
    "networks_and_complete": f"waits out a paused game (80 s); {_SESSIONS}",
    "tests/integration/test_real_install.py::test_a_game_that_begins_training_late_is_served": (
        f"waits out a late BeginTraining (LATE_START_S; 300 s in the recorded long-wait run); {_SESSIONS}"
    ),
    # Failure handling of a job of several processes (our watchdog and launcher; a killed rank's gloo errors
    # and the collectives stay in the step).
    "tests/trainer/test_distributed.py::test_a_frozen_rank_is_caught_by_the_watchdog": (
        "waits for our watchdog (up to 120 s); gloo's failure path runs in test_a_killed_rank_ends_the_job..."
    ),
    "tests/trainer/test_distributed.py::test_the_engine_spawns_two_processes_through_the_launcher_and_stops_them": (
        "the launcher's process handling; torchrun runs in tests/integration/test_torchrun.py"
    ),
    "tests/integration/test_torchrun.py::test_the_engine_spawned_drop_in_reexecutes_under_torchrun": (
        "the re-exec path; test_torchrun_on_the_drop_in_completes_a_session_and_leaves_nothing_behind runs torchrun"
    ),
    "tests/integration/test_torchrun.py::test_wrong_inputs_of_an_engine_spawned_scale_out_end_with_their_exit_code": (
        "exit codes before training"
    ),
    "tests/integration/test_heldout_scaleout.py": "held-out measurement under torchrun; torchrun and held-out run elsewhere",
    # Transport faults, hand-over, launch errors and packaging: the trainer's torch use is that of the sessions.
    "tests/faults/test_game_killed.py::test_spawned_shared_memory[": f"a killed game, one per moment; {_SESSIONS}",
    "tests/faults/test_game_killed.py::test_attach_mode": f"a killed game in attach mode; {_SESSIONS}",
    "tests/faults/test_game_killed.py::test_broken_output_pipe": f"a closed stdout; {_SESSIONS}",
    "tests/faults/test_serve.py::test_one_server_serves_two_sessions": f"server mode across sessions; {_SESSIONS}",
    "tests/integration/test_handover.py": "hands other methods to the engine's script before training starts",
    "tests/integration/test_launch_errors.py": "bad launch inputs end with their exit code before training starts",
    "tests/integration/test_wheel.py": "packaging (builds and installs a wheel)",
    "tests/integration/test_run_status.py": f"`la-trainer watch` output; {_SESSIONS}",
    "tests/integration/test_demo.py::test_time_limit": "the demo's time limit; the quick demo runs here",
    "tests/trainer/test_install_engine.py::test_the_installed_shim_trains": f"the installed shim; {_SESSIONS}",
}
"""Tests kept out of the engine-torch step for time, by node-id prefix, each with its reason; every entry
must match a collected test (tests/test_engine_torch_step.py). The step's budget is about 5 minutes on 2
cores, which the whole torch set overruns about threefold."""


def kept_off_reason(nodeid: str) -> str | None:
    """The reason ``nodeid`` is kept out of the engine-torch step, if a prefix of the table matches it."""
    return next((why for prefix, why in KEPT_OFF_ENGINE_TORCH.items() if nodeid.startswith(prefix)), None)


def suite_test_files() -> list[Path]:
    """Every test module of the suite (``tests/**/test_*.py``), sorted."""
    return sorted((REPO_ROOT / "tests").rglob("test_*.py"))
