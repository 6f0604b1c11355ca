"""Held-out imitation quality: a share of the recorded episodes is kept out of training and the policy is
measured on it, periodically, the way the game will run it.

The engine's own trainer logs only its training loss, which says little about the policy a game gets: it
falls while the network memorises, and it is the same number for a policy that covers both of a
demonstration's modes and one that sits between them. This module answers on data the training never
saw, with no game and no emulator:

* **Split** (:func:`split_episodes`): whole episodes, never rows (neighbouring steps of one episode are
  near-copies; holding out rows would measure memory, not imitation). ``round(share · E)`` of the ``E``
  non-empty episodes (half rounds up), at least one, and at least one left to train on, chosen by the
  config's Seed; nothing when ``E`` is below ``min_episodes`` or the share is 0. Then the training data
  is exactly what it was without the option: same rows, same statistics, same seeded results.
* **Metrics** (:class:`HeldOutEvaluator`), on a fixed subset of the held-out rows, with draws fixed once
  per run (their own generator, seeded from the config's Seed: the training's random stream is never
  touched, and two evaluations differ only by the weights):

  ``selection`` (what "best" means, and what the recipe pilot chooses by: higher is better)
      ``f1 − energy`` on up to :data:`SELECTION_ROWS` held-out observations with
      :data:`SELECTION_SAMPLES` actions each, drawn through the engine's inference path from draws of a
      generator of their own (seeded by the config's Seed only), so two runs of one seed with any options
      (time density, source spread, recipe) are measured on the same rows and the same noise.
      ``f1``: the harmonic mean of coverage and precision (below, with 16 samples and the 5 nearest
      observations) averaged over the radii :data:`SELECTION_RADII`; ``energy``: the energy score with
      16 samples, in root-mean-square demonstrated stds. Chosen because it ranks policies *across*
      recipes like the tasks' own quality (benchmarks/results/selection/: same-iteration Spearman over
      13 recipes, positive on B1-B4, the demo and a four-mode task, where the iteration count scores 0
      and the flow loss below misranks recipes).
  ``flow_loss`` (lower is better; comparable only between measurements of one run)
      the training loss (standardised-velocity MSE, the run's time density, no observation noise) on
      up to :data:`LOSS_ROWS` held-out rows, one fixed ``(t, x0)`` each. It is measured on the run's
      own time density and path, so a run with other options gets another scale: it ranked the
      checkpoints of one run well (benchmarks/heldout_agreement.py) but misranked recipes.
  ``energy_score`` (the sample-based headline: lower is better)
      for each of up to :data:`SAMPLE_ROWS` held-out observations, :data:`SAMPLES_PER_ROW` actions drawn
      through the engine's inference path (encoder, explicit Euler from ``t = 0`` noise to ``t = 1`` with
      the game's ODEStepsNum, decoder: :meth:`trainer.training.model.FlowModel.sample`), compared with the one
      demonstrated action by the energy score ``E‖Y − a‖ − ½E‖Y − Y'‖`` (unbiased over the samples),
      averaged over the rows. A proper scoring rule for the whole conditional distribution: in
      expectation it is smallest for the demonstrator's own distribution, so it rewards covering every
      mode of an observation and penalises spreading between them. Distances are over the whole action
      chunk, each dimension divided by the demonstrated held-out std (raw units otherwise favour large
      dimensions).
  ``energy_distance``
      the energy distance ``2E‖X − Y‖ − E‖X − X'‖ − E‖Y − Y'‖`` between the demonstrated actions and
      the first sample of every observation, pooled over the observations (V-statistics: >= 0, and 0
      exactly when the two sample sets are the same); the marginal counterpart of the score.
  ``w1`` and ``w1_raw``
      per action dimension (the chunk's, in the decoder's layout), the 1-D Wasserstein-1 distance
      between demonstrated and sampled actions pooled over the observations: ``w1_raw`` in the game's
      units (after the decoder), ``w1`` their mean over dimensions, each divided by its demonstrated std.
  ``coverage``
      of the demonstrated modes: the share of held-out rows whose demonstrated action has at least one
      of its :data:`SAMPLES_PER_ROW` samples within :data:`RADIUS` (root-mean-square over dimensions, in
      demonstrated stds). A policy that never produces one of the modes leaves its rows uncovered.
  ``precision``
      the share of samples within :data:`RADIUS` of a demonstrated action of one of the
      :data:`NEIGHBOURS` held-out rows with the nearest observations (standardised), the row itself
      included: samples in places no demonstrator went lower it.

Cost: one evaluation is a few hundred training steps' worth of forward passes at most; measured numbers
are in docs/training.md ("Held-out quality").
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor

from trainer.training.data import MIN_STD, TrainingData
from trainer.training.flow import TimeDistribution, flow_matching_loss

__all__ = [
    "DEFAULT_ODE_STEPS",
    "LOSS_ROWS",
    "NEIGHBOURS",
    "RADIUS",
    "SAMPLES_PER_ROW",
    "SAMPLE_ROWS",
    "SELECTION_RADII",
    "SELECTION_ROWS",
    "SELECTION_SAMPLES",
    "EpisodeSplit",
    "HeldOutEvaluator",
    "HeldOutMetrics",
    "Selection",
    "energy_distance",
    "energy_score",
    "heldout_episode_count",
    "split_episodes",
    "wasserstein_1d",
]

DEFAULT_ODE_STEPS = 8
"""The engine policy's default ODEStepsNum (spec §4.3). The game's value is not sent to the trainer: the
``ode_steps`` option names it when set, else the engine's default is assumed."""

