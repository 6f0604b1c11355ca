"""Resumable checkpoints: the training state after iteration N, written so that a crash never loses it.

A checkpoint is what ``la-trainer --resume`` (ML-Agents' ``--resume``) needs to continue a run exactly
where it stopped: the model's tensors (live and EMA weights, normalisation buffers), the optimiser state,
the random generator, the iteration and the smoothed loss, plus a :class:`Fingerprint` of the networks,
config and data it belongs to.

File format (one file, ``torch.load(path, weights_only=True)`` reads it; nothing is ever unpickled with
the full unpickler)::

    {"format": "la-trainer-checkpoint", "version": 1,
     "sha256": "<hex digest of payload>", "payload_bytes": <int>,
     "payload": uint8 tensor}            # itself a torch.save of the state dict below

    payload = {"iteration": int, "smoothed_loss": float, "model": {name: tensor},
               "optimizer": optimizer.state_dict(), "generator": uint8 tensor,
               "generator_device": "cpu" | "cuda", "fingerprint": {key: str},
               "trainer_version": str, "saved_at": float (Unix seconds),
               "recipe": str (trainer.training.recipes; absent in older checkpoints: "")}

The checksum is embedded (not a sidecar) so one rename publishes data and checksum together.

Writing (:func:`save_checkpoint`, through :func:`trainer.system.atomic.atomic_file`): temp file in the
same folder, fsync, then the current checkpoint is renamed to ``la-trainer-checkpoint.prev.pt`` and the
temp file to ``la-trainer-checkpoint.pt``, then the folder is fsynced. At every instant at least one
complete, checksummed checkpoint exists (the old current one, then the previous one, then the new one),
so dying mid-write costs at most the newest state.
Reading (:func:`load_latest`) tries the current file, then the previous one, and says why it skipped one.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from protocol.config import SessionConfig
from protocol.names import network_label
from protocol.nne.codec import structure_key
from protocol.nne.layers import Layer
from protocol.nne.layout import children
from protocol.replay import ReplayBuffer
from protocol.schema import schema_to_json
from protocol.snapshot import Snapshot
from trainer.errors import ResumeRefused, TrainerError
from trainer.system.atomic import atomic_file, stale_temp_files

__all__ = [
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_NAME",
    "CHECKPOINT_VERSION",
    "MAX_CHECKPOINT_BYTES",
    "PREVIOUS_CHECKPOINT_NAME",
    "CheckpointError",
    "Fingerprint",
    "TrainingState",
    "checkpoint_paths",
    "load_checkpoint",
    "load_for_resume",
    "load_latest",
    "remove_stale_temp_files",
    "save_checkpoint",
    "sibling_checkpoint_folders",
]

CHECKPOINT_NAME = "la-trainer-checkpoint.pt"
"""The newest checkpoint in a run's folder (``<task_dir>/Snapshots``)."""
PREVIOUS_CHECKPOINT_NAME = "la-trainer-checkpoint.prev.pt"
"""The one before it, kept so that a crash while the newest is written still leaves one to resume."""
CHECKPOINT_FORMAT = "la-trainer-checkpoint"
CHECKPOINT_VERSION = 1
MAX_CHECKPOINT_BYTES = 64 * 1024**3
"""Largest checkpoint file read (bytes). A flow-matching model and its AdamW state are megabytes; the
bound only stops a corrupt or foreign file from being read into memory whole."""

_STRUCTURE_TEXT_LIMIT = 4000
"""Characters of a network's structure kept in the fingerprint (a deep encoder can be long; beyond the
limit a digest of the full text is appended so a difference is still detected)."""


class CheckpointError(TrainerError):
    """A checkpoint file is missing, truncated, corrupt, foreign or of another format version.

    Only raised for one file; :func:`load_latest` turns it into a fallback or a :class:`ResumeRefused`.
    """

    exit_code = ResumeRefused.exit_code


# ---------------------------------------------------------------------------------------------------------
# Fingerprint


def _structure_text(layer: Layer) -> str:
    """Types and widths of a layer tree, no weights: ``Sequence(35->2)[Linear(35->32), ELU(32->32), ...]``."""
    subs = children(layer)
    head = f"{type(layer).__name__}({layer.input_size}->{layer.output_size})"
    if not subs:
        return head
    return head + "[" + ", ".join(_structure_text(sub) for sub in subs) + "]"


