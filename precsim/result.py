"""A run's result in one place: what it produced (:class:`Result`, built by every engine with
:func:`make_result`), its summary (:func:`build_summary`, headline figures by
:func:`summary_figures`), its table text (:func:`format_table`) and its files
(:func:`write_outputs`, read back by :func:`load_result`): ``metrics.csv`` (tidy),
``per_step.npz``, the PNG, then ``summary.json`` last (its ``complete`` flag marks a finished
run; sweeps and reuse rely on it).

Every file is written to a temporary name in the same directory and renamed into place, so a
reader never sees half a file and an interrupted run leaves no corrupt result behind.
"""

from __future__ import annotations

import csv
import datetime as _dt
import io
import math
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .config import Config
from .errors import PrecsimError
from .rundir import (  # noqa: F401 - also read as result's names (report.py, until it moves)
    GENERATIONS_FILE,
    METRICS_FILE,
    PER_STEP_FILE,
    PLOT_FILE,
    SENS_CSV,
    SENS_PNG,
    SUMMARY_FILE,
    atomic_write_bytes,
    atomic_write_text,
    config_diff,
    input_fingerprint,
    inputs_changed,
    interrupted_at,
    is_complete,
    json_safe,
    read_summary,
    reusable,
    write_json,
)


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
    # what ran it (set by precsim.simulate / precsim.api.run): the summary and the verdict
    config: Config | None = field(default=None, repr=False, compare=False)
    run_dir: Path | None = field(default=None, repr=False, compare=False)

    def summary(self) -> dict:
        """The headline figures, cost and config, as ``summary.json`` holds them."""
        if self.config is None:
            raise PrecsimError("Result.config is None; allowed: a Result of precsim.simulate "
                               "or precsim.api.run (they set it)")
        return build_summary(self.config, self)

    # (``verdict()``: precsim.api.RunResult, the Result the API returns; the report module
    # that judges it builds on this one)


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
                     "fmt": s.fmt, "rounding": s.rounding, "read_fmt": s.read_fmt,
                     "error_feedback": s.error_feedback,
                     **({"layers": dict(s.layers)} if s.layers is not None else {})}
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
        for k in ("kl_lo", "kl_hi", "top1_lo", "top1_hi"):  # a whole-model run's intervals
            if k in last:
                figs["final"][k] = last[k]
        if "first_flip" in last:
            figs["final"]["first_flip"] = last["first_flip"]
            figs["final"]["flipped"] = int(last["flipped"])
    return out


# -- files ------------------------------------------------------------------------------------


def rows_to_csv(rows: list[dict]) -> str:
    cols = list(dict.fromkeys(k for r in rows for k in r))  # every key, in first-seen order
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if isinstance(v, float) and math.isnan(v) else
                        (f"{v:.6e}" if isinstance(v, float) else v)) for k, v in r.items()})
    return buf.getvalue()


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


