# la-trainer on a GPU server, socket mode: the game connects to port 48491 of this container.
#   docker build -t la-trainer .
#   mkdir -p runs
#   docker run --gpus all --shm-size=8g -p 48491:48491 --user "$(id -u):$(id -g)" -v "$PWD/runs:/runs" la-trainer
# It is a server: it serves one game session after another (an editor restarted, PIE started again), each
# in its own /runs/External<N> (status, snapshots, run record), and waits for the next game without a
# bound; `docker stop -t 60` (SIGTERM) ends it cleanly (a session in progress finishes its step, saves and
# sends its networks first). --user runs it as the owner of the host folder, which it must be able to
# write (a folder it cannot write ends it at once with exit 2, the path and this fix); with a named
# volume (-v la-trainer-runs:/runs) the image's own user 10001 owns it and --user is not needed.
# `docker ps` shows the health that `la-trainer watch --once` reports. Other commands:
#   docker run --rm la-trainer demo --quick
# torch from PyPI on Linux is the CUDA build (bundles its CUDA libraries; the host needs the NVIDIA
# driver and container toolkit). It falls back to the CPU with one warning where no GPU is visible.
FROM python:3.11-slim-bookworm

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies first, so this layer stays cached while the source changes.
COPY constraints.txt ./
RUN pip install -c constraints.txt torch numpy msgpack click posix_ipc

COPY pyproject.toml README.md LICENSE ./
COPY protocol ./protocol
COPY trainer ./trainer
COPY emulator ./emulator
COPY scripts ./scripts
RUN pip install --no-deps . \
    && useradd --create-home --uid 10001 trainer \
    && mkdir -p /runs \
    && chown trainer /runs

USER 10001
# Commands that write into the current folder (demo, report, offline) write into the volume: /app is
# root's, and a user given with --user may write only there.
WORKDIR /runs
VOLUME ["/runs"]
# The engine's default port (spec §1.6); the link is unencrypted and unauthenticated: keep it on a
# private network or behind a tunnel.
EXPOSE 48491

# Healthy while the newest run's trainer is alive and its status fresh (rewritten every 10 s, also while
# it waits for the game), or that run completed; unhealthy when it failed, was interrupted, diverged, went
# stale or died (`la-trainer watch --once` exit codes, README). It never connects to the port: a
# connection would be taken for the game.
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
    CMD ["la-trainer", "watch", "/runs", "--once", "--max-age", "120"]

ENTRYPOINT ["la-trainer"]
CMD ["socket", "--host", "0.0.0.0", "--port", "48491", "--temp-dir", "/runs"]
