"""A counting seam for host reads of tensor values: every call that makes the host wait for a device's
numbers on a GPU (``Tensor.item``, ``tolist``, ``__float__``, ``__int__``, ``__bool__``, ``numpy``,
``cpu`` and ``torch.cuda.synchronize``), counted per thread while the seam is open.

On a CPU none of these waits for anything, but each is where a CUDA run would: counting them on the CPU
is how a test here pins a loop that a GPU runs without a sync per iteration (issue 32).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["READS", "HostReads", "count_host_reads"]

READS = ("item", "tolist", "__float__", "__int__", "__bool__", "numpy", "cpu")
"""The ``torch.Tensor`` methods counted (plus ``torch.cuda.synchronize``)."""


class HostReads:
    """Counts by thread name and by what was called; :meth:`on` the calling thread's total."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_thread: Counter[str] = Counter()
        self.by_call: Counter[tuple[str, str]] = Counter()

    def note(self, what: str) -> None:
        name = threading.current_thread().name
        with self._lock:
            self.by_thread[name] += 1
            self.by_call[(name, what)] += 1

    def on(self, thread: str) -> int:
        with self._lock:
            return self.by_thread[thread]

    def total(self) -> int:
        with self._lock:
            return sum(self.by_thread.values())


@contextmanager
def count_host_reads() -> Iterator[HostReads]:
    """Count host reads (module docstring) until the block ends; the originals are put back after."""
    reads = HostReads()
    originals: dict[str, Callable[..., Any]] = {name: getattr(torch.Tensor, name) for name in READS}

    def wrap(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def counted(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            reads.note(name)
            return original(self, *args, **kwargs)

        return counted

    synchronize = torch.cuda.synchronize

    def counted_synchronize(*args: Any, **kwargs: Any) -> None:
        reads.note("cuda.synchronize")
        synchronize(*args, **kwargs)

    try:
        for name, original in originals.items():
            setattr(torch.Tensor, name, wrap(name, original))
        torch.cuda.synchronize = counted_synchronize
        yield reads
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
        torch.cuda.synchronize = synchronize
