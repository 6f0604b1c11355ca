"""The quality benchmark's plan: the tasks, the targets, the rows (variants) and the settings they share.

A row (:class:`Variant`) is one policy of one task, trained for every seed; :func:`plan_variants` turns a
:class:`HarnessConfig` into the rows in table order. :class:`RunResult` is what one (row, seed) gives.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from emulator.tasks import avoid, bimodal, pendulum
from protocol.config import FlowMatchingTrainingSettings
from trainer.settings.options import TrainerOptions

__all__ = [
    "CURVE_NFE",
    "DEFAULT_DEMOS",
    "DEFAULT_EVAL",
    "DEFAULT_ITERATIONS",
    "DEFAULT_T",
    "DEFAULT_TIME_DISTRIBUTIONS",
    "ENGINE_TIMEOUT_S",
    "PRIMARY",
    "TABLE_METRICS",
    "TARGETS",
    "TASKS",
    "TASK_TITLES",
    "WEIGHT_DECAY",
    "HarnessConfig",
    "RunResult",
    "Target",
    "Variant",
    "plan_variants",
    "time_rows",
]

TASKS: Mapping[str, str] = {"b1": "bimodal", "b2": "avoid", "b3": "pendulum"}
"""Benchmark key -> task module name in :mod:`emulator.tasks`."""
TASK_TITLES: Mapping[str, str] = {
    "b1": "B1 conditional bimodal (open loop)",
    "b2": "B2 six-path avoid (closed loop)",
    "b3": "B3 pendulum swing-up (closed loop)",
}
DEFAULT_ITERATIONS: Mapping[str, int] = {"b1": 12_000, "b2": 12_000, "b3": 8_000}
"""Train steps per task (benchmarks.md: 12k for B1/B2, 8k for B3)."""
DEFAULT_DEMOS: Mapping[str, int] = {"b1": bimodal.PAIR_NUM, "b2": avoid.DEMO_NUM, "b3": pendulum.DEMO_NUM}
"""B1: demonstration pairs; B2/B3: demonstration episodes."""
DEFAULT_EVAL: Mapping[str, int] = {
    "b1": bimodal.EVAL_OBS_NUM,
    "b2": avoid.EVAL_ROLLOUT_NUM,
    "b3": pendulum.EVAL_EPISODE_NUM,
}
"""B1: held-out observations (× 64 samples each); B2: rollouts; B3: episodes."""
PRIMARY: Mapping[str, str] = {"b1": "on_mode", "b2": "success", "b3": "score"}
"""The metric of each task's learning curve and NFE plot."""
TABLE_METRICS: Mapping[str, tuple[tuple[str, str], ...]] = {
    "b1": (
        ("on_mode", "on_mode"),
        ("both_modes_covered", "both covered"),
        ("balance_err", "balance_err"),
        ("mmd", "MMD"),
    ),
    "b2": (("success", "success"), ("entropy", "entropy"), ("collision", "collision")),
    "b3": (("score", "score"), ("upright", "upright"), ("return", "return")),
}
DEFAULT_TIME_DISTRIBUTIONS = ("uniform", "logit_normal:0,1", "beta:1,1.5", "power:2")
"""Compared training-time distributions (t = 0 noise, t = 1 data): SD3's logit-normal, a π0-like Beta
skewed towards noise (mean 0.4) and a power skew towards noise (U², mean 1/3)."""
DEFAULT_T = str(TrainerOptions().time_distribution)
"""The trainer's default t distribution: every main row trains with it."""
CURVE_NFE = 8
"""The engine's default ODEStepsNum: the NFE of the learning curves and of the target checks."""
ENGINE_TIMEOUT_S = 60.0
"""Communicator timeout the emulated engine uses here (the engine default is 10 s)."""
WEIGHT_DECAY = FlowMatchingTrainingSettings().weight_decay
"""The engine default the emulator's trainer config carries; the MSE baseline uses the same."""


@dataclass(frozen=True, slots=True)
class Target:
    """A pass/fail target of the issue: ``metric`` of the FM rows of ``task`` at NFE ``nfe`` >= ``threshold``
    (mean over seeds)."""

    task: str
    metric: str
    threshold: float
    nfe: int = CURVE_NFE


TARGETS: tuple[Target, ...] = (
    Target("b1", "on_mode", 0.95),
    Target("b1", "both_modes_covered", 0.99),
    Target("b2", "success", 0.9),
    Target("b2", "entropy", 0.9),
    Target("b3", "score", 0.98),
)


@dataclass(frozen=True, slots=True)
class Variant:
    """One row of the plan, run for every seed.

    ``method``: ``"fm"`` (the trainer process) or ``"mse"`` (the in-process baseline). ``chunk_size`` is
    ActionChunkSize (predicted steps), ``execute`` the steps run per policy call. ``embed`` is
    EmbedNormalizationsInWeights. ``group``: ``"main"`` rows go into the task tables, ``"time"`` rows
    into the time-distribution comparison.
    """

    key: str
    task: str
    label: str
    method: str
    iterations: int
    chunk_size: int = 1
    execute: int = 1
    embed: bool = True
    time_distribution: str = DEFAULT_T
    group: str = "main"
    priority: int = 0
    """Run order (lower first; the plan order within a priority): the rows the targets are checked on
    come first, so that an interrupted run has left the most useful results in ``partial.json``."""


