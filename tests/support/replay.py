"""Shared test builders."""

from __future__ import annotations

import numpy as np

from protocol.replay import (
    ReplayBuffer,
    ReplayLayout,
)


def f32(rows: list[list[float]]) -> np.ndarray:
    return np.array(rows, dtype=np.float32)


def i32(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.int32)


# The flow-matching shape: one observation stream (2 floats), one action stream (1 float), nothing else.
FM_LAYOUT = ReplayLayout(0, max_episode_num=3, max_step_num=5, observation_dims=(2,), action_dims=(1,))


FM_BUFFER = ReplayBuffer(
    replay_buffer_id=0,
    episode_starts=i32([0, 2]),
    episode_lengths=i32([2, 1]),
    observations=(f32([[1, 2], [3, 4], [5, 6]]),),
    actions=(f32([[0.5], [-1], [2]]),),
)


# Every optional section: completions (uint8, so later floats are unaligned), final observations and memory
# states, modifiers, memory states and rewards, in §3 order.
FULL_LAYOUT = ReplayLayout(
    7,
    max_episode_num=2,
    max_step_num=2,
    has_completions=True,
    has_final_observations=True,
    has_final_memory_states=True,
    observation_dims=(2,),
    action_dims=(1,),
    action_modifier_dims=(3,),
    memory_state_dims=(1,),
    reward_dims=(1,),
)


FULL_BUFFER = ReplayBuffer(
    replay_buffer_id=7,
    episode_starts=i32([0]),
    episode_lengths=i32([2]),
    observations=(f32([[1, 2], [3, 4]]),),
    actions=(f32([[5], [6]]),),
    completion_modes=np.array([2], dtype=np.uint8),
    final_observations=(f32([[7, 8]]),),
    final_memory_states=(f32([[9]]),),
    action_modifiers=(f32([[10, 11, 12], [13, 14, 15]]),),
    memory_states=(f32([[16], [17]]),),
    rewards=(f32([[18], [19]]),),
)


def assert_same(a: ReplayBuffer, b: ReplayBuffer) -> None:
    assert a.replay_buffer_id == b.replay_buffer_id
    names = ("episode_starts", "episode_lengths")
    for name in names:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), strict=True)
    if a.completion_modes is None or b.completion_modes is None:
        assert a.completion_modes is None and b.completion_modes is None
    else:
        np.testing.assert_array_equal(a.completion_modes, b.completion_modes, strict=True)
    assert [n for n, _ in a.float_streams()] == [n for n, _ in b.float_streams()]
    for (_, x), (_, y) in zip(a.float_streams(), b.float_streams(), strict=True):
        np.testing.assert_array_equal(x, y, strict=True)


def fill_regions(layout: ReplayLayout, rb: ReplayBuffer) -> dict[str, bytearray]:
    """Regions sized for the maxima (plus page-rounding slack) holding rb in their first rows."""
    views = {r.name: bytearray(r.nbytes + 100) for r in layout.regions()}
    arrays = {
        "EpisodeStarts": rb.episode_starts,
        "EpisodeLengths": rb.episode_lengths,
        "EpisodeCompletionModes": rb.completion_modes,
        **dict(rb.float_streams()),
    }
    for name, arr in arrays.items():
        if arr is None:
            continue
        raw = np.ascontiguousarray(arr).tobytes()
        views[name][: len(raw)] = raw
    return views