LOSS_ROWS = 4096
"""Held-out rows the flow loss is measured on (a fixed subset when there are more)."""
SAMPLE_ROWS = 512
"""Held-out observations the sample-based metrics draw actions for (a fixed subset when there are more)."""
SAMPLES_PER_ROW = 4
"""Actions drawn per observation: enough for the score's spread term and for a mode of one in four to be
covered two times in three, cheap enough to run every evaluation (2,048 samples)."""
RADIUS = 0.25
"""Coverage and precision radius: root-mean-square distance over the action dimensions, in demonstrated
stds (a quarter of the spread of the demonstrations: well inside one mode, well apart from another)."""
NEIGHBOURS = 5
"""Held-out rows (nearest observations, itself included) whose demonstrated actions a sample may match for
``precision``."""

SELECTION_ROWS = 512
"""Held-out observations the selection score draws actions for (a fixed subset when there are more). The
validation drew 1,024 (benchmarks/results/selection/); 512 halves the cost of every measurement (about
70 ms at 1 x 128 on one core: 8,192 samples through 8 Euler steps, under a tenth of the 1,000 iterations
between measurements)."""
SELECTION_SAMPLES = 16
"""Actions drawn per observation for the selection score (8,192 samples at most)."""
SELECTION_RADII = (0.1, 0.175, 0.25, 0.35, 0.5)
"""Radii (root-mean-square, in demonstrated stds) whose coverage/precision F1 the selection score
averages: from finer than one mode to about half the demonstrations' spread, so neither a sharp policy
that misses modes nor a blurred one that covers them all scores well."""

_SPLIT_STREAM = 0x48454C44
"""Second word of the split's seed (``default_rng([Seed, stream])``): a stream of its own."""
_DRAW_STREAM = 0x4C44
"""Offset of the evaluation draws' torch seed from the config's Seed."""
_SELECTION_STREAM = 0x53454C
"""Offset of the selection draws' torch seed from the config's Seed: a generator of their own, so they do
not depend on what the other draws consumed (the time density's sampler)."""

Ints = npt.NDArray[np.int64]


# --------------------------------------------------------------------------------------------------
# The split


