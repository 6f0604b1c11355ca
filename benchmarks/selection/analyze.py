"""Tables for issue 33 phase 1 from benchmarks/results/selection/*.jsonl (runner.py rows).

  python -m benchmarks.selection.analyze benchmarks/results/selection/recipes.jsonl [...] \
      [--seeds 100 101] [--section all]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt

Row = dict[str, Any]
"""One runner.py row (one training), as loaded from JSON."""
Eval = dict[str, Any]
"""One evaluation point of a row (``row["evals"]``)."""
Pick = tuple[int, str, float, int | None]
"""One pilot length's pick: (length, picked recipe, its final quality, its hold iteration)."""
PilotLine = tuple[str, int, str, float, int | None, dict[str, float], dict[str, int | None], list[Pick]]
"""One (task, seed) line of :func:`pilot`: task, seed, best recipe, its final quality and hold iteration,
every candidate's final quality and hold iteration, and the picks."""


def _rank(x: npt.ArrayLike) -> npt.NDArray[np.float64]:
    x = np.asarray(x, float)
    order = x.argsort(kind="mergesort")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x))
    # average ties
    for v in np.unique(x):
        m = x == v
        if m.sum() > 1:
            ranks[m] = ranks[m].mean()
    return ranks


def spearman(a: npt.ArrayLike, b: npt.ArrayLike) -> float:
    ra, rb = _rank(a), _rank(b)
    ra -= ra.mean()
    rb -= rb.mean()
    d = math.sqrt((ra * ra).sum() * (rb * rb).sum())
    return float((ra * rb).sum() / d) if d > 0 else 0.0


TARGETS = {
    "b1": {"on_mode": 0.95, "both_modes_covered": 0.99},
    "four": {"on_mode": 0.95},
    "fourpi": {"on_mode": 0.95},
    "b2": {"success": 0.95, "entropy": 0.88},
    "demo": {"success": 0.95, "entropy": 0.9},
    "b3": {"score": 0.98},
    "b4": {"score": 0.98},
    "b4flat": {"score": 0.98},
}
PRIMARY = {
    "b1": "on_mode",
    "four": "on_mode",
    "fourpi": "on_mode",
    "b2": "q",
    "demo": "q",
    "b3": "score",
    "b4": "score",
    "b4flat": "score",
}

# candidate selection metrics: name -> (source, key, sign); higher = better after the sign
SPECS: dict[str, tuple[str, str | None, float]] = {
    "iteration": ("it", None, 1.0),
    "selection": ("selection", None, 1.0),
    "run_flow_loss(-)": ("heldout", "flow_loss", -1.0),
    "trainer_ES4(-)": ("heldout", "energy_score", -1.0),
    "trainer_cov4": ("heldout", "coverage", 1.0),
    "trainer_prec4": ("heldout", "precision", 1.0),
    "fl_uniform(-)": ("sel", "fl_uniform", -1.0),
    "fl_grid(-)": ("sel", "fl_grid", -1.0),
    "fl_late(-)": ("sel", "fl_uniform_late", -1.0),
    "es16(-)": ("sel", "es16", -1.0),
    "es4(-)": ("sel", "es4", -1.0),
    "mmd@0.1(-)": ("sel", "mmd@0.1", -1.0),
    "mmd@0.25(-)": ("sel", "mmd@0.25", -1.0),
    "mmd@0.5(-)": ("sel", "mmd@0.5", -1.0),
    "cov16@0.25": ("sel", "cov16@0.25", 1.0),
    "prec16@0.25": ("sel", "prec16@0.25", 1.0),
    "cov4@0.25": ("sel", "cov4@0.25", 1.0),
    "prec4@0.25": ("sel", "prec4@0.25", 1.0),
    "f1_16@0.1": ("sel", "f1_16@0.1", 1.0),
    "f1_16@0.25": ("sel", "f1_16@0.25", 1.0),
    "f1_16@0.5": ("sel", "f1_16@0.5", 1.0),
    "f1_4@0.25": ("sel", "f1_4@0.25", 1.0),
    "prod16@0.25": ("sel", "prod16@0.25", 1.0),
    "f1_avg": ("sel", "f1_avg", 1.0),
    "f1c_avg": ("sel", "f1c_avg", 1.0),
    "prec_avg": ("sel", "prec_avg", 1.0),
    "cov_avg": ("sel", "cov_avg", 1.0),
    "es16b0.25(-)": ("sel", "es16b0.25", -1.0),
    "es16b0.5(-)": ("sel", "es16b0.5", -1.0),
    "ks@0.05(-)": ("sel", "ks@0.05", -1.0),
    "ks@0.1(-)": ("sel", "ks@0.1", -1.0),
    "ks@0.25(-)": ("sel", "ks@0.25", -1.0),
    "ks@0.5(-)": ("sel", "ks@0.5", -1.0),
    "ks_multi(-)": ("sel", "ks_multi", -1.0),
}


