"""Reading run directories: every job under a directory (:func:`collect`), whether a run is
complete (:func:`check_run_dir`), its per-window rows and its costs."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .. import result as res
from ..errors import PrecsimError
from ..rundir import (
    ERROR_FILE,
    HYDRA_DIR,
    METRICS_FILE,
    SUMMARY_FILE,
    interrupted_at,
    is_complete,
    layer_dir_name,
)

METRICS = ("kl", "rel_err", "state_drift")
_IGNORED_OVERRIDES = ("run.progress", "run.out_dir")


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


def check_run_dir(path: Path) -> str | None:
    """``None`` when ``path`` holds a complete, readable result; else why not (one line). A run
    over every recorded layer of a trace (precsim.layers) holds its results in its layers'
    folders: each must hold one."""
    path = Path(path)
    subs = layer_dirs(path)
    if subs:
        return next((f"{d}: {why}" for d in subs if (why := check_run_dir(path / d))), None)
    if not is_complete(path):
        return f"no complete {SUMMARY_FILE}"
    try:
        summary = json.loads((path / SUMMARY_FILE).read_text())
        rows = res.read_rows(path / METRICS_FILE)
    except (OSError, ValueError) as e:
        return f"unreadable result files ({e})"
    steps = summary.get("steps")
    for scheme in summary.get("schemes", {}):
        last = max((r.get("step", -1) for r in rows if r.get("scheme") == scheme), default=None)
        if last is None or (steps is not None and last != steps):
            return f"{METRICS_FILE} is truncated (scheme {scheme} ends at step {last})"
    return None


def layer_dirs(path: Path) -> list[str]:
    """The layer folders a complete run over every recorded layer of a trace names in its
    summary.json (``info.layer_dirs``, precsim.layers); none for any other run directory."""
    try:
        s = json.loads((path / SUMMARY_FILE).read_text())
        subs = s["info"]["layer_dirs"] if s.get("complete") is True else []
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return []
    import re

    ok = isinstance(subs, list) and all(re.fullmatch(r"layer_\d+", str(d)) for d in subs)
    return subs if ok else []


def scheme_rows(job: Job) -> dict[str, list[dict]]:
    """Each scheme's per-window rows of a complete job: its metrics.csv, or for a run over
    every recorded layer, the rows of the scheme's worst layer (its summary's figures)."""
    subs, files = layer_dirs(job.path), {}
    out = {}
    for s in job.summary.get("schemes", {}):
        d = "."
        if subs:
            worst = job.summary["figures"][s]["final"].get("worst_layer")
            d = layer_dir_name(worst) if isinstance(worst, int) else ""
            d = d if d in subs else subs[0]
        if d not in files:
            files[d] = res.read_rows(job.path / d / METRICS_FILE)
        out[s] = [r for r in files[d] if r["scheme"] == s]
    return out


def _read_overrides(path: Path) -> dict[str, str]:
    f = path / HYDRA_DIR / "overrides.yaml"
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
    return any((path / n).exists() for n in (SUMMARY_FILE, HYDRA_DIR, ERROR_FILE))


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
            job.summary = json.loads((p / SUMMARY_FILE).read_text())
        else:
            err = p / ERROR_FILE
            at = interrupted_at(p)
            if err.is_file():
                job.status, job.error = "failed", (err.read_text().splitlines() or [""])[0]
            elif at is not None:
                job.status, job.error = "incomplete", f"interrupted at step {at:,}"
            elif (p / SUMMARY_FILE).exists():
                job.status, job.error = "broken", why
            else:
                job.status = "incomplete"
        jobs.append(job)
    return jobs


def _natural_key(s: str) -> list:
    import re

    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def costs(summary: dict) -> dict:
    if summary.get("cost"):
        return summary["cost"]
    try:  # results written before the cost model existed: recompute from the config
        from ..config import to_config
        from ..cost import scheme_costs

        return scheme_costs(to_config(summary["config"]))
    except Exception:  # noqa: BLE001 - the cost columns stay empty
        return {}

