"""Where a shared-memory replay buffer is copied to, made ready while the trainer waits for it.

The trainer must copy the posted rows out of the engine's regions (spec §2.4, "copy them out"). Into
freshly allocated memory that copy runs at page-fault speed, not memory speed: every 4 KiB page of
the destination is faulted in and zeroed by the kernel during the copy, and every page of our mapping
of the source is faulted in on first read (measured on the 2-core CI VM: 0.35–3 GB/s against ~11 GB/s
for a copy between pages already mapped; ``benchmarks/results/bench.txt``).

The sizes are known before the buffer arrives: the data config gives MaxEpisodeNum and MaxStepNum and
the engine always sends a full buffer (MaxStepNum = total steps, spec §4.2). So :class:`ReplayStaging`
allocates the destination at capacity when the regions are mapped and, a slice per poll of the wait
loop, touches one byte per page of every source region (read) and every destination (write). When the
engine posts, the copy runs between mapped pages; what the wait did not reach yet is faulted during the
copy as before, so a buffer that arrives early costs what it did without staging.

Memory: the destination is what the copy would allocate anyway (capacity = the sent rows for the
engine's buffers). If a peer sends fewer rows than its capacity, the arrays returned are views of the
first rows of capacity-sized memory: the remainder stays allocated (and untouched pages of it cost no
RSS) for as long as the buffer is held. [INF: the spec says the buffer is always full, §4.2.]
"""

from __future__ import annotations

import mmap
from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

from protocol.replay import ReplayBuffer, ReplayLayout

__all__ = ["PREFAULT_SLICE_BYTES", "ReplayStaging"]

PREFAULT_SLICE_BYTES = 16 << 20
"""Bytes of regions touched per poll of the wait: ~2–15 ms of page faults on the CI VM, so a posted
buffer is noticed at most about that late (its copy takes ~100 ms per GiB)."""

_PAGE = mmap.PAGESIZE


class ReplayStaging:
    """Capacity-sized destinations for one replay buffer's regions, pre-faulted a slice at a time.

    Args:
        layout: the buffer's layout (from the data config).
        sources: the mapped shared-memory regions, by region name (:meth:`ReplayLayout.regions`).
    """

    def __init__(self, layout: ReplayLayout, sources: Mapping[str, memoryview]) -> None:
        self.layout = layout
        self._sources: dict[str, NDArray[np.uint8]] = {}
        self._destinations: dict[str, NDArray[np.uint8]] = {}
        for spec in layout.regions():
            self._sources[spec.name] = np.frombuffer(sources[spec.name], dtype=np.uint8, count=spec.nbytes)
            # np.empty maps pages lazily: nothing is resident until touched.
            self._destinations[spec.name] = np.empty(spec.nbytes, dtype=np.uint8)
        # The work list: (array, write?) per region, destinations first: a source page the engine has
        # already written is mapped ~30× faster than a fresh destination page is faulted and zeroed,
        # and reading a source page before the engine writes it would allocate it for the engine.
        self._todo: list[tuple[NDArray[np.uint8], bool]] = [(a, True) for a in self._destinations.values()]
        self._todo += [(a, False) for a in self._sources.values()]
        self._index = 0
        self._offset = 0

    @property
    def done(self) -> bool:
        """True once every page of every source and destination has been touched."""
        return self._index >= len(self._todo)

    def advance(self, budget: int = PREFAULT_SLICE_BYTES) -> None:
        """Touch up to ``budget`` bytes' worth of pages (one byte per page), continuing where the last
        call stopped. Cheap to call when :attr:`done`."""
        while budget > 0 and not self.done:
            array, write = self._todo[self._index]
            end = min(self._offset + budget, array.size)
            pages = array[self._offset : end : _PAGE]
            if write:
                pages[...] = 0  # a write fault: the kernel maps (and zeroes) a private page
            else:
                pages.max(initial=0)  # a read fault maps the shared page; the value is not needed
            budget -= end - self._offset
            self._offset = end
            if self._offset >= array.size:
                self._index += 1
                self._offset = 0

    def copy_out(self, episode_num: int, step_num: int, replay_buffer_id: int) -> ReplayBuffer:
        """Copy the posted first E / S rows of every region into the staged memory and decode them.

        The caller has validated the regions (:meth:`ReplayLayout.read_regions` on the sources). The
        arrays returned own this memory (views that keep it alive); the staging must not be reused.
        """
        used = self.layout.region_bytes(episode_num, step_num)
        for name, nbytes in used.items():
            np.copyto(self._destinations[name][:nbytes], self._sources[name][:nbytes])
        staged = {name: dest.data for name, dest in self._destinations.items()}
        copied = self.layout.read_regions(staged, episode_num, step_num, replay_buffer_id)
        self._sources.clear()  # no views into shared memory outlive the copy (the engine may reuse it)
        self._destinations.clear()
        self._todo.clear()
        return copied