class EpisodeSplit(NamedTuple):
    """Episode indices (sorted) into the replay buffer's episode arrays: ``train`` and ``heldout``."""

    train: Ints
    heldout: Ints

    @property
    def active(self) -> bool:
        """Something is held out."""
        return bool(self.heldout.size)


def heldout_episode_count(episode_num: int, share: float, min_episodes: int) -> int:
    """How many of ``episode_num`` non-empty episodes are held out: 0 when ``share`` is 0 or there are
    fewer than ``min_episodes``; else ``share · episode_num`` rounded half up, at least 1 and at most
    ``episode_num − 1`` (training keeps one)."""
    if share <= 0 or episode_num < max(2, min_episodes):
        return 0
    count = math.floor(share * episode_num + 0.5)
    return min(max(count, 1), episode_num - 1)


def split_episodes(lengths: npt.ArrayLike, share: float, min_episodes: int, seed: int) -> EpisodeSplit:
    """Hold out whole episodes (module docstring). ``lengths`` (E,): the replay buffer's episode lengths;
    empty episodes are never held out (they hold no row) and stay in ``train``. The choice depends only on
    the lengths, ``share``, ``min_episodes`` and ``seed``."""
    lengths64 = np.asarray(lengths, dtype=np.int64).reshape(-1)
    everything = np.arange(lengths64.size, dtype=np.int64)
    candidates = everything[lengths64 > 0]
    count = heldout_episode_count(int(candidates.size), share, min_episodes)
    if count == 0:
        return EpisodeSplit(everything, np.zeros(0, dtype=np.int64))
    rng = np.random.default_rng([seed & 0xFFFFFFFF, _SPLIT_STREAM])
    heldout = np.sort(rng.choice(candidates, size=count, replace=False)).astype(np.int64)
    train = np.setdiff1d(everything, heldout, assume_unique=True).astype(np.int64)
    return EpisodeSplit(train, heldout)


# --------------------------------------------------------------------------------------------------
# Sample-based distances (closed-form checks in tests/trainer/test_heldout.py)


