"""ReplayStaging: the shared-memory copy-out target, pre-faulted while the trainer waits."""

from __future__ import annotations

import mmap
import struct

import numpy as np
import pytest

from protocol.errors import ReplayError
from protocol.replay import ReplayBuffer, ReplayLayout
from tests.support.replay import (
    FM_BUFFER,
    FM_LAYOUT,
    FULL_BUFFER,
    FULL_LAYOUT,
    assert_same,
    fill_regions,
)
from trainer.session.transport.staging import ReplayStaging


def _staging(layout: ReplayLayout, rb: ReplayBuffer) -> tuple[ReplayStaging, dict[str, bytearray]]:
    regions = fill_regions(layout, rb)
    return ReplayStaging(layout, {name: memoryview(buf) for name, buf in regions.items()}), regions


@pytest.mark.parametrize("prefault", ["none", "partial", "all"])
@pytest.mark.parametrize(("layout", "rb"), [(FM_LAYOUT, FM_BUFFER), (FULL_LAYOUT, FULL_BUFFER)])
def test_copy_out_equals_the_posted_rows(layout: ReplayLayout, rb: ReplayBuffer, prefault: str) -> None:
    staging, regions = _staging(layout, rb)
    if prefault == "partial":
        staging.advance(5)
    elif prefault == "all":
        while not staging.done:
            staging.advance(7)
    got = staging.copy_out(rb.episode_num, rb.step_num, rb.replay_buffer_id)
    assert_same(got, rb)
    # A copy, not a view: the engine reusing its regions does not change what we hold.
    for buf in regions.values():
        buf[:] = bytes(len(buf))
    assert_same(got, rb)
    assert got.observations[0].flags.writeable and got.observations[0].flags.c_contiguous


def test_fewer_rows_than_capacity_are_views_of_the_first_rows() -> None:
    staging, regions = _staging(FM_LAYOUT, FM_BUFFER)  # capacity 3 episodes, 5 steps; 2 / 3 posted
    struct.pack_into("<f", regions["Observations[0]"], 3 * 8, 99.0)  # row 4: past the posted rows
    got = staging.copy_out(2, 3, 0)
    assert got.observations[0].shape == (3, 2) and got.episode_starts.shape == (2,)
    assert_same(got, FM_BUFFER)


def test_advance_spends_its_byte_budget_across_regions_then_is_done() -> None:
    layout = ReplayLayout(
        0, max_episode_num=1, max_step_num=3 * mmap.PAGESIZE // 4, observation_dims=(1,), action_dims=(1,)
    )
    rb = ReplayBuffer(
        replay_buffer_id=0,
        episode_starts=np.array([0], np.int32),
        episode_lengths=np.array([layout.max_step_num], np.int32),
        observations=(np.arange(layout.max_step_num, dtype=np.float32)[:, None],),
        actions=(-np.arange(layout.max_step_num, dtype=np.float32)[:, None],),
    )
    staging, _ = _staging(layout, rb)
    total = 2 * sum(r.nbytes for r in layout.regions())  # each region: destination and source
    calls = 0
    while not staging.done:
        staging.advance(mmap.PAGESIZE)
        calls += 1
        assert calls <= total, "advance does not make progress"
    # The budget is bytes of regions, carried across region boundaries: ceil(total / budget) calls.
    assert calls == -(-total // mmap.PAGESIZE) == 13
    staging.advance()  # harmless once done
    assert_same(staging.copy_out(1, layout.max_step_num, 0), rb)


def test_copy_out_checks_counts_and_id() -> None:
    staging, _ = _staging(FM_LAYOUT, FM_BUFFER)
    with pytest.raises(ReplayError):
        staging.copy_out(2, 6, 0)  # MaxStepNum + 1
    staging, _ = _staging(FM_LAYOUT, FM_BUFFER)
    with pytest.raises(ReplayError):
        staging.copy_out(2, 3, 1)