def _flatten(prefix: str, value: object, out: dict[str, str]) -> None:
    """JSON-like ``value`` as ``path -> text`` entries, so a diff names the exact key that changed."""
    if isinstance(value, Mapping):
        for key in sorted(value):
            _flatten(f"{prefix}.{key}", value[key], out)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _flatten(f"{prefix}[{index}]", item, out)
        if not value:
            out[prefix] = "[]"
    else:
        out[prefix] = json.dumps(value)


def _data_digest(replay: ReplayBuffer) -> str:
    """sha256 over the episode table and the float streams (what the normalisation statistics and the
    training rows are computed from)."""
    digest = hashlib.sha256()
    arrays: list[np.ndarray] = [replay.episode_starts, replay.episode_lengths]
    arrays += list(replay.observations) + list(replay.actions)
    for array in arrays:
        contiguous = np.ascontiguousarray(array)
        digest.update(str((contiguous.dtype.str, contiguous.shape)).encode())
        digest.update(contiguous.reshape(-1).view(np.uint8).data)
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """What a checkpoint's state is only valid for, as ``key -> text`` pairs (sorted by key).

    Included: the three networks' snapshot headers and layer structure (not their weights: the engine may
    send back our own trained weights on a restart), the training-relevant config keys (method,
    FlowMatchingSettings, EmbedNormalizationsInWeights, NormalizeLatents, both schemas, the replay
    buffer's dimensions) and the replay data itself (a digest: the normalisation statistics baked into the
    model's buffers come from it), and the one option that changes the state's layout (``ema_decay``).
    Left out on purpose: LearningRate, WeightDecay, BatchSize, IterationNum, Seed, snapshot cadence and
    Device, which a user may change between a crash and its resume.
    """

    entries: tuple[tuple[str, str], ...]

    @classmethod
    def of(
        cls,
        config: SessionConfig,
        received: Mapping[int, Snapshot],
        replay: ReplayBuffer,
        *,
        ema_decay: float,
    ) -> Fingerprint:
        out: dict[str, str] = {}
        training = config.trainer.training
        fm = config.model.flow_matching
        out["TrainerMethod"] = json.dumps(config.trainer.trainer_method)
        out["EmbedNormalizationsInWeights"] = json.dumps(config.trainer.embed_normalizations_in_weights)
        out["NormalizeLatents"] = json.dumps(training.normalize_latents)
        out["FlowMatchingSettings.ActionChunkSize"] = json.dumps(fm.action_chunk_size)
        out["FlowMatchingSettings.HiddenLayerNum"] = json.dumps(fm.hidden_layer_num)
        out["FlowMatchingSettings.HiddenLayerSize"] = json.dumps(fm.hidden_layer_size)
        out["FlowMatchingSettings.ActivationFunction"] = json.dumps(fm.activation_function)
        out["option ema_decay"] = json.dumps(float(ema_decay))
        _flatten("observation schema", schema_to_json(config.observation_schema.schema), out)
        _flatten("action schema", schema_to_json(config.action_schema.schema), out)
        out["replay buffer.observation dims"] = json.dumps([int(a.shape[1]) for a in replay.observations])
        out["replay buffer.action dims"] = json.dumps([int(a.shape[1]) for a in replay.actions])
        out["replay buffer.EpisodeNum"] = json.dumps(int(replay.episode_num))
        out["replay buffer.StepNum"] = json.dumps(int(replay.step_num))
        out["replay buffer.data sha256"] = _data_digest(replay)
        for nid in sorted(received):
            snapshot = received[nid]
            name = network_label(nid)
            header = snapshot.header
            out[f"{name}.InputSize"] = str(header.input_size)
            out[f"{name}.OutputSize"] = str(header.output_size)
            out[f"{name}.CompatibilityHash"] = str(header.compatibility_hash)
            out[f"{name}.FileDataSize"] = str(header.file_data_size)
            text = _structure_text(snapshot.model)
            if len(text) > _STRUCTURE_TEXT_LIMIT:
                text = (
                    text[:_STRUCTURE_TEXT_LIMIT] + f"... (sha256 {hashlib.sha256(text.encode()).hexdigest()})"
                )
            out[f"{name}.structure"] = text
            # Every integer of the layout (offsets, counts, sizes the text above leaves out), exactly.
            out[f"{name}.layout sha256"] = hashlib.sha256(
                repr(structure_key(snapshot.model)).encode()
            ).hexdigest()
        return cls(tuple(sorted(out.items())))

    @classmethod
    def from_dict(cls, raw: object) -> Fingerprint:
        """From a checkpoint's ``fingerprint`` entry; raises :class:`CheckpointError` if it is not str→str."""
        if not isinstance(raw, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
        ):
            raise CheckpointError("the checkpoint's fingerprint is not a map of strings")
        return cls(tuple(sorted(raw.items())))

    def as_dict(self) -> dict[str, str]:
        return dict(self.entries)

    def differences(self, current: Fingerprint) -> list[str]:
        """One readable line per key whose value differs (``self`` is the checkpoint's side)."""
        saved, now = self.as_dict(), current.as_dict()
        lines = []
        for key in sorted(saved.keys() | now.keys()):
            old, new = saved.get(key, "(absent)"), now.get(key, "(absent)")
            if old != new:
                lines.append(f"  {key}: checkpoint {_clip(old, new)}, now {_clip(new, old)}")
        return lines


