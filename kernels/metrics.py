"""Fused window-metric kernels of the Triton engine (plain tensors in, tensors out).

:func:`row_stats` reduces a window's outputs of every scheme in one pass (rel_err, non-finite
flags, the normalised readout inputs), :func:`drift_partials` the state drift, :func:`kl_tail`
the KL and the top-1 agreement after the readout matmuls. ``precsim.metrics.DeviceAccumulator``
drives them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _row_chunk(ys_row, yr_row, x_row, D_ptr, c, m, dead, P: tl.constexpr, HAS_D: tl.constexpr):
    """Columns ``c`` of one output row: the scheme's (float64, NaN if ``dead``) and the truth's,
    each with its skip term ``D x`` (float32 for the scheme, float64 for the truth)."""
    ys = tl.load(ys_row + c, mask=m, other=0.0)
    yr = tl.load(yr_row + c, mask=m, other=0.0)
    if HAS_D:
        Dh = tl.load(D_ptr + c // P, mask=m, other=0.0)
        xv = tl.load(x_row + c, mask=m, other=0.0)
        yr = yr + Dh * xv
        ys = ys + Dh.to(tl.float32) * xv.to(tl.float32)
    return tl.where(dead, float("nan"), ys).to(tl.float64), yr


@triton.jit(do_not_specialize=["ROWS", "W", "T0", "SQ"])
def _row_stats_kernel(y32_ptr, y64_ptr, x_ptr, D_ptr, first_ptr, err_ptr, d_ptr, yh_ptr,
                      ROWS, W, T0, SQ, P: tl.constexpr, HAS_D: tl.constexpr, KL: tl.constexpr,
                      BW: tl.constexpr):
    """One output row (a step of one sequence, width W = H*P) of one scheme slot: rel_err, the
    slot's first non-finite step (an atomic minimum into ``first``) and, for the KL, the
    normalised difference ``yh_sim - yh_ref`` (float32) and ``yh_ref`` (float64, slot 0 only).
    The skip term ``D x`` is added as the torch path does (float64 for the truth, float32 for the
    schemes); a slot dead before this window (``first <= T0``) reads as NaN."""
    r = tl.program_id(0)
    k = tl.program_id(1)
    ys_row = y32_ptr + (k * ROWS + r).to(tl.int64) * W
    yr_row = y64_ptr + r.to(tl.int64) * W
    x_row = x_ptr + r.to(tl.int64) * W
    dead = tl.load(first_ptr + k) <= T0
    ss = tl.zeros([BW], tl.float64)
    rr = tl.zeros([BW], tl.float64)
    ee = tl.zeros([BW], tl.float64)
    for c0 in range(0, W, BW):
        c = c0 + tl.arange(0, BW)
        m = c < W
        y, yr = _row_chunk(ys_row, yr_row, x_row, D_ptr, c, m, dead, P, HAS_D)
        ss += tl.where(m, y * y, 0.0)
        rr += yr * yr
        ee += tl.where(m, (y - yr) * (y - yr), 0.0)
    s_ss = tl.sum(ss, axis=0)
    s_rr = tl.sum(rr, axis=0)
    tl.store(err_ptr + k * ROWS + r, tl.sqrt(tl.sum(ee, axis=0)) / tl.sqrt(s_rr))
    step = T0 + 1 + r // SQ  # rows are (step, sequence)
    tl.atomic_min(first_ptr + k, step, mask=s_ss - s_ss != 0)  # NaN or Inf
    if KL:  # Readout.normalise: y / rms (1 where rms == 0)
        rms_s = tl.sqrt(s_ss / W)
        rms_r = tl.sqrt(s_rr / W)
        rms_s = tl.where(rms_s > 0, rms_s, 1.0)
        rms_r = tl.where(rms_r > 0, rms_r, 1.0)
        d_row = d_ptr + (k * ROWS + r).to(tl.int64) * W
        for c0 in range(0, W, BW):
            c = c0 + tl.arange(0, BW)
            m = c < W
            y, yr = _row_chunk(ys_row, yr_row, x_row, D_ptr, c, m, dead, P, HAS_D)
            yh = yr / rms_r
            tl.store(d_row + c, (y / rms_s - yh).to(tl.float32), mask=m)
            if k == 0:
                tl.store(yh_ptr + r.to(tl.int64) * W + c, yh, mask=m)


def row_stats(y32, y64, x, D, first, t0: int, seqs: int, rows: int, P: int, kl: bool):
    """Fused per-row statistics of one launch window (all scheme slots at once).

    ``y32 (k, n, S*H, P)`` float32 scheme outputs (storage slots), ``y64 (n, S*H, P)`` the truth
    (``rows = n*S`` rows of width ``W = H*P``, steps ``t0+1 .. t0+n``), ``x`` the inputs for the
    skip term ``D x`` (Mamba-2; None without D), ``first (k,)`` int32: each slot's first step
    with a non-finite output (``NO_STEP`` while none), updated in place, so a run tracks its
    dead schemes without a device op of its own; a slot with ``first <= t0`` reads as NaN.
    Returns ``err (k, rows)`` float64 rel_err and for the KL ``d (k, rows, W)`` float32 and
    ``yh_ref (rows, W)`` float64 (else None). One pass over the outputs instead of ~20 torch
    kernels over float64 copies.
    """
    k = y32.shape[0]
    ROWS = rows
    W = y64.numel() // ROWS
    dev = y32.device
    err = torch.empty((k, ROWS), dtype=torch.float64, device=dev)
    d = torch.empty((k, ROWS, W), dtype=torch.float32, device=dev) if kl else err
    yh = torch.empty((ROWS, W), dtype=torch.float64, device=dev) if kl else err
    has_d = D is not None
    xx = x.to(torch.float64).contiguous() if has_d else y64
    _row_stats_kernel[(ROWS, k)](y32, y64, xx, D if has_d else y64, first, err, d, yh, ROWS, W,
                                 t0, seqs, P=P, HAS_D=has_d, KL=kl,
                                 BW=min(1024, triton.next_power_of_2(W)), num_warps=4)
    return err, (d if kl else None), (yh if kl else None)


NO_STEP = 2**31 - 1  # row_stats' ``first`` of a slot without a non-finite output


@triton.jit(do_not_specialize=["E", "NCH"])
def _drift_kernel(ref_ptr, st_ptr, rd_ptr, out_ptr, E, NCH, CH: tl.constexpr, BW: tl.constexpr):
    """Partial sums over one chunk of a sequence's layer state: ``|st - ref|^2``,
    ``|rd - ref|^2`` (float32 copies against the float64 truth) and ``|ref|^2``."""
    c = tl.program_id(0)
    s = tl.program_id(1)
    k = tl.program_id(2)
    S = tl.num_programs(1)
    ref_row = ref_ptr + s.to(tl.int64) * E
    off = (k * S + s).to(tl.int64) * E
    a_s = tl.zeros([BW], tl.float64)
    a_r = tl.zeros([BW], tl.float64)
    a_n = tl.zeros([BW], tl.float64)
    for c0 in range(0, CH, BW):
        e = c * CH + c0 + tl.arange(0, BW)
        m = e < E
        rf = tl.load(ref_row + e, mask=m, other=0.0)
        da = tl.load(st_ptr + off + e, mask=m, other=0.0).to(tl.float64) - rf
        db = tl.load(rd_ptr + off + e, mask=m, other=0.0).to(tl.float64) - rf
        a_s += da * da
        a_r += db * db
        a_n += rf * rf
    o = out_ptr + ((k * S + s) * 3) * NCH + c
    tl.store(o, tl.sum(a_s, axis=0))
    tl.store(o + NCH, tl.sum(a_r, axis=0))
    tl.store(o + 2 * NCH, tl.sum(a_n, axis=0))


def drift_partials(ref, st, rd, k: int, S: int) -> torch.Tensor:
    """Partial sums of the state drift of ``k`` scheme slots, ``(k, S, 3, chunks)`` float64
    (``|st_i - ref|^2``, ``|rd_i - ref|^2``, ``|ref|^2`` per chunk of a sequence's state), for
    ``ref (S, ...)`` float64 and ``st``/``rd`` ``(>=k, S, ...)`` float32: one read of the states,
    one launch; :func:`drift_from_partials` finishes them (later, many samples at once)."""
    E = ref.numel() // S
    CH = 16384
    NCH = triton.cdiv(E, CH)
    out = torch.empty((k, S, 3, NCH), dtype=torch.float64, device=ref.device)
    _drift_kernel[(NCH, S, k)](ref, st, rd, out, E, NCH, CH=CH, BW=min(1024, CH), num_warps=4)
    return out


def drift_from_partials(parts: torch.Tensor):
    """``|st_i - ref| / |ref|`` and ``|rd_i - ref| / |ref|`` ``(..., k, S)`` from
    :func:`drift_partials` outputs ``(..., k, S, 3, chunks)`` (stacked samples welcome)."""
    tot = parts.sum(dim=-1)
    rn = torch.sqrt(tot[..., :1, :, 2])
    rn = torch.where(rn > 0, rn, torch.ones_like(rn))
    return torch.sqrt(tot[..., 0]) / rn, torch.sqrt(tot[..., 1]) / rn


@triton.jit(do_not_specialize=["ROWS"])
def _kl_kernel(ref_ptr, prod_ptr, scale_ptr, out_ptr, agree_ptr, ROWS, V, BV: tl.constexpr):
    """KL of one row of one scheme slot, ``Readout.kl`` operation for operation in float64:
    reference logits ``scale * ref[row]`` (``ref = yh_ref W64^T``), ``logp_ref = log_softmax``,
    ``logp_sim = log_softmax(logp_ref + scale * prod)`` (prod the float32 difference product),
    ``sum exp(logp_ref) (logp_ref - logp_sim)`` clamped at 0; and the top-1 agreement as
    ``precsim.metrics.kl_top1``: argmax of ``logp_ref + scale * prod`` (all finite) equals
    argmax of ``logp_ref`` (first index on ties)."""
    r = tl.program_id(0)
    k = tl.program_id(1)
    v = tl.arange(0, BV)
    m = v < V
    scale = tl.load(scale_ptr)  # float64 (a scalar argument would be float32)
    a = tl.load(ref_ptr + r.to(tl.int64) * V + v, mask=m, other=0.0)
    a = tl.where(m, scale * a, float("-inf"))
    sa = a - tl.max(tl.where(a == a, a, float("-inf")), axis=0)
    lp = sa - tl.log(tl.sum(tl.exp(sa), axis=0))
    p = tl.load(prod_ptr + (k * ROWS + r).to(tl.int64) * V + v, mask=m, other=0.0)
    b = lp + scale * p.to(tl.float64)
    # a NaN (dead scheme) must reach the result, as in torch: the max skips it, the sum not
    sb = b - tl.max(tl.where(b == b, b, float("-inf")), axis=0)
    ls = sb - tl.log(tl.sum(tl.exp(sb), axis=0))
    kl = tl.sum(tl.where(m, tl.exp(lp) * (lp - ls), 0.0), axis=0)
    tl.store(out_ptr + k * ROWS + r, tl.maximum(kl, 0.0, propagate_nan=tl.PropagateNan.ALL))
    finite = tl.sum(tl.where(m & (b - b != 0), 1, 0), axis=0) == 0  # b - b: NaN for Inf/NaN
    same = tl.argmax(lp, axis=0, tie_break_left=True) == tl.argmax(  # NaN lanes out of it
        tl.where(m & (b == b), b, float("-inf")), axis=0, tie_break_left=True)
    tl.store(agree_ptr + k * ROWS + r, (same & finite).to(tl.float64))


def kl_tail(ref: torch.Tensor, prod: torch.Tensor,
            scale64: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """KL and top-1 agreement (float64 1/0) per row, ``(k, rows)`` each, after the readout's two
    matmuls, in one pass: ``ref (rows, V)`` float64 reference logits before scaling, ``prod (k,
    rows, V)`` float32 difference logits, ``scale64 (1,)`` the logit scale (as
    ``precsim.metrics.Readout.kl_top1``)."""
    k, rows, V = prod.shape
    out = torch.empty((k, rows), dtype=torch.float64, device=prod.device)
    agree = torch.empty((k, rows), dtype=torch.float64, device=prod.device)
    _kl_kernel[(rows, k)](ref, prod, scale64, out, agree, rows, V,
                          BV=triton.next_power_of_2(V), num_warps=4)
    return out, agree
