"""How torch's OpenMP threads wait between parallel regions, set before torch loads.

Why: a thread of an OpenMP team that finishes its part of a parallel region spins, burning its core,
before it sleeps, so that the next region starts without a wake-up. GNU OpenMP (libgomp, which torch's
Linux wheels bundle and MKL's threading layer shares) spins 300,000 times by default. On a machine
whose cores are shared with a busy process (the Unreal editor running the game beside the trainer
it spawned), a spinning thread keeps the core from the thread that has work, and every region then
waits for a descheduled team member: measured 26x slower beside one CPU-bound process (issue 28).

The remedy that matters is the thread count (:mod:`trainer.training.threads` measures it during the run and
keeps the fastest); a shorter spin limits the damage in the moments before the count adapts and in
processes whose threads share cores with each other (torchrun ranks on one node). The spin is bounded,
not removed: a passive wait (``OMP_WAIT_POLICY=PASSIVE``, every wait a futex sleep) costs half the
idle throughput of a two-thread step here, while :data:`GOMP_SPIN_COUNT` spins cost none that the
busy-machine benchmark can see (``python -m benchmarks.busy_machine``, raw rows in
``benchmarks/results/busy-machine.jsonl``).

numpy's OpenBLAS (the demo's and ``record``'s evaluation through the engine's inference path, in the
same processes) has a thread pool of its own that spins as well: its rollouts took 161 ms a call beside
one busy process on 2 cores against 18 idle, and 23 with one BLAS thread (22 idle). Its count is set to
one (:data:`OPENBLAS_THREADS`): numpy does no large products on the trainer's path, where torch does the
work.

Only libgomp's spin is tuned. Windows (Intel OpenMP) and macOS (LLVM OpenMP) wheels read ``KMP_BLOCKTIME``,
whose units and accepted values differ between their versions and which no machine here runs; there
the thread count alone adapts. A user's own OpenMP settings always win: nothing is set when any of the
variables below is already in the environment.

Torch-free on purpose: :mod:`trainer` calls :func:`set_openmp_wait_defaults` in its ``__init__``, the
first of our modules that every process we start imports (the console script, ``python -m trainer``,
the engine's ``train.py`` drop-in, torchrun ranks, which also inherit the variable), before any module
imports torch.
"""

from __future__ import annotations

from collections.abc import MutableMapping

__all__ = [
    "GOMP_SPIN_COUNT",
    "OPENBLAS_THREADS",
    "USER_BLAS_THREAD_VARIABLES",
    "USER_OPENMP_WAIT_VARIABLES",
    "set_openmp_wait_defaults",
]

GOMP_SPIN_COUNT = "30000"
"""Spins of an idle libgomp thread before it sleeps (libgomp's default without ``OMP_WAIT_POLICY``:
300,000). At about a nanosecond a spin this bridges the gaps between the regions of one training step
(tens of microseconds) but not a descheduling (milliseconds)."""

USER_OPENMP_WAIT_VARIABLES = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "KMP_BLOCKTIME", "KMP_LIBRARY")
"""Any of these in the environment means the user chose how OpenMP waits: we leave it alone."""
OPENBLAS_THREADS = "1"
"""numpy's OpenBLAS threads (``OPENBLAS_NUM_THREADS``)."""
USER_BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
"""Any of these means the user chose OpenBLAS's thread count (it reads all three, in this order)."""


def set_openmp_wait_defaults(environ: MutableMapping[str, str]) -> bool:
    """Set :data:`GOMP_SPIN_COUNT` in ``environ`` unless the user chose an OpenMP wait already, and
    :data:`OPENBLAS_THREADS` unless the user chose a BLAS thread count. Returns whether it set anything.
    (Where torch or numpy is loaded already, its runtime has read the environment; the processes this
    one starts still inherit the setting.)"""
    changed = False
    if not any(environ.get(name, "").strip() for name in USER_OPENMP_WAIT_VARIABLES):
        environ["GOMP_SPINCOUNT"] = GOMP_SPIN_COUNT
        changed = True
    if not any(environ.get(name, "").strip() for name in USER_BLAS_THREAD_VARIABLES):
        environ["OPENBLAS_NUM_THREADS"] = OPENBLAS_THREADS
        changed = True
    return changed
