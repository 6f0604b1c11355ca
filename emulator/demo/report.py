"""The demo report: a metrics table (Markdown and plain text), ``metrics.json`` and a three-panel PNG.

Input is one :class:`DemoReport` value (plain numbers and arrays, no torch, no processes), so rendering is
testable on synthetic data and the demo's logic stays in the rest of :mod:`emulator.demo`. Files written by
:func:`write_report` into the output folder:

* ``report.md``: what ran, the results table, training facts, settings, the figure;
* ``report.png``: left, the expert demonstrations coloured by route; middle, the trained policy's
  closed-loop rollouts coloured the same way (failures grey, collisions marked); right, the training loss;
* ``metrics.json``: every number of the report, machine-readable (see :func:`report_json`).

The figure is drawn by :mod:`emulator.demo.figure`; matplotlib is optional (the ``plots`` extra), and
without it the Markdown and JSON are still written and :attr:`ReportFiles.warning` says how to get the
figure.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from emulator.demo.figure import PlottingUnavailable, Trajectories, render_figure
from emulator.tasks.avoid import MODE_NAMES

__all__ = [
    "FIGURE_FILE_NAME",
    "JSON_FILE_NAME",
    "MARKDOWN_FILE_NAME",
    "DemoReport",
    "ReportFiles",
    "ResultRow",
    "render_markdown",
    "report_json",
    "results_table_markdown",
    "results_table_text",
    "write_report",
]

MARKDOWN_FILE_NAME = "report.md"
FIGURE_FILE_NAME = "report.png"
JSON_FILE_NAME = "metrics.json"

FloatArray = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class ResultRow:
    """One line of the results table: a policy, its Euler step count (None for the scripted expert) and
    the B2 metrics of :meth:`emulator.tasks.avoid.Rollouts.metrics`."""

    policy: str
    ode_steps: int | None
    metrics: Mapping[str, float]


@dataclass(frozen=True, slots=True, eq=False)
class DemoReport:
    """Everything the report shows.

    ``loss_curve``: (iteration, smoothed training loss) pairs as the trainer printed them.
    ``training``/``settings``/``timings``: flat maps of facts (numbers, strings, bools); ``timings`` in
    seconds per stage. ``notes``: sentences shown under the table (early stop, missing pieces).
    """

    title: str
    summary: str
    rows: tuple[ResultRow, ...]
    expert: Trajectories
    expert_label: str
    policy: Trajectories
    policy_label: str
    loss_curve: tuple[tuple[int, float], ...]
    training: Mapping[str, Any]
    settings: Mapping[str, Any]
    timings: Mapping[str, float]
    notes: tuple[str, ...] = ()
    command: str = ""


@dataclass(frozen=True, slots=True)
class ReportFiles:
    """Paths written by :func:`write_report`; ``figure`` is None (and ``warning`` set) without matplotlib."""

    markdown: Path
    metrics: Path
    figure: Path | None
    warning: str | None = None


# ---------------------------------------------------------------------------------------------------------
# Tables


def _fmt(value: float | None, digits: int) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value:.{digits}f}"


def _row_cells(row: ResultRow) -> list[str]:
    m = row.metrics
    expert = row.ode_steps is None
    return [
        row.policy,
        "–" if expert else str(row.ode_steps),
        _fmt(m.get("success"), 3),
        _fmt(m.get("entropy"), 3),
        _fmt(m.get("collision"), 3),
        _fmt(m.get("mean_steps"), 1),
        # The scripted expert's call time measures numpy bookkeeping, not a network: not comparable.
        "–" if expert else _fmt(m.get("ms_per_call"), 2),
    ]


_HEADERS = ["policy", "ODE steps", "success", "entropy", "collision", "steps", "ms/call"]


def results_table_markdown(rows: Sequence[ResultRow]) -> str:
    """A Markdown table: the headline metrics, then one column per route (successful episodes)."""
    headers = _HEADERS + list(MODE_NAMES)
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|",
    ]
    for row in rows:
        routes = [_fmt(row.metrics.get(f"mode/{name}"), 0) for name in MODE_NAMES]
        lines.append("| " + " | ".join(_row_cells(row) + routes) + " |")
    return "\n".join(lines)


def results_table_text(rows: Sequence[ResultRow]) -> str:
    """The headline columns aligned for a terminal (first column left, numbers right)."""
    table = [_HEADERS] + [_row_cells(row) for row in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(_HEADERS))]
    out = []
    for r in table:
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)]
        out.append("  ".join(cells).rstrip())
    return "\n".join(out)


def _facts_table(facts: Mapping[str, Any]) -> str:
    lines = ["| | |", "|---|---|"]
    for key, value in facts.items():
        if isinstance(value, float):
            text = f"{value:.4g}"
        elif isinstance(value, (list, tuple)):
            text = ", ".join(str(v) for v in value)
        else:
            text = str(value)
        lines.append(f"| {key} | {text} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# JSON and Markdown


def _finite_or_none(value: float) -> float | None:
    # JSON has no NaN/Infinity; a missing number is null rather than an invalid file.
    return value if math.isfinite(value) else None


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return _finite_or_none(float(value))
    if isinstance(value, Path):
        return str(value)
    return value


def report_json(report: DemoReport) -> dict[str, Any]:
    """The machine-readable report.

    Keys: ``title``; ``expert`` (metrics of the first row without ODE steps); ``policy`` (metrics per
    Euler step count, keyed by the count as a string); ``rows`` (every table row in order); ``training``
    (facts plus ``loss_curve`` as [iteration, loss] pairs); ``settings``; ``timings_s``; ``notes``;
    ``command``. Non-finite numbers become null.
    """
    expert = next((dict(r.metrics) for r in report.rows if r.ode_steps is None), {})
    policy = {str(r.ode_steps): dict(r.metrics) for r in report.rows if r.ode_steps is not None}
    training = dict(report.training)
    training["loss_curve"] = [[int(i), float(loss)] for i, loss in report.loss_curve]
    result: dict[str, Any] = _jsonable(
        {
            "title": report.title,
            "expert": expert,
            "policy": policy,
            "rows": [
                {"policy": r.policy, "ode_steps": r.ode_steps, "metrics": dict(r.metrics)}
                for r in report.rows
            ],
            "training": training,
            "settings": dict(report.settings),
            "timings_s": dict(report.timings),
            "notes": list(report.notes),
            "command": report.command,
        }
    )
    return result


def render_markdown(report: DemoReport, figure_name: str | None) -> str:
    """``report.md``: summary, results table, notes, the figure (if drawn), training facts, settings."""
    parts = [
        f"# {report.title}",
        "",
        report.summary,
        "",
        "## Results",
        "",
        results_table_markdown(report.rows),
    ]
    parts += [
        "",
        "*success*: reached y ≥ 1 without touching an obstacle; *entropy*: Shannon entropy of the route "
        "histogram of successful episodes / log 6 (1.0 = all six routes equally often); *collision*: ended "
        "on an obstacle; *steps*: mean episode length; *ms/call*: wall-clock per batched policy call "
        "through the engine's inference path (encoder → Euler steps of the denoiser → decoder). The route "
        "columns count successful episodes per route (side of the first obstacle – gap of the second row).",
    ]
    if report.notes:
        parts += ["", *[f"> {note}" for note in report.notes]]
    if figure_name is not None:
        parts += [
            "",
            "## Trajectories and loss",
            "",
            f"![expert vs policy trajectories and the training loss]({figure_name})",
            "",
            f"Left: {report.expert_label}. Middle: {report.policy_label}. Colours are routes; grey paths "
            "failed (× where they hit an obstacle). Right: the trainer's smoothed loss as printed on stdout "
            "(a dotted line marks where the trainer switches to few-step distillation, whose loss has another "
            "scale).",
        ]
    parts += ["", "## Training", "", _facts_table(report.training)]
    parts += ["", "## Settings", "", _facts_table(report.settings)]
    if report.timings:
        parts += [
            "",
            "## Wall-clock",
            "",
            _facts_table({k: f"{v:.1f} s" for k, v in report.timings.items()}),
        ]
    if report.command:
        parts += ["", "Reproduce with:", "", "```bash", report.command, "```"]
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------------------------------------------------
# Files


def _write_text_atomically(path: Path, text: str) -> None:
    # A reader (or a second demo run) never sees half a report. A plain open() (not mkstemp) so that the
    # file gets the user's umask permissions like any other output.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_report(report: DemoReport, out_dir: Path) -> ReportFiles:
    """Write ``metrics.json``, ``report.png`` (when matplotlib is available) and ``report.md`` into
    ``out_dir`` (created if missing). A stale ``report.png`` from an earlier run is removed when no new
    one can be drawn, so the Markdown never shows an old figure."""
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics_path = out_dir / JSON_FILE_NAME
    _write_text_atomically(metrics_path, json.dumps(report_json(report), indent=2) + "\n")
    figure_path: Path | None = out_dir / FIGURE_FILE_NAME
    warning = None
    try:
        render_figure(report, out_dir / FIGURE_FILE_NAME)
    except PlottingUnavailable as error:
        warning = str(error)
        (out_dir / FIGURE_FILE_NAME).unlink(missing_ok=True)
        figure_path = None
    markdown_path = out_dir / MARKDOWN_FILE_NAME
    text = render_markdown(report, FIGURE_FILE_NAME if figure_path is not None else None)
    if warning is not None:
        text += f"\n> {warning}\n"
    _write_text_atomically(markdown_path, text)
    return ReportFiles(markdown_path, metrics_path, figure_path, warning)
