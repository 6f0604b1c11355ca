"""``shared-memory-<GUID>.json`` (spec §2.6): the GUIDs of the engine's shared-memory regions.

The GUID strings are kept as written; :mod:`protocol.guid` parses them. :func:`check_shared_memory_config`
checks the file against the session's data and model configs.
"""

from __future__ import annotations

from protocol.config.fields import ParseContext, check_unique
from protocol.config.values import ReplayBufferGuids, SessionConfig, SharedMemoryConfig
from protocol.errors import ConfigError
from protocol.json_fields import json_int, json_list, json_object, json_str, require

__all__ = ["check_shared_memory_config", "parse_shared_memory_config", "shared_memory_config_to_json"]

_GUID_FIELDS = ("EpisodeStartsGuid", "EpisodeLengthsGuid", "EpisodeCompletionModesGuid")
_GUID_LIST_FIELDS = (
    ("EpisodeFinalObservationsGuids", "episode_final_observations_guids"),
    ("EpisodeFinalMemoryStatesGuids", "episode_final_memory_states_guids"),
    ("ObservationsGuids", "observations_guids"),
    ("ActionsGuids", "actions_guids"),
    ("ActionModifiersGuids", "action_modifiers_guids"),
    ("MemoryStatesGuids", "memory_states_guids"),
    ("RewardsGuids", "rewards_guids"),
)


def parse_shared_memory_config(
    obj: object, warnings: list[str] | None = None, *, source: str = "shared-memory config"
) -> SharedMemoryConfig:
    """Parse ``shared-memory-<GUID>.json`` (§2.6). GUID strings are kept as written (protocol.guid parses)."""
    ctx = ParseContext(source, warnings if warnings is not None else [])
    node = json_object(obj, "shared-memory config", source=source)
    raw_nets = json_list(require(node, "NetworkGuids", "", source=source), "NetworkGuids", source=source)
    network_guids = []
    for i, item in enumerate(raw_nets):
        p = f"NetworkGuids[{i}]"
        entry = json_object(item, p, source=source)
        nid = json_int(require(entry, "NetworkId", p, source=source), f"{p}.NetworkId", source=source)
        guid = json_str(require(entry, "Guid", p, source=source), f"{p}.Guid", source=source)
        ctx.unknown(entry, ("NetworkId", "Guid"), p)
        network_guids.append((nid, guid))
    check_unique([nid for nid, _ in network_guids], "NetworkGuids", ctx)

    raw_rbs = json_list(require(node, "ReplayBuffers", "", source=source), "ReplayBuffers", source=source)
    replay_buffers = []
    for i, item in enumerate(raw_rbs):
        p = f"ReplayBuffers[{i}]"
        entry = json_object(item, p, source=source)
        starts = json_str(
            require(entry, "EpisodeStartsGuid", p, source=source), f"{p}.EpisodeStartsGuid", source=source
        )
        lengths = json_str(
            require(entry, "EpisodeLengthsGuid", p, source=source), f"{p}.EpisodeLengthsGuid", source=source
        )
        completions = ""
        if "EpisodeCompletionModesGuid" in entry:
            completions = json_str(
                entry["EpisodeCompletionModesGuid"], f"{p}.EpisodeCompletionModesGuid", source=source
            )
        else:
            ctx.missing(f"{p}.EpisodeCompletionModesGuid", "")
        lists: dict[str, tuple[str, ...]] = {}
        for key, attr in _GUID_LIST_FIELDS:
            if key in entry:
                raw = json_list(entry[key], f"{p}.{key}", source=source)
                lists[attr] = tuple(json_str(g, f"{p}.{key}[{k}]", source=source) for k, g in enumerate(raw))
            else:
                ctx.missing(f"{p}.{key}", [])
                lists[attr] = ()
        ctx.unknown(entry, (*_GUID_FIELDS, *(k for k, _ in _GUID_LIST_FIELDS)), p)
        replay_buffers.append(ReplayBufferGuids(starts, lengths, completions, **lists))
    ctx.unknown(node, ("NetworkGuids", "ReplayBuffers"), "")
    return SharedMemoryConfig(tuple(network_guids), tuple(replay_buffers))


def shared_memory_config_to_json(cfg: SharedMemoryConfig) -> dict[str, object]:
    """``shared-memory-<GUID>.json`` as the engine writes it (§2.6)."""
    return {
        "NetworkGuids": [{"NetworkId": nid, "Guid": guid} for nid, guid in cfg.network_guids],
        "ReplayBuffers": [
            {
                "EpisodeStartsGuid": rb.episode_starts_guid,
                "EpisodeLengthsGuid": rb.episode_lengths_guid,
                "EpisodeCompletionModesGuid": rb.episode_completion_modes_guid,
                **{key: list(getattr(rb, attr)) for key, attr in _GUID_LIST_FIELDS},
            }
            for rb in cfg.replay_buffers
        ],
    }


def check_shared_memory_config(session: SessionConfig, shm: SharedMemoryConfig) -> None:
    """Check that ``shm`` names a region for every network and every allocated replay-buffer stream.

    The replay buffer with Id ``i`` uses ``shm.replay_buffers[i]`` (array index = id, §2.6).
    """
    for net in session.model.networks:
        shm.network_guid(net.id)
    for rb in session.data.replay_buffers:
        p = f"ReplayBuffers[{rb.id}]"
        if rb.id >= len(shm.replay_buffers):
            raise ConfigError(
                f"shared-memory config has no entry {p} for replay buffer {rb.id}",
                field=p,
                expected=rb.id + 1,
                actual=len(shm.replay_buffers),
            )
        guids = shm.replay_buffers[rb.id]
        expected = {
            "EpisodeFinalObservationsGuids": len(rb.observations) if rb.has_final_observations else None,
            "EpisodeFinalMemoryStatesGuids": len(rb.memory_states) if rb.has_final_memory_states else None,
            "ObservationsGuids": len(rb.observations),
            "ActionsGuids": len(rb.actions),
            "ActionModifiersGuids": len(rb.action_modifiers),
            "MemoryStatesGuids": len(rb.memory_states),
            "RewardsGuids": len(rb.rewards),
        }
        for key, attr in _GUID_LIST_FIELDS:
            want = expected[key]
            have = len(getattr(guids, attr))
            # Unflagged final-state lists are empty in 5.8 (§10 item 10); any count is harmless there.
            if want is not None and have != want:
                raise ConfigError(
                    f"shared-memory config {p}.{key} has {have} GUIDs but the data config has {want} streams",
                    field=f"{p}.{key}",
                    expected=want,
                    actual=have,
                )
