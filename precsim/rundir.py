"""The run directory (layer 5, beside :mod:`precsim.result` and :mod:`precsim.checkpoint`):
the one home of its file names, and of what decides whether a directory
holds a finished result (completeness, reuse, the input fingerprint), how its files are written
(atomically) and how a broken job is set aside.

A run directory holds ``metrics.csv``, ``per_step.npz``, the PNG, ``precsim.log`` and
``summary.json`` last (its ``complete`` flag marks a finished run); while a run is unfinished
its ``checkpoint.pt``; a failed sweep job's ``error.txt``. A sweep directory adds the sweep's
summary and plots; a replay of every recorded layer its ``layers.csv``, ``layers.png`` and one
``layer_XX/`` run directory per layer; a recording (``precsim.record``) its ``record.json``.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from .errors import PrecsimError

# -- file names ---------------------------------------------------------------------------------
# a run
METRICS_FILE = "metrics.csv"
SUMMARY_FILE = "summary.json"  # written last: its ``complete`` flag marks a finished run
PER_STEP_FILE = "per_step.npz"
PLOT_FILE = "error_vs_length.png"
GENERATIONS_FILE = "generations.txt"  # model.mode=generate: the continuations, readable
LOG_FILE = "precsim.log"  # Hydra's job log (the job's name is precsim)
CHECKPOINT_FILE = "checkpoint.pt"  # while a run is unfinished
ERROR_FILE = "error.txt"  # a failed sweep job's error
BROKEN_SUFFIX = ".broken"  # a broken job's summary, set aside: summary.json.broken
HYDRA_DIR = ".hydra"  # Hydra's copy of the composed config
# a sweep
SWEEP_CSV_FILE = "sweep_summary.csv"
SWEEP_ERROR_PLOT = "sweep_error_vs_length.png"
SWEEP_PARETO_PLOT = "sweep_pareto.png"
MULTIRUN_FILE = "multirun.yaml"  # Hydra's, in a sweep directory
# every recorded layer of a recording, replayed (precsim.layers)
LAYERS_CSV = "layers.csv"
LAYERS_PLOT = "layers.png"
# a recording (precsim.record)
RECORD_FILE = "record.json"
# a task run (experiment=task_eval) and a per-layer sensitivity run
ITEMS_CSV = "items.csv"
TASK_LENGTH_PLOT, TASK_DELTA_PLOT = "accuracy_vs_length.png", "task_accuracy.png"
SENS_CSV, SENS_PNG = "sensitivity.csv", "sensitivity.png"


def layer_dir_name(layer: int) -> str:
    """The run directory of one layer of a replay over every recorded layer: ``layer_07``."""
    return f"layer_{layer:02d}"


# -- atomic writes ------------------------------------------------------------------------------
def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0o22)  # read it (mkstemp's file is 0600): the file follows it, as open's
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
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


def json_safe(v):
    import numpy as np  # (not at the top: the command line imports this module to start)

    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    if isinstance(v, (np.floating,)):
        return json_safe(float(v))
    if isinstance(v, (np.integer,)):
        return int(v)
    return v


def write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(json_safe(obj), indent=2, sort_keys=False) + "\n")



# -- completeness, reuse, the input fingerprint -------------------------------------------------
def is_complete(run_dir: Path) -> bool:
    """A run directory is complete when summary.json parses and its metrics.csv exists."""
    return _complete_flag(run_dir) is True


def interrupted_at(run_dir: Path) -> int | None:
    """The step an interrupted run's files end at (its summary says ``complete: false``)."""
    flag = _complete_flag(run_dir, full=True)
    return flag.get("info", {}).get("interrupted_at", 0) if isinstance(flag, dict) else None


def _complete_flag(run_dir: Path, full: bool = False):
    """summary.json's ``complete`` (its whole content when ``full`` and it is false), None when
    summary.json or metrics.csv is missing or unreadable."""
    s, m = Path(run_dir) / SUMMARY_FILE, Path(run_dir) / METRICS_FILE
    try:
        data = json.loads(s.read_text()) if m.is_file() else None
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    done = bool(data.get("complete"))
    return data if full and not done else done


