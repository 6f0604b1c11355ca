"""The trainer side of sections 2, 4 and 5 of ``la-trainer bench``: one worker process, the real links.

Run as ``python -m emulator.bench --worker SPEC`` by :class:`emulator.bench.ipc.WorkerProcess` (the
engine side). For each transport of the spec it plays what the trainer does: link → config → networks →
(socket: raw loopback) → ingest repeats → small buffer → job → sync rounds → Complete. Every result is
one :data:`MARK` JSON line on stdout, tagged with the transport; everything else it prints is log.

Peak RSS (section 5) is ``VmHWM`` of this process while it ingests the buffer, reset before each ingest
via ``/proc/self/clear_refs``. The timestamps are ``time.monotonic()``, one system-wide clock, so the
engine side subtracts its own post times from them.
"""

from __future__ import annotations

import gc
import json
import socket
import sys
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from emulator.bench.workload import quiet

__all__ = ["MARK", "run_worker"]

MARK = "@@bench "
"""Prefix of the worker's result lines (everything else it prints is log)."""


def _rss_kib(field_name: str) -> int:
    """VmRSS / VmHWM of this process in KiB (Linux); falls back to ru_maxrss for the peak."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak // 1024 if sys.platform == "darwin" else peak)


def _reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux ``clear_refs`` value 5); False where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _emit(kind: str, **values: Any) -> None:
    print(MARK + json.dumps({"kind": kind, **values}), flush=True)


def _memcpy_baseline(nbytes: int, repeats: int) -> None:
    """memcpy of ``nbytes`` in this process: into fresh memory (page faults included, as an ingest must
    allocate) and into already-touched memory (bandwidth alone)."""
    src = np.empty(nbytes, dtype=np.uint8)
    src.fill(1)
    for _ in range(repeats):
        dst = np.empty(nbytes, dtype=np.uint8)
        start = time.perf_counter()
        np.copyto(dst, src)
        fresh = time.perf_counter() - start
        start = time.perf_counter()
        np.copyto(dst, src)
        warm = time.perf_counter() - start
        _emit("memcpy", nbytes=nbytes, fresh_s=fresh, warm_s=warm)
        del dst
    del src


def _raw_receive(server: socket.socket, nbytes: int, repeats: int) -> None:
    """Accept one plain connection and receive ``repeats`` × ``nbytes`` into fresh buffers."""
    conn, _ = server.accept()
    with conn:
        for _ in range(repeats):
            buf = np.empty(nbytes, dtype=np.uint8)
            view = buf.data
            got = 0
            while got < nbytes:
                n = conn.recv_into(view[got:])
                if n == 0:
                    raise ConnectionError("raw loopback sender closed early")
                got += n
            _emit("raw", transport="socket", done=time.monotonic())
            del view, buf


def run_worker(spec: Mapping[str, Any]) -> None:
    """The trainer side, one process for every transport (one torch import): memcpy baseline, then per
    transport link → config → networks → (socket: raw loopback) → ingest repeats → small buffer → job →
    sync rounds → Complete. Results are ``@@bench`` lines on stdout, tagged with the transport."""
    start = time.perf_counter()
    import torch  # the real trainer has torch loaded before the replay buffer arrives

    _emit("imported", torch_s=time.perf_counter() - start)
    torch.set_num_threads(1)
    _memcpy_baseline(int(spec["nbytes"]), int(spec["repeats"]))
    for transport in spec["transports"]:
        _worker_session(transport, spec)


def _worker_session(transport: str, spec: Mapping[str, Any]) -> None:
    import torch

    from protocol.snapshot import read_snapshot
    from trainer.session.links import ShmTrainerLink, SocketTrainerLink
    from trainer.session.run import (  # the loop's own encode and send: measure those
        SyncRounds,
        encode_networks,
    )
    from trainer.settings.options import TrainerOptions
    from trainer.training.job import TrainingJob

    repeats, nbytes = int(spec["repeats"]), int(spec["nbytes"])
    raw_server: socket.socket | None = None
    link: ShmTrainerLink | SocketTrainerLink
    if transport == "shm":
        link = ShmTrainerLink(spec["shm_config_dir"], spec["shm_guid"])
        _emit("ready", transport=transport)
    else:
        link = SocketTrainerLink("127.0.0.1", 0)
        raw_server = socket.create_server(("127.0.0.1", 0))
        _emit("ready", transport=transport, port=link.port, raw_port=raw_server.getsockname()[1])
    try:
        config = link.receive_config()
        received = {nid: read_snapshot(link.receive_network(nid)) for nid in (0, 1, 2)}
        if raw_server is not None:
            _raw_receive(raw_server, nbytes, repeats)
        _emit("baselines-done", transport=transport)
        for _ in range(repeats):
            gc.collect()
            resettable = _reset_peak_rss()
            before = _rss_kib("VmRSS")
            _emit("waiting", transport=transport)  # the engine posts only now: the clock starts there
            replay = link.receive_experience()
            done = time.monotonic()
            peak = _rss_kib("VmHWM")
            _emit(
                "ingest",
                transport=transport,
                done=done,
                rss_before_kib=before,
                peak_kib=peak,
                reset=resettable,
            )
            del replay
        small = link.receive_experience()
        with quiet():
            job = TrainingJob.create(
                config, received, small, options=TrainerOptions(heldout_share=0.0), device=torch.device("cpu")
            )
        job.step(0)
        sync = SyncRounds(link)
        for r in range(int(spec["sync_rounds"])):
            start = time.monotonic()
            blobs = encode_networks(received, job.export())
            encoded = time.monotonic()
            sync.send(blobs)
            _emit("sync", transport=transport, start=start, encoded=encoded, sent=time.monotonic())
            job.step(r + 1)
            time.sleep(0.005)  # let the engine finish the round before the next one starts
        link.send_complete()
        link.finish(10.0)
    finally:
        link.close()
        if raw_server is not None:
            raw_server.close()
