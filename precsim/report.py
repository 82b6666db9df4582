"""Sweep reports: ``python -m precsim.report DIR [--metric rel_err --budget 0.0625 --horizon N]``.

What it reads and writes is :data:`REPORT_HELP` (docs/sweeps.md); jobs
that failed or never finished get one row each in ``sweep_summary.csv``. Also :func:`run_verdict`,
the budget verdict the CLI prints at the end of a single run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from . import result as res
from .errors import PrecsimError, print_error

METRICS = ("kl", "rel_err", "state_drift")
CSV_FILE = "sweep_summary.csv"
ERROR_PLOT = "sweep_error_vs_length.png"
PARETO_PLOT = "sweep_pareto.png"
ERROR_FILE = "error.txt"
_IGNORED_OVERRIDES = ("run.progress", "run.out_dir")
_COST_COLS = ("bytes_per_step", "fraction_of_fp32", "roofline_speedup",
              "state_transfers_per_step", "bytes_per_token")  # (per token: whole-model runs)


class ReportError(PrecsimError):
    """Bad input to the report (missing directory, no results, bad horizon)."""


@dataclass
class Job:
    """One run directory: ``status`` is complete, failed, broken or incomplete."""

    path: Path
    name: str
    status: str
    overrides: dict[str, str] = field(default_factory=dict)
    summary: dict | None = None
    error: str | None = None


@dataclass
class Candidate:
    """One (job, scheme) configuration evaluated at ``length`` (<= the horizon)."""

    job: str
    scheme: str
    label: str
    bytes_per_step: float
    value: float
    length: int
    tag: str = ""  # the job's overrides that differ between jobs (short keys)


@dataclass
class Aggregate:
    jobs: list[Job]
    rows: list[dict]
    csv_path: Path
    plots: list[Path]

    @property
    def n_complete(self) -> int:
        return sum(j.status == "complete" for j in self.jobs)


# -- reading ---------------------------------------------------------------------------------
def check_run_dir(path: Path) -> str | None:
    """``None`` when ``path`` holds a complete, readable result; else why not (one line). A run
    over every recorded layer of a trace (precsim.layers) holds its results in its layers'
    folders: each must hold one."""
    path = Path(path)
    subs = layer_dirs(path)
    if subs:
        return next((f"{d}: {why}" for d in subs if (why := check_run_dir(path / d))), None)
    if not res.is_complete(path):
        return f"no complete {res.SUMMARY_FILE}"
    try:
        summary = json.loads((path / res.SUMMARY_FILE).read_text())
        rows = res.read_rows(path / res.METRICS_FILE)
    except (OSError, ValueError) as e:
        return f"unreadable result files ({e})"
    steps = summary.get("steps")
    for scheme in summary.get("schemes", {}):
        last = max((r.get("step", -1) for r in rows if r.get("scheme") == scheme), default=None)
        if last is None or (steps is not None and last != steps):
            return f"{res.METRICS_FILE} is truncated (scheme {scheme} ends at step {last})"
    return None


def layer_dirs(path: Path) -> list[str]:
    """The layer folders a complete run over every recorded layer of a trace names in its
    summary.json (``info.layer_dirs``, precsim.layers); none for any other run directory."""
    try:
        s = json.loads((path / res.SUMMARY_FILE).read_text())
        subs = s["info"]["layer_dirs"] if s.get("complete") is True else []
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return []
    import re

    ok = isinstance(subs, list) and all(re.fullmatch(r"layer_\d+", str(d)) for d in subs)
    return subs if ok else []


def _scheme_rows(job: Job) -> dict[str, list[dict]]:
    """Each scheme's per-window rows of a complete job: its metrics.csv, or for a run over
    every recorded layer, the rows of the scheme's worst layer (its summary's figures)."""
    subs, files = layer_dirs(job.path), {}
    out = {}
    for s in job.summary.get("schemes", {}):
        d = "."
        if subs:
            worst = job.summary["figures"][s]["final"].get("worst_layer")
            d = f"layer_{worst:02d}" if isinstance(worst, int) else ""
            d = d if d in subs else subs[0]
        if d not in files:
            files[d] = res.read_rows(job.path / d / res.METRICS_FILE)
        out[s] = [r for r in files[d] if r["scheme"] == s]
    return out


def _read_overrides(path: Path) -> dict[str, str]:
    f = path / ".hydra" / "overrides.yaml"
    if not f.is_file():
        return {}
    import yaml

    out = {}
    for item in yaml.safe_load(f.read_text()) or []:
        key, sep, value = str(item).partition("=")
        key = key.lstrip("+")
        if sep and not key.startswith("~") and key not in _IGNORED_OVERRIDES:
            out[key] = value
    return out


def _is_job_dir(path: Path) -> bool:
    return any((path / n).exists() for n in (res.SUMMARY_FILE, ".hydra", ERROR_FILE))


def collect(root: Path) -> list[Job]:
    """Every job directory under ``root`` (``root`` itself when it is one), in name order."""
    root = Path(root)
    if not root.is_dir():
        raise ReportError(f"{root} is not a directory")
    dirs = []
    for cur, subdirs, _ in os.walk(root):
        p = Path(cur)
        if _is_job_dir(p):
            dirs.append(p)
            subdirs[:] = []  # a job directory holds no further jobs
        else:
            subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
    jobs = []
    for p in sorted(dirs, key=lambda p: _natural_key(p.relative_to(root).as_posix())):
        name = p.relative_to(root).as_posix()
        job = Job(path=p, name=name, status="complete", overrides=_read_overrides(p))
        why = check_run_dir(p)
        if why is None:
            job.summary = json.loads((p / res.SUMMARY_FILE).read_text())
        else:
            err = p / ERROR_FILE
            at = res.interrupted_at(p)
            if err.is_file():
                job.status, job.error = "failed", (err.read_text().splitlines() or [""])[0]
            elif at is not None:
                job.status, job.error = "incomplete", f"interrupted at step {at:,}"
            elif (p / res.SUMMARY_FILE).exists():
                job.status, job.error = "broken", why
            else:
                job.status = "incomplete"
        jobs.append(job)
    return jobs


def _natural_key(s: str) -> list:
    import re

    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


# -- the summary table -----------------------------------------------------------------------
def _lengths(jobs: list[Job]) -> list[int]:
    out = set()
    for j in jobs:
        for figs in (j.summary or {}).get("figures", {}).values():
            out.update(int(k) for k in figs if k.isdigit())
    return sorted(out)


def _costs(summary: dict) -> dict:
    if summary.get("cost"):
        return summary["cost"]
    try:  # results written before the cost model existed: recompute from the config
        from .config import to_config
        from .cost import scheme_costs

        return scheme_costs(to_config(summary["config"]))
    except Exception:  # noqa: BLE001 - the cost columns stay empty
        return {}


def summary_rows(jobs: list[Job]) -> list[dict]:
    """The rows of ``sweep_summary.csv`` (see the module docstring)."""
    keys = list(dict.fromkeys(k for j in jobs for k in j.overrides))
    lengths = _lengths(jobs)
    rows = []
    for j in jobs:
        base = {"job": j.name, "status": j.status, **{k: j.overrides.get(k) for k in keys}}
        if j.summary is None:
            rows.append({**base, "error": j.error})
            continue
        s = j.summary
        cost = _costs(s)
        replay = s.get("config", {}).get("replay", {})
        for scheme, figs in s.get("figures", {}).items():
            info = s.get("schemes", {}).get(scheme, {})
            row = {**base, "scheme": scheme, "label": info.get("label", scheme),
                   **{k: info.get(k) for k in ("kind", "fmt", "rounding", "read_fmt")},
                   "buffer_len": replay.get("buffer_len"), "steps": s.get("steps"),
                   "dead_at": info.get("dead_at")}
            for L in [*lengths, "final"]:
                f = figs.get(str(L), {})
                for m in METRICS:
                    row[f"{m}@{L}"] = f.get(m)
            for c in _COST_COLS:
                row[c] = cost.get(scheme, {}).get(c)
            rows.append(row)
    # one column set for all rows, in first-seen order
    cols = list(dict.fromkeys(k for r in rows for k in r))
    return [{c: r.get(c) for c in cols} for r in rows]


# -- recommendation --------------------------------------------------------------------------
def candidates(jobs: list[Job], metric: str, horizon: int | None = None) -> list[Candidate]:
    """Every complete (job, scheme) with ``metric`` at the largest reported length <= horizon
    (the run's last step counts as a reported length). Non-finite or dead schemes get inf.
    Identical configurations repeated across jobs (a baseline in every job) appear once."""
    if metric not in METRICS:
        raise ReportError(f"--metric={metric!r} is unknown; allowed: {', '.join(METRICS)}")
    out: list[Candidate] = []
    tags = short_tags([j for j in jobs if j.summary is not None])
    for j in jobs:
        if j.summary is None:
            continue
        cost = _costs(j.summary)
        for scheme, figs in j.summary.get("figures", {}).items():
            avail = {int(k): v for k, v in figs.items() if k.isdigit()}
            if "final" in figs and figs["final"].get("step") is not None:
                avail.setdefault(int(figs["final"]["step"]), figs["final"])
            usable = [L for L in avail if horizon is None or L <= horizon]
            b = cost.get(scheme, {}).get("bytes_per_step")
            if not usable or b is None:
                continue
            L = max(usable)
            v = avail[L].get(metric)
            info = j.summary.get("schemes", {}).get(scheme, {})
            dead = info.get("dead_at")
            if v is None or not math.isfinite(v) or (dead is not None and dead <= L):
                v = math.inf
            label = info.get("label", scheme)
            c = Candidate(j.name, scheme, label, float(b), float(v), L, tags[j.name])
            twin = next((o for o in out if _same(c, o)), None)
            if twin is None:
                out.append(c)
            else:  # a baseline repeated in every job: listed once, without a job's tag
                twin.tag = ""
    return out


def _same(a: Candidate, b: Candidate) -> bool:
    return ((a.label, a.bytes_per_step, a.length) == (b.label, b.bytes_per_step, b.length)
            and (a.value == b.value or abs(a.value - b.value) <= 1e-3 * abs(a.value)))


@dataclass
class Recommendation:
    budget: float
    within: list[Candidate]  # cheapest first (ties: the more accurate first)
    over: list[Candidate]  # the rest, cheapest first

    @property
    def best(self) -> Candidate | None:
        return self.within[0] if self.within else None


def recommend(cands: list[Candidate], budget: float) -> Recommendation:
    """Split ``cands`` at ``budget`` and sort each side by bytes per step."""
    order = sorted(cands, key=lambda c: (c.bytes_per_step, c.value))
    within = [c for c in order if c.value <= budget]
    over = [c for c in order if c.value > budget]
    return Recommendation(budget, within, over)


def format_recommendation(rec: Recommendation, metric: str, horizon: int | None,
                          top: int = 3) -> str:
    """The text the CLI prints (see the module docstring)."""
    lines = []
    all_c = rec.within + rec.over
    used = sorted({c.length for c in all_c})
    hz = "the longest run" if horizon is None else f"horizon {horizon:,}"
    lines.append(f"metric {metric} <= {rec.budget:g} at {hz}; {len(all_c)} configurations")
    if horizon is not None and used and max(used) < horizon:
        lines.append(f"note: no run reached the horizon; figures at length "
                     f"{', '.join(f'{L:,}' for L in used)} used (largest reported <= {horizon:,})")
    best = rec.best
    if best is None:
        acc = min(all_c, key=lambda c: (c.value, c.bytes_per_step))
        lines.append(f"NO configuration is within the budget: the most accurate is {acc.label} "
                     f"({metric}={_g(acc.value)} at length {acc.length:,}, "
                     f"{acc.bytes_per_step:,.0f} B/step; job {acc.job}, scheme {acc.scheme}).")
        return "\n".join(lines)
    headroom = rec.budget / best.value if best.value > 0 else math.inf
    under = f"{_g(headroom)}x under the budget" if best.value > 0 else "exact (0)"
    lines.append(f"recommended: {best.label}  (job {best.job}, scheme {best.scheme})")
    lines.append(f"  {best.bytes_per_step:,.0f} bytes/step/head; {metric}={_g(best.value)} at "
                 f"length {best.length:,}")
    margin = f"  margin: {under}"
    if len(rec.within) > 1:
        nxt = rec.within[1]
        extra = 100 * (nxt.bytes_per_step / best.bytes_per_step - 1)
        margin += (f"; the runner-up costs {extra:+.1f}% bytes/step" if extra > 0.05 else
                   f"; the runner-up costs the same bytes/step at {metric}={_g(nxt.value)}")
    cheaper = [c for c in rec.over if c.bytes_per_step < best.bytes_per_step]
    if cheaper:
        c = cheaper[-1]
        margin += (f"; the next cheaper ({c.label}, {c.bytes_per_step:,.0f} B) misses it with "
                   f"{metric}={_g(c.value)}")
    lines.append(margin)
    if len(rec.within) > 1:
        lines.append("runners-up within the budget (cheapest first):")
        lines += [_cand_line(i + 2, c, metric) for i, c in enumerate(rec.within[1:1 + top])]
    return "\n".join(lines)


# -- what is comparable -----------------------------------------------------------------------
@dataclass
class Group:
    """Complete jobs whose figures measure the same thing: one workload kind (a synthetic layer
    run, a trace replay, a whole-model run), one SSM family and layer shape (a trace: the same
    trace; a whole model: the same checkpoint). Only runs of one group are ranked together."""

    key: tuple
    title: str
    jobs: list[Job]


def workload_kind(summary: dict) -> str:
    """``synthetic``, ``trace`` or ``model`` (a whole-model run: its figures are the logits')."""
    info = summary.get("info") or {}
    cfg = summary.get("config") or {}
    w = str(info.get("workload") or (cfg.get("workload") or {}).get("kind") or "synthetic")
    if w == "model" or (cfg.get("model") or {}).get("path"):
        return "model"
    return "trace" if w.startswith("trace") else "synthetic"


_FAMILY = {"mamba2": "Mamba-2", "gdn": "Gated DeltaNet"}


def _group_of(summary: dict) -> tuple[tuple, str]:
    cfg = summary.get("config") or {}
    m, w = cfg.get("model") or {}, cfg.get("workload") or {}
    kind = workload_kind(summary)
    fam = _FAMILY.get(m.get("family"), m.get("family"))
    dims = [m.get(k) for k in ("heads", "head_dim", "state_dim")]
    shape = (f"{dims[0]} head{'s' if dims[0] != 1 else ''} x {dims[1]} x {dims[2]}"
             if all(d is not None for d in dims) else None)
    if kind == "model":
        path = (summary.get("info") or {}).get("model_path") or m.get("path")
        name = Path(str(path)).name if path else "?"
        return (kind, str(path)), (f"whole-model runs of {name} (the metric measures the "
                                   "model's logits against its baseline, metrics.baseline)")
    layer = " ".join(x for x in (fam, "layer" if fam else None, shape and f"({shape})") if x)
    if kind == "trace":
        src = w.get("path")
        where = f" of {Path(str(src)).name}" if src else ""
        lay = f" layer {w['layer']}" if w.get("layer") is not None else ""
        return (kind, src, w.get("layer"), m.get("family"), tuple(dims)), \
            f"trace replays{where}{lay}" + (f", {layer}" if layer else "")
    return (kind, m.get("family"), tuple(dims)), \
        "synthetic layer runs" + (f", {layer}" if layer else "")


def comparable_groups(jobs: list[Job]) -> list[Group]:
    """The complete jobs in groups (:class:`Group`), in the order of their first job."""
    out: dict[tuple, Group] = {}
    for j in jobs:
        if j.summary is None:
            continue
        key, title = _group_of(j.summary)
        out.setdefault(key, Group(key, title, [])).jobs.append(j)
    return list(out.values())


def longest_run(jobs: list[Job]) -> int:
    """The most steps any complete job ran (0: none)."""
    return max((int(j.summary.get("steps") or 0) for j in jobs if j.summary is not None),
               default=0)


def decide(jobs: list[Job], metric: str, budget: float | None, horizon: int | None = None
           ) -> list[tuple[Group, list[Candidate], Recommendation | None]]:
    """Per comparable group: its candidates and, with a budget, its recommendation."""
    out = []
    for g in comparable_groups(jobs):
        cands = candidates(g.jobs, metric, horizon)
        out.append((g, cands, recommend(cands, budget) if budget is not None and cands
                    else None))
    return out


def format_decision(decision, metric: str, horizon: int | None, top: int = 3) -> str:
    """The recommendation of each group (one group: :func:`format_recommendation`, after a line
    saying what was compared)."""
    lines = []
    if len(decision) > 1:
        lines.append(f"the runs form {len(decision)} groups that are not ranked against each "
                     "other (another workload kind, SSM family, layer shape, trace or "
                     "checkpoint): a recommendation within each")
    for i, (g, cs, rec) in enumerate(decision, 1):
        if not cs:
            continue
        n = len(g.jobs)
        what = f"{g.title} ({n} job{'s' if n > 1 else ''})"
        lines.append(f"== group {i} of {len(decision)}: {what}" if len(decision) > 1 else
                     f"compared: {what}")
        if rec is not None:
            lines.append(format_recommendation(rec, metric, horizon, top))
        else:
            at = f"the largest length <= {horizon:,}" if horizon else "each run's last step"
            lines.append(f"configurations by bytes/step ({metric} at {at}):")
            order = sorted(cs, key=lambda c: (c.bytes_per_step, c.value))
            lines += [_cand_line(k + 1, c, metric) for k, c in enumerate(order)]
    for g, cs, _ in decision:
        if not cs:
            lines.append(f"({g.title}: no reported length <= the horizon; not compared)")
    lines += relation_lines(decision)
    return "\n".join(lines)


def _recording_model(src) -> str | None:
    """The checkpoint a recording directory was made from (its record.json), else None."""
    import json

    try:
        meta = json.loads((Path(str(src)) / "record.json").read_text())
    except (OSError, ValueError, TypeError):
        return None
    return meta.get("model_path")


def relation_lines(decision) -> list[str]:
    """Where the runs hold both layer replays of a recording and whole-model runs of the
    checkpoint it was recorded from: how the two verdicts relate, and which to trust for what."""
    def same(a, b) -> bool:
        try:
            return Path(str(a)).resolve() == Path(str(b)).resolve()
        except OSError:
            return False

    def best(rec) -> str:
        return rec.best.label if rec is not None and rec.best is not None else "nothing"

    out = []
    for i, (gm, cm, rm) in enumerate(decision, 1):
        if gm.key[0] != "model" or not cm:
            continue
        for j, (gt, ct, rt) in enumerate(decision, 1):
            if gt.key[0] != "trace" or not ct or not same(_recording_model(gt.key[1]),
                                                         gm.key[1]):
                continue
            agree = best(rm) == best(rt)
            out.append(
                f"note: group {j} replays layers of a recording of group {i}'s checkpoint: the "
                f"replays recommend {best(rt)} (each layer's own output error against the "
                f"float64 truth), the whole model {best(rm)} (its next-token distributions "
                f"against its baseline){'' if agree else ': they differ'}. For the deployment "
                "decision trust the whole-model verdict (it weighs what the rest of the model "
                "does with each layer's error, against the model's own floor); the replays "
                "show which layers are sensitive and reach long horizons cheaply "
                "(docs/real-models.md)")
    return out


def _cand_line(rank: int, c: Candidate, metric: str) -> str:
    return (f"  {rank:>2}. {c.bytes_per_step:>10,.0f} B  {metric}={_g(c.value):<9} "
            f"@{c.length:<7,} {c.label}  [{c.tag or c.job} / {c.scheme}]")


def _g(v: float) -> str:
    if not math.isfinite(v):
        return "inf" if v > 0 else "nan"
    return f"{v:.3g}"


# -- one run's verdict -----------------------------------------------------------------------
# in a whole-model run the same columns measure the model's logits against the float64-state
# reference (precsim.models)
MODEL_MEANING = {
    "rel_err": lambda b: f"the logits' relative RMS error <= {b:g} vs the float64-state reference",
    "kl": lambda b: f"KL(p_ref || p_scheme) <= {b:g} nats/token of the model's own next-token "
                    "distributions",
}


def _meaning(summary: dict, metric: str, budget: float) -> str:
    info = summary.get("info") or {}
    if info.get("workload") == "model" and metric in MODEL_MEANING:
        text = MODEL_MEANING[metric](budget)
        if (info.get("floor") or {}).get("baseline") == "fp32":
            text = text.replace("vs the float64-state reference", "vs the FP32-state baseline")
            text += " against the FP32-state baseline" if metric == "kl" else ""
        return text
    return BUDGET_MEANING[metric](budget)


BUDGET_MEANING = {
    "rel_err": lambda b: (f"the layer output's RMS error <= {100 * b:.3g}% of its RMS vs the "
                          f"float64 truth, i.e. an output SNR >= {-20 * math.log10(b):.1f} dB"
                          if b < 1 else "the layer output's relative RMS error vs float64"),
    "kl": lambda b: (f"KL(p_ref || p_sim) <= {b:g} nats/token through the random readout "
                     "(its size scales with metrics.logit_scale^2)"),
    "state_drift": lambda b: f"the held state's relative Frobenius error <= {b:g}",
}


def margin_text(value: float, budget: float) -> str:
    """'fits, 29% under' / 'fits, 2.5e+05x under' / 'misses by 42%' / 'misses by 3.1x'."""
    if not math.isfinite(value):
        return "misses (non-finite)"
    if value <= budget:
        if value <= 0:
            return "fits (exact)"
        r = budget / value
        return f"fits, {100 * (1 - 1 / r):.0f}% under" if r < 10 else f"fits, {r:.2g}x under"
    r = value / budget
    return f"misses by {100 * (r - 1):.0f}%" if r < 2 else f"misses, {r:.2g}x over"


def knob(scheme: str, info: dict, config: dict) -> str:
    """The setting most likely to bring a scheme that misses the budget within it."""
    kind, fmt, rd = info.get("kind"), info.get("fmt"), info.get("read_fmt")
    key = f"schemes.{scheme}"
    four = ("nvfp4", "mxfp4", "fp4_e2m1")
    if kind == "split":
        if rd in four:
            return f"an FP8 read copy ({key}.read_fmt=fp8_e4m3): its error is the read copy's"
        if info.get("rounding") == "rne" and fmt not in ("fp32", "fp64"):
            return f"stochastic rounding of the master ({key}.rounding=sr)"
        return f"a wider read copy ({key}.read_fmt=bf16)"
    if kind == "shared":
        L = int((config.get("replay") or {}).get("buffer_len") or 16)
        alt = f" or a wider checkpoint ({key}.fmt=fp8_e4m3)" if fmt in four else ""
        return (f"a longer buffer (replay.buffer_len={2 * L}: half the roundings of the "
                f"checkpoint){alt}")
    if info.get("rounding") == "rne" and fmt not in ("fp32", "fp64"):
        return f"stochastic rounding ({key}.rounding=sr)"
    return (f"a ReplaySSM split scheme with {fmt} as the read copy (kind=split, fmt=fp32, "
            f"read_fmt={fmt})")


def run_verdict(summary: dict, metric: str, budget: float, run_dir: Path | str) -> str:
    """What the CLI prints at the end of a run: every scheme's status against the budget at the
    run's last step (cheapest first), the recommendation with its margin, the knob that would
    change the answer on a near miss, and the report command for this directory and budget."""
    steps = int(summary.get("steps") or 0)
    cost = _costs(summary)
    rows = []
    for name, figs in summary.get("figures", {}).items():
        info = summary.get("schemes", {}).get(name, {})
        v = (figs.get("final") or {}).get(metric)
        dead = info.get("dead_at")
        v = math.inf if v is None or not math.isfinite(v) or dead is not None else float(v)
        rows.append((float(cost.get(name, {}).get("bytes_per_step") or math.inf), v, name, info))
    rows.sort(key=lambda r: (r[0], r[1]))
    from .floor import (
        confidence_note,
        floor_exceeds,
        floor_lines,
        interval,
        separation_line,
        within_noise,
    )

    floor = (summary.get("info") or {}).get("floor")
    # every-layer replays of a recording: the model's own cast of each layer's output
    of = None
    if metric == "rel_err":
        of = (summary.get("info") or {}).get("output_floor")
        wl = (summary.get("config") or {}).get("workload") or {}
        if of is None and wl.get("kind") == "trace" and wl.get("path"):  # one recorded layer
            from .floor import output_floor_of

            of = output_floor_of(wl["path"]).get("output_floor")
    lines = [f"budget: {metric} <= {budget:g} at step {steps:,} "
             f"({_meaning(summary, metric, budget)}; metrics.budget_metric, metrics.budget)"]
    if floor:
        lines += floor_lines(floor, metric, budget)
    if of:
        from .floor import output_floor_line

        lines.append(output_floor_line(of))
    w = max([len(r[2]) for r in rows] + [6])
    figs = summary.get("figures", {})
    ci = bool(floor) and metric in ("kl", "top1")
    lines.append(f"  {'scheme':<{w}}  {'B/step/head':>11}  {metric:>9}  "
                 + (f"{'95% interval':>22}  " if ci else "") + "status")
    for b, v, name, _ in rows:
        fin = figs.get(name, {}).get("final", {})
        band = f"{interval(fin.get(metric + '_lo'), fin.get(metric + '_hi')):>22}  " if ci else ""
        base = (floor.get("baseline_name") == name and floor.get("baseline") == "fp32"
                ) if floor else False
        tail = ("the baseline" if base else "within the floor's noise"
                if within_noise(v, floor, metric) else
                f"below floor ({_g(of['rel_err'])})" if of and v <= of["rel_err"] else "")
        status = margin_text(v, budget) + (f" ({tail})" if tail else "")
        lines.append(f"  {name:<{w}}  {b:>11,.0f}  {_g(v):>9}  {band}{status}")
    fits = [r for r in rows if r[1] <= budget]
    blocked = floor_exceeds(floor, metric, budget)
    if blocked:
        lines.append(blocked)
        fits = None
    if fits is None:
        pass
    elif not fits:
        b, v, name, info = min(rows, key=lambda r: (r[1], r[0]))
        hint = knob(name, info, summary.get("config", {}))
        lines.append(f"NO scheme is within the budget; the most accurate is {name} "
                     f"({metric}={_g(v)}, {margin_text(v, budget)}); try {hint}")
    else:
        b, v, name, info = fits[0]
        top = max(r[0] for r in rows)
        save = f", {top / b:.2g}x fewer bytes than the costliest" if top > b * 1.01 else ""
        lines.append(f"recommended: {info.get('label', name)} [{name}]: {b:,.0f} B/step/head"
                     f"{save}; {metric}={_g(v)}, {margin_text(v, budget)} the budget")
        if (summary.get("info") or {}).get("workload") == "model":  # how to serve it
            from .serving import next_step_line

            lines.append(f"  {next_step_line(info)}")
        if floor and metric in ("kl",):
            fin = figs.get(name, {}).get("final", {})
            lines.append(f"  {confidence_note(fin, budget, metric)}")
            cheaper = [r for r in rows if r[0] < b]
            for other in ([cheaper[-1]] if cheaper else []) + [rows[-1]]:
                if other[2] != name:
                    sep = separation_line(floor, name, other[2])
                    if sep:
                        lines.append(sep)
        elif v > 0 and budget / v < 1.1:
            lines.append("  note: within 10% of the budget; check with more sequences "
                         "(run.seqs) or seeds before relying on it")
        for cb, cv, cname, cinfo in rows:
            if cb < b and cv <= 2 * budget and "per_layer" not in (summary.get("info") or {}):
                lines.append(f"  near miss: {cname} ({cb:,.0f} B) {margin_text(cv, budget)}; "
                             f"what could make it fit (at more bytes: rerun to compare): "
                             f"{knob(cname, cinfo, summary.get('config', {}))}")
    pl = (summary.get("info") or {}).get("per_layer")
    if pl:
        lines += per_layer_lines(pl)
    gen = (summary.get("info") or {}).get("generation")
    if gen:
        from .floor import generation_lines

        lines += generation_lines(gen)
    lines.append("to compare with other runs: python -m precsim.report "
                 f"{shlex.quote(str(run_dir))} --metric {metric} --budget {budget:g}")
    return "\n".join(lines)


def per_layer_lines(pl: dict) -> list[str]:
    """The per-layer block of a run's verdict: the assignment beside the best uniform scheme."""
    from .result import SENS_CSV, SENS_PNG

    metric, budget = pl["metric"], pl["budget"]
    n = len(pl["layers"])
    lines = [f"per-layer assignment ({pl['template']}'s {pl['slot']} per layer, from "
             f"{', '.join(pl['formats'])}; sensitivity: {pl['sensitivity_runs']} one-layer runs, "
             f"{SENS_CSV}, {SENS_PNG}):"]
    below = pl.get("below_floor") or {}
    n_below = sum(bool(v) for per in below.values() for v in per.values())
    if n_below:
        which = "; ".join(
            f"{f}: " + ", ".join(f"L{la} below floor ({_g(pl['added'][f][la])})"
                                 for la, v in per.items() if v)
            for f, per in below.items() if any(per.values()))
        lines.append(f"  {n_below} of {n * len(pl['formats'])} sensitivities are below the "
                     f"floor ({metric} {_g(pl['floor'])}, the model's own noise) and are taken "
                     f"at it: {which}")
    for i, rd in enumerate(pl["rounds"], 1):
        lines.append(f"  verification {i}: {as_override(rd['layers'])}: "
                     f"{rd['bytes_per_token']:,.0f} B/token,"
                     f" {metric}={_g(rd['measured'])} (predicted {_g(rd['predicted'])}), "
                     f"{margin_text(rd['measured'], budget)}")
    best = pl["best_uniform"]
    u = pl["uniform"].get(best, {})
    ub = f" [{u['scheme']}]: {u['bytes_per_token']:,.0f} B/token, {metric}={_g(u['value'])}" \
        if best else ""
    if not pl["rounds"]:
        lines.append(f"  NO assignment is predicted within the budget (the all-"
                     f"{pl['base_format']} runs give {metric}={_g(pl['base_value'])})")
    elif not pl["verified"]:
        lines.append(f"  NOT VERIFIED: the assignment missed the budget in every one of "
                     f"{len(pl['rounds'])} verifications (per_layer.rounds); best uniform"
                     f"{ub or ': none fits'}")
    else:
        rd = pl["rounds"][-1]
        if best is None:
            lines.append(f"  verified: {rd['bytes_per_token']:,.0f} B/token over {n} SSM layers,"
                         f" {metric}={_g(rd['measured'])}; no uniform scheme fits the budget")
        else:
            save = 100 * (1 - rd["bytes_per_token"] / u["bytes_per_token"])
            than = f"{save:.1f}% fewer" if save >= 0 else f"{-save:.1f}% more"
            lines.append(f"  verified: {rd['bytes_per_token']:,.0f} B/token, {than} than the "
                         f"best uniform{ub}; per-layer {metric}={_g(rd['measured'])}, "
                         f"{margin_text(rd['measured'], budget)} the budget")
    if pl["rounds"]:
        lines.append(f"  as a scheme: schemes.{pl['template']}.layers='"
                     f"{as_override(pl['rounds'][-1]['layers'])}'")
    return lines


def as_override(layers: dict) -> str:
    """A per-layer map as Hydra writes it: ``{2: fp16, default: nvfp4}``."""
    return "{" + ", ".join(f"{k}: {v}" for k, v in layers.items()) + "}"


# -- plots -----------------------------------------------------------------------------------
def short_tags(jobs: list[Job]) -> dict[str, str]:
    """Per job: the settings that differ between ``jobs``, with short keys. A key a job does not
    override takes its value from the job's config (summary.json), so a single run beside a
    sweep gets no ``experiment=None``; a key whose value no job's config knows is left out of
    that job's tag."""
    keys = list(dict.fromkeys(k for j in jobs for k in j.overrides))
    vals = {j.name: {k: _effective(j, k) for k in keys} for j in jobs}
    varying = [k for k in keys if len({vals[j.name][k] for j in jobs}) > 1]
    short = {k: k.rsplit(".", 1)[-1] for k in varying}
    if len(set(short.values())) < len(short):  # two keys end alike: the full keys
        short = {k: k for k in varying}
    return {j.name: ",".join(f"{short[k]}={v}" for k in varying
                             if (v := vals[j.name][k]) is not None) for j in jobs}


def _effective(job: Job, key: str) -> str | None:
    """The value of ``key`` in ``job``: its override, else its config's (None: unknown)."""
    if key in job.overrides:
        return job.overrides[key]
    node = (job.summary or {}).get("config")
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return None if node is None or isinstance(node, (dict, list)) else str(node)


_KIND_MARKERS = {"conventional": "s", "shared": "^", "split": "o"}
_SERIES_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "<", ">", "h")


def _group_tags(jobs: list[Job]) -> dict[str, str]:
    """:func:`short_tags` within each comparable group (what differs between comparable runs)."""
    out = {j.name: "" for j in jobs}
    for g in comparable_groups(jobs):
        out.update(short_tags(g.jobs))
    return out


def _recommended(jobs: list[Job], budget: tuple[str, float] | None,
                 horizon: int | None) -> list[Candidate]:
    """Each comparable group's recommended configuration under ``budget`` (none without one)."""
    if budget is None or budget[0] not in METRICS:
        return []
    return [rec.best for _, _, rec in decide(jobs, budget[0], budget[1], horizon)
            if rec is not None and rec.best is not None]


def _budget_line(ax, budget: tuple[str, float]) -> None:
    ax.axhline(budget[1], color="k", ls=(0, (4, 3)), lw=1.2, zorder=4,
               label=f"budget: {budget[0]} ≤ {budget[1]:g}")


def _mark_recommended(ax, x: float, y: float, hollow: bool = False,
                      others: list[tuple[float, float]] = ()) -> None:
    """A star on the recommended point and a "recommended" label with a leader line, placed at
    the first offset (of seven around the point, the nearer first) that leaves 30 points of
    room to the other points ``others`` (data coordinates; the axes' limits must be final), else
    at the one with the most room, inside the axes."""
    ax.scatter([x], [y], marker="*", s=260, zorder=4.5, linewidths=1.2, edgecolors="k",
               facecolors="none" if hollow else "gold")
    to_px = ax.transData.transform
    pts = [to_px(p) for p in others if _pos(p[0]) and _pos(p[1]) and p != (x, y)]
    x0, y0 = to_px((x, y))
    dpi = ax.figure.dpi / 72  # points -> pixels

    box = ax.get_window_extent()

    def room(off):  # the distance from the label's centre to the nearest other point
        cx, cy = x0 + (off[0] + 30 * (1 if off[0] > 0 else -0.2)) * dpi, y0 + off[1] * dpi
        if not (box.x0 + 34 * dpi <= cx <= box.x1 - 34 * dpi
                and box.y0 + 8 * dpi <= cy <= box.y1 - 8 * dpi):
            return -1.0  # (outside the axes: over the ticks or the title)
        return min((max(abs(px - cx) - 34 * dpi, 0) + max(abs(py - cy) - 8 * dpi, 0)
                    for px, py in pts), default=math.inf)

    off = max([(-58, 26), (12, 26), (12, -30), (-58, -30), (40, -70), (-70, -70), (60, 40)],
              key=lambda o: min(room(o), 30 * dpi))  # (beyond 30 pt of room: the nearest)
    ax.annotate("recommended", (x, y), xytext=off, textcoords="offset points",
                fontsize=8, weight="bold", zorder=7,
                bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "0.3", "lw": 0.6},
                arrowprops={"arrowstyle": "-", "color": "0.2", "lw": 0.8, "shrinkB": 7})


