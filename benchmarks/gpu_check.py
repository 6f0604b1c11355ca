"""The GPU checks of issue 32, prepared to run in one go on the first session that has a CUDA device.

No GPU was lent while the captured step (trainer/training/steps/graphed.py) was written: what a CPU can
check is tested there (tests/trainer/test_captured_step.py), and this script does the rest, writing raw
rows for benchmarks/results/:

1. ``env``: torch, CUDA, the device.
2. ``equality``: the default network (1 x 128, batch 256) trained 300 steps from one seed three ways:
   replayed as a CUDA graph, the same device-state step eagerly (must be bitwise equal: weights, EMA,
   Adam moments, the generator's state, the smoothed loss) and the eager step with host numbers (the
   CPU's default; on CUDA its learning rate is a double, the device tensor's a float: a small difference
   is expected there, reported as the largest absolute one).
3. ``speed``: iterations/s of the captured step (what ``TrainingJob.advance`` runs on CUDA) and of the
   eager fused step, interleaved, median of ``--repeats`` runs of ``--seconds`` each, for the bench's
   three networks; targets at the default network: >= 10,000 it/s and >= 3x eager.
4. ``tests``: the CUDA tests of tests/trainer/test_captured_step.py (graph bitwise the eager steps, a whole
   CUDA run reading the device at most once per hundred iterations), skipped everywhere else.
5. ``bench``: ``python -m trainer bench --device cuda --sections train`` (its JSON and text beside).

Run from the repository root on the GPU machine (its python3 holds torch; nothing to install):

    PYTHONUNBUFFERED=1 python3 -m benchmarks.gpu_check --out "$OUT"

then copy ``$OUT/*`` to ``benchmarks/results/gpu-check/`` and commit it. About 4-6 minutes; ``--quick``
for a 1-minute smoke run. Shared memory is not used here: where ``posix_ipc`` is missing (that
machine's image) a stub stands in for it, so that the trainer's modules import.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[1]
TARGET_IT_PER_S = 10_000.0
TARGET_OVER_EAGER = 3.0


def _stub_posix_ipc(stub_dir: Path) -> None:
    """A ``posix_ipc`` that imports and refuses every use (this script uses no shared memory)."""
    try:
        import posix_ipc  # noqa: F401
    except ImportError:
        text = (
            '"""Stub (benchmarks/gpu_check.py): no shared memory on this machine."""\n'
            "class ExistentialError(Exception): ...\n"
            "class PermissionsError(Exception): ...\n"
            "O_CREX = O_CREAT = 0\n"
            "def __getattr__(name):\n"
            "    raise ImportError(f'posix_ipc is not installed here (stub): {name}')\n"
        )
        (stub_dir / "posix_ipc.py").write_text(text, encoding="utf-8")
        sys.path.insert(0, str(stub_dir))
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(stub_dir), str(ROOT), os.environ.get("PYTHONPATH", "")) if p
        )
        sys.modules.pop("posix_ipc", None)


class Rows:
    """Raw rows, one JSON object per line, written as they come."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: list[dict[str, Any]] = []
        path.write_text("", encoding="utf-8")

    def add(self, kind: str, **values: Any) -> dict[str, Any]:
        row = {"kind": kind, **values}
        self.rows.append(row)
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(row, default=str) + "\n")
        print(json.dumps(row, default=str), flush=True)
        return row


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    from emulator.bench.workload import quiet

    with quiet():
        yield


def _env(rows: Rows) -> None:
    import torch

    props = torch.cuda.get_device_properties(0)
    rows.add(
        "env",
        torch=torch.__version__,
        cuda=torch.version.cuda,
        device=props.name,
        capability=f"{props.major}.{props.minor}",
        multiprocessors=props.multi_processor_count,
        memory_gib=round(props.total_memory / 2**30, 1),
        python=sys.version.split()[0],
    )


DEVICE = "cuda"
"""The device checked (``--device cpu`` runs the script's own code here, without a GPU: a smoke test)."""


def _sync() -> None:
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _job(config_name: str, *, graph: bool, rows_n: int) -> Any:
    import torch

    from emulator.bench.config import TRAIN_CONFIGS
    from emulator.bench.workload import make_job

    cfg = next(c for c in TRAIN_CONFIGS if c.name == config_name)
    with _quiet():
        job = make_job(cfg, rows_n, torch.device(DEVICE))
    job.cuda_graph = graph
    return job


def _device_state_step(job: Any) -> Any:
    from trainer.training.steps import fused_step

    inputs = job._step_inputs()
    step = fused_step(inputs, device_state=True)
    assert step is not None
    return step


def _state(job: Any) -> dict[str, Any]:
    out = {f"model.{k}": v.detach().clone() for k, v in job.model.state_dict().items()}
    for i, p in enumerate(p for g in job.optimizer.param_groups for p in g["params"]):
        for key, value in job.optimizer.state.get(p, {}).items():
            out[f"adam.{i}.{key}"] = value.detach().clone() if hasattr(value, "detach") else value
    return out