def load_result(out: Path, summary: dict) -> Result:
    """A :class:`Result` read back from a complete run directory."""
    with np.load(out / PER_STEP_FILE) as z:
        per_step = {k: z[k].astype(np.float64) for k in z.files}
    return Result(rows=read_rows(out / METRICS_FILE), per_step_rel_err=per_step,
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


def result_schemes(cfg: Config, result: Result) -> dict:
    """The SchemeConfigs a result ran: the config's, or those a run chose itself (the per-layer
    assignment's verification, whose schemes are not the config's template)."""
    from .config import SchemeConfig

    if set(result.schemes) == set(cfg.schemes):
        return cfg.schemes
    keys = ("kind", "fmt", "rounding", "read_fmt", "layers")
    return {n: SchemeConfig(**{k: v[k] for k in keys if k in v})
            for n, v in result.schemes.items()}


def build_summary(cfg: Config, result: Result, complete: bool = True) -> dict:
    from .cost import scheme_costs

    lengths, skipped = reported_lengths(cfg, result.steps)
    return {
        "complete": complete,
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
        "cost": scheme_costs(cfg, result_schemes(cfg, result), result.info.get("ssm_layers"),
                             result.info.get("mean_segment")),
        "info": result.info,
        "config": asdict(cfg),
        "inputs": input_fingerprint(cfg),
    }


def write_outputs(cfg: Config, result: Result, out: Path, complete: bool = True) -> dict:
    """metrics.csv, per_step.npz, the PNG, then summary.json last (it marks completion; an
    interrupted run's files, up to its last whole window, say ``complete: false`` and no PNG)."""
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / METRICS_FILE, rows_to_csv(result.rows))
    write_per_step(out / PER_STEP_FILE, result.per_step_rel_err)
    summary = build_summary(cfg, result, complete)
    if cfg.metrics.plot is not False and complete:
        from .plots import plot_error_vs_length

        m = cfg.model
        title = result.info.get("title") or (
            f"{m.name}: {m.heads}×{m.head_dim}×{m.state_dim}, {cfg.workload.kind}, "
            f"L={cfg.replay.buffer_len}" + (f", T={cfg.replay.drafts}" if cfg.replay.drafts
                                            else "") + f", seed {cfg.run.seed}")
        labels = {n: s["label"] for n, s in result.schemes.items()}
        plot_error_vs_length(result.rows, labels, out / PLOT_FILE, title,
                             budget=(cfg.metrics.budget_metric, cfg.metrics.budget))
    if "per_layer" in result.info and complete:  # experiment=per_layer: its sensitivity table
        write_sensitivity(result.info["per_layer"], out, cfg.metrics.plot is not False)
    text = summary.get("info", {}).pop("generations_text", None)
    if text is not None:  # model.mode=generate: both continuations, readable
        atomic_write_text(out / GENERATIONS_FILE, text)
    if "phases_s" in summary.get("info", {}):  # the files before summary.json (it is written last)
        summary["info"]["phases_s"]["files"] = round(time.perf_counter() - t0, 4)
    write_json(out / SUMMARY_FILE, summary)
    return summary




def write_sensitivity(pl: dict, out: Path, plot: bool) -> None:
    """``experiment=per_layer``'s ``sensitivity.csv`` (layer, format, the one-layer run's figure,
    the error it adds, the layer's bytes per token) and ``sensitivity.png`` (a layer x format
    heatmap of the added error); ``pl``: its ``info["per_layer"]``."""
    m = pl["metric"]
    below = pl.get("below_floor") or {}
    rows = [{"layer": int(la), "format": f, m: pl["sensitivity"][f][la],
             f"added_{m}": pl["added"][f][la], "bytes_per_token": pl["layer_bytes_per_token"][f],
             "below_floor": bool((below.get(f) or {}).get(la, False))}
            for la in pl["layers"] for f in pl["formats"]]
    atomic_write_text(out / SENS_CSV, rows_to_csv(rows))
    if plot:
        from .plots import plot_heatmap

        unit = " (squared)" if m == "rel_err" else ""
        plot_heatmap([{**r, "scheme": r["format"]} for r in rows], f"added_{m}", out / SENS_PNG,
                     f"error a layer adds in each format{unit}, the others at {pl['base_format']}")