def _same_curve(a: list, b: list, rel: float = 0.02) -> bool:
    """Whether two curves (values at the same steps) lie on top of each other on a log axis."""
    pairs = [(x, y) for x, y in zip(a, b, strict=False) if _pos(x) and _pos(y)]
    return len(pairs) == len(a) == len(b) and bool(pairs) and all(
        abs(x - y) <= rel * max(x, y) for x, y in pairs)


def plot_error_vs_length(jobs: list[Job], path: Path, budget: tuple[str, float] | None = None,
                         horizon: int | None = None) -> Path:
    """rel_err and KL vs length of every (job, scheme); a scheme with the same curve in every
    job (the baseline) is drawn once. Line style by scheme kind; each highlighted curve has a
    marker of its own (markers staggered along the curve), and a curve lying on top of another
    says so in the legend. With ``budget`` ``(metric, value)``: the budget line on its panel and
    the recommended configuration drawn bold, first in the legend."""
    from .plots import fixed_margins, plain_ticks, plt, save_png

    done = [j for j in jobs if j.summary is not None]
    tags = _group_tags(done)
    recs = {(c.label, c.bytes_per_step) for c in _recommended(done, budget, horizon)}
    series, seen = [], {}
    for j in done:
        per_scheme = _scheme_rows(j)
        cost = _costs(j.summary)
        for s, info in j.summary.get("schemes", {}).items():
            mine = per_scheme[s]
            label = info.get("label", s)
            key = (label, f"{mine[-1].get('rel_err', math.nan):.3g}" if mine else "")
            if key in seen:  # same configuration, same result: drawn once, without a job tag
                seen[key][3] = ""
                continue
            b = cost.get(s, {}).get("bytes_per_step")
            item = [info.get("kind", ""), label, mine, tags.get(j.name, ""),
                    (label, float(b)) in recs if b is not None else False]
            seen[key] = item
            series.append(item)
    n_label = Counter(x[1] for x in series)  # a job's tag only where the label is ambiguous
    series = [(k, f"{t}: {lab}" if t and n_label[lab] > 1 else lab, rs, r)
              for k, lab, rs, t, r in series]
    panels = [m for m in ("rel_err", "kl")
              if any(_pos(r.get(m)) for _k, _l, rs, _r in series for r in rs)]
    panels = panels or ["rel_err"]
    # the configurations on a Pareto front (bytes vs final rel_err, per comparable group) are
    # drawn in colour; the others are faded, without a legend entry, so 25 stay readable
    front_labels = set()
    for _g, cs, _ in decide(done, panels[0], None, horizon):
        front = pareto_front(_drawable(cs))  # (and what coincides with it: not hidden)
        front_labels |= {(c.tag + ": " if c.tag and n_label[c.label] > 1 else "") + c.label
                         for c in _drawable(cs) if any(_coincide(c, f) for f in front)}
    hi = [x for x in series if x[1] in front_labels or x[3]] or series[:10]
    hi.sort(key=lambda x: not x[3])  # the recommended first
    # a curve on top of an earlier one (on the first panel): said in the legend
    on_top: dict[int, int] = {}
    for i, (_k, _l, rs, _r) in enumerate(hi):
        ys = [r.get(panels[0]) for r in rs]
        for k in range(i):
            if k not in on_top and _same_curve(ys, [r.get(panels[0]) for r in hi[k][2]]):
                on_top[i] = k
                break
    names = []
    for i, (_k, lab, _rs, rec) in enumerate(hi):
        name = ("★ recommended: " if rec else "") + lab
        if i in on_top:
            name += f"  (lies on #{on_top[i] + 1})"
        names.append(f"#{i + 1} {name}")
    ncol = 1 if len(hi) <= 6 else 2
    n_extra = bool(budget and budget[0] in panels) + (len(hi) < len(series))
    extra = 0.22 * math.ceil((len(hi) + n_extra + 1) / ncol)
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.4 + extra),
                             squeeze=False)
    cmap = plt.get_cmap("tab10")
    styles = {"conventional": ":", "shared": "--", "split": "-"}
    for ax, m in zip(axes[0], panels, strict=True):
        for _kind, lab, rs, _rec in series:
            if any(lab == x[1] for x in hi):
                continue
            y = [r.get(m) if _pos(r.get(m)) else math.nan for r in rs]
            ax.plot([r["step"] for r in rs], y, lw=0.8, color="0.75", zorder=1,
                    marker="o" if len(rs) < 4 else None, ms=2)
        for i, (kind, _lab, rs, rec) in enumerate(hi):
            y = [r.get(m) if _pos(r.get(m)) else math.nan for r in rs]
            every = max(1, len(rs) // 8)
            ax.plot([r["step"] for r in rs], y, lw=3.2 if rec else 1.8, label=names[i],
                    color=cmap(i % 10), zorder=5 if rec else 3, ls=styles.get(kind, "-."),
                    marker=_SERIES_MARKERS[i % len(_SERIES_MARKERS)],
                    markevery=(i % every, every), ms=5 if i in on_top else 3.5,
                    mfc="none" if i in on_top else None)
        vals = [r.get(m) for *_, rs, _r in series for r in rs]
        exact = not any(_pos(v) for v in vals)  # every value 0: a linear axis (log has none)
        if budget and budget[0] == m:
            _budget_line(ax, budget)
            vals.append(budget[1])
        ax.set_xscale("log", base=2)
        steps = [r["step"] for *_, rs, _r in series for r in rs if r.get("step")]
        if steps:  # (curves of NaN alone set no x range: the log axis would get 0..1)
            ax.set_xlim(min(steps) / 1.1, max(steps) * 1.1)
        if not exact:
            ax.set_yscale("log")
        plain_ticks(ax, y_log=not exact)
        clip_low(ax, vals, [(lab, rs[-1].get(m), "C0") for _k, lab, rs, _r in series if rs])
        ax.set_xlabel("decode steps (tokens)")
        ax.set_ylabel({"rel_err": "‖y − y_ref‖ / ‖y_ref‖", "kl": "KL per token (nats)"}[m])
        ax.set_title({"rel_err": "relative output error", "kl": "KL(p_ref || p_sim)"}[m])
        ax.grid(True, alpha=0.3)
    fixed_margins(fig, left=0.75, right=0.2, top=0.35, bottom=0.5 + extra, gap=0.9)
    legend: dict = {}
    for ax in axes[0]:
        for hh, ll in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(ll, hh)
    handles, labels = list(legend.values()), list(legend)
    if len(hi) < len(series):
        from matplotlib.lines import Line2D

        handles.append(Line2D([], [], color="0.75", lw=0.8))
        labels.append(f"{len(series) - len(hi)} other configurations (not on the Pareto front)")
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=7.5, frameon=False,
               title="Pareto front (bytes/step vs final " + panels[0] + ")", title_fontsize=8)
    return save_png(fig, path, dpi=120, bbox_inches="tight")


