"""Engines: the float64 truth and every scheme advance in lockstep over one input stream.

The vectorised torch engine walks the *flush schedule*: the positions between two ReplaySSM
flushes form a segment (``buffer_len`` steps, or irregular lengths under speculative decoding).
Per segment it reads the inputs once, advances the float64 truth (chunked, exact to rounding),
steps every conventional scheme token by token, and evaluates every replay scheme's outputs for the
whole segment at once (output-only evaluation), then flushes. Memory stays flat over the horizon.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from precsim import formats as pf

from .config import Config
from .errors import PrecsimError
from .metrics import Accumulator, Readout
from .schemes import build_schemes
from .ssm import family_params, get_family
from .workload import make_workload

TORCH_DTYPES = {"fp32": torch.float32, "fp64": torch.float64}


@dataclass
class Result:
    """What a run produced: tidy window rows, per-step errors, and run facts."""

    rows: list[dict]
    per_step_rel_err: dict[str, np.ndarray]
    schemes: dict[str, dict]
    engine: str
    device: str
    wall_s: float
    steps: int
    info: dict = field(default_factory=dict)


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise PrecsimError("run.device='cuda' but no CUDA device is visible; allowed here: "
                           "auto, cpu")
    return name


def resolve_engine(name: str, device: str) -> str:
    if name == "auto":
        if device == "cuda":
            from precsim.kernels import available

            return "triton" if available() else "torch"
        return "torch"
    if name == "triton":
        from precsim.kernels import available, why_unavailable

        if not available(device):
            raise PrecsimError(f"run.engine='triton' is unavailable ({why_unavailable(device)});"
                               " allowed here: auto, torch, numpy")
    return name


def flush_schedule(cfg: Config) -> Iterator[int]:
    """Lengths of the segments between flushes, in committed tokens, until ``run.steps``.

    Without drafts: ``buffer_len`` each. With ``drafts = T``: each verification appends T drafts
    and commits ``a`` of them (i.i.d. acceptance: the run of leading successes, or
    ``accept_seq`` cycled); a flush follows when ``committed + 2T > buffer_len``.
    """
    r = cfg.replay
    steps, L, T = cfg.run.steps, r.buffer_len, r.drafts
    done = 0
    if T == 0:
        while done < steps:
            m = min(L, steps - done)
            done += m
            yield m
        return
    rng = np.random.default_rng([cfg.run.seed, 0xACCE])
    seq = list(r.accept_seq) if r.accept_seq else None
    i = committed = 0
    while done < steps:
        if seq is not None:
            a = int(seq[i % len(seq)])
        else:
            ok = rng.random(T) < r.acceptance
            a = int(np.argmin(ok)) if not ok.all() else T
        i += 1
        a = min(a, steps - done - committed)
        committed += a
        if committed and (committed + 2 * T > L or done + committed >= steps):
            done += committed
            yield committed
            committed = 0


def _buffer_rounder(dtype_name: str, compute: torch.dtype):
    if dtype_name == "fp64" or (dtype_name == "fp32" and compute == torch.float32):
        return lambda x: x
    return lambda x: pf.quantize(x, dtype_name, "rne")


def run_torch(cfg: Config, device: str, progress: bool = True,
              record_outputs: bool = False) -> Result:
    """The vectorised engine. ``record_outputs`` keeps every output (tests, small runs)."""
    t_start = time.perf_counter()
    wl = make_workload(cfg)  # first: a trace fixes model.family and the shape
    family = get_family(cfg.model.family)
    cdt = TORCH_DTYPES[cfg.run.compute_dtype]
    dev = torch.device(device)
    p64 = family_params(family.name, wl.params, dev, torch.float64)
    pc = family_params(family.name, wl.params, dev, cdt)
    D = wl.params.get("D")
    D64 = torch.as_tensor(D, dtype=torch.float64, device=dev) if D is not None else None
    Dc = D64.to(cdt) if D64 is not None else None  # the D*x skip, in the schemes' precision
    Sq, H = cfg.run.seqs, cfg.model.heads
    Dv, Dk = family.state_dims(cfg.model)
    shape = (Sq, H, Dv, Dk)
    schemes = build_schemes(cfg)
    for s in schemes:
        s.init(shape, dev, cdt)
    S_ref = torch.zeros(shape, dtype=torch.float64, device=dev)
    readout = Readout(H * Dv, cfg.metrics.vocab, cfg.metrics.logit_scale, dev) \
        if cfg.metrics.kl else None
    acc = Accumulator([s.name for s in schemes], cfg.metrics.window, readout)
    spec = cfg.replay.drafts > 0
    br = _buffer_rounder(cfg.replay.buffer_dtype, cdt)
    identity = lambda x: x  # noqa: E731
    u_master = cfg.replay.gdn_u_source == "master"
    bar = _progress(cfg, progress)
    pos = n_flush = 0
    recorded: dict[str, list] = {n: [] for n in ["truth", *(s.name for s in schemes)]}
    for m in flush_schedule(cfg):
        raw = wl.chunk(pos, pos + m)
        inp64 = {k: torch.as_tensor(v, device=dev) for k, v in raw.items()}
        y_ref, S_ref = family.segment(S_ref, S_ref, inp64, p64, out_from_fold=True,
                                      buffer_round=identity)
        inp = {k: v.to(cdt) for k, v in inp64.items()} if cdt != torch.float64 else inp64
        if D64 is not None:
            y_ref = y_ref + D64[:, None] * inp64["x"]
        ys: dict[str, torch.Tensor | None] = {}
        for s in schemes:
            if s.dead_at is not None:
                ys[s.name] = None
                continue
            if s.replay:
                y = s.run_segment(family, inp, pc, pos, True, out_from_fold=not spec,
                                  buffer_round=br, u_from_master=u_master)
            else:
                y = s.run_segment(family, inp, pc, pos, True)
            if Dc is not None:
                y = y + Dc[:, None] * inp["x"]
            finite = torch.isfinite(y).reshape(m, -1).all(dim=1)
            if not bool(finite.all()):
                s.dead_at = pos + int((~finite).nonzero()[0, 0]) + 1
            ys[s.name] = y
        pos += m
        n_flush += 1
        acc.push(y_ref, ys)
        if record_outputs:
            recorded["truth"].append(y_ref.cpu().numpy())
            for n, y in ys.items():
                recorded[n].append(np.full(y_ref.shape, np.nan) if y is None
                                   else y.cpu().numpy())
        if acc.want_drift(pos):
            acc.record_drift(pos, S_ref, {s.name: (None if s.dead_at else s.held())
                                          for s in schemes})
        if bar is not None:
            bar.update(m)
    acc.finish()
    if bar is not None:
        bar.close()
    info = {"flushes": n_flush, "workload": cfg.workload.kind,
            "mean_segment": cfg.run.steps / max(n_flush, 1)}
    if record_outputs:
        info["outputs"] = {k: np.concatenate(v) for k, v in recorded.items()}
    return Result(
        rows=acc.rows(),
        per_step_rel_err={n: np.concatenate(v) for n, v in acc.per_step_rel_err.items()},
        schemes={s.name: {"kind": s.kind, "label": s.label, "dead_at": s.dead_at,
                          "fmt": s.cfg.fmt, "rounding": s.cfg.rounding,
                          "read_fmt": s.cfg.read_fmt} for s in schemes},
        engine="torch", device=device, wall_s=time.perf_counter() - t_start,
        steps=cfg.run.steps, info=info)


def _progress(cfg: Config, enabled: bool):
    if not (enabled and cfg.run.progress):
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        return None
    return tqdm(total=cfg.run.steps, unit="step", desc="precsim", mininterval=0.5,
                leave=False, dynamic_ncols=True, disable=None)  # None: off when not a TTY


def run(cfg: Config, progress: bool = True) -> Result:
    """Run a validated config on the engine and device it asks for."""
    device = resolve_device(cfg.run.device)
    engine = resolve_engine(cfg.run.engine, device)
    if cfg.run.threads > 0 and torch.get_num_threads() != cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    if engine == "numba":
        from .engine_numba import run_numba_or_torch

        return run_numba_or_torch(cfg, progress=progress)
    if engine == "numpy":
        from .reference import run_numpy

        return run_numpy(cfg, progress=progress)
    if engine == "triton":
        from precsim.kernels import run_triton

        return run_triton(cfg, device, progress=progress)
    return run_torch(cfg, device, progress=progress)


def summary_figures(rows: list[dict], lengths: list[int], steps: int) -> dict:
    """rel_err / kl / drift of each scheme at the reported lengths (window ending there)."""
    out: dict[str, dict] = {}
    for r in rows:
        out.setdefault(r["scheme"], {})
    for name in out:
        mine = [r for r in rows if r["scheme"] == name]
        for L in lengths:
            if L > steps:
                continue
            cand = [r for r in mine if r["step"] >= L]
            if not cand:
                continue
            r = min(cand, key=lambda r: r["step"])
            out[name][str(L)] = {k: r.get(k, math.nan) for k in
                                 ("rel_err", "kl", "state_drift", "read_drift")}
        last = mine[-1] if mine else None
        if last:
            out[name]["final"] = {k: last.get(k, math.nan) for k in
                                  ("step", "rel_err", "kl", "state_drift", "read_drift")}
    return out