def format_table(summary: dict) -> str:
    """A plain-text table of the headline figures (printed by the CLI)."""
    figs = summary["figures"]
    lengths = sorted({int(k) for f in figs.values() for k in f if k.isdigit()})
    seqs = summary.get("config", {}).get("run", {}).get("seqs")
    div = any("first_flip" in f.get("final", {}) for f in figs.values())
    kl = summary.get("config", {}).get("metrics", {}).get("kl", True) is not False  # off: no
    head = f"{'scheme':<26}" + "".join(f"{'err@' + _k(L):>11}" for L in lengths) + \
        f"{'err(final)':>11}" + (f"{'KL(final)':>11}" if kl else "") + \
        (f"{'top1':>8}{'1st flip':>15}" if div else "") + f"{'drift':>10}{'B/step/hd':>11}"
    lines = [head, "-" * len(head)]
    cost = summary.get("cost", {})
    stale = [n for n in figs if not name_matches(n, summary.get("schemes", {}).get(n) or {})]
    for name, f in figs.items():
        cells = "".join(f"{_fmt(f.get(str(L), {}).get('rel_err')):>11}" for L in lengths)
        fin = f.get("final", {})
        b = cost.get(name, {}).get("bytes_per_step")
        dead = summary["schemes"].get(name, {}).get("dead_at")
        tail = f"  (non-finite from step {dead})" if dead else ""
        shown = f"{name}*" if name in stale else name
        lines.append(f"{shown:<26}{cells}{_fmt(fin.get('rel_err')):>11}"
                     + (f"{_fmt(fin.get('kl')):>11}" if kl else "")  # (a column of nan)
                     + (f"{_share(fin.get('top1')):>8}{_flip(fin, _units(summary, name, seqs)):>15}"
                        if div else "")
                     + f"{_fmt(fin.get('state_drift')):>10}"
                     f"{(f'{b:,.0f}' if b is not None else '-'):>11}{tail}")
    for n in stale:
        lines.append(f"* {n} no longer runs what its name says (its settings were overridden): "
                     f"{_described(summary['schemes'][n])}")
    floor = (summary.get("info") or {}).get("floor")
    if floor:  # a whole-model run: what the columns are measured against, and its floor
        f, n = floor["fp32_vs_fp64"], floor["noise"]
        against = ("the FP32-state baseline" if floor["baseline"] == "fp32"
                   else "the float64-state reference")
        lines.append(f"(KL and top1 against {against}; floor: FP32 state vs float64 KL "
                     f"{_fmt(f['kl'])}, the model's own {floor['model_dtype']} noise KL "
                     f"{_fmt(n['kl'])}, top1 {_share(n['top1'])})")
    return "\n".join(lines)


def name_matches(name: str, info: dict) -> bool:
    """Whether a scheme's name (a preset's key such as ``split_fp32_nvfp4``) agrees with what it
    runs: every kind, format and ``sr`` the name spells is the scheme's (a name that spells none
    agrees). ``schemes.split_fp32_nvfp4.read_fmt=fp8_e4m3`` makes it disagree."""
    import re

    from . import formats as pf
    from .formats.ids import SCHEME_KINDS

    if not info:
        return True
    low = name.lower()
    if low.split("_")[0] in SCHEME_KINDS and info.get("kind") and low.split("_")[0] != info["kind"]:
        return False
    fmts = [str(f).lower() for f in (info.get("fmt"), info.get("read_fmt"),
                                     info.get("error_feedback")) if f]
    for f in sorted(pf.names(), key=len, reverse=True):  # whole names: nvfp4 before fp4_e2m1
        for m in list(re.finditer(rf"(?<![a-z0-9]){re.escape(f)}(?=$|_|sr)", low)):
            if not any(x == f or x.startswith(f + "_") for x in fmts):
                return False
            low = low[:m.start()] + "#" * len(f) + low[m.end():]  # (not matched again)
    said_sr = bool(re.search(r"(?:_|[0-9#])sr(?:_|$)", low))
    return not (said_sr and info.get("rounding") not in (None, "sr"))


def _described(info: dict) -> str:
    from .config import SchemeConfig
    from .schemes import describe

    keys = ("kind", "fmt", "rounding", "read_fmt", "error_feedback", "layers")
    try:
        return describe(SchemeConfig(**{k: info[k] for k in keys if info.get(k) is not None}))
    except Exception:  # noqa: BLE001 - an old summary: the stored label
        return str(info.get("label", ""))


def _units(summary: dict, name: str, seqs):
    """The runs a scheme's flip count is over: documents x SR seeds (whole-model run.sr_seeds)."""
    S = (summary.get("info") or {}).get("sr_seeds") or 1
    sr = summary["schemes"].get(name, {}).get("rounding") == "sr"
    return seqs * S if seqs and sr else seqs


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
