"""The Python API: ``simulate(cfg)`` runs a study without Hydra and writes its files."""

from __future__ import annotations

import datetime as _dt
import math
import platform
from dataclasses import asdict
from pathlib import Path

from . import results as res
from .config import Config, to_config
from .engines import run
from .errors import PrecsimError
from .result import Result, summary_figures


def simulate(cfg, out_dir: str | Path | None = None, progress: bool = True) -> Result:
    """Run every scheme of ``cfg`` against the float64 truth; write files when ``out_dir``.

    ``cfg`` is a :class:`precsim.config.Config`, a dict or an OmegaConf node (validated here).

    Example:
        >>> from precsim import simulate
        >>> r = simulate({"schemes": {"c32": {"kind": "conventional"}},
        ...               "model": {"heads": 1, "head_dim": 4, "state_dim": 16},
        ...               "run": {"steps": 64, "progress": False}})
        >>> r.rows[-1]["step"]
        64
    """
    cfg = to_config(cfg)
    if out_dir is not None:
        stored = reusable(cfg, Path(out_dir))
        if stored is not None:
            return load_result(Path(out_dir), stored)
    result = run(cfg, progress=progress)
    if out_dir is not None:
        write_outputs(cfg, result, Path(out_dir))
    return result


def reusable(cfg: Config, out: Path) -> dict | None:
    """The summary of a complete result in ``out`` made by the same config (result-neutral keys
    such as ``run.progress`` or the budget aside); ``None`` when ``out`` holds no complete result.
    A complete result of a *different* config is a one-line :class:`PrecsimError`: a finished
    result is never overwritten."""
    stored = res.read_summary(out)
    if stored is None:
        return None
    diff = res.config_diff(stored.get("config", {}), asdict(cfg))
    if diff:
        key, old, new = diff[0]
        more = f" and {len(diff) - 1} more" if len(diff) > 1 else ""
        raise PrecsimError(f"{out} already holds a complete result of another config ({key}="
                           f"{old!r} there, {new!r} now{more}); allowed: the same config, or "
                           "another directory (run.out_dir / hydra.run.dir); delete it to redo")
    return stored


def load_result(out: Path, summary: dict) -> Result:
    """A :class:`Result` read back from a complete run directory."""
    import numpy as np

    with np.load(out / res.PER_STEP_FILE) as z:
        per_step = {k: z[k].astype(np.float64) for k in z.files}
    return Result(rows=res.read_rows(out / res.METRICS_FILE), per_step_rel_err=per_step,
                  schemes=summary.get("schemes", {}), engine=summary.get("engine", ""),
                  device=summary.get("device", ""), wall_s=float(summary.get("wall_s") or 0.0),
                  steps=int(summary["steps"]), info={**summary.get("info", {}), "reused": True})


def reported_lengths(cfg: Config, steps: int) -> tuple[list[int], list[int]]:
    """``metrics.lengths`` split into (reported, skipped): a length is reported when a window
    ends there (a multiple of ``metrics.window``) and the run reaches it, so a figure is never
    labelled with a length its window does not end at."""
    w = cfg.metrics.window
    ok = [L for L in cfg.metrics.lengths if L <= steps and L % w == 0]
    skipped = [L for L in cfg.metrics.lengths if L <= steps and L % w != 0]
    return ok, skipped


def build_summary(cfg: Config, result: Result) -> dict:
    from .cost import scheme_costs

    lengths, skipped = reported_lengths(cfg, result.steps)
    return {
        "complete": True,
        "name": cfg.name,
        "engine": result.engine,
        "device": result.device,
        "wall_s": round(result.wall_s, 4),
        "steps": result.steps,
        "finished_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "figures": summary_figures(result.rows, lengths, result.steps),
        "lengths_skipped": skipped,
        "schemes": result.schemes,
        "cost": scheme_costs(cfg),
        "info": result.info,
        "config": asdict(cfg),
    }


def write_outputs(cfg: Config, result: Result, out: Path) -> dict:
    """metrics.csv, per_step.npz, the PNG, then summary.json last (it marks completion)."""
    import time

    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    res.atomic_write_text(out / res.METRICS_FILE, res.rows_to_csv(result.rows))
    res.write_per_step(out / res.PER_STEP_FILE, result.per_step_rel_err)
    summary = build_summary(cfg, result)
    if cfg.metrics.plot:
        from .plots import plot_error_vs_length

        m = cfg.model
        title = result.info.get("title") or (
            f"{m.name}: {m.heads}×{m.head_dim}×{m.state_dim}, {cfg.workload.kind}, "
            f"L={cfg.replay.buffer_len}" + (f", T={cfg.replay.drafts}" if cfg.replay.drafts
                                            else "") + f", seed {cfg.run.seed}")
        labels = {n: s["label"] for n, s in result.schemes.items()}
        plot_error_vs_length(result.rows, labels, out / res.PLOT_FILE, title,
                             budget=(cfg.metrics.budget_metric, cfg.metrics.budget))
    if "phases_s" in summary.get("info", {}):  # the files before summary.json (it is written last)
        summary["info"]["phases_s"]["files"] = round(time.perf_counter() - t0, 4)
    res.write_json(out / res.SUMMARY_FILE, summary)
    return summary


def format_table(summary: dict) -> str:
    """A plain-text table of the headline figures (printed by the CLI)."""
    figs = summary["figures"]
    lengths = sorted({int(k) for f in figs.values() for k in f if k.isdigit()})
    seqs = summary.get("config", {}).get("run", {}).get("seqs")
    div = any("first_flip" in f.get("final", {}) for f in figs.values())
    head = f"{'scheme':<26}" + "".join(f"{'err@' + _k(L):>11}" for L in lengths) + \
        f"{'err(final)':>11}{'KL(final)':>11}" + \
        (f"{'top1':>8}{'1st flip':>15}" if div else "") + f"{'drift':>10}{'B/step/hd':>11}"
    lines = [head, "-" * len(head)]
    cost = summary.get("cost", {})
    for name, f in figs.items():
        cells = "".join(f"{_fmt(f.get(str(L), {}).get('rel_err')):>11}" for L in lengths)
        fin = f.get("final", {})
        b = cost.get(name, {}).get("bytes_per_step")
        dead = summary["schemes"].get(name, {}).get("dead_at")
        tail = f"  (non-finite from step {dead})" if dead else ""
        lines.append(f"{name:<26}{cells}{_fmt(fin.get('rel_err')):>11}{_fmt(fin.get('kl')):>11}"
                     + (f"{_share(fin.get('top1')):>8}{_flip(fin, seqs):>15}" if div else "")
                     + f"{_fmt(fin.get('state_drift')):>10}"
                     f"{(f'{b:,.0f}' if b is not None else '-'):>11}{tail}")
    return "\n".join(lines)


def _share(v) -> str:
    """A share in [0, 1] with 4 decimals (0.9996 must not print as 1)."""
    return "nan" if v is None or not math.isfinite(v) else f"{v:.4f}"


def _flip(fin: dict, seqs) -> str:
    """``first_flip`` with the count of sequences that flipped (``none`` when none did)."""
    n = fin.get("flipped")
    if n is None:
        return "-"
    if not n:
        return "none"
    return f"{fin['first_flip']:,.0f} ({n}/{seqs if seqs else '?'})"


def _k(L: int) -> str:
    return f"{L // 1024}K" if L >= 1024 and L % 1024 == 0 else str(L)


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "nan"
    return f"{v:.3g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.2e}"
