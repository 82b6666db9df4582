"""The vectorised torch engine (``run.engine=torch``; CPU or CUDA).

It walks the flush schedule: the positions between two ReplaySSM flushes form a segment
(``buffer_len`` steps, or irregular lengths under speculative decoding). Per segment it reads the
inputs once, advances the float64 truth (chunked, exact to rounding), steps every conventional
scheme token by token (the family's naive step), and evaluates every replay scheme's outputs for
the whole segment at once (output-only evaluation), then flushes. Memory stays flat.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ..checkpoint import Checkpoint, restore_acc
from ..config import Config
from ..families import decays, family_params, get_family
from ..metrics import Accumulator, Readout
from ..result import Result, make_result
from ..schemes import build_schemes
from ..workload import expand_groups, make_workload
from .base import buffer_rounder, flush_schedule, progress_bar, skip_to

NAME = "torch"
DTYPES = {"fp32": torch.float32, "fp64": torch.float64}


def supports(cfg: Config, device: str) -> str | None:
    return None


def run(cfg: Config, device: str = "cpu", progress: bool = True,
        record_outputs: bool = False, ckpt: Checkpoint | None = None) -> Result:
    """Run ``cfg``; ``record_outputs`` keeps every output in ``info["outputs"]`` (tests);
    ``ckpt`` saves and restores its state (:mod:`precsim.checkpoint`)."""
    t_start = time.perf_counter()
    ck = ckpt or Checkpoint(cfg, None)
    ck.start(NAME, device, t_start)
    wl = make_workload(cfg, device)  # first: a trace fixes model.family and the shape
    family = get_family(cfg.model.family)
    cdt = DTYPES[cfg.run.compute_dtype]
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
    br = buffer_rounder(cfg.replay.buffer_dtype, 32 if cdt == torch.float32 else 64)
    identity = lambda x: x  # noqa: E731
    u_master = cfg.replay.gdn_u_source == "master"
    bar = progress_bar(cfg, progress)
    pos = n_flush = 0
    recorded: dict[str, list] = {n: [] for n in ["truth", *(s.name for s in schemes)]}
    saved = ck.resume()
    if saved is not None:
        pos, n_flush, S_ref = saved["pos"], saved["n_flush"], saved["S_ref"].to(dev)
        restore_acc(acc, saved["acc"])
        for s, d in zip(schemes, saved["schemes"], strict=True):
            s.__dict__.update({k: v.to(dev) if torch.is_tensor(v) else v for k, v in d.items()})
        if bar is not None:
            bar.update(pos)

    def state() -> dict:
        return {"pos": pos, "n_flush": n_flush, "S_ref": S_ref, "acc": acc,
                "schemes": [vars(s) for s in schemes],
                "dead_at": {s.name: s.dead_at for s in schemes}}

    for m in skip_to(flush_schedule(cfg), pos):
        inp64 = expand_groups(wl.chunk(pos, pos + m), H)
        inp64["la"] = family.log_decay(inp64, p64)
        y_ref, S_ref = family.segment(S_ref, S_ref, inp64, p64, out_from_fold=True,
                                      buffer_round=identity)
        inp = {k: v.to(cdt) for k, v in inp64.items()}
        inp.update(decays(family.name, inp64, p64, cdt, cfg.model.decay_exp))
        if D64 is not None:
            y_ref = y_ref + D64[:, None] * inp64["x"]
        ys: dict[str, torch.Tensor | None] = {}
        for s in schemes:
            if s.dead_at is not None:
                ys[s.name] = None
                continue
            if s.replay:
                y = s.run_segment(family, inp, pc, True, out_from_fold=not spec,
                                  buffer_round=br, u_from_master=u_master)
            else:
                y = s.run_segment(family, inp, pc, True)
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
        ck.window(pos, state)
    acc.finish()
    if bar is not None:
        bar.close()
    info = {"flushes": n_flush, "mean_segment": cfg.run.steps / max(n_flush, 1), **ck.info()}
    if record_outputs:
        info["outputs"] = {k: np.concatenate(v) for k, v in recorded.items()}
    return make_result(cfg, acc, {s.name: s.dead_at for s in schemes}, engine=NAME,
                       device=device, t_start=t_start, info=info)
