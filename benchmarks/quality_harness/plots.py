"""The plots (matplotlib, optional): what they need collected while a row's policy is at hand
(:func:`collect_plot_data`, first seed only) and the PNG files drawn at the end (:func:`write_plots`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks.quality_harness.evaluation import FloatArray
from benchmarks.quality_harness.plan import (
    CURVE_NFE,
    PRIMARY,
    TASK_TITLES,
    HarnessConfig,
    RunResult,
    Variant,
    time_rows,
)
from benchmarks.quality_harness.tables import describe_variant
from emulator.tasks import avoid, bimodal

__all__ = ["B1_PLOT_OBS", "B1_PLOT_SAMPLES", "collect_plot_data", "write_plots"]

B1_PLOT_OBS = np.array([[-0.75, 0.0], [-0.25, 0.5], [0.2, -0.5], [0.6, 0.3]], dtype=np.float32)
"""Observations whose action samples ``b1_samples.png`` shows."""
B1_PLOT_SAMPLES = 256


def collect_plot_data(
    variant: Variant,
    seed: int,
    cfg: HarnessConfig,
    plot_data: dict[str, Any],
    policy_for: Callable[[int], Callable[[FloatArray], npt.ArrayLike]],
) -> None:
    """Raw samples (B1) and trajectories (B2) of the first seed, for the plots only."""
    nfes = [CURVE_NFE] if variant.method == "mse" else sorted(set(cfg.nfe) | {CURVE_NFE})
    if variant.task == "b1" and variant.group == "main":
        obs = np.repeat(B1_PLOT_OBS, B1_PLOT_SAMPLES, axis=0)
        plot_data.setdefault("b1_samples", {})[variant.key] = {
            nfe: np.asarray(policy_for(nfe)(obs), dtype=np.float32).reshape(
                len(B1_PLOT_OBS), B1_PLOT_SAMPLES, -1
            )
            for nfe in nfes
        }
    if variant.task == "b2" and variant.group == "main":
        starts = avoid.sample_starts(cfg.eval_sizes["b2"], np.random.default_rng([cfg.eval_seed, 0xB2]))
        policy = policy_for(CURVE_NFE)

        def chunk_fn(idx: npt.NDArray[np.intp], obs: FloatArray) -> npt.ArrayLike:
            return policy(obs)

        rollouts = avoid.rollout(chunk_fn, starts, variant.execute, record=True)
        plot_data.setdefault("b2_paths", {})[variant.key] = (rollouts.observations, rollouts.success)


def write_plots(
    cfg: HarnessConfig,
    variants: Sequence[Variant],
    summary: Sequence[Mapping[str, Any]],
    results: Sequence[RunResult],
    plot_data: Mapping[str, Any],
) -> list[Path]:
    """PNG plots into ``cfg.out``; returns the files written (none when matplotlib is missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Circle
    except ImportError:  # pragma: no cover - matplotlib is in the dev set
        print("quality: matplotlib is not installed; no plots.", flush=True)
        return []
    written: list[Path] = []

    def save(fig: Any, name: str) -> None:
        path = cfg.out / name
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    # 1. Primary metric against NFE, per task (FM rows as lines with the seed spread, MSE as a band).
    tasks = [t for t in cfg.tasks if any(v.task == t and v.group == "main" for v in variants)]
    if tasks:
        fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.8), squeeze=False)
        for ax, task in zip(axes[0], tasks, strict=True):
            metric = PRIMARY[task]
            for v in (v for v in variants if v.task == task and v.group == "main"):
                entries = [s for s in summary if s["variant"] == v.key]
                label = f"{v.label} {v.chunk_size}/{v.execute}" + ("" if v.embed else " embed=false")
                if v.method == "mse" and entries:
                    stat = entries[0]["metrics"][metric]
                    ax.axhline(
                        stat["mean"], ls="--", color="grey" if v.chunk_size == 1 else "black", label=label
                    )
                    continue
                xs = [int(s["nfe"]) for s in entries]
                ys = [s["metrics"][metric]["mean"] for s in entries]
                es = [s["metrics"][metric]["std"] for s in entries]
                if xs:
                    ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=label)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("NFE (ODEStepsNum)")
            ax.set_ylabel(metric)
            ax.set_title(TASK_TITLES[task], fontsize=9)
            ax.legend(fontsize=7)
        save(fig, "nfe.png")

    # 2. Learning curves (primary metric at NFE 8 against train steps), mean over seeds.
    curve_tasks = [
        t for t in tasks if any(len(r.curve) > 1 for r in results if r.variant.startswith(t + "/"))
    ]
    if curve_tasks:
        fig, axes = plt.subplots(1, len(curve_tasks), figsize=(5 * len(curve_tasks), 3.8), squeeze=False)
        for ax, task in zip(axes[0], curve_tasks, strict=True):
            for v in (v for v in variants if v.task == task and v.method == "fm"):
                curves = [r.curve for r in results if r.variant == v.key and r.failure is None and r.curve]
                if not curves:
                    continue
                steps = sorted({s for c in curves for s, _ in c})
                mean = [np.nanmean([dict(c).get(s, np.nan) for c in curves]) for s in steps]
                ax.plot(steps, mean, marker="o", label=describe_variant(v))
            ax.set_xlabel("train steps")
            ax.set_ylabel(f"{PRIMARY[task]} (NFE {CURVE_NFE})")
            ax.set_title(TASK_TITLES[task], fontsize=9)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
        save(fig, "curves.png")

    # 3. B1 action samples of the first seed.
    samples = plot_data.get("b1_samples", {})
    if samples:
        panels = [(key, nfe) for key, by_nfe in samples.items() for nfe in by_nfe]
        fig, axes = plt.subplots(1, len(panels), figsize=(2.6 * len(panels), 2.9), squeeze=False)
        circle = np.linspace(0, 2 * np.pi, 200)
        for ax, (key, nfe) in zip(axes[0], panels, strict=True):
            ax.plot(np.cos(circle), np.sin(circle), color="lightgrey", lw=0.8)
            data = samples[key][nfe]
            for i, obs in enumerate(B1_PLOT_OBS):
                ax.scatter(data[i, :, 0], data[i, :, 1], s=2, alpha=0.5)
                centre = bimodal.mode_centres(obs[None])[0]
                ax.scatter([centre[0], -centre[0]], [centre[1], -centre[1]], marker="x", color="black", s=20)
            ax.set_title(f"{key} NFE {nfe}" if not key.endswith("mse") else key, fontsize=8)
            ax.set_xlim(-1.4, 1.4)
            ax.set_ylim(-1.4, 1.4)
            ax.set_aspect("equal")
            ax.tick_params(labelsize=6)
        save(fig, "b1_samples.png")

    # 4. B2 paths of the first seed at NFE 8 (green: success, red: failure), obstacles in grey.
    paths = plot_data.get("b2_paths", {})
    if paths:
        fig, axes = plt.subplots(1, len(paths), figsize=(3.2 * len(paths), 4.2), squeeze=False)
        for ax, (key, (trajectories, success)) in zip(axes[0], paths.items(), strict=True):
            for cx, cy, r in avoid.OBSTACLES:
                ax.add_patch(Circle((cx, cy), r, color="grey", alpha=0.6))
            for traj, ok in zip(trajectories, success, strict=True):
                ax.plot(traj[:, 0], traj[:, 1], lw=0.5, alpha=0.5, color="tab:green" if ok else "tab:red")
            ax.axhline(avoid.GOAL_Y, color="black", lw=0.6, ls=":")
            ax.set_xlim(-0.7, 0.7)
            ax.set_ylim(-0.05, 1.1)
            ax.set_aspect("equal")
            ax.set_title(key if "/mse" in key else f"{key} NFE {CURVE_NFE}", fontsize=8)
            ax.tick_params(labelsize=6)
        save(fig, "b2_paths.png")

    # 5. Time-distribution comparison.
    dist_tasks = [t for t in cfg.time_dist_tasks if time_rows(cfg, variants, t)] if cfg.time_dists else []
    if dist_tasks:
        fig, axes = plt.subplots(1, len(dist_tasks), figsize=(5 * len(dist_tasks), 3.8), squeeze=False)
        for ax, task in zip(axes[0], dist_tasks, strict=True):
            metric = PRIMARY[task]
            for dist, v in time_rows(cfg, variants, task):
                entries = [s for s in summary if s["variant"] == v.key]
                xs = [int(s["nfe"]) for s in entries]
                ys = [s["metrics"][metric]["mean"] for s in entries]
                es = [s["metrics"][metric]["std"] for s in entries]
                if xs:
                    ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=dist)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("NFE (ODEStepsNum)")
            ax.set_ylabel(metric)
            ax.set_title(f"{TASK_TITLES[task]}: training time distribution", fontsize=9)
            ax.legend(fontsize=7)
        save(fig, "time_distributions.png")
    return written
