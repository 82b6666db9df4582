"""The ``triton`` backend of :func:`precsim.models.scan.scan`: the fused kernels of
:mod:`precsim.kernels`, one launch per group and metrics window (of at least
``DRIFT_EVERY`` tokens, rounded up to whole ReplaySSM segments; the state drift is sampled at
each launch's end), the groups side by side on CUDA streams of their own.

The reference group runs in the kernels' float64 truth slot (measured faster here than the torch
engine's chunked truth beside the scheme launches: 44 against 51 s for a 1.3B-shape model over
4 x 32,768 tokens on one H200), each scheme group in a kernel scheme slot of its own (groups
see different inputs, so they cannot share a launch). States stay on the device between
windows; the SR keys are the torch backend's (same scheme names and events). The kernel's
horizon is padded to whole segments, so an incomplete last segment is not flushed.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import torch

from ..families import FAMILIES, decays
from ..workload import expand_groups
from .metrics import rel_ratio, row_dist

DRIFT_EVERY = 2048  # tokens between drift samples at least (launch windows)
# diagnosis knobs (experiments/diagnose/gpu_layer_scan.py): warps per launch (0: by the state's
# size) and whether the groups run on streams of their own
NUM_WARPS = 0
STREAMS = True
MAXNREG = None  # registers per thread at most (None: the compiler's choice)


def scan_triton(step, groups, K: int, cfg, carry: bool = False, chunks=None):
    from precsim.kernels.codes import dispatch_order
    from precsim.kernels.inputs import exp_f32
    from precsim.kernels.quant import SCOPE_MATRIX, SCOPE_NONE, as_int32, scale_flags
    from precsim.kernels.rng import event_keys

    from ..engines.base import segment_phase
    from ..engines.triton import kernel_sets, launch_span
    from ..engines.triton_codes import BUF_IDS, ef_code, scheme_block, scheme_code

    fam = step.family
    T, b = step.shape
    val = step.inp[FAMILIES[fam].VALUE]
    dev = val.device
    H, P = val.shape[2], val.shape[3]
    N = step.inp[FAMILIES[fam].KEY].shape[-1]
    L = cfg.replay.buffer_len
    # no flush at the end of an incomplete last segment (unless carrying the state on)
    off = chunks.offset if chunks is not None else 0
    total = T if carry else math.ceil((chunks.horizon if chunks is not None else T) / L) * L
    SH = K * H
    schemes = groups[1:]
    at = [g.at(step.layer) for g in schemes]  # each group's scheme in this layer
    codes = [scheme_code(sc) for sc in at]
    blocks = [scheme_block(sc) or min(16, N) for sc in at]
    kept = chunks.layers.get(step.layer) if chunks is not None else None
    if kept is not None:  # the previous chunk's states and SR keys
        S64, st, rd, ef, k1, k0, ph = (kept[k] for k in ("S64", "st", "rd", "ef", "k1", "k0",
                                                           "ph"))
    else:
        S64 = torch.zeros((SH, P, N), dtype=torch.float64, device=dev)
        if carry and step.state is not None:
            S64.copy_(step.state.reshape(SH, P, N))
        st = torch.zeros((len(schemes), SH, P, N), dtype=torch.float32, device=dev)
        # a read copy for each split group, a residual for each error-feedback group, None for
        # the others (the kernels touch them only for those kinds): at 64 documents of a
        # 64-head layer each such tensor is 134 MB a layer
        rd = [st.new_zeros((1, SH, P, N)) if sc.kind == "split" else None for sc in at]
        ef = [st.new_zeros((1, SH, P, N)) if ef_code(sc) else None for sc in at]
        keys = np.zeros((len(schemes), total), dtype=np.uint32)
        ev = np.arange(total, dtype=np.int64)
        k0 = 0
        for i, (g, sc) in enumerate(zip(schemes, at, strict=True)):
            if sc.rounding == "sr":
                k0, keys[i] = event_keys(cfg.run.seed, f"{g.name}@layer{step.layer}",
                                         ev if sc.kind == "conventional" else ev // L, 0)
        k1 = _upload(keys.view(np.int32), dev)
        ends = np.unique(np.minimum(np.arange(L, total + L, L), total))  # a flush every L
        ph = _upload(segment_phase(ends, total, True), dev)
        if chunks is not None:
            chunks.layers[step.layer] = {"S64": S64, "st": st, "rd": rd, "ef": ef, "k1": k1,
                                         "k0": k0, "ph": ph}
    params = {k: v.to(device=dev, dtype=torch.float64) for k, v in step.const.items()}
    D = params.get("D")
    nw = NUM_WARPS or (4 if P * N <= 8192 else 8)
    LB = max(16, 1 << (L - 1).bit_length())
    kw = dict(lpt=True, buf=BUF_IDS[cfg.replay.buffer_dtype],
              sfloor=scale_flags(cfg.formats.scale_floor, cfg.formats.nvfp4_scale),
              scope=SCOPE_NONE if cfg.formats.tensor_scope == "none" else SCOPE_MATRIX,
              u_master=cfg.replay.gdn_u_source == "master", kernels=kernel_sets(),
              order=dispatch_order)
    out = torch.empty((T, b, H, P), dtype=torch.float32, device=dev)
    # a launch per window of at least DRIFT_EVERY tokens (whole segments); the state drift is
    # sampled at each window's end. Groups run on streams of their own (on CUDA), side by side.
    win = math.ceil(max(cfg.metrics.window, DRIFT_EVERY) / L) * L
    fast = cfg.model.decay_exp == "fast"
    cuda = dev.type == "cuda"
    main = torch.cuda.current_stream(dev) if cuda else None
    streams = ([torch.cuda.Stream(device=dev) for _ in groups] if cuda and STREAMS else
               [None] * len(groups))
    y64_none = torch.empty((1, 1, P), dtype=torch.float64, device=dev)
    samples = []  # (token, [(state norm diff, read norm diff or None) per scheme], ref norm)
    for t0 in range(0, T, win):
        n = min(win, T - t0)
        for gi, (g, stream) in enumerate(zip(groups, streams, strict=True)):
            if stream is not None:
                stream.wait_stream(main)
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                rows = slice(gi * K, (gi + 1) * K)
                inp = {k: v[t0:t0 + n, rows].double().contiguous() for k, v in step.inp.items()}
                if not FAMILIES[fam].KERNEL_GROUPS:
                    inp = expand_groups(inp, H)
                d64 = decays(fam, inp, params, torch.float64)
                la32 = d64["la"].to(torch.float32)
                a32 = exp_f32(la32) if fast else d64["a"].to(torch.float32)
                inp.update({"_a64": d64["a"].reshape(n, SH), "_a32": a32.reshape(n, SH),
                            "_dA32": la32.reshape(n, SH)})
                if g.reference:  # the kernels' float64 truth slot
                    y = torch.empty((n, SH, P), dtype=torch.float64, device=dev)
                    launch_span(fam, inp, S64, st[:1], st[:1], y, st.new_empty((1, n, SH, P)),
                            k1[:1], ph, as_int32(k0), [], [], True, off + t0, n, total, H,
                            min(16, N), LB, nw, MAXNREG, **kw)
                else:
                    i = gi - 1
                    y = torch.empty((1, n, SH, P), dtype=torch.float32, device=dev)
                    own = st[i:i + 1]  # (the kernels read rd / ef only where they exist)
                    launch_span(fam, inp, S64, own, own if rd[i] is None else rd[i], y64_none, y,
                            k1[i:i + 1], ph, as_int32(k0), [0], [codes[i]], False, off + t0, n,
                            total, H, blocks[i], LB, nw, MAXNREG, ef=ef[i], efs=ef_code(at[i]),
                            **kw)
                    y = y[0]
                y = y.view(n, K, H, P)
                if D is not None:
                    y = y + D[:, None] * inp["x"].view(n, K, H, P)
                out[t0:t0 + n, rows] = y.to(torch.float32)
        for stream in streams:
            if stream is not None:
                main.wait_stream(stream)
        if n % L == 0:  # whole segments: every state is current
            ref = S64.view(K, -1)
            samples.append((off + t0 + n, [
                (row_dist(st[i].view(K, -1), ref),
                 row_dist(rd[i].view(K, -1), ref) if rd[i] is not None else None)
                for i, sc in enumerate(at)], torch.linalg.vector_norm(ref, dim=1)))
    layer = step.layer
    bad = None if carry else ~torch.isfinite(out.view(T, len(groups), -1)).all(dim=2)  # (T, g)

    def settle():  # one device-to-host copy per sample; then the first non-finite token
        for tok, per, rn in samples:
            rn = rn.cpu().numpy()
            for (d_st, d_rd), g in zip(per, schemes, strict=True):
                g.drift.setdefault(layer, []).append(
                    (tok, rel_ratio(d_st.cpu().numpy(), rn),
                     None if d_rd is None else rel_ratio(d_rd.cpu().numpy(), rn)))
        if bad is not None and bool(bad.any()):
            for gi, g in enumerate(groups):
                hit = torch.nonzero(bad[:, gi])
                if hit.numel():
                    first = off + int(hit[0, 0]) + 1
                    g.dead_at = min(g.dead_at or first, first)

    if chunks is not None and not carry:
        chunks.pending.append(settle)  # read back after the forward pass (Chunks.settle)
    else:
        settle()
    if carry:
        return out, S64.view(K, H, P, N)
    return out


def _upload(a: np.ndarray, dev) -> torch.Tensor:
    """A host array on ``dev`` without waiting for the device: a copy from pageable memory
    waits for the stream's queued work first, one from page-locked memory does not."""
    t = torch.from_numpy(np.ascontiguousarray(a))
    if dev.type != "cuda":
        return t.to(dev)
    return t.pin_memory().to(dev, non_blocking=True)
