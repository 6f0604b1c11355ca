"""The fused step replayed as one CUDA graph: a whole step for one launch.

On a GPU the eager fused step (:mod:`trainer.training.steps.fused`) is launch-bound, not compute-bound:
about 45 kernels per step at some microseconds of host time each, against about 33 MFLOP of arithmetic at
the engine's default network (1 x 128, batch 256). A CUDA graph records the device half of one step
(:meth:`FusedStep.device_step`: the draws, forward, backward, the finiteness check, AdamW, the EMA and the
smoothed loss) once, and each later step is one ``replay``: the host work per step is then the host
half (:meth:`FusedStep.prepare`: a few counters) and one call.

What makes the device half capturable, all of it in the fused step itself:

* **No host read**: the finiteness check, the skip of a bad step and the loss smoothing happen on the
  device (:class:`~trainer.training.steps.base.DeferredStep`).
* **Numbers that change between steps live in device tensors** (``device_state``): each parameter
  group's learning rate and the EMA's ``1 - decay``, written in place by the host half when they
  change; everything else a step reads (statistics, the noise scale) is fixed for the run.
* **The job's generator is registered with the graph** (:func:`trainer.system.torch_compat.
  register_generator`), so each replay draws the next numbers of the run's seeded stream (its Philox
  offset advances by the graph's draws), not the same numbers again.
* **Static buffers**: the fused step preallocates every batch-sized tensor, and what it allocates inside
  a step (a norm, the time draw of a non-uniform density) comes from the graph's private pool.

Capture needs warm-up: the first :data:`WARMUP_STEPS` steps run eagerly on a side stream (real steps of
the run), then one capture (which runs nothing), then a replay per step. Where capture fails (an
operation that cannot be captured, a torch without generator registration, a driver refusing it), the
step continues eagerly with one log line; the steps it took are the run's either way.

Measured: the CPU cannot run this; ``benchmarks/gpu_check.py`` measures it on a GPU (graph against
eager, bit for bit, and iterations/s) and writes its raw rows to ``benchmarks/results/``.
"""

from __future__ import annotations

import torch

from trainer.system.console import log
from trainer.system.torch_compat import register_generator
from trainer.training.steps.base import StepMetrics
from trainer.training.steps.fused import FusedStep

__all__ = ["WARMUP_STEPS", "GraphedStep", "graph_unavailable"]

WARMUP_STEPS = 3
"""Eager steps on a side stream before the capture (cuBLAS handles, workspaces, the allocator's blocks
and lazily initialised kernels exist before the graph records them)."""


def graph_unavailable(device: torch.device) -> str | None:
    """Why this device cannot replay a CUDA graph, or None."""
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device, not {device.type!r}"
    if not torch.cuda.is_available():
        return "CUDA is not available"
    return None


class GraphedStep:
    """A :class:`FusedStep` built with ``device_state`` whose device half is replayed as a CUDA graph
    (module docstring); a :class:`~trainer.training.steps.base.DeferredStep` like the step it wraps,
    reading and reporting through it.

    ``warmup``: eager steps before the capture."""

    def __init__(self, fused: FusedStep, warmup: int = WARMUP_STEPS) -> None:
        if not fused.device_state:
            raise ValueError("the graphed step needs a fused step built with device_state=True")
        self.fused = fused
        self.warmup = warmup
        self.graph: torch.cuda.CUDAGraph | None = None
        self.eager = False
        """Capture failed (or was refused): every step runs eagerly from now on."""
        self._stream: torch.cuda.Stream | None = None
        self._eager_steps = 0

    @property
    def captured(self) -> bool:
        """Whether the steps now replay a graph."""
        return self.graph is not None

    def step(self, iteration: int = 0) -> StepMetrics:
        self.launch(iteration)
        return self.read()

    @torch.no_grad()
    def launch(self, iteration: int) -> None:
        fused = self.fused
        fused.prepare(iteration)
        if self.graph is not None:
            self.graph.replay()
            return
        if self.eager or self._eager_steps < self.warmup:
            self._eager(fused)
            return
        self._capture(fused)
        if self.graph is not None:
            self.graph.replay()
        else:
            self._eager(fused)

    def _eager(self, fused: FusedStep) -> None:
        if self.eager:
            fused.device_step()
            return
        # Warm-up on a side stream, as torch's CUDA graph notes ask (the capture stream's allocations
        # and handles then exist), ordered after and before the current stream's work.
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=fused.device)  # type: ignore[no-untyped-call]
        current = torch.cuda.current_stream(fused.device)
        self._stream.wait_stream(current)
        with torch.cuda.stream(self._stream):
            fused.device_step()
        current.wait_stream(self._stream)
        self._eager_steps += 1

    def _capture(self, fused: FusedStep) -> None:
        """Record one device half; on any failure go eager for good, with one log line."""
        generator = fused.generator
        state = generator.get_state()
        graph = torch.cuda.CUDAGraph()
        try:
            why = register_generator(graph, generator)
            if why is not None:
                raise RuntimeError(why)
            torch.cuda.synchronize(fused.device)
            # thread_local: the sender's and the held-out thread's own CUDA calls (their streams are not
            # the capture's) must not invalidate it, nor be refused while it runs.
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                fused.device_step()
        except Exception as error:  # capture raises many types (cudaErrorStreamCapture*, RuntimeError)
            self.eager = True
            try:
                generator.set_state(state)  # a failed capture may have moved its offset
            except RuntimeError:
                pass
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            log(
                f"la-trainer: note: the training step runs eagerly on CUDA (graph capture failed: {first[:200]})"
            )
            return
        self.graph = graph
        log("la-trainer: the training step replays as one CUDA graph")

    def smooth_from(self, value: float) -> None:
        self.fused.smooth_from(value)

    def read(self) -> StepMetrics:
        return self.fused.read()

    def probe(self) -> torch.Tensor:
        return self.fused.probe()

    @property
    def smoothed_loss(self) -> float:
        return self.fused.smoothed_loss
