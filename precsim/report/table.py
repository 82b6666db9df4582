"""The summary table: the rows of ``sweep_summary.csv`` (:func:`summary_rows`)."""

from __future__ import annotations

from .runs import METRICS, Job, costs

_COST_COLS = ("bytes_per_step", "fraction_of_fp32", "roofline_speedup",
              "state_transfers_per_step", "bytes_per_token")  # (per token: whole-model runs)


def _lengths(jobs: list[Job]) -> list[int]:
    out = set()
    for j in jobs:
        for figs in (j.summary or {}).get("figures", {}).values():
            out.update(int(k) for k in figs if k.isdigit())
    return sorted(out)


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
        cost = costs(s)
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