def _clip(text: str, other: str, width: int = 160) -> str:
    """``text`` around its first difference from ``other`` (long structure strings stay readable)."""
    if len(text) <= width:
        return text
    first = next(
        (i for i, (a, b) in enumerate(zip(text, other, strict=False)) if a != b), min(len(text), len(other))
    )
    start = max(0, first - width // 2)
    return (
        ("..." if start else "") + text[start : start + width] + ("..." if start + width < len(text) else "")
    )


# ---------------------------------------------------------------------------------------------------------
# State


@dataclass(frozen=True, eq=False)
class TrainingState:
    """Everything a resumed run restores. Tensors are on the CPU after loading.

    ``iteration``: optimisation steps done (the resumed loop starts there). ``model``: the FlowModel's
    state_dict. ``optimizer``: the optimiser's state_dict. ``generator``: ``torch.Generator.get_state()``
    of the run's one generator, with ``generator_device`` its device type (a CPU state cannot seed a CUDA
    generator). ``smoothed_loss``: the logged loss (NaN before the first step).
    """

    iteration: int
    model: Mapping[str, torch.Tensor]
    optimizer: Mapping[str, Any]
    generator: torch.Tensor
    generator_device: str
    smoothed_loss: float
    fingerprint: Fingerprint
    trainer_version: str = ""
    saved_at: float = 0.0
    recipe: str = ""
    """The recipe trained (:mod:`trainer.training.recipes`; empty: the user's own, or a checkpoint of a version
    without recipes)."""

    def payload(self) -> dict[str, Any]:
        return {
            "iteration": int(self.iteration),
            "smoothed_loss": float(self.smoothed_loss),
            "model": dict(self.model),
            "optimizer": dict(self.optimizer),
            "generator": self.generator,
            "generator_device": self.generator_device,
            "fingerprint": self.fingerprint.as_dict(),
            "trainer_version": self.trainer_version,
            "saved_at": float(self.saved_at),
            "recipe": self.recipe,
        }

    @classmethod
    def from_payload(cls, raw: object, source: str) -> TrainingState:
        if not isinstance(raw, Mapping):
            raise CheckpointError(f"{source}: the checkpoint payload is not a map")

        def need(key: str, kind: type | tuple[type, ...]) -> Any:
            value = raw.get(key)
            if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
                names = "/".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
                raise CheckpointError(f"{source}: the checkpoint's {key!r} is missing or not a {names}")
            return value

        iteration = need("iteration", int)
        if iteration < 0:
            raise CheckpointError(f"{source}: the checkpoint's iteration is negative ({iteration})")
        model = need("model", Mapping)
        if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in model.items()):
            raise CheckpointError(f"{source}: the checkpoint's model state is not a map of tensors")
        generator = need("generator", torch.Tensor)
        if generator.dtype != torch.uint8:
            raise CheckpointError(f"{source}: the checkpoint's generator state is not a byte tensor")
        return cls(
            iteration=iteration,
            model=model,
            optimizer=need("optimizer", Mapping),
            generator=generator,
            generator_device=need("generator_device", str),
            smoothed_loss=float(need("smoothed_loss", (int, float))),
            fingerprint=Fingerprint.from_dict(raw.get("fingerprint")),
            trainer_version=str(raw.get("trainer_version", "")),
            saved_at=float(raw.get("saved_at", 0.0))
            if isinstance(raw.get("saved_at"), (int, float))
            else 0.0,
            recipe=str(raw.get("recipe", "")) if isinstance(raw.get("recipe", ""), str) else "",
        )