def getter(name: str, draw: int | str = 0) -> Callable[[Eval], float]:
    src, key, sign = SPECS[name]
    if src == "sel":

        def get(e: Eval, key: str | None = key, sign: float = sign, draw: int | str = draw) -> float:
            sel = e["sel"]
            if key not in sel[0]:
                return math.nan
            return float(sign * (0.5 * (sel[0][key] + sel[1][key]) if draw == "mean" else sel[draw][key]))

        return get
    if src == "selection":
        # The trainer's selection score (trainer/training/heldout.py): f1_avg - es16.
        def score(e: Eval, draw: int | str = draw) -> float:
            parts = [e["sel"][0], e["sel"][1]] if draw == "mean" else [e["sel"][draw]]
            return float(sum(p["f1_avg"] - p["es16"] for p in parts) / len(parts))

        return score
    if src == "it":
        return lambda e: float(e["it"])
    if src == "heldout":
        return lambda e: sign * e["heldout"][key] if e.get("heldout") else math.nan
    if draw == "mean":
        return lambda e: sign * 0.5 * (e["sel"][0][key] + e["sel"][1][key])
    return lambda e: sign * e["sel"][draw][key]


METRICS = {name: getter(name) for name in SPECS}
COMBOS = {
    "R:f1avg+es16": ("f1_avg", "es16(-)"),
    "R:f1avg+flgrid": ("f1_avg", "fl_grid(-)"),
    "R:f1avg+es16+flgrid": ("f1_avg", "es16(-)", "fl_grid(-)"),
    "R:f1@.5+es16": ("f1_16@0.5", "es16(-)"),
    "R:prec_avg+es16": ("prec_avg", "es16(-)"),
}


def values(name: str, evs: Sequence[Eval], draw: int | str = 0) -> list[float]:
    """Scores of the evaluations ``evs`` under metric ``name`` (a combination: the sum of its
    components' ranks within ``evs``)."""
    if name in COMBOS:
        total = np.zeros(len(evs))
        for part in COMBOS[name]:
            total += _rank([getter(part, draw)(e) for e in evs])
        return list(total)
    return [getter(name, draw)(e) for e in evs]


def quality(task: str, m: dict[str, float]) -> float:
    if PRIMARY[task] == "q":
        return min(m[k] / v for k, v in TARGETS[task].items())
    return m[PRIMARY[task]]


def load(paths: Sequence[str], seeds: Sequence[int] | None = None) -> list[Row]:
    rows: list[Row] = []
    for p in paths:
        for line in open(p):
            r = json.loads(line)
            if seeds and r["seed"] not in seeds:
                continue
            r["name"] = r["variant"] + ("" if r["learning_rate"] == 1e-3 else f"@lr{r['learning_rate']:g}")
            rows.append(r)
    # last row wins per (task, seed, name)
    by: dict[tuple[str, int, str], Row] = {}
    for r in rows:
        by[(r["task"], r["seed"], r["name"])] = r
    return list(by.values())


def sp(a: npt.ArrayLike, b: npt.ArrayLike) -> float:
    a, b = np.asarray(a, float), np.asarray(b, float)
    ok = np.isfinite(a) & np.isfinite(b)
    if ok.sum() < 3 or np.ptp(a[ok]) == 0 or np.ptp(b[ok]) == 0:
        return 0.0
    return spearman(a[ok], b[ok])