# keys that do not change a result's numbers: a rerun that differs only here reuses the result
RESULT_NEUTRAL_KEYS = ("run.progress", "run.out_dir", "run.threads", "run.checkpoint_s",
                       "run.resume", "metrics.plot", "metrics.budget", "metrics.budget_metric")


def _flat(d, prefix: str = "") -> dict:
    out = {}
    for k, v in (d or {}).items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _defaults() -> dict:
    """Every key of a default :class:`precsim.config.Config`, flattened as in ``summary.json``."""
    import dataclasses

    from .config import Config

    return _flat(json.loads(json.dumps(json_safe(dataclasses.asdict(Config())))))


def config_diff(stored: dict, current: dict) -> list[tuple[str, object, object]]:
    """``(key, stored value, current value)`` for every result-changing key that differs
    between two configs (as written in ``summary.json``). With ``workload.kind=trace`` the trace
    fixes ``model.*``, and with ``model.path`` the checkpoint fixes the layer shape, so those
    keys are not compared. A key the stored config lacks (written before the key existed)
    counts as the key's default, the value the older run had in effect."""
    a = _flat(json.loads(json.dumps(json_safe(stored))))
    b = _flat(json.loads(json.dumps(json_safe(current))))
    a = {**{k: v for k, v in _defaults().items() if k not in a and k in b}, **a}
    trace = b.get("workload.kind") == "trace"
    shape = {f"model.{k}" for k in ("family", "heads", "head_dim", "state_dim", "groups")} \
        if b.get("model.path") else set()
    out = []
    for k in sorted(set(a) | set(b), key=lambda k: (k not in b, k)):
        if k in RESULT_NEUTRAL_KEYS or (trace and k.startswith("model.")) or k in shape:
            continue
        if a.get(k) != b.get(k):
            out.append((k, a.get(k), b.get(k)))
    return out


INPUT_KEYS = ("workload.path", "model.path", "model.text", "model.ids")
# what precsim and Hydra write into a run or sweep folder (one may sit inside an input folder,
# or an all-layers replay write into a recording's layer folders): not part of an input
_OUTPUT_NAMES = {METRICS_FILE, SUMMARY_FILE, PER_STEP_FILE, LOG_FILE, CHECKPOINT_FILE,
                 ERROR_FILE, LAYERS_CSV, MULTIRUN_FILE, SWEEP_CSV_FILE}


def _input_file(q: Path, root: Path) -> bool:
    """Whether ``q`` (under ``root``) is an input's own file: not hidden (``.git``, ``.hydra``,
    ``.DS_Store``), not a run's output (:data:`_OUTPUT_NAMES`, plots)."""
    rel = q.relative_to(root).parts
    return q.is_file() and not any(p.startswith(".") for p in rel) and \
        q.name not in _OUTPUT_NAMES and q.suffix != ".png"


def input_fingerprint(cfg) -> dict:
    """Each file a run reads beside its config (a trace or recording, a checkpoint, documents,
    token ids: :data:`INPUT_KEYS`), as ``[path within it, size, mtime_ns]`` (a directory: its
    files and those of its subfolders). Stored with a result and a checkpoint, so that a file
    changed under the same path is not taken for the same input; size and time, not contents,
    to cost nothing on GB-sized recordings (a copy with new times counts as changed). Hidden
    files and what runs write (:func:`_input_file`) are left out: a run folder inside a
    recording, or ``git status`` in a checkpoint's clone, is not a change of input."""
    from dataclasses import asdict

    flat = _flat(cfg if isinstance(cfg, dict) else asdict(cfg))
    out = {}
    for key in INPUT_KEYS:
        v = flat.get(key)
        if not isinstance(v, str) or not v:
            continue
        p = Path(v)
        if p.is_file():
            files = [p]
        elif p.is_dir():
            files = sorted(q for q in [*p.glob("*"), *p.glob("*/*")] if _input_file(q, p))
        else:
            continue
        rows = []
        for q in files:
            st = q.stat()
            rows.append([q.relative_to(p).as_posix() if q != p else "", st.st_size,
                         st.st_mtime_ns])
        out[key] = rows
    return out