# ---------------------------------------------------------------------------------------------------------
# Files


def checkpoint_paths(folder: str | os.PathLike[str]) -> tuple[Path, Path]:
    """``(current, previous)`` checkpoint paths in ``folder``."""
    root = Path(folder)
    return root / CHECKPOINT_NAME, root / PREVIOUS_CHECKPOINT_NAME


def _serialise(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def save_checkpoint(folder: str | os.PathLike[str], state: TrainingState) -> Path:
    """Write ``state`` as the current checkpoint of ``folder``; the old current one becomes the previous.

    Order (each step leaves a loadable checkpoint behind if the process dies right after it): write and
    fsync a temp file; rename current → previous; rename temp → current; fsync the folder. A temp file
    left by a killed writer is removed by :func:`remove_stale_temp_files` at the next start.
    """
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    payload = _serialise(state.payload())
    outer = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "sha256": hashlib.sha256(payload).hexdigest(),
        "payload_bytes": len(payload),
        # A writable copy: torch.frombuffer warns on read-only buffers.
        "payload": torch.frombuffer(bytearray(payload), dtype=torch.uint8),
    }
    current, previous = checkpoint_paths(root)

    def rotate() -> None:
        if current.exists():
            os.replace(current, previous)

    with atomic_file(current, before_replace=rotate) as handle:
        torch.save(outer, handle)
    return current


def remove_stale_temp_files(folder: str | os.PathLike[str]) -> list[Path]:
    """Delete temp files a killed checkpoint writer left in ``folder``; returns what was removed."""
    removed = []
    for path in stale_temp_files(checkpoint_paths(folder)[0]):
        with contextlib.suppress(OSError):
            path.unlink()
            removed.append(path)
    return removed


def load_checkpoint(path: str | os.PathLike[str]) -> TrainingState:
    """Read and verify one checkpoint file (size bound, format, version, sha256, payload types).

    Raises:
        CheckpointError: anything wrong with the file; the message names the file and the fault.
    """
    source = str(path)
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        raise CheckpointError(f"{source} does not exist") from None
    except OSError as error:
        raise CheckpointError(f"{source} cannot be read: {error}") from None
    if size > MAX_CHECKPOINT_BYTES:
        raise CheckpointError(
            f"{source} is {size} bytes, more than the {MAX_CHECKPOINT_BYTES} a checkpoint can be"
        )
    outer = _torch_load(Path(path), source)
    if not isinstance(outer, Mapping) or outer.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{source} is not an la-trainer checkpoint")
    version = outer.get("version")
    if version != CHECKPOINT_VERSION:
        raise CheckpointError(
            f"{source} has checkpoint format version {version!r}; this la-trainer reads version "
            f"{CHECKPOINT_VERSION}"
        )
    payload = outer.get("payload")
    expected_digest = outer.get("sha256")
    expected_size = outer.get("payload_bytes")
    if not isinstance(payload, torch.Tensor) or payload.dtype != torch.uint8 or payload.dim() != 1:
        raise CheckpointError(f"{source}: the checkpoint payload is not a byte tensor")
    raw = payload.numpy().tobytes()
    if len(raw) != expected_size:
        raise CheckpointError(
            f"{source}: the payload is {len(raw)} bytes but the checkpoint says {expected_size}"
        )
    digest = hashlib.sha256(raw).hexdigest()
    if digest != expected_digest:
        raise CheckpointError(
            f"{source}: checksum mismatch (sha256 {digest}, the checkpoint says {expected_digest!r}); "
            "the file is corrupt"
        )
    inner = _torch_load(io.BytesIO(raw), source)
    return TrainingState.from_payload(inner, source)