def pair_acc(xs: Sequence[float], qs: Sequence[float], margin: float) -> tuple[float, float]:
    """Share of pairs with |dq| > margin that the metric orders as the quality does (ties count half)."""
    good = tot = 0.0
    for (x1, q1), (x2, q2) in itertools.combinations(zip(xs, qs, strict=False), 2):
        if abs(q1 - q2) <= margin or not (math.isfinite(x1) and math.isfinite(x2)):
            continue
        tot += 1
        s = (x1 - x2) * (q1 - q2)
        good += 1.0 if s > 0 else (0.5 if s == 0 else 0.0)
    return good, tot


MARGIN = {
    "b1": 0.01,
    "four": 0.01,
    "fourpi": 0.01,
    "b2": 0.01,
    "demo": 0.01,
    "b3": 0.005,
    "b4": 0.005,
    "b4flat": 0.005,
}


def validation(
    rows: list[Row], min_it: int = 0, tasks: Sequence[str] | None = None
) -> dict[str, dict[str, tuple[float, float, float, float, int]]]:
    """Spearman per task: pooled within seed across recipes (mean over seeds), same-iteration (mean over
    (seed, it) groups), same-iteration pairwise accuracy, and the draw noise."""
    tasks = tasks or sorted({r["task"] for r in rows}, key=list(TARGETS).index)
    out = {}
    for task in tasks:
        tr = [r for r in rows if r["task"] == task]
        seeds = sorted({r["seed"] for r in tr})
        res = {}
        for name in [*METRICS, *COMBOS]:
            pooled: list[float] = []
            same: list[float] = []
            good, tot = 0.0, 0.0
            for s in seeds:
                evs = [e for r in tr if r["seed"] == s for e in r["evals"] if e["it"] >= min_it]
                xs = values(name, evs)
                qs = [quality(task, e["metrics"]) for e in evs]
                pooled.append(sp(xs, qs))
                its = sorted({e["it"] for e in evs})
                for it in its:
                    ge = [e for e in evs if e["it"] == it]
                    grp = list(zip(values(name, ge), [quality(task, e["metrics"]) for e in ge], strict=False))
                    if len(grp) >= 3:
                        gx, gq = zip(*grp, strict=False)
                        same.append(sp(gx, gq))
                        g, t = pair_acc(gx, gq, MARGIN[task])
                        good += g
                        tot += t
            res[name] = (
                float(np.mean(pooled)),
                float(np.min(pooled)),
                float(np.mean(same)) if same else math.nan,
                good / tot if tot else math.nan,
                int(tot),
            )
        out[task] = res
    return out


def noise(
    rows: list[Row], tasks: Sequence[str] | None = None
) -> dict[str, dict[str, tuple[float, float, float]]]:
    """Per metric and task: share of same-iteration recipe pairs whose order flips between draw 0 and 1,
    the draw-to-draw std (one draw), and the mean between-recipe std at the same iteration."""
    tasks = tasks or sorted({r["task"] for r in rows}, key=list(TARGETS).index)
    out = {}
    for task in tasks:
        tr = [r for r in rows if r["task"] == task]
        res = {}
        for name, (src, key, _sign) in SPECS.items():
            if src != "sel":
                continue
            flips = tot = 0
            diffs: list[float] = []
            spreads: list[float] = []
            for s in sorted({r["seed"] for r in tr}):
                evs = [e for r in tr if r["seed"] == s for e in r["evals"]]
                for it in sorted({e["it"] for e in evs}):
                    grp = [e for e in evs if e["it"] == it]
                    grp = [e for e in grp if key in e["sel"][0]]
                    a = [e["sel"][0][key] for e in grp]
                    b = [e["sel"][1][key] for e in grp]
                    diffs += [x - y for x, y in zip(a, b, strict=False)]
                    if len(a) >= 2:
                        spreads.append(np.std(a))
                    for i, j in itertools.combinations(range(len(a)), 2):
                        tot += 1
                        flips += (a[i] - a[j]) * (b[i] - b[j]) < 0
            if tot:
                res[name] = (flips / tot, float(np.std(diffs) / math.sqrt(2)), float(np.mean(spreads)))
        out[task] = res
    return out