def inputs_changed(stored: dict | None, cfg) -> str | None:
    """What changed in the files behind ``cfg`` since ``stored`` (:func:`input_fingerprint` of
    a result or checkpoint; None: recorded before fingerprints, not checked), else None."""
    if stored is None:
        return None
    now = input_fingerprint(cfg)
    for key in sorted(set(stored) | set(now)):
        a, b = {r[0]: r[1:] for r in stored.get(key, [])}, {r[0]: r[1:] for r in now.get(key, [])}
        if a == b:
            continue
        gone, new = sorted(set(a) - set(b)), sorted(set(b) - set(a))
        diff = sorted(f for f in set(a) & set(b) if a[f] != b[f])
        what = (f"{diff[0] or 'the file'} changed (size or time)" if diff else
                f"{gone[0] or 'the file'} is gone" if gone else f"{new[0]} is new")
        return f"{key}: {what}"
    return None


def read_summary(run_dir: Path) -> dict | None:
    """The parsed ``summary.json`` of a complete run directory, else None."""
    if not is_complete(run_dir):
        return None
    return json.loads((Path(run_dir) / SUMMARY_FILE).read_text())


def reusable(cfg, out: Path) -> dict | None:
    """The summary of a complete result in ``out`` made by the same config (result-neutral keys
    such as ``run.progress`` or the budget aside); ``None`` when ``out`` holds no complete result.
    A complete result of a *different* config is a one-line :class:`PrecsimError`: a finished
    result is never overwritten."""
    from dataclasses import asdict

    stored = read_summary(out)
    if stored is None:
        return None
    diff = config_diff(stored.get("config", {}), asdict(cfg))
    if diff:
        key, old, new = diff[0]
        more = f" and {len(diff) - 1} more" if len(diff) > 1 else ""
        raise PrecsimError(f"{out} already holds a complete result of another config ({key}="
                           f"{old!r} there, {new!r} now{more}); allowed: the same config, or "
                           "another directory (run.out_dir / hydra.run.dir); delete it to redo")
    changed = inputs_changed(stored.get("inputs"), cfg)
    if changed:
        raise PrecsimError(f"{out} already holds a complete result of this config made from "
                           f"other inputs ({changed} since); allowed: the same inputs, or "
                           "another directory (run.out_dir / hydra.run.dir); delete it to redo")
    return stored


# -- stubs and the job's log ----------------------------------------------------------------------
def remove_stub(out: Path, job_name: str = "precsim") -> None:
    """Remove the directory Hydra made for a run that then failed validation, but only when it
    holds nothing except Hydra's ``.hydra/`` and the job's log (never a result)."""
    import shutil

    out = Path(out)
    allowed = {HYDRA_DIR, f"{job_name}.log"}
    if out.is_dir() and all(p.name in allowed for p in out.iterdir()):
        shutil.rmtree(out, ignore_errors=True)
        remove_empty_parents(out)


def remove_empty_parents(out: Path) -> None:
    """After a removed stub ``out``: its parents below the working directory that it left
    empty (e.g. Hydra's ``outputs/NAME/``, ``multirun/NAME/``)."""
    cwd = Path.cwd().resolve()
    for parent in Path(out).resolve().parents:
        if parent == cwd or cwd not in parent.parents:
            break
        try:
            parent.rmdir()  # only when empty
        except OSError:
            break


def job_log(text: str, level: str = "INFO") -> None:
    """Write to the job's log file only (``precsim.log``; a sweep keeps the terminal for
    progress)."""
    import logging

    for h in logging.getLogger().handlers:
        if isinstance(h, logging.FileHandler):
            h.emit(logging.makeLogRecord({"msg": text, "levelno": getattr(logging, level),
                                          "levelname": level, "name": "precsim"}))