def _torch_load(target: Path | io.BytesIO, source: str) -> object:
    try:
        # weights_only: only tensors, containers and plain scalars can come back; never arbitrary objects.
        with warnings.catch_warnings():
            # A damaged or foreign file makes torch warn about its pickle protocol before it refuses it;
            # the refusal (below) is the message that matters.
            warnings.simplefilter("ignore")
            return torch.load(target, map_location="cpu", weights_only=True)
    except Exception as error:  # zip errors, unpickling refusals, truncation: all mean "not usable"
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"{source} is not a readable checkpoint ({first_line})") from None


def load_latest(folder: str | os.PathLike[str]) -> tuple[TrainingState | None, list[str]]:
    """The newest usable checkpoint in ``folder`` and a note per file that was skipped (and why).

    Returns ``(None, notes)`` when neither file is usable; ``notes`` is empty when neither exists.
    """
    notes: list[str] = []
    for path in checkpoint_paths(folder):
        if not path.exists():
            continue
        try:
            return load_checkpoint(path), notes
        except CheckpointError as error:
            notes.append(str(error))
    return None, notes


def sibling_checkpoint_folders(folder: str | os.PathLike[str]) -> list[Path]:
    """Snapshot folders of earlier runs of the same task, newest checkpoint first.

    The engine gives every spawned run a fresh task folder ``<TaskName><TaskId>`` (spec §1.2), so the run
    to resume lives next to this one: ``<parent>/<TaskName><N>/Snapshots`` for every other ``N``.
    """
    here = Path(folder)
    task_dir = here.parent
    stem = task_dir.name.rstrip("0123456789")
    # Only the layout the loop creates (<TaskName><TaskId>/Snapshots): any other folder has no siblings.
    if here.name != "Snapshots" or stem == task_dir.name or not task_dir.parent.is_dir():
        return []
    found = []
    for other in task_dir.parent.iterdir():
        suffix = other.name[len(stem) :]
        if other == task_dir or not other.name.startswith(stem) or not suffix.isdigit():
            continue
        candidate = other / here.name
        stamps = [p.stat().st_mtime for p in checkpoint_paths(candidate) if p.is_file()]
        if stamps:
            found.append((max(stamps), candidate))
    return [path for _, path in sorted(found, key=lambda item: item[0], reverse=True)]


def load_for_resume(
    folder: str | os.PathLike[str], current: Fingerprint
) -> tuple[TrainingState | None, list[str]]:
    """The checkpoint to resume from, checked against ``current``; ``(None, notes)`` when none exists.

    Looks in ``folder`` first. When it holds no checkpoint file at all, the newest *matching* checkpoint
    of an earlier run of the same task (:func:`sibling_checkpoint_folders`) is used; siblings that do not
    match are skipped with a note, not refused: they are other experiments.

    Raises:
        ResumeRefused: ``folder`` holds checkpoint files but none is usable, or the newest usable one was
            made for other networks, config or data (the message lists every difference).
    """
    own = any(path.exists() for path in checkpoint_paths(folder))
    if not own:
        notes: list[str] = []
        for sibling in sibling_checkpoint_folders(folder):
            state, skipped = load_latest(sibling)
            notes += skipped
            if state is None:
                continue
            differences = state.fingerprint.differences(current)
            if not differences:
                notes.append(
                    f"resuming the run in {sibling.parent} (this run's folder {folder} has no checkpoint)"
                )
                return state, notes
            notes.append(
                f"{sibling} holds a checkpoint for other networks, config or data ({len(differences)} "
                "differences); not used"
            )
        return None, notes
    state, notes = load_latest(folder)
    if state is None:
        raise ResumeRefused(
            "cannot resume: no usable checkpoint in "
            f"{folder}:\n  " + "\n  ".join(notes) + "\nMove the files away to start a fresh run."
        )
    differences = state.fingerprint.differences(current)
    if differences:
        raise ResumeRefused(
            f"cannot resume from the checkpoint of iteration {state.iteration} in {folder}: it was made for "
            "other networks, config or data:\n"
            + "\n".join(differences)
            + "\nRestore the original settings, or start a fresh run (--no-resume) after moving the "
            "checkpoint away."
        )
    return state, notes