def hold_it(evals: Sequence[Eval], task: str, budget: int | None = None) -> int | None:
    """First evaluation point from which every target holds to the end (None: not reached)."""
    first: int | None = None
    for e in evals:
        ok = all(e["metrics"].get(k, -1) >= v for k, v in TARGETS[task].items())
        if ok and first is None:
            first = e["it"]
        elif not ok:
            first = None
    return first


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--seeds", nargs="*", type=int)
    ap.add_argument("--section", default="all")
    ap.add_argument("--min-it", type=int, default=0)
    ap.add_argument("--cands", nargs="*", default=["default", "s6"])
    ap.add_argument("--metric", default="f1_avg")
    ap.add_argument("--lengths", nargs="*", type=int, default=[500, 1000, 2000])
    a = ap.parse_args()
    rows = load(a.paths, a.seeds)
    if a.section == "predict":
        ms = a.metric.split(",")
        pred = predict(rows, a.lengths, ms, a.cands if a.cands != ["all"] else None)
        for task, d in pred.items():
            print(
                f"\n## predict {task}: Spearman(metric at P, final quality) across recipes, mean/min over seeds"
            )
            for m in ["quality@P", *ms]:
                print(
                    f"  {m:22s} "
                    + " ".join(
                        f"P={P}: {d[(P, m)][0]:6.3f}/{d[(P, m)][1]:6.3f}" for P in a.lengths if (P, m) in d
                    )
                )
        return
    if a.section == "halving":
        print(
            f"\n## the trainer's pilot: {a.cands}, the lowest {a.metric} stops at {a.lengths[0]}, the best at "
            f"{a.lengths[-1]} goes on; its final quality against the best candidate's (* within the margin)"
        )
        for task, seed, line in halving(rows, a.cands, a.lengths[0], a.lengths[-1], a.metric):
            print(f"  {task:6s} s{seed:<3d} {line}")
        return
    if a.section == "pilot":
        for metric in a.metric.split(","):
            print(
                f"\n## pilot {a.cands} metric {metric} (pick's final quality / hold_it; * = the best at the end or within margin)"
            )
            for task, s, best, qb, _hb, fin, holds, picks in pilot(rows, a.cands, a.lengths, metric):
                cells = []
                for P, pick, q, h in picks:
                    good = q >= qb - MARGIN[task]
                    cells.append(f"{P}:{pick}{'*' if good else ' '}{q:.3f}/{h}")
                    if P == a.lengths[-1] or True:
                        pass
                fins = " ".join(f"{n}={fin[n]:.3f}/{holds[n]}" for n in a.cands)
                print(f"  {task:6s} s{s:<3d} best={best:10s} | {' '.join(cells)} | {fins}")
        return
    if a.section in ("all", "validation"):
        val = validation(rows, a.min_it)
        for task, vres in val.items():
            n = len({(r["seed"], r["name"]) for r in rows if r["task"] == task})
            print(
                f"\n## {task} ({n} runs) metric: pooled-mean pooled-min same-it-spearman same-it-pair-acc (pairs)"
            )
            for name, v in sorted(vres.items(), key=lambda kv: -kv[1][2] if math.isfinite(kv[1][2]) else 9):
                print(f"  {name:18s} {v[0]:6.3f} {v[1]:6.3f} {v[2]:6.3f} {v[3]:6.3f} ({v[4]})")
    if a.section in ("all", "noise"):
        for task, nres in noise(rows).items():
            print(f"\n## noise {task}: flip-rate  draw-sd  between-recipe-sd(same it)")
            for name, nv in nres.items():
                print(f"  {name:18s} {nv[0]:6.3f} {nv[1]:8.4f} {nv[2]:8.4f}")
    if a.section in ("all", "final"):
        tasks = sorted({r["task"] for r in rows}, key=list(TARGETS).index)
        for task in tasks:
            print(f"\n## final {task}")
            names = sorted({r["name"] for r in rows if r["task"] == task})
            for nm in names:
                rs = sorted(
                    [r for r in rows if r["task"] == task and r["name"] == nm], key=lambda r: r["seed"]
                )
                finals = [r["evals"][-1]["metrics"] for r in rs]
                cols = " ".join(f"{k}={min(f[k] for f in finals):.3f}" for k in TARGETS[task])
                hold_its = [hold_it(r["evals"], task) for r in rs]
                spi = np.mean([r["seconds_per_iteration"] for r in rs]) * 1000
                print(
                    f"  {nm:12s} lowest {cols}  hold_it={hold_its} ms/it={spi:.2f} seeds={[r['seed'] for r in rs]}"
                )


