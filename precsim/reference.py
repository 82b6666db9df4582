"""The plain NumPy engine (``run.engine=numpy``): one step at a time, one buffer list per scheme.

This is how the article runs the experiment, written to be read, not to be fast: for every token
each scheme appends to its buffer, evaluates its output from the checkpoint plus the buffer
(output-only), and flushes when the flush schedule says so. It shares nothing with the vectorised
torch engine but the formats and the metrics, so the two cross-check each other, and it is the
baseline of ``experiments/bench_cpu.py``.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from precsim import formats as pf

from .config import Config
from .engine import Result, _progress, flush_schedule
from .metrics import Accumulator, Readout
from .schemes import format_options, quantize_state
from .workload import make_workload

NP_DTYPES = {"fp32": np.float32, "fp64": np.float64}


class _Q:
    """Quantizer bound to one scheme (same SR streams as the torch engine)."""

    def __init__(self, name, cfg, sc):
        self.kw = dict(name=name, seed=cfg.run.seed, sc=sc, fmt_options=format_options(cfg),
                       layer_scope=cfg.formats.tensor_scope == "tensor")

    def __call__(self, S, fmt, rounding, event, purpose):
        return quantize_state(S, fmt, rounding, event=event, purpose=purpose, **self.kw)


def _out(S, c):
    return np.einsum("shvk,shk->shv", S, c)


def run_numpy(cfg: Config, progress: bool = True, record_outputs: bool = False) -> Result:
    t_start = time.perf_counter()
    wl = make_workload(cfg)  # first: a trace fixes model.family and the shape
    fam = cfg.model.family
    dt_ = NP_DTYPES[cfg.run.compute_dtype]
    Sq, H = cfg.run.seqs, cfg.model.heads
    P, N = cfg.model.head_dim, cfg.model.state_dim
    shape = (Sq, H, P, N)
    names = list(cfg.schemes)
    qs = {n: _Q(n, cfg, sc) for n, sc in cfg.schemes.items()}
    state = {n: np.zeros(shape, dt_) for n in names}
    read = {n: np.zeros(shape, dt_) for n in names}
    events = dict.fromkeys(names, 0)
    buf: dict[str, list] = {n: [] for n in names}
    dead: dict[str, int | None] = dict.fromkeys(names)
    A = wl.params.get("A")
    D = wl.params.get("D")
    S_ref = np.zeros(shape)
    bdt = cfg.replay.buffer_dtype
    u_master = cfg.replay.gdn_u_source == "master"
    spec = cfg.replay.drafts > 0

    def bround(v):
        if bdt == "fp64" or (bdt == "fp32" and v.dtype == np.float32):
            return v
        return pf.quantize(v, bdt, "rne")

    readout = Readout(H * P, cfg.metrics.vocab, cfg.metrics.logit_scale, "cpu") \
        if cfg.metrics.kl else None
    acc = Accumulator(names, cfg.metrics.window, readout)
    recorded: dict[str, list] = {n: [] for n in ["truth", *names]}
    bar = _progress(cfg, progress)
    pos = 0
    for m in flush_schedule(cfg):
        inp64 = wl.chunk(pos, pos + m)
        inp = {k: v.astype(dt_) for k, v in inp64.items()}
        y_ref = np.empty((m, Sq, H, P))
        ys = {n: np.empty((m, Sq, H, P), dt_) for n in names}
        for i in range(m):
            last = i == m - 1
            if fam == "mamba2":
                S_ref = _m2_update(S_ref, inp64, i, A)
                y_ref[i] = _out(S_ref, inp64["C"][i])
            else:
                S_ref, _ = _gdn_update(S_ref, inp64, i)
                y_ref[i] = _out(S_ref, inp64["q"][i])
            for n in names:
                sc = cfg.schemes[n]
                if dead[n] is not None:
                    ys[n][i] = np.nan
                    continue
                if sc.kind == "conventional":
                    if fam == "mamba2":
                        S_new = _m2_update(state[n], inp, i, A.astype(dt_))
                        ys[n][i] = _out(S_new, inp["C"][i])
                    else:
                        S_new, _ = _gdn_update(state[n], inp, i)
                        ys[n][i] = _out(S_new, inp["q"][i])
                    state[n] = qs[n](S_new, sc.fmt, sc.rounding, events[n], 0)
                    events[n] += 1
                else:
                    R = state[n] if sc.kind == "shared" else read[n]
                    ys[n][i] = _replay_step(fam, buf[n], R, state[n], inp, i, A, dt_, bround,
                                            u_master)
                    if last:  # flush: fold the buffer into the master, write back once
                        fold = _fold(fam, buf[n], state[n], dt_)
                        if not spec:
                            c = inp["C"][i] if fam == "mamba2" else inp["q"][i]
                            ys[n][i] = _out(fold, c)
                        state[n] = qs[n](fold, sc.fmt, sc.rounding, events[n], 0)
                        if sc.kind == "split":
                            read[n] = qs[n](state[n], sc.read_fmt, "rne", events[n], 1)
                        events[n] += 1
                        buf[n] = []
                if D is not None:
                    ys[n][i] += (D[:, None] * inp["x"][i]).astype(dt_)
                if dead[n] is None and not np.isfinite(ys[n][i]).all():
                    dead[n] = pos + i + 1
            if D is not None:
                y_ref[i] += D[:, None] * inp64["x"][i]
        pos += m
        acc.push(torch.from_numpy(y_ref), {n: torch.from_numpy(ys[n]) for n in names})
        if record_outputs:
            recorded["truth"].append(y_ref)
            for n in names:
                recorded[n].append(ys[n])
        if acc.want_drift(pos):
            held = {}
            for n in names:
                if dead[n] is not None:
                    held[n] = None
                    continue
                h = {"state": torch.from_numpy(state[n])}
                if cfg.schemes[n].kind == "split":
                    h["read"] = torch.from_numpy(read[n])
                held[n] = h
            acc.record_drift(pos, torch.from_numpy(S_ref), held)
        if bar is not None:
            bar.update(m)
    acc.finish()
    if bar is not None:
        bar.close()
    info = {"workload": cfg.workload.kind}
    if record_outputs:
        info["outputs"] = {k: np.concatenate(v) for k, v in recorded.items()}
    return Result(
        rows=acc.rows(),
        per_step_rel_err={n: np.concatenate(v) for n, v in acc.per_step_rel_err.items()},
        schemes={n: {"kind": s.kind, "label": s.label or n, "dead_at": dead[n], "fmt": s.fmt,
                     "rounding": s.rounding, "read_fmt": s.read_fmt}
                 for n, s in cfg.schemes.items()},
        engine="numpy", device="cpu", wall_s=time.perf_counter() - t_start,
        steps=cfg.run.steps, info=info)


def _m2_update(S, inp, i, A):
    dt = inp["dt"][i]
    a = np.exp(dt * A)
    return a[..., None, None] * S + (dt[..., None] * inp["x"][i])[..., :, None] \
        * inp["B"][i][..., None, :]


def _gdn_update(S, inp, i):
    alpha = np.exp(inp["g"][i])
    k = inp["k"][i]
    u = inp["beta"][i][..., None] * (inp["v"][i] - alpha[..., None] * np.einsum(
        "shvk,shk->shv", S, k))
    return alpha[..., None, None] * S + u[..., :, None] * k[..., None, :], u


def _replay_step(fam, buf, R, M, inp, i, A, dt_, bround, u_master):
    """Append step i to the buffer and return its output by output-only evaluation."""
    if fam == "mamba2":
        buf.append((inp["dt"][i] * A.astype(dt_), inp["dt"][i], bround(inp["x"][i]),
                    bround(inp["B"][i])))
        c = inp["C"][i]
        logs = np.stack([e[0] for e in buf])  # (m, S, H)
        after = np.cumsum(logs[::-1], axis=0)[::-1] - logs  # log-decay after each entry
        y = np.exp(logs.sum(0))[..., None] * _out(R, c)
        for j, (_, dt, x, B) in enumerate(buf):
            w = dt * np.exp(after[j])
            y = y + (w * np.einsum("shn,shn->sh", B, c))[..., None] * x
        return y
    k = bround(inp["k"][i])
    g = inp["g"][i]
    logs = np.stack([e[0] for e in buf] + [g])
    after = np.cumsum(logs[::-1], axis=0)[::-1] - logs
    # alpha_t S_{t-1} k_t from the checkpoint and the buffer, without building the state
    src = M if u_master else R
    Sk = np.exp(logs.sum(0))[..., None] * _out(src, k)
    for j, (_, u_j, k_j) in enumerate(buf):
        Sk = Sk + (np.exp(after[j]) * np.einsum("shk,shk->sh", k_j, k))[..., None] * u_j
    u = bround(inp["beta"][i][..., None] * (inp["v"][i] - Sk))
    buf.append((g, u, k))
    q = inp["q"][i]
    logs = np.stack([e[0] for e in buf])
    after = np.cumsum(logs[::-1], axis=0)[::-1] - logs
    y = np.exp(logs.sum(0))[..., None] * _out(R, q)
    for j, (_, u_j, k_j) in enumerate(buf):
        y = y + (np.exp(after[j]) * np.einsum("shk,shk->sh", k_j, q))[..., None] * u_j
    return y


def _fold(fam, buf, M, dt_):
    logs = np.stack([e[0] for e in buf])
    after = np.cumsum(logs[::-1], axis=0)[::-1] - logs
    S = np.exp(logs.sum(0))[..., None, None] * M
    for j, e in enumerate(buf):
        if fam == "mamba2":
            _, dt, x, B = e
            w = (dt * np.exp(after[j]))[..., None, None]
            S = S + w * (x[..., :, None] * B[..., None, :])
        else:
            _, u, k = e
            S = S + np.exp(after[j])[..., None, None] * (u[..., :, None] * k[..., None, :])
    return S.astype(dt_)