@dataclass(frozen=True, slots=True)
class HarnessConfig:
    """Everything shared by the rows: seeds, NFEs, network and optimiser settings, sizes, paths."""

    tasks: tuple[str, ...]
    seeds: tuple[int, ...]
    nfe: tuple[int, ...]
    iterations: Mapping[str, int]
    batch_size: int = 256
    learning_rate: float = 1e-3
    hidden_layer_num: int = 2
    hidden_layer_size: int = 256
    activation: str = "ELU"
    ema_decay: float = 0.999
    threads: int = 0
    eval_seed: int = 1000
    curve_every: int = 2000
    demos: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_DEMOS))
    eval_sizes: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_EVAL))
    b1_samples: int = bimodal.EVAL_SAMPLE_NUM
    embed_false_row: bool = True
    b2_chunk_row: bool = True
    time_dists: tuple[str, ...] = ()
    time_dist_tasks: tuple[str, ...] = ("b1",)
    rows: str = ""
    """Regular expression: train only the rows whose key matches (``b2/fm-chunk8x4``); empty: all."""
    out: Path = Path("reports/quality")
    work_dir: Path | None = None
    plots: bool = True
    echo: bool = False
    quick: bool = False
    resume: bool = False
    """Keep the successful trainings recorded in ``<out>/partial.json`` and run only the others."""
    jobs: int = 1
    """Trainings run at the same time (each in its own process). > 1 shortens the run but makes the
    wall-clock columns (train s, ms/call) depend on the sharing; the quality numbers are unaffected."""


@dataclass
class RunResult:
    """One (variant, seed): train steps, wall-clock, metrics per NFE (``"-"`` for MSE), learning curve."""

    variant: str
    seed: int
    train_steps: int = 0
    train_s: float = math.nan
    session_s: float = math.nan
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    curve: list[tuple[int, float]] = field(default_factory=list)
    failure: str | None = None
    log_tail: str = ""


def plan_variants(cfg: HarnessConfig) -> list[Variant]:
    """The rows to run, in order: per task FM, its extra FM rows, MSE; then the time-distribution rows."""
    rows: list[Variant] = []
    for task in cfg.tasks:
        n = cfg.iterations[task]
        if task == "b1":
            rows.append(Variant("b1/fm", "b1", "FM", "fm", n))
            if cfg.embed_false_row:
                rows.append(
                    Variant("b1/fm-embed-false", "b1", "FM embed=false", "fm", n, embed=False, priority=2)
                )
            rows.append(Variant("b1/mse", "b1", "MSE", "mse", n, priority=1))
        elif task == "b2":
            rows.append(Variant("b2/fm", "b2", "FM", "fm", n, priority=2))
            if cfg.b2_chunk_row:
                rows.append(Variant("b2/fm-chunk8x4", "b2", "FM", "fm", n, chunk_size=8, execute=4))
            rows.append(Variant("b2/mse", "b2", "MSE", "mse", n, priority=1))
            if cfg.b2_chunk_row:
                rows.append(
                    Variant("b2/mse-chunk8x4", "b2", "MSE", "mse", n, chunk_size=8, execute=4, priority=2)
                )
        elif task == "b3":
            rows.append(Variant("b3/fm-chunk4x2", "b3", "FM", "fm", n, chunk_size=4, execute=2))
            rows.append(
                Variant("b3/mse-chunk4x2", "b3", "MSE", "mse", n, chunk_size=4, execute=2, priority=1)
            )
    for task in cfg.time_dist_tasks if cfg.time_dists else ():
        base = next((v for v in rows if v.task == task and v.method == "fm" and v.group == "main"), None)
        for dist in cfg.time_dists:
            if base is not None and dist == base.time_distribution and base.chunk_size == 1:
                continue  # the main FM row already is this one: reused, not retrained
            rows.append(
                Variant(
                    f"{task}/fm-t={dist}",
                    task,
                    f"FM t~{dist}",
                    "fm",
                    cfg.iterations[task],
                    time_distribution=dist,
                    group="time",
                    priority=3,
                )
            )
    if cfg.rows:
        rows = [v for v in rows if re.search(cfg.rows, v.key)]
    return rows


def time_rows(cfg: HarnessConfig, variants: Sequence[Variant], task: str) -> list[tuple[str, Variant]]:
    """(time distribution, variant) pairs of the comparison for ``task`` (the uniform one may be a main row)."""
    out: list[tuple[str, Variant]] = []
    for dist in cfg.time_dists:
        match = next(
            (v for v in variants if v.task == task and v.group == "time" and v.time_distribution == dist),
            None,
        )
        if match is None and dist == DEFAULT_T:
            match = next(
                (
                    v
                    for v in variants
                    if v.task == task and v.method == "fm" and v.group == "main" and v.chunk_size == 1
                ),
                None,
            )
        if match is not None:
            out.append((dist, match))
    return out
