"""Candidates and the recommendation: every configuration's metric at the horizon
(:func:`candidates`), the cheapest within a budget (:func:`recommend`), per comparable group
(:func:`decide`), and the text the command line prints (:func:`format_decision`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ..rundir import RECORD_FILE
from .groups import Group, comparable_groups, short_tags
from .runs import METRICS, Job, ReportError, costs


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
        cost = costs(j.summary)
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
                     f"({metric}={sig3(acc.value)} at length {acc.length:,}, "
                     f"{acc.bytes_per_step:,.0f} B/step; job {acc.job}, scheme {acc.scheme}).")
        return "\n".join(lines)
    headroom = rec.budget / best.value if best.value > 0 else math.inf
    under = f"{sig3(headroom)}x under the budget" if best.value > 0 else "exact (0)"
    lines.append(f"recommended: {best.label}  (job {best.job}, scheme {best.scheme})")
    lines.append(f"  {best.bytes_per_step:,.0f} bytes/step/head; {metric}={sig3(best.value)} at "
                 f"length {best.length:,}")
    margin = f"  margin: {under}"
    if len(rec.within) > 1:
        nxt = rec.within[1]
        extra = 100 * (nxt.bytes_per_step / best.bytes_per_step - 1)
        margin += (f"; the runner-up costs {extra:+.1f}% bytes/step" if extra > 0.05 else
                   f"; the runner-up costs the same bytes/step at {metric}={sig3(nxt.value)}")
    cheaper = [c for c in rec.over if c.bytes_per_step < best.bytes_per_step]
    if cheaper:
        c = cheaper[-1]
        margin += (f"; the next cheaper ({c.label}, {c.bytes_per_step:,.0f} B) misses it with "
                   f"{metric}={sig3(c.value)}")
    lines.append(margin)
    if len(rec.within) > 1:
        lines.append("runners-up within the budget (cheapest first):")
        lines += [_cand_line(i + 2, c, metric) for i, c in enumerate(rec.within[1:1 + top])]
    return "\n".join(lines)


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
        meta = json.loads((Path(str(src)) / RECORD_FILE).read_text())
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
    return (f"  {rank:>2}. {c.bytes_per_step:>10,.0f} B  {metric}={sig3(c.value):<9} "
            f"@{c.length:<7,} {c.label}  [{c.tag or c.job} / {c.scheme}]")


def sig3(v: float) -> str:
    """``v`` in three significant digits ("inf", "nan": not finite)."""
    if not math.isfinite(v):
        return "inf" if v > 0 else "nan"
    return f"{v:.3g}"


def pareto_front(cands: list[Candidate]) -> list[Candidate]:
    """The configurations no other one beats on both bytes and metric, cheapest first."""
    front, best = [], math.inf
    for c in sorted(cands, key=lambda c: (c.bytes_per_step, c.value)):
        if c.value < best:
            front.append(c)
            best = c.value
    return front