def at(r: Row, it: int) -> Eval | None:
    for e in r["evals"]:
        if e["it"] == it:
            return cast(Eval, e)
    return None


def halving(
    rows: list[Row], candidates: Sequence[str], drop: int, pick: int, metric: str
) -> list[tuple[str, int, str]]:
    """Per task and seed: the candidate the trainer's pilot (trainer/training/recipes.py) keeps, scoring
    with ``metric`` (draw 0): the lowest stops at ``drop``, the best of the rest is kept at ``pick``."""
    out = []
    for task in sorted({r["task"] for r in rows}, key=list(TARGETS).index):
        for seed in sorted({r["seed"] for r in rows if r["task"] == task}):
            rs = {
                r["name"]: r
                for r in rows
                if r["task"] == task and r["seed"] == seed and r["name"] in candidates
            }
            if len(rs) < len(candidates) or any(
                at(r, drop) is None or at(r, pick) is None for r in rs.values()
            ):
                continue
            get = getter(metric)
            first = {n: get(cast(Eval, at(r, drop))) for n, r in rs.items()}
            stopped = min(first, key=lambda n: first[n])
            second = {n: get(cast(Eval, at(r, pick))) for n, r in rs.items() if n != stopped}
            kept = max(second, key=lambda n: second[n])
            final = {n: quality(task, r["evals"][-1]["metrics"]) for n, r in rs.items()}
            best = max(final, key=lambda n: final[n])
            good = final[kept] >= final[best] - MARGIN[task]
            finals = " ".join(f"{n}={final[n]:.3f}" for n in candidates)
            out.append(
                (
                    task,
                    seed,
                    f"stops {stopped:9s} keeps {kept:9s}{'*' if good else ' '} {final[kept]:.3f} | {finals}",
                )
            )
    return out


def pilot(
    rows: list[Row],
    candidates: Sequence[str],
    lengths: Sequence[int],
    metric: str = "f1_avg",
    draw: int | str = 0,
    tasks: Sequence[str] | None = None,
    ms: dict[str, float] | None = None,
) -> list[PilotLine]:
    """For each task and seed: the candidate the metric picks at each pilot length, against the best
    candidate at the end of the budget (by the task's quality). ``ms``: name -> ms per iteration (cost)."""
    tasks = tasks or sorted({r["task"] for r in rows}, key=list(TARGETS).index)
    lines: list[PilotLine] = []
    for task in tasks:
        for s in sorted({r["seed"] for r in rows if r["task"] == task}):
            rs = {
                r["name"]: r for r in rows if r["task"] == task and r["seed"] == s and r["name"] in candidates
            }
            if len(rs) < len(candidates):
                continue
            fin = {n: quality(task, r["evals"][-1]["metrics"]) for n, r in rs.items()}
            holds = {n: hold_it(r["evals"], task) for n, r in rs.items()}
            best = max(fin, key=lambda n: fin[n])
            picks: list[Pick] = []
            for P in lengths:
                names = [n for n, r in rs.items() if at(r, P)]
                if len(names) < len(rs):
                    continue
                sc = dict(
                    zip(names, values(metric, [cast(Eval, at(rs[n], P)) for n in names], draw), strict=False)
                )
                pick = max(sc, key=lambda n: sc[n])
                picks.append((P, pick, fin[pick], holds[pick]))
            lines.append((task, s, best, fin[best], holds[best], fin, holds, picks))
    return lines


