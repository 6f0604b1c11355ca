"""``la-trainer bench`` runs end to end in a tiny configuration and writes the promised JSON.

No timing is asserted (CI machines vary); the facts are the structure of the results, that every
section measured something finite, and the table/targets bookkeeping."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import emulator.bench
from emulator.bench import TARGETS, TRAIN_CONFIGS, TrainConfig, bench_command, format_report
from tests.support.ascii_scan import non_ascii_literals

pytestmark = pytest.mark.slow


def finite(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def test_the_tiny_bench_writes_every_section_with_the_expected_keys(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(
        bench_command,
        [
            "--configs=default",
            "--repeats=1",
            "--train-seconds=0.02",
            "--train-rows=2000",
            "--matmul-size=256",
            "--ingest-mb=1",
            "--sync-rounds=2",
            "--startup-repeats=1",
            "--device=cpu",
            f"--json={out}",
        ],
    )
    assert result.exit_code == 0, result.output + repr(result.exception)
    data = json.loads(out.read_text(encoding="utf-8"))
    assert {"meta", "train", "ingest", "sync", "startup", "summary", "targets"} <= data.keys()

    train = data["train"]
    assert finite(train["matmul_gflops"]) and finite(train["matmul_gflops_1_thread"])
    default = train["default"]
    assert {"ours", "autograd", "reference"} <= default["contenders"].keys()
    for contender in default["contenders"].values():
        assert finite(contender["it_per_s"]) and contender["it_per_s"] > 0
    assert default["config"]["flops_per_iteration"] == TRAIN_CONFIGS[0].flops_per_iteration
    for key in ("roofline_it_per_s", "ours_over_reference", "ours_over_roofline", "ours_over_autograd"):
        assert finite(default[key]), key
    # The headline divides by the reference at its best thread count in the run, never a slower one.
    contenders = default["contenders"]
    references = [contenders[k]["it_per_s"] for k in ("reference", "reference_1_thread") if k in contenders]
    assert default["reference_best_it_per_s"] == max(references)
    assert default["ours_over_reference"] == pytest.approx(contenders["ours"]["it_per_s"] / max(references))
    assert default["ours_over_reference"] <= default["ours_over_reference_default_threads"] + 1e-12

    for transport in ("shm", "socket"):
        ingest = data["ingest"][transport]
        for key in (
            "ingest_gb_per_s",
            "memcpy_warm_gb_per_s",
            "memcpy_fresh_gb_per_s",
            "peak_rss_over_buffer",
        ):
            assert finite(ingest[key]), (transport, key)
        assert abs(ingest["bytes"] - 2**20) < 4096  # whole 160-byte steps of 1 MiB
        sync = data["sync"][transport]
        assert sync["sync_rounds"] == 2
        assert finite(sync["sync_round_ms"]) and finite(sync["sync_export_encode_ms"])
    assert finite(data["ingest"]["socket"]["raw_gb_per_s"])

    startup = data["startup"]
    for key in ("first_request_s", "training_start_s", "first_round_s", "import_torch_s"):
        assert finite(startup[key]), key
    assert startup["first_request_s"] < startup["training_start_s"] < startup["first_round_s"]

    keys = {t["key"] for t in data["targets"]}
    assert keys == {t.key for t in TARGETS}
    by_key = {t["key"]: t for t in data["targets"]}
    assert by_key["train.wide.ours_over_roofline"]["met"] is None  # not selected: not measured
    assert by_key["train.default.ours_over_reference"]["met"] in (True, False)
    assert "Targets" in result.output and "Training iterations/s" in result.output


def test_flops_follow_the_layer_widths_and_the_configs_are_the_documented_ones() -> None:
    default, wide, chunk = TRAIN_CONFIGS
    assert default.layer_widths == (41, 128, 128, 8)
    assert default.flops_per_iteration == 6 * 256 * (41 * 128 + 128 * 128 + 128 * 8)  # ≈ 34.8 M
    assert wide.layer_widths == (41, 256, 256, 8) and wide.batch_size == 1024
    assert chunk.layer_widths == (97, 512, 64) and chunk.chunk_size == 8
    assert TrainConfig("x", 0, 4, 2).flops_per_iteration == 6 * 2 * (41 * 4 + 4 * 8)


def test_unknown_names_are_usage_errors() -> None:
    result = CliRunner().invoke(bench_command, ["--sections=train,warp"])
    assert result.exit_code == 2 and "unknown section warp" in result.output


def test_the_report_marks_missing_sections_as_not_measured() -> None:
    results = {
        "meta": {"python": "3", "torch": "2", "cores": 2, "load_before": [], "settings": {"repeats": 5}},
        "targets": [
            {"key": t.key, "target": f"{t.op} {t.bound:g}", "value": math.nan, "met": None, "text": t.text}
            for t in TARGETS
        ],
    }
    text = format_report(results)
    assert text.count("not measured") == len(TARGETS)


def test_the_bench_prints_only_ascii_so_a_cp1252_console_takes_it(tmp_path: Path) -> None:
    """A Windows console or pipe in cp1252 (PYTHONIOENCODING=cp1252 here): the table went out with
    arrows, ≥ and × and ended in UnicodeEncodeError, exit 1, after the whole measurement. Now every
    printed literal of emulator/bench is ASCII (the trainer's own rule, test_ascii_output)."""
    assert non_ascii_literals(Path(emulator.bench.__file__).parent) == []
    out = tmp_path / "bench.json"
    args = ["--sections=sync", "--transports=shm", "--sync-rounds=1", "--ingest-mb=1", "--repeats=1"]
    done = subprocess.run(
        [sys.executable, "-m", "trainer", "bench", *args, "--device=cpu", f"--json={out}"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONIOENCODING": "cp1252"},
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr.decode("cp1252", "replace")
    assert b"Targets" in done.stdout and out.is_file()
    done.stdout.decode("ascii")  # every byte of the table


@pytest.mark.parametrize(
    ("option", "value"),
    [("--ingest-mb", "-1"), ("--ingest-mb", "0"), ("--train-seconds", "-0.5"), ("--threads", "-2")],
)
def test_negative_sizes_are_refused_before_anything_runs(tmp_path: Path, option: str, value: str) -> None:
    result = CliRunner().invoke(bench_command, [f"{option}={value}", f"--json={tmp_path / 'b.json'}"])
    assert result.exit_code == 2, result.output
    assert option in result.output and "range" in result.output
    assert not (tmp_path / "b.json").exists()
