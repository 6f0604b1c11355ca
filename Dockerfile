# la-trainer on a GPU server, socket mode: the game connects to port 48491 of this container.
#   docker build -t la-trainer .
#   docker run --gpus all --shm-size=8g -p 48491:48491 -v "$PWD/runs:/runs" la-trainer
# Each run gets /runs/External<N> (status, snapshots, run record); `docker ps` shows the health that
# `la-trainer watch --once` reports. Other commands: docker run --rm la-trainer demo --quick
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