def predict(
    rows: list[Row], lengths: Sequence[int], metrics: Sequence[str], names: Sequence[str] | None = None
) -> dict[str, dict[tuple[int, str], tuple[float, float]]]:
    """Spearman across recipes (one seed) between a metric at pilot length P and the task's quality at
    the end of the budget; 'quality@P' is the task's own quality at P (an oracle that sees the game)."""
    out: defaultdict[str, dict[tuple[int, str], tuple[float, float]]] = defaultdict(dict)
    for task in sorted({r["task"] for r in rows}, key=list(TARGETS).index):
        for P in lengths:
            for m in ["quality@P", *metrics]:
                vals: list[float] = []
                for s in sorted({r["seed"] for r in rows if r["task"] == task}):
                    rs = [
                        r
                        for r in rows
                        if r["task"] == task and r["seed"] == s and (names is None or r["name"] in names)
                    ]
                    rs = [r for r in rs if at(r, P)]
                    if len(rs) < 3:
                        continue
                    fin = [quality(task, r["evals"][-1]["metrics"]) for r in rs]
                    if m == "quality@P":
                        xs = [quality(task, cast(Eval, at(r, P))["metrics"]) for r in rs]
                    else:
                        xs = values(m, [cast(Eval, at(r, P)) for r in rs])
                    vals.append(sp(xs, fin))
                if vals:
                    out[task][(P, m)] = (float(np.mean(vals)), float(np.min(vals)))
    return out


BUDGET = {
    "b1": 5000,
    "four": 10000,
    "fourpi": 10000,
    "b2": 30000,
    "demo": 8000,
    "b3": 2000,
    "b4": 10000,
    "b4flat": 10000,
}
"""Iterations within which the issue's target must hold (B3: 2,000 of its 10,000-iteration runs)."""


def met_by(r: Row, task: str, budget: int) -> int | None:
    """First point from which the targets hold up to ``budget`` (the run's points beyond are ignored)."""
    evs = [e for e in r["evals"] if e["it"] <= budget]
    return hold_it(evs, task)


def simulate(
    rows: list[Row],
    cands: Sequence[str],
    P: int,
    metric: str,
    cost: dict[tuple[str, str], float],
    batch_factor: Callable[[int], float],
    draw: int | str = 0,
) -> list[dict[str, Any]]:
    """Pilot: the candidates train side by side for P iterations each (cost: batch_factor(K) x the mean
    single cost per iteration), the metric picks one at P, which continues alone to the budget.
    Returns per (task, seed): pick, its final quality, hold iteration, and time-to-target against the
    best fixed recipe among every recipe measured (cost: name -> ms per iteration for that task)."""
    res: list[dict[str, Any]] = []
    for task in sorted({r["task"] for r in rows}, key=list(TARGETS).index):
        B = BUDGET[task]
        for s in sorted({r["seed"] for r in rows if r["task"] == task}):
            allr = {r["name"]: r for r in rows if r["task"] == task and r["seed"] == s}
            rs = {n: allr[n] for n in cands if n in allr}
            if len(rs) < len(cands):
                continue
            names = list(rs)
            evs = [at(rs[n], P) for n in names]
            if any(e is None for e in evs):
                continue
            sc = dict(zip(names, values(metric, cast(list[Eval], evs), draw), strict=False))
            w = max(sc, key=lambda n: sc[n])

            def last(r: Row, budget: int = B) -> Eval:
                return cast(Eval, [e for e in r["evals"] if e["it"] <= budget][-1])

            qw = quality(task, last(rs[w])["metrics"])
            hw = met_by(rs[w], task, B)

            def c(n: str, task: str = task) -> float:
                return cost.get((task, n), 1.0)

            pilot_ms = P * batch_factor(len(names)) * float(np.mean([c(n) for n in names]))
            t = None if hw is None else pilot_ms + max(0, hw - P) * c(w)
            fixed = {n: met_by(r, task, B) for n, r in allr.items()}
            tf = {n: h * c(n) for n, h in fixed.items() if h is not None}
            bestn = min(tf, key=lambda n: tf[n]) if tf else None
            bestq = max(quality(task, last(r)["metrics"]) for n, r in allr.items() if n in cands)
            res.append(
                dict(
                    task=task,
                    seed=s,
                    pick=w,
                    q=qw,
                    hold=hw,
                    t=t,
                    best_fixed=bestn,
                    t_best=tf.get(bestn) if bestn is not None else None,
                    ratio=(t / tf[bestn]) if (t and bestn) else None,
                    best_cand_q=bestq,
                    oracle_in_cands=max(cands, key=lambda n: quality(task, last(rs[n])["metrics"])),
                )
            )
    return res


if __name__ == "__main__":
    main()
