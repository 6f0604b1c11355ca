"""The ``la-trainer bench`` command: options → :class:`~emulator.bench.config.BenchSettings` → run →
table on stdout, JSON on disk."""

from __future__ import annotations

import json
from pathlib import Path

import click

from emulator.bench.config import SECTIONS, TRAIN_CONFIGS, TRAIN_ROWS, TRANSPORTS, BenchSettings
from emulator.bench.report import format_report
from emulator.bench.run import run_bench
from trainer.commands.cli import NonEmptyPath
from trainer.system.console import use_utf8_output

__all__ = ["bench_command"]


def _names(text: str, allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in allowed]
    if unknown:
        raise click.BadParameter(f"unknown {what} {', '.join(unknown)}; choose from {', '.join(allowed)}")
    return names


@click.command("bench")
@click.option(
    "--sections",
    default=",".join(SECTIONS),
    show_default=True,
    help="What to measure; only these run (sync without ingest uses a small buffer, not --ingest-mb).",
)
@click.option(
    "--configs",
    default=",".join(c.name for c in TRAIN_CONFIGS),
    show_default=True,
    help="Training configurations.",
)
@click.option(
    "--repeats", default=5, show_default=True, type=click.IntRange(1, 1000), help="Runs per median."
)
@click.option(
    "--train-seconds",
    default=1.0,
    show_default=True,
    type=click.FloatRange(0, 3600, min_open=True),
    help="Seconds per timed training run (> 0).",
)
@click.option(
    "--train-rows",
    default=TRAIN_ROWS,
    show_default=True,
    type=click.IntRange(1000),
    help="Rows of the synthetic training set.",
)
@click.option(
    "--matmul-size",
    default=1024,
    show_default=True,
    type=click.IntRange(16, 16384),
    help="N of the NxNxN matmul that sets the roofline.",
)
@click.option(
    "--ingest-mb",
    default=1024.0,
    show_default=True,
    type=click.FloatRange(0, 1 << 20, min_open=True),
    help="Replay buffer size for the ingest runs (MiB, > 0).",
)
@click.option(
    "--sync-rounds",
    default=20,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="Sync rounds per transport.",
)
@click.option(
    "--startup-repeats", default=5, show_default=True, type=click.IntRange(1, 100), help="Trainer launches."
)
@click.option(
    "--transports", default=",".join(TRANSPORTS), show_default=True, help="Transports for ingest and sync."
)
@click.option(
    "--device",
    default="auto",
    show_default=True,
    type=click.Choice(["auto", "cpu", "cuda"]),
    help="Also time CUDA when present (auto).",
)
@click.option(
    "--threads",
    default=0,
    show_default=True,
    type=click.IntRange(0, 1024),
    help="Threads for 'ours' (0: the trainer's choice).",
)
@click.option(
    "--json",
    "json_path",
    default="la-trainer-bench.json",
    show_default=True,
    type=NonEmptyPath(dir_okay=False, path_type=Path),
    help="Where to write the results.",
)
def bench_command(
    sections: str,
    configs: str,
    repeats: int,
    train_seconds: float,
    train_rows: int,
    matmul_size: int,
    ingest_mb: float,
    sync_rounds: int,
    startup_repeats: int,
    transports: str,
    device: str,
    threads: int,
    json_path: Path,
) -> None:
    """Measure training throughput, replay ingest, startup and sync against their limits.

    \b
    Examples:
      la-trainer bench                                  # everything, 1 GiB ingest, median of 5
      la-trainer bench --sections train --configs default
      la-trainer bench --ingest-mb 64 --repeats 3 --json /tmp/bench.json
    """
    # Everything printed here is ASCII; a quoted path need not be: escaped, never a UnicodeEncodeError on a
    # cp1252 console (as the trainer's own output, trainer.system.console.use_utf8_output).
    use_utf8_output()
    settings = BenchSettings(
        sections=_names(sections, SECTIONS, "section"),
        configs=_names(configs, tuple(c.name for c in TRAIN_CONFIGS), "config"),
        repeats=repeats,
        train_seconds=train_seconds,
        train_rows=train_rows,
        matmul_size=matmul_size,
        ingest_mb=ingest_mb,
        sync_rounds=sync_rounds,
        startup_repeats=startup_repeats,
        device=device,
        threads=threads,
        transports=_names(transports, TRANSPORTS, "transport"),
    )
    results = run_bench(settings, progress=lambda s: click.echo(s, err=True))
    click.echo(format_report(results))
    json_path.write_text(json.dumps(results, indent=2, default=str), encoding="utf-8")
    click.echo(f"\nwrote {json_path}")