def wasserstein_1d(a: Tensor, b: Tensor) -> Tensor:
    """Per column, the Wasserstein-1 distance between the empirical distributions of ``a`` (n, D) and
    ``b`` (m, D). Equal counts: the mean absolute difference of the sorted columns. Unequal: each side is
    repeated to the least common multiple of the counts (the same empirical measure)."""
    n, m = a.shape[0], b.shape[0]
    if n != m:
        common = n * m // math.gcd(n, m)
        a = a.repeat_interleave(common // n, dim=0)
        b = b.repeat_interleave(common // m, dim=0)
    return (a.sort(dim=0).values - b.sort(dim=0).values).abs().mean(dim=0)


def energy_distance(x: Tensor, y: Tensor) -> Tensor:
    """``2E‖X − Y‖ − E‖X − X'‖ − E‖Y − Y'‖`` between the rows of ``x`` (n, D) and ``y`` (m, D), Euclidean,
    V-statistics (every pair, the zero diagonals included): >= 0, and 0 exactly when the two empirical
    distributions are equal (to the rounding of the means' summation order)."""
    # Direct distances, not torch's matrix-product shortcut (used past 25 rows): that one computes
    # sqrt(|x|^2 + |y|^2 - 2x.y), whose rounding leaves the zero diagonals at about 1e-8 and made equal
    # distributions come out around 1e-12 instead of 0, varying with the BLAS and its threads.
    direct = "donot_use_mm_for_euclid_dist"
    xy = torch.cdist(x, y, compute_mode=direct).mean()
    xx = torch.cdist(x, x, compute_mode=direct).mean()
    yy = torch.cdist(y, y, compute_mode=direct).mean()
    return (2.0 * xy - xx - yy).clamp_min(0.0)


def energy_score(samples: Tensor, observed: Tensor) -> Tensor:
    """Mean over rows of ``E‖Y − a‖ − ½E‖Y − Y'‖``: ``samples`` (R, K, D) drawn for each row, ``observed``
    (R, D) the demonstrated action; the spread term over the K(K − 1) distinct pairs (unbiased; K >= 2)."""
    k = samples.shape[1]
    if k < 2:
        raise ValueError(f"the energy score needs at least 2 samples per row, got {k}")
    to_observed = (samples - observed[:, None, :]).norm(dim=2).mean(dim=1)
    spread = torch.cdist(samples, samples).sum(dim=(1, 2)) / (k * (k - 1))
    score: Tensor = (to_observed - 0.5 * spread).mean()
    return score


# --------------------------------------------------------------------------------------------------
# The evaluator


@dataclass(frozen=True, slots=True)
class Selection:
    """The selection score and its parts (module docstring, ``selection``)."""

    score: float
    """``f1 − energy``: higher is better."""
    f1: float
    energy: float
    coverage: float
    """Coverage averaged over :data:`SELECTION_RADII` (16 samples per observation)."""
    precision: float
    """Precision averaged over :data:`SELECTION_RADII`."""

    def record(self) -> dict[str, float]:
        return {
            "score": self.score,
            "f1": self.f1,
            "energy": self.energy,
            "coverage": self.coverage,
            "precision": self.precision,
        }


@dataclass(frozen=True, slots=True)
class HeldOutMetrics:
    """One evaluation (module docstring for each number). ``seconds``: what it cost."""

    iteration: int
    selection: Selection
    flow_loss: float
    energy_score: float
    energy_distance: float
    w1: float
    w1_raw: tuple[float, ...]
    coverage: float
    precision: float
    seconds: float

    def record(self) -> dict[str, Any]:
        """The ``heldout`` object of a metrics line."""
        return {
            "selection": self.selection.score,
            "selection_f1": self.selection.f1,
            "selection_energy": self.selection.energy,
            "selection_coverage": self.selection.coverage,
            "selection_precision": self.selection.precision,
            "flow_loss": self.flow_loss,
            "energy_score": self.energy_score,
            "energy_distance": self.energy_distance,
            "w1": self.w1,
            "w1_raw": list(self.w1_raw),
            "coverage": self.coverage,
            "precision": self.precision,
            "seconds": self.seconds,
        }

    def tracker_values(self) -> dict[str, float]:
        """Scalars for TensorBoard/MLflow, under ``heldout/``."""
        values = self.record()
        del values["w1_raw"]
        return {f"heldout/{key}": float(value) for key, value in values.items()}

    def short(self) -> str:
        """For the progress line: the selection score, the flow loss, the energy score and the coverage,
        named in words (the log line that starts the hold-out says what each means and which way is
        better)."""
        return (
            f"held-out selection {self.selection.score:.3f} loss {self.flow_loss:.4f} "
            f"energy score {self.energy_score:.3f} coverage {self.coverage:.2f}"
        )


@dataclass(eq=False)
class HeldOutEvaluator:
    """Measures a :class:`trainer.training.model.FlowModel` on the held-out rows (module docstring). Build with
    :meth:`build`; :meth:`evaluate` is read-only on the model and on the training generator."""

    episodes: int
    rows: int
    steps: int
    loss_obs: Tensor
    loss_x1: Tensor
    loss_t: Tensor
    loss_x0: Tensor
    sample_obs: Tensor
    demonstrated: Tensor
    """(S, A) float64 on the CPU: the demonstrated chunks in raw units, decoder layout."""
    sample_x0: Tensor
    """(S·K, A): the fixed start noise, row-major by observation."""
    scale: Tensor
    """(A,) float64: the demonstrated held-out std per dimension (< MIN_STD: 1)."""
    neighbours: Tensor
    """(S, NEIGHBOURS) int64: held-out rows with the nearest observations, each row first."""
    select_obs: Tensor
    """(R·SELECTION_SAMPLES, O): the selection rows' observations, each repeated per sample."""
    select_x0: Tensor
    """(R·SELECTION_SAMPLES, A): the selection's start noise (its own generator)."""
    select_demonstrated: Tensor
    """(R, A) float64 on the CPU: the selection rows' demonstrated chunks in their stds (``select_scale``)."""
    select_scale: Tensor
    select_neighbours: Tensor
    """(R, NEIGHBOURS) int64: selection rows with the nearest observations, each row first."""
    history: list[HeldOutMetrics] = field(default_factory=list)
    last_sampled: Tensor | None = None
    """(S·K, A) float64 on the CPU: the actions sampled by the latest :meth:`evaluate`, raw units."""

    @classmethod
    def build(
        cls,
        model: Any,
        heldout: TrainingData,
        *,
        episodes: int,
        time_distribution: TimeDistribution,
        seed: int,
        steps: int,
        device: torch.device,
    ) -> HeldOutEvaluator:
        """Fix the rows and the draws for ``model`` (a FlowModel built from the training rows) and the
        held-out rows ``heldout``; ``steps``: the game's ODEStepsNum."""
        tensors = model.tensor_data(heldout)
        generator = torch.Generator(device="cpu")
        generator.manual_seed(seed + _DRAW_STREAM)
        n = tensors.row_num
        loss_rows = _subset(n, LOSS_ROWS, generator)
        sample_rows = _subset(n, SAMPLE_ROWS, generator)
        width = int(tensors.x1.shape[1])
        loss_t = time_distribution.sample(loss_rows.numel(), generator, "cpu")
        loss_x0 = torch.randn((loss_rows.numel(), width), generator=generator)
        sample_x0 = torch.randn((sample_rows.numel() * SAMPLES_PER_ROW, width), generator=generator)
        demonstrated, scale = _demonstrated(model, tensors.x1[sample_rows.to(tensors.x1.device)])
        neighbours = _neighbours(tensors.obs[sample_rows.to(tensors.obs.device)])
        on = tensors.obs.device
        # The selection's draws: a generator of their own, seeded by the Seed only (module docstring).
        selecting = torch.Generator(device="cpu")
        selecting.manual_seed(seed + _SELECTION_STREAM)
        select_rows = _subset(n, SELECTION_ROWS, selecting)
        select_x0 = torch.randn((select_rows.numel() * SELECTION_SAMPLES, width), generator=selecting)
        select_raw, select_scale = _demonstrated(model, tensors.x1[select_rows.to(tensors.x1.device)])
        select_obs = tensors.obs[select_rows.to(on)]
        return cls(
            episodes=episodes,
            rows=n,
            steps=steps,
            loss_obs=tensors.obs[loss_rows.to(on)],
            loss_x1=tensors.x1[loss_rows.to(on)],
            loss_t=loss_t.to(device),
            loss_x0=loss_x0.to(device),
            sample_obs=tensors.obs[sample_rows.to(on)].repeat_interleave(SAMPLES_PER_ROW, dim=0),
            demonstrated=demonstrated,
            sample_x0=sample_x0.to(device),
            scale=scale,
            neighbours=neighbours,
            select_obs=select_obs.repeat_interleave(SELECTION_SAMPLES, dim=0),
            select_x0=select_x0.to(device),
            select_demonstrated=select_raw / select_scale,
            select_scale=select_scale,
            select_neighbours=_neighbours(select_obs),
        )

    @torch.no_grad()
    def evaluate(self, model: Any, iteration: int) -> HeldOutMetrics:
        """Measure ``model`` now; appended to :attr:`history` and returned."""
        started = time.perf_counter()
        loss = self._flow_loss(model)
        sampled = model.sample(self.sample_obs, self.sample_x0, self.steps).cpu().double()
        self.last_sampled = sampled
        rows, width = self.demonstrated.shape
        normalised = (sampled / self.scale).reshape(rows, SAMPLES_PER_ROW, width)
        demonstrated = self.demonstrated / self.scale
        w1_raw = wasserstein_1d(self.demonstrated, sampled)
        distance = (normalised - demonstrated[:, None, :]).norm(dim=2) / math.sqrt(width)  # (S, K)
        covered = (distance.min(dim=1).values <= RADIUS).double().mean()
        # precision: sample (i, k) against the demonstrated actions of row i's neighbours
        near = demonstrated[self.neighbours]  # (S, NEIGHBOURS, A)
        to_near = torch.cdist(normalised, near) / math.sqrt(width)  # (S, K, NEIGHBOURS)
        precise = (to_near.min(dim=2).values <= RADIUS).double().mean()
        metrics = HeldOutMetrics(
            iteration=iteration,
            selection=self.select(model),
            flow_loss=loss,
            energy_score=float(energy_score(normalised, demonstrated)),
            # the first sample of each row: as many as demonstrated, and 16x cheaper than all of them
            energy_distance=float(energy_distance(demonstrated, normalised[:, 0, :])),
            w1=float((w1_raw / self.scale).mean()),
            w1_raw=tuple(float(v) for v in w1_raw),
            coverage=float(covered),
            precision=float(precise),
            seconds=time.perf_counter() - started,
        )
        self.history.append(metrics)
        return metrics

    @torch.no_grad()
    def select(self, model: Any) -> Selection:
        """The selection score of ``model`` (module docstring): read-only, not added to :attr:`history`
        (the recipe pilot scores its candidates with it)."""
        k = SELECTION_SAMPLES
        demonstrated = self.select_demonstrated
        rows, width = demonstrated.shape
        sampled = model.sample(self.select_obs, self.select_x0, self.steps).cpu().double()
        normalised = (sampled / self.select_scale).reshape(rows, k, width)
        rms = math.sqrt(width)
        own = (normalised - demonstrated[:, None, :]).norm(dim=2) / rms  # (R, K)
        near = demonstrated[self.select_neighbours]  # (R, NEIGHBOURS, A)
        to_near = (torch.cdist(normalised, near) / rms).min(dim=2).values  # (R, K)
        radii = torch.tensor(SELECTION_RADII, dtype=torch.float64)
        covered = (own.min(dim=1).values[None, :] <= radii[:, None]).double().mean(dim=1)  # (radii,)
        precise = (to_near[None, :, :] <= radii[:, None, None]).double().mean(dim=(1, 2))
        spread = (torch.cdist(normalised, normalised) / rms).sum(dim=(1, 2)) / (k * (k - 1))
        energy_t = (own.mean(dim=1) - 0.5 * spread).mean()
        # one read of every number (a read per number cost the training thread 60 per pilot)
        values = torch.cat((covered, precise, energy_t.reshape(1))).tolist()
        count = len(SELECTION_RADII)
        coverages, precisions, energy = values[:count], values[count : 2 * count], values[-1]
        f1s = [
            2.0 * coverage * precision / (coverage + precision) if coverage + precision > 0 else 0.0
            for coverage, precision in zip(coverages, precisions, strict=True)
        ]
        f1 = sum(f1s) / len(f1s)
        return Selection(
            score=f1 - energy,
            f1=f1,
            energy=energy,
            coverage=sum(coverages) / len(coverages),
            precision=sum(precisions) / len(precisions),
        )

    def _flow_loss(self, model: Any) -> float:
        encoder, denoiser = model.sampling_networks()
        path = model.flow_path(self.loss_x0, self.loss_x1, self.loss_t)
        z = (encoder(self.loss_obs) - model.latent_mean) / model.latent_std
        x = (path.x_t - model.x_mean) / model.x_std
        pred = denoiser(torch.cat((z, x, self.loss_t), dim=1))
        return float(flow_matching_loss(pred, model.standardize_velocity(path.target)))

    def actions_record(self, iteration: int) -> dict[str, Any]:
        """Demonstrated and sampled actions of the latest evaluation, for ``la-trainer report``'s picture
        (``heldout-actions.json`` in the run record): two columns of the chunk (decoder layout), those with
        the largest demonstrated std; with a one-dimensional action, the observation column that
        correlates most with it and the action. Small: at most S + S·K rows of two numbers."""
        demonstrated = self.demonstrated
        sampled = (
            self.last_sampled if self.last_sampled is not None else torch.zeros((0, demonstrated.shape[1]))
        )
        record: dict[str, Any] = {"iteration": iteration, "ode_steps": self.steps}
        if demonstrated.shape[1] >= 2:
            columns = demonstrated.std(dim=0, unbiased=False).topk(2).indices.sort().values.tolist()
            record.update(
                x_label=f"action column {columns[0]}",
                y_label=f"action column {columns[1]}",
                demonstrated=_rounded(demonstrated[:, columns]),
                sampled=_rounded(sampled[:, columns]),
            )
            return record
        obs = self.sample_obs[::SAMPLES_PER_ROW].cpu().double()
        centred = obs - obs.mean(dim=0)
        action = demonstrated[:, 0] - demonstrated[:, 0].mean()
        strength = (centred * action[:, None]).sum(dim=0).abs() / (centred.norm(dim=0) + 1e-12)
        column = int(strength.argmax())
        x = obs[:, column]
        record.update(
            x_label=f"observation column {column}",
            y_label="action",
            demonstrated=_rounded(torch.stack((x, demonstrated[:, 0]), dim=1)),
            sampled=_rounded(torch.stack((x.repeat_interleave(SAMPLES_PER_ROW), sampled[:, 0]), dim=1)),
        )
        return record

    def summary(self) -> Mapping[str, Any]:
        """For the run's log: how much is held out and how it is measured."""
        return {
            "episodes": self.episodes,
            "rows": self.rows,
            "loss_rows": int(self.loss_obs.shape[0]),
            "sample_rows": int(self.demonstrated.shape[0]),
            "samples_per_row": SAMPLES_PER_ROW,
            "selection_rows": int(self.select_demonstrated.shape[0]),
            "selection_samples_per_row": SELECTION_SAMPLES,
            "ode_steps": self.steps,
        }


def _rounded(values: Tensor) -> list[list[float]]:
    """Rows of a (n, 2) tensor as lists of 5-significant-digit floats (a small JSON file)."""
    return [[float(f"{v:.5g}") for v in row] for row in values.tolist()]


def _demonstrated(model: Any, x1: Tensor) -> tuple[Tensor, Tensor]:
    """Demonstrated chunks ``x1`` (decoder-input space) in raw units, float64 on the CPU, and their std
    per dimension (below MIN_STD: 1), the unit every sample-based distance is measured in."""
    raw = x1.cpu().double() * model.decoder_scale.cpu().double() + model.decoder_shift.cpu().double()
    std = raw.std(dim=0, unbiased=False)
    return raw, torch.where(std < MIN_STD, torch.ones_like(std), std)


def _neighbours(obs: Tensor) -> Tensor:
    """(S, min(NEIGHBOURS, S)) int64: for each row of ``obs`` (S, O), the rows with the nearest
    observations (each column standardised), the row itself first."""
    values = obs.cpu().double()
    std = values.std(dim=0, unbiased=False)
    standardised = (values - values.mean(dim=0)) / torch.where(std < MIN_STD, torch.ones_like(std), std)
    distances = torch.cdist(standardised, standardised)
    distances.fill_diagonal_(-1.0)  # each row is its own first neighbour
    return distances.topk(min(NEIGHBOURS, values.shape[0]), dim=1, largest=False).indices


def _subset(n: int, limit: int, generator: torch.Generator) -> Tensor:
    """All ``n`` row indices, or a sorted random ``limit`` of them."""
    if n <= limit:
        return torch.arange(n)
    return torch.randperm(n, generator=generator)[:limit].sort().values