def _equality(rows: Rows, steps: int) -> None:
    import torch

    from trainer.training.steps import Phase
    from trainer.training.steps.graphed import GraphedStep

    graphed = _job("default", graph=True, rows_n=20_000)
    eager = _job("default", graph=True, rows_n=20_000)
    eager.training_step, eager.phase = _device_state_step(eager), Phase.FLOW_MATCHING
    host = _job("default", graph=False, rows_n=20_000)
    for i in range(steps):
        for job in (graphed, eager, host):
            job.advance(i)
    losses = [job.settle() for job in (graphed, eager, host)]
    captured = isinstance(graphed.training_step, GraphedStep) and graphed.training_step.captured
    a, b, c = _state(graphed), _state(eager), _state(host)
    unequal = [k for k in a if not torch.equal(a[k], b[k])]

    def largest(x: dict[str, Any], y: dict[str, Any]) -> float:
        return max(float((x[k].double() - y[k].double()).abs().max()) for k in x if x[k].is_floating_point())

    rows.add(
        "equality",
        steps=steps,
        graph_captured=captured,
        graph_bitwise_eager=not unequal
        and bool(torch.equal(graphed.generator.get_state(), eager.generator.get_state())),
        unequal_tensors=unequal[:10],
        graph_vs_eager_max_abs=largest(a, b),
        graph_vs_host_numbers_max_abs=largest(a, c),
        smoothed_losses=losses,
    )


def _rate(step: Callable[[int], None], counter: list[int], seconds: float) -> float:
    _sync()
    n = 0
    started = time.perf_counter()
    while True:
        for _ in range(100):
            step(counter[0])
            counter[0] += 1
        n += 100
        _sync()
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            return n / elapsed


def _speed(rows: Rows, configs: list[str], repeats: int, seconds: float) -> None:
    for name in configs:
        contenders = {
            "graph": _job(name, graph=True, rows_n=100_000),
            "eager": _job(name, graph=False, rows_n=100_000),
        }
        counters = {k: [0] for k in contenders}
        for key, job in contenders.items():  # warm-up: the capture happens here
            _rate(job.advance, counters[key], 0.5)
        rates: dict[str, list[float]] = {k: [] for k in contenders}
        for r in range(repeats):
            order = list(contenders) if r % 2 == 0 else list(reversed(contenders))
            for key in order:
                rates[key].append(_rate(contenders[key].advance, counters[key], seconds))
        for job in contenders.values():
            job.settle()
        graph, eager = statistics.median(rates["graph"]), statistics.median(rates["eager"])
        step = contenders["graph"].training_step
        targets = (
            {"meets_10k": graph >= TARGET_IT_PER_S, "meets_3x": graph / eager >= TARGET_OVER_EAGER}
            if name == "default"
            else {}
        )
        rows.add(
            "speed",
            config=name,
            graph_captured=bool(getattr(step, "captured", False)),
            graph_it_per_s=round(graph, 1),
            eager_it_per_s=round(eager, 1),
            graph_over_eager=round(graph / eager, 3),
            runs={k: [round(x, 1) for x in v] for k, v in rates.items()},
            seconds_per_run=seconds,
            **targets,
        )


def _run(rows: Rows, kind: str, argv: list[str], log: Path, timeout: float) -> None:
    started = time.monotonic()
    try:
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        output, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as expired:
        parts = [
            x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
            for x in (expired.stdout, expired.stderr)
        ]
        output, code = "".join(parts) + f"\n(timed out after {timeout:g} s)", -1
    log.write_text(output, encoding="utf-8")
    rows.add(
        kind, argv=argv, exit_code=code, seconds=round(time.monotonic() - started, 1), tail=output[-1500:]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, required=True, help="folder for the raw rows and logs")
    parser.add_argument("--quick", action="store_true", help="a 1-minute smoke run")
    parser.add_argument("--skip", default="", help="comma-separated: equality,speed,tests,bench")
    parser.add_argument(
        "--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a smoke test of this script"
    )
    args = parser.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    args.out.mkdir(parents=True, exist_ok=True)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    stub_dir = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    _stub_posix_ipc(stub_dir)
    sys.path.insert(0, str(ROOT))
    import torch

    rows = Rows(args.out / "rows.jsonl")
    if DEVICE == "cuda" and not torch.cuda.is_available():
        rows.add("env", torch=torch.__version__, cuda_available=False)
        print("no CUDA device: nothing to check here", file=sys.stderr)
        return 2
    if DEVICE == "cuda":
        _env(rows)
    if "equality" not in skip:
        _equality(rows, 50 if args.quick else 300)
    if "speed" not in skip:
        configs = ["default"] if args.quick else ["default", "wide", "chunk8"]
        _speed(rows, configs, 1 if args.quick else 5, 0.5 if args.quick else 2.0)
    if "tests" not in skip:
        _run(
            rows,
            "tests",
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-rs",
                "-p",
                "no:cacheprovider",
                "tests/trainer/test_captured_step.py",
            ],
            args.out / "pytest-cuda.txt",
            240,
        )
    if "bench" not in skip:
        bench = [
            sys.executable,
            "-m",
            "trainer",
            "bench",
            "--device",
            "cuda",
            "--sections",
            "train",
            "--repeats",
            "1" if args.quick else "3",
            "--train-seconds",
            "0.5" if args.quick else "1",
            "--json",
            str(args.out / "bench-cuda.json"),
        ]
        _run(rows, "bench", bench, args.out / "bench-cuda.txt", 300)
    failed = [r for r in rows.rows if r.get("exit_code") not in (None, 0)]
    equal = [r for r in rows.rows if r["kind"] == "equality"]
    ok = not failed and all(r["graph_bitwise_eager"] and r["graph_captured"] for r in equal)
    print("gpu_check:", "all checks ran and passed" if ok else "see rows.jsonl: something failed", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
