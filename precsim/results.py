"""Result files: ``metrics.csv`` (tidy), ``summary.json``, ``per_step.npz``; written atomically.

Every file is written to a temporary name in the same directory and renamed into place, so a
reader never sees half a file and an interrupted run leaves no corrupt result behind.
``summary.json`` is written last: its presence marks a complete run (sweeps rely on it to resume).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np

METRICS_FILE = "metrics.csv"
SUMMARY_FILE = "summary.json"
PER_STEP_FILE = "per_step.npz"
PLOT_FILE = "error_vs_length.png"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if isinstance(v, (np.floating,)):
        return _clean(float(v))
    if isinstance(v, (np.integer,)):
        return int(v)
    return v


def rows_to_csv(rows: list[dict]) -> str:
    cols = list(dict.fromkeys(k for r in rows for k in r))  # every key, in first-seen order
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if isinstance(v, float) and math.isnan(v) else
                        (f"{v:.6e}" if isinstance(v, float) else v)) for k, v in r.items()})
    return buf.getvalue()


def write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(_clean(obj), indent=2, sort_keys=False) + "\n")


def write_per_step(path: Path, per_step: dict[str, np.ndarray]) -> None:
    buf = io.BytesIO()
    np.savez_compressed(buf, **{k: v.astype(np.float32) for k, v in per_step.items()})
    atomic_write_bytes(path, buf.getvalue())


def read_rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    out = []
    for r in rows:
        d = {}
        for k, v in r.items():
            if k == "scheme":
                d[k] = v
            elif k == "step":
                d[k] = int(v)
            else:
                try:
                    d[k] = float(v) if v != "" else math.nan
                except ValueError:
                    d[k] = v
        out.append(d)
    return out


def is_complete(run_dir: Path) -> bool:
    """A run directory is complete when summary.json parses and its metrics.csv exists."""
    run_dir = Path(run_dir)
    s, m = run_dir / SUMMARY_FILE, run_dir / METRICS_FILE
    if not (s.is_file() and m.is_file()):
        return False
    try:
        data = json.loads(s.read_text())
    except (OSError, ValueError):
        return False
    return bool(data.get("complete"))


# keys that do not change a result's numbers: a rerun that differs only here reuses the result
RESULT_NEUTRAL_KEYS = ("run.progress", "run.out_dir", "run.threads", "metrics.plot",
                       "metrics.budget", "metrics.budget_metric")


def _flat(d, prefix: str = "") -> dict:
    out = {}
    for k, v in (d or {}).items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_diff(stored: dict, current: dict) -> list[tuple[str, object, object]]:
    """``(key, stored value, current value)`` for every result-changing key that differs
    between two configs (as written in ``summary.json``). With ``workload.kind=trace`` the trace
    fixes ``model.*``, so those keys are not compared."""
    a = _flat(json.loads(json.dumps(_clean(stored))))
    b = _flat(json.loads(json.dumps(_clean(current))))
    trace = b.get("workload.kind") == "trace"
    out = []
    for k in sorted(set(a) | set(b), key=lambda k: (k not in b, k)):
        if k in RESULT_NEUTRAL_KEYS or (trace and k.startswith("model.")):
            continue
        if a.get(k) != b.get(k):
            out.append((k, a.get(k), b.get(k)))
    return out


def read_summary(run_dir: Path) -> dict | None:
    """The parsed ``summary.json`` of a complete run directory, else None."""
    if not is_complete(run_dir):
        return None
    return json.loads((Path(run_dir) / SUMMARY_FILE).read_text())