def plot_pareto(jobs: list[Job], path: Path, budget: tuple[str, float] | None = None,
                horizon: int | None = None) -> Path:
    """rel_err and KL (and the budget's metric) at the last reported length <= the horizon vs
    bytes per step. Each comparable group's front is a staircase of numbered markers (the
    number inside the marker), listed under the panel; points off the front are grey markers
    by scheme kind (legend), without text. With ``budget``: the budget line on its panel and
    each group's recommended configuration starred and labelled "recommended" on every
    panel."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    from .plots import fixed_margins, plain_ticks, plt, save_png

    done = [j for j in jobs if j.summary is not None]
    panels = ["rel_err", "kl"]
    if budget and budget[0] in METRICS and budget[0] not in panels:
        panels.append(budget[0])
    recs = _recommended(done, budget, horizon)
    rec_keys = {(r.label, r.bytes_per_step) for r in recs}
    per = {m: [(g, _drawable(cs)) for g, cs, _ in decide(done, m, None, horizon)]
           for m in panels}
    fronts = {m: [(g, pareto_front(cs)) for g, cs in per[m]] for m in panels}
    n_lines = max(sum(2 * len(f) + (len(fronts[m]) > 1) for _, f in fronts[m])
                  for m in panels)  # (a front point may take a "same point" line)
    extra = 0.17 * n_lines + 0.5
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 5.2 + extra),
                             squeeze=False)
    front_colors = ("C3", "C0", "C2", "C4", "C1", "C5")
    for ax, m in zip(axes[0], panels, strict=True):
        cs = [c for _, gc in per[m] for c in gc]
        lines, kinds_seen, placed = [], set(), 0
        for gi, ((g, gcs), (_, front)) in enumerate(zip(per[m], fronts[m], strict=True)):
            color = front_colors[gi % len(front_colors)]
            kinds = {(j.name, s): (i or {}).get("kind", "") for j in g.jobs
                     for s, i in j.summary.get("schemes", {}).items()}
            off = [c for c in gcs if c not in front]
            for k in sorted({kinds.get((c.job, c.scheme), "") for c in off}):
                pts = [c for c in off if kinds.get((c.job, c.scheme), "") == k]
                lab = f"{k or 'other'} (off the front)"
                ax.scatter([c.bytes_per_step for c in pts], [c.value for c in pts], s=22,
                           alpha=0.6, color="0.55", marker=_KIND_MARKERS.get(k, "D"), zorder=2,
                           label=None if lab in kinds_seen else lab)
                kinds_seen.add(lab)
            glabel = "Pareto front" + (f" (group {gi + 1})" if len(per[m]) > 1 else "")
            ax.plot([c.bytes_per_step for c in front], [c.value for c in front], "-",
                    color=color, drawstyle="steps-post", label=glabel, zorder=3, lw=1.4)
            ax.scatter([c.bytes_per_step for c in front], [c.value for c in front], s=130,
                       color=color, zorder=4, edgecolors="white", linewidths=0.6)
            n_label = Counter(c.label for c in gcs)
            if len(per[m]) > 1:
                lines.append(f"group {gi + 1}: {g.title}")
            for c in front:
                placed += 1
                star = bool(budget and budget[0] == m and (c.label, c.bytes_per_step) in rec_keys)
                ax.text(c.bytes_per_step, c.value, str(placed), ha="center", va="center",
                        fontsize=6.5, color="k" if star else "white", weight="bold", zorder=5,
                        clip_on=True)  # (one below the axis would stretch the figure)
                same = [o.label for o in off if _coincide(o, c)]
                lines.append(f"{placed:>2}. {c.bytes_per_step:>9,.0f} B  {m}={_g(c.value):<8} "
                             f"{c.label}" + (f" [{c.tag}]" if c.tag and n_label[c.label] > 1
                                             else "") + ("   <- recommended" if star else ""))
                if same:  # on a line of its own: the list stays within its panel
                    more = f" (+{len(same) - 2} more)" if len(same) > 2 else ""
                    lines.append(f"{'':>17}same point: {'; '.join(same[:2])}{more}")
        vals = [c.value for c in cs]
        if budget and budget[0] == m:
            _budget_line(ax, budget)
            vals.append(budget[1])
        clip_low(ax, vals, [(c.label, c.value, "C3") for c in cs])
        ax.annotate("Pareto front:\n" + "\n".join(lines), xy=(0, 0), xycoords="axes fraction",
                    xytext=(0, -40), textcoords="offset points", va="top", fontsize=6.5,
                    family="monospace")
        if not cs:  # nothing above zero to draw (every scheme exact): an empty linear panel
            ax.set_title(f"{m}: every value 0", fontsize=9)
            continue
        ax.set_xscale("log")
        ax.set_yscale("log")
        plain_ticks(ax, x_tokens=False)
        xs = [c.bytes_per_step for c in cs]
        lo, hi = min(xs) / 1.25, max(xs) * 1.25
        ax.set_xlim(lo, hi)
        ticks = [k * 2.0 ** e for e in range(-2, 40) for k in (1, 1.5)
                 if lo <= k * 2.0 ** e <= hi]
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(
            lambda x, _: f"{x / 1024:g}K" if x >= 1024 else f"{x:g}"))
        ax.set_xlabel("bytes per decode step per head (cost model)")
        at = f"the largest length ≤ {horizon:,}" if horizon else "the last reported length"
        ax.set_ylabel(f"{m} at {at}")
        nf = sum(len(f) for _, f in fronts[m])
        ax.set_title(f"{m} vs cost: {len(cs)} configurations, {nf} on the front"
                     + (f" ({len(per[m])} groups)" if len(per[m]) > 1 else ""), fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        for r in recs:
            hit = next((c for c in cs if (c.job, c.scheme) == (r.job, r.scheme)), None) or \
                next((c for c in cs if (c.label, c.bytes_per_step) ==
                      (r.label, r.bytes_per_step)), None)
            if hit is not None and hit.value >= ax.get_ylim()[0]:
                _mark_recommended(ax, hit.bytes_per_step, hit.value,
                                  hollow=not (budget and budget[0] == m),
                                  others=[(c.bytes_per_step, c.value) for c in cs])
        # inside, top right: a Pareto plot's empty corner (costly and inaccurate)
        ax.legend(fontsize=7, loc="upper right", framealpha=0.9)
    # (bbox_inches="tight" crops what the fixed margins leave over)
    fixed_margins(fig, left=0.75, right=0.2, top=0.35, bottom=0.5 + extra, gap=0.9)
    return save_png(fig, path, dpi=120, bbox_inches="tight")


def _coincide(a: Candidate, b: Candidate, rel: float = 0.005) -> bool:
    """Whether two points would be drawn on top of each other."""
    return (abs(a.bytes_per_step - b.bytes_per_step) <= rel * b.bytes_per_step
            and abs(a.value - b.value) <= rel * b.value)


def clip_low(ax, values, named, decades: float = 3.0) -> None:
    """Show at most ``decades`` decades below the largest value; name what lies below (an FP32
    baseline at 1e-7 would otherwise take most of the height)."""
    vals = [v for v in values if _pos(v)]
    if not vals:
        return
    floor = max(vals) * 10.0 ** -decades
    if min(vals) >= floor:
        return
    ax.set_ylim(bottom=floor, top=max(vals) * 1.6)
    below = {lab: v for lab, v, _ in named if _pos(v) and v < floor}
    text = "; ".join(f"{lab}: {_g(v)}" for lab, v in list(below.items())[:3])
    ax.annotate(f"▼ below the axis: {text}", xy=(0.01, 0.015), xycoords="axes fraction",
                fontsize=7, color="0.2")


def _short_label(c: Candidate) -> str:
    """A compact label for a point off the front: 'split fp16/sr+nvfp4'."""
    lab = c.label.replace(" update + ", "+").replace(" read", "").replace("(", " ")
    return lab.replace(")", "").replace("conventional", "conv")


def pareto_front(cands: list[Candidate]) -> list[Candidate]:
    """The configurations no other one beats on both bytes and metric, cheapest first."""
    front, best = [], math.inf
    for c in sorted(cands, key=lambda c: (c.bytes_per_step, c.value)):
        if c.value < best:
            front.append(c)
            best = c.value
    return front


def _pos(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0


def _drawable(cands: list[Candidate]) -> list[Candidate]:
    """The candidates a log axis can show (a finite, positive metric)."""
    return [c for c in cands if _pos(c.value)]


# -- the whole report ------------------------------------------------------------------------
def aggregate(root: Path, plots: bool = True, budget: tuple[str, float] | None = None,
              horizon: int | None = None, jobs: list[Job] | None = None) -> Aggregate:
    """Collect ``root`` (or take its ``jobs``), write ``sweep_summary.csv`` (and the plots, with
    the budget line ``(metric, value)`` and each group's recommended configuration when given)
    into it."""
    root = Path(root)
    jobs = collect(root) if jobs is None else jobs
    if not jobs:
        raise ReportError(f"no run results (summary.json) under {root}")
    rows = summary_rows(jobs)
    csv_path = root / CSV_FILE
    res.atomic_write_text(csv_path, res.rows_to_csv(rows))
    written = []
    if plots and any(j.summary is not None for j in jobs):
        written = [plot_error_vs_length(jobs, root / ERROR_PLOT, budget, horizon),
                   plot_pareto(jobs, root / PARETO_PLOT, budget, horizon)]
    return Aggregate(jobs, rows, csv_path, written)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not usage + message (errors.print_error)
        self.exit(print_error(self.prog, message))


REPORT_HELP = """\
Compares every run under DIR (a sweep directory, one run directory, or a folder of sweeps) and
writes into DIR: sweep_summary.csv (one row per job and scheme: the job's overrides, rel_err /
kl / state_drift at each reported length and at the end, bytes per step), sweep_error_vs_length.png
(the Pareto-front configurations highlighted) and sweep_pareto.png (metric vs bytes per step).
With --budget it recommends the cheapest configuration within the budget and lists runners-up.

example: python -m precsim.report multirun/precision_sweep/2026-01-01_12-00-00_ab12 \\
             --metric rel_err --budget 0.0625
"""


def main(argv: list[str] | None = None) -> int:
    p = _Parser(prog="precsim-report", description=REPORT_HELP,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", type=Path, help="a sweep or run directory")
    p.add_argument("--metric", choices=METRICS, default="rel_err",
                   help="the figure compared against the budget (default: rel_err, the layer "
                        "output's relative RMS error; kl depends on the readout's scale)")
    p.add_argument("--budget", type=float,
                   help="largest acceptable metric at the horizon, e.g. 0.0625 (rel_err)")
    p.add_argument("--horizon", type=int, help="generated tokens (default: the longest run); "
                   "beyond the longest run only with --extrapolate")
    p.add_argument("--extrapolate", action="store_true",
                   help="allow a --horizon beyond the longest run: each configuration is then "
                        "judged at its last reported length (shared and conventional schemes' "
                        "errors still grow with length)")
    p.add_argument("--top", type=int, default=3, help="runners-up to list")
    p.add_argument("--no-plots", action="store_true", help="write only sweep_summary.csv")
    a = p.parse_args(argv)
    if a.budget is not None and not (a.budget > 0 and math.isfinite(a.budget)):
        p.error(f"--budget={a.budget} must be a positive number")
    if a.horizon is not None and a.horizon < 1:
        p.error(f"--horizon={a.horizon} must be a positive number of tokens")
    try:
        from .preflight import readable_dir, writable_dir

        # an unreadable DIR, or one it cannot write its summary into: one line, no work
        if a.dir.is_dir():  # (a missing one: collect's own line)
            readable_dir("DIR", a.dir)
            writable_dir("DIR", a.dir, "a directory of runs that precsim-report can write "
                         "sweep_summary.csv and its plots into")
        jobs = collect(a.dir)
        if not jobs:
            raise ReportError(f"no run results (summary.json) under {a.dir}")
        longest = longest_run(jobs)
        if a.horizon is not None and longest and a.horizon > longest and not a.extrapolate:
            raise ReportError(
                f"--horizon={a.horizon} is beyond the longest run ({longest:,} steps); "
                f"allowed: 1..{longest}, or add --extrapolate to judge each configuration at "
                "its last reported length")
        decision = decide(jobs, a.metric, a.budget, a.horizon)  # (checks --metric too)
        if not any(cs for _, cs, _ in decision) and longest:
            raise ReportError(f"no reported length <= --horizon={a.horizon} in any run")
        agg = aggregate(a.dir, plots=not a.no_plots, jobs=jobs, horizon=a.horizon,
                        budget=(a.metric, a.budget) if a.budget is not None else None)
    except PrecsimError as e:  # ReportError, a preflight's, a format's: one line (errors.py)
        p.error(str(e))
    print(f"{a.dir}: {agg.n_complete}/{len(agg.jobs)} jobs complete; wrote "
          f"{', '.join(x.name for x in [agg.csv_path, *agg.plots])}")
    for j in agg.jobs:
        if j.status != "complete":
            print(f"  job {j.name}: {j.status}" + (f" ({j.error})" if j.error else ""))
    if any(cs for _, cs, _ in decision):
        print(format_decision(decision, a.metric, a.horizon, a.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
