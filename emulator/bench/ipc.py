"""The engine side of sections 2, 4 and 5 of ``la-trainer bench``: ingest, sync and peak RSS per transport.

The engine side runs in this process against the trainer side in one worker process
(:mod:`emulator.bench.worker`), over the real :mod:`trainer.session.links` links and the emulator's
:mod:`emulator.game` halves:

2. **Ingest** of a ``--ingest-mb`` replay buffer over shared memory and over the socket, against a memcpy
   of the same bytes and a raw loopback transfer, in the same processes. Time = from the engine posting
   the buffer (shm) or starting to send it (socket) to ``receive_experience`` returning in the worker
   (one system-wide monotonic clock). The shm trainer pre-faults its copy-out target while it waits
   (:mod:`trainer.session.transport.staging`); the engine side writes the buffer only after the trainer says it
   is waiting, so that work races the engine's write here as it does in a real session (where the engine
   also writes into fresh regions, slower than the warm ones reused by these repeats, so staging usually
   finishes there).
4. **Sync**: one round of networks 0, 1, 2 with the default networks: export + encode (the trainer's work)
   and the hand-over until the engine holds network 2, the engine checking for networks every
   :data:`~emulator.bench.config.ENGINE_TICK_S` (game frame latency excluded).
5. **Peak RSS** of the worker while it ingests, absolute and as a multiple of the buffer size.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from emulator.bench.config import (
    ACT_DIM,
    ENGINE_TICK_S,
    ENGINE_TIMEOUT_S,
    EPISODE_STEPS,
    OBS_DIM,
    SYNC_STEPS,
    TRAIN_CONFIGS,
    BenchSettings,
)
from emulator.bench.stats import median, ratio
from emulator.bench.worker import MARK
from emulator.bench.workload import session_for, synthetic_replay

if TYPE_CHECKING:
    from emulator.game import ShmGame
    from protocol.config import SessionConfig
    from protocol.replay import ReplayBuffer

__all__ = ["WorkerProcess", "measure_ipc"]


class WorkerProcess:
    """The worker subprocess; a thread collects its ``@@bench`` lines."""

    def __init__(self, spec: Mapping[str, Any]) -> None:
        from emulator.launch import REPO_ROOT

        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "emulator.bench", "--worker", json.dumps(spec)],
            cwd=str(REPO_ROOT),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.results: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None  # a pipe by construction
        for line in self.proc.stdout:
            if line.startswith(MARK):
                with self._cond:
                    self.results.append(json.loads(line[len(MARK) :]))
                    self._cond.notify_all()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None  # a pipe by construction
        for line in self.proc.stderr:
            self._stderr.append(line)

    def of(self, kind: str, transport: str | None = None) -> list[dict[str, Any]]:
        """The results of ``kind`` (for ``transport``: those tagged with it)."""
        with self._cond:
            return [r for r in self.results if r["kind"] == kind and r.get("transport") == transport]

    def wait_for(
        self, kind: str, count: int = 1, transport: str | None = None, timeout: float = 300.0
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = [r for r in self.results if r["kind"] == kind and r.get("transport") == transport]
                if len(found) >= count:
                    return found
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"bench worker: no {count} {kind!r} result(s) (exit {self.proc.poll()}):\n"
                        + "".join(self._stderr[-30:])
                    )
                self._cond.wait(0.1)

    def close(self) -> None:
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def measure_ipc(settings: BenchSettings, work: Path) -> tuple[dict[str, dict[str, Any]], float]:
    """Sections 2, 4 and 5 for every transport: the engine side runs here, the trainer side in one
    worker process. Returns ``{transport: results}`` and the worker's ``import torch`` seconds."""
    from emulator.game import ShmGame

    default = TRAIN_CONFIGS[0]
    step_bytes = 4 * (OBS_DIM + ACT_DIM)
    steps = max(EPISODE_STEPS, int(settings.ingest_mb * 2**20) // step_bytes)
    big = synthetic_replay(steps)
    small = synthetic_replay(min(SYNC_STEPS, steps), seed=1)
    nbytes = int(
        sum(a.nbytes for a in (big.episode_starts, big.episode_lengths, *big.observations, *big.actions))
    )
    config, snapshots = session_for(big, default)
    spec: dict[str, Any] = {
        "transports": list(settings.transports),
        "repeats": settings.repeats,
        "nbytes": nbytes,
        "sync_rounds": settings.sync_rounds,
    }
    shm_game: ShmGame | None = None
    if "shm" in settings.transports:
        config_dir = work / f"shm-{os.getpid()}" / "Configs"
        shm_game = ShmGame.create(config_dir, timeout=ENGINE_TIMEOUT_S)
        spec |= {"shm_config_dir": str(config_dir), "shm_guid": shm_game.controls_guid}
    worker = WorkerProcess(spec)
    out: dict[str, dict[str, Any]] = {}
    try:
        torch_import_s = float(worker.wait_for("imported")[0]["torch_s"])
        memcpy = worker.wait_for("memcpy", settings.repeats)
        for transport in settings.transports:
            rounds, posted, raw_start = _drive(
                transport, worker, shm_game, settings, big, small, config, snapshots
            )
            out[transport] = _transport_results(
                memcpy,
                worker.of("raw", transport),
                worker.of("ingest", transport),
                worker.of("sync", transport),
                posted,
                raw_start,
                rounds,
                nbytes,
            )
    finally:
        if shm_game is not None:
            with contextlib.suppress(Exception):
                shm_game.close()
        worker.close()
    return out, torch_import_s


def _drive(
    transport: str,
    worker: WorkerProcess,
    shm_game: ShmGame | None,
    settings: BenchSettings,
    big: ReplayBuffer,
    small: ReplayBuffer,
    config: SessionConfig,
    snapshots: tuple[bytes, ...],
) -> tuple[list[tuple[float, float]], list[float], list[float]]:
    """The engine's side of one transport's session; returns (rounds, ingest posts, raw starts)."""
    from emulator.drive import tick_until_end
    from emulator.game import SocketGame

    alive = lambda: worker.proc.poll() is None  # noqa: E731 - the engine's IsRunning
    ready = worker.wait_for("ready", transport=transport)[0]
    game: ShmGame | SocketGame
    if transport == "shm":
        if shm_game is None:
            raise ValueError("the shared-memory transport needs the game created before the worker")
        game = shm_game
        game.process_alive = alive
    else:
        game = SocketGame.connect(
            "127.0.0.1", int(ready["port"]), timeout=ENGINE_TIMEOUT_S, process_alive=alive
        )
    posted: list[float] = []
    raw_start: list[float] = []
    rounds: list[tuple[float, float]] = []
    try:
        # BeginTraining up to the networks (emulator.drive.begin_training would also send the replay
        # buffer once): the buffer goes over ``repeats`` times below, each when the worker waits for it.
        game.begin(config)
        for nid, blob in enumerate(snapshots):
            game.send_network(nid, blob)
        if transport == "socket":
            payload = np.ones(int(worker.wait_for("memcpy")[0]["nbytes"]), dtype=np.uint8)
            with socket.create_connection(("127.0.0.1", int(ready["raw_port"]))) as raw:
                for r in range(settings.repeats):
                    raw_start.append(time.monotonic())
                    raw.sendall(payload.data)
                    worker.wait_for("raw", r + 1, transport)
            del payload
        worker.wait_for("baselines-done", transport=transport)
        for r in range(settings.repeats):
            worker.wait_for("waiting", r + 1, transport)
            if transport == "shm":
                game.send_experience(big)  # writes every region, then posts E, S (the engine's work)
                posted.append(time.monotonic())
            else:
                posted.append(time.monotonic())
                game.send_experience(big)
            worker.wait_for("ingest", r + 1, transport)
        game.send_experience(small)
        # The engine's tick loop until Complete; a round's hand-over ends when network 2 arrived.
        tick_until_end(
            game,
            tick_s=ENGINE_TICK_S,
            on_round=lambda nets: rounds.append((nets[0].received_at, nets[-1].received_at)),
            timeout_s=300.0,
        )
        game.done()
    finally:
        if transport != "shm":
            with contextlib.suppress(Exception):
                game.close()
    return rounds, posted, raw_start


def _transport_results(
    memcpy: list[dict[str, Any]],
    raw: list[dict[str, Any]],
    ingest: list[dict[str, Any]],
    syncs: list[dict[str, Any]],
    posted: list[float],
    raw_start: list[float],
    rounds: list[tuple[float, float]],
    nbytes: int,
) -> dict[str, Any]:
    by = {"memcpy": memcpy, "raw": raw, "ingest": ingest}
    ingest_s = [r["done"] - p for r, p in zip(ingest, posted, strict=False)]
    raw_s = [r["done"] - s for r, s in zip(raw, raw_start, strict=False)]
    round_ms = [(end - s["start"]) * 1e3 for s, (_, end) in zip(syncs, rounds, strict=False)]
    encode_ms = [(s["encoded"] - s["start"]) * 1e3 for s in syncs]
    handover_ms = [(end - s["encoded"]) * 1e3 for s, (_, end) in zip(syncs, rounds, strict=False)]
    peaks = [r["peak_kib"] * 1024 for r in ingest]
    befores = [r["rss_before_kib"] * 1024 for r in ingest]
    gb = nbytes / 1e9
    out: dict[str, Any] = {
        "bytes": nbytes,
        "ingest_s": median(ingest_s),
        "ingest_gb_per_s": ratio(gb, median(ingest_s)),
        "memcpy_fresh_gb_per_s": ratio(gb, median([r["fresh_s"] for r in by["memcpy"]])),
        "memcpy_warm_gb_per_s": ratio(gb, median([r["warm_s"] for r in by["memcpy"]])),
        "peak_rss_bytes": median(peaks),
        "rss_before_bytes": median(befores),
        "peak_rss_over_buffer": ratio(median(peaks), nbytes),
        "peak_rss_reset": all(r.get("reset", False) for r in by["ingest"]),
        "sync_round_ms": median(round_ms),
        "sync_export_encode_ms": median(encode_ms),
        "sync_handover_ms": median(handover_ms),
        "sync_rounds": len(round_ms),
        "runs": {"ingest_s": ingest_s, "raw_s": raw_s, "sync_round_ms": [round(x, 3) for x in round_ms]},
    }
    if raw_s:
        out["raw_gb_per_s"] = ratio(gb, median(raw_s))
    return out
