"""What is comparable: the complete jobs in groups that measure the same thing
(:func:`comparable_groups`), and the settings that tell jobs apart (:func:`short_tags`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..families import FAMILIES
from .runs import Job


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


_FAMILY = {name: f.LABEL for name, f in FAMILIES.items()}


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


def group_tags(jobs: list[Job]) -> dict[str, str]:
    """:func:`short_tags` within each comparable group (what differs between comparable runs)."""
    out = {j.name: "" for j in jobs}
    for g in comparable_groups(jobs):
        out.update(short_tags(g.jobs))
    return out

