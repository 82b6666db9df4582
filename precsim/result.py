"""What a run produced (``Result``), built in one place (:func:`make_result`) by every engine,
and the headline figures of a summary (:func:`summary_figures`)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Result:
    """Tidy window rows, per-step errors, and run facts."""

    rows: list[dict]
    per_step_rel_err: dict[str, np.ndarray]
    schemes: dict[str, dict]
    engine: str
    device: str
    wall_s: float
    steps: int
    info: dict = field(default_factory=dict)


def make_result(cfg, acc, dead_at: dict, *, engine: str, device: str, t_start: float,
                info: dict | None = None, rows: list | None = None,
                per_step: dict | None = None, steps: int | None = None) -> Result:
    """The Result of a finished run: ``acc`` a finished ``metrics.Accumulator`` (or None, with
    the ``rows`` and ``per_step`` rel_err a run reduced itself, e.g. whole-model mode),
    ``dead_at`` the first non-finite step of each scheme (None: finite throughout)."""
    from .schemes import describe

    if acc is not None:
        rows = acc.rows()
        per_step = {n: np.concatenate(v) for n, v in acc.per_step_rel_err.items() if v}
    return Result(
        rows=rows, per_step_rel_err=per_step or {},
        schemes={n: {"kind": s.kind, "label": s.label or describe(s), "dead_at": dead_at.get(n),
                     "fmt": s.fmt, "rounding": s.rounding, "read_fmt": s.read_fmt}
                 for n, s in cfg.schemes.items()},
        engine=engine, device=str(device), wall_s=time.perf_counter() - t_start,
        steps=cfg.run.steps if steps is None else steps,
        info={"workload": cfg.workload.kind, **(info or {})})


def summary_figures(rows: list[dict], lengths: list[int], steps: int) -> dict:
    """rel_err / kl / top1 / drift of each scheme at the reported lengths (window ending there)
    and at the end, which also has ``first_flip`` / ``flipped`` (with the readout)."""
    keys = ("rel_err", "kl", "top1", "state_drift", "read_drift")
    out: dict[str, dict] = {r["scheme"]: {} for r in rows}
    for name, figs in out.items():
        mine = [r for r in rows if r["scheme"] == name]
        for L in lengths:
            cand = [r for r in mine if r["step"] >= L]
            if L <= steps and cand:
                r = min(cand, key=lambda r: r["step"])
                figs[str(L)] = {k: r.get(k, math.nan) for k in keys}
        last = mine[-1]  # every scheme in ``out`` has rows
        figs["final"] = {k: last.get(k, math.nan) for k in ("step", *keys)}
        if "first_flip" in last:
            figs["final"]["first_flip"] = last["first_flip"]
            figs["final"]["flipped"] = int(last["flipped"])
    return out
