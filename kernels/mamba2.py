"""Fused Mamba-2 decode kernel: the float64 truth and every scheme over one window of steps.

Grid ``(seqs * heads, slots)``: a program owns one head's whole state matrix ``(P, N)`` for one
*slot* (slot 0 the float64 truth when ``TRUTH``, then one slot per scheme), keeps every copy it
needs on-chip for the whole window (registers), loops over time and writes only the per-step
outputs ``y``. A program per head keeps NVFP4's per-matrix FP32 scale an in-program reduction.
Slots never talk to each other: they share only the input stream, so the schemes and the truth
advance in lockstep per launch. States persist in global memory between launches; a launch covers
whole ReplaySSM segments (it ends at a flush), so the replay buffers start empty and live in
registers only. Where each step sits in its segment comes from the host (``ph``: the flush
schedule, regular or, with speculative drafts, irregular).

Tiles are ``[P, NB, BLK]`` (``N = NB * BLK``, BLK the block of the scheme's block format) so
block scales are a reduction over the last axis without reshapes.

ReplaySSM is evaluated output-only from a buffer of the segment's inputs, as the
torch engine does: ``y_t = gamma_t (R C_t) + sum_j w_j(t) (C_t . B_j) x_j`` with the decays
from the float32 cumulative log-decay ``Lc_t = sum_{i<=t} dt_i A`` since the checkpoint:
``gamma_t = exp(Lc_t)``, ``w_j(t) = exp(Lc_t - Lc_j) dt_j`` (a product of per-step decays would
carry ~100x more float32 error on slowly decaying heads). At a flush
``fold = gamma M + (w x)^T B`` (one ``tl.dot`` in IEEE float32) gives the output and the write.

Inputs (one window, time-major, float64): ``dt, a64 (n, S*H)``, float32 ``a32 = exp(dt A)`` and
``dA32 = dt A`` (n, S*H) (computed on the host exactly as the torch engine does),
``x (n, S*H, P)``, ``B, C (n, S*G, N)`` (G groups; head h reads group ``h // REP``).
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl

from .codes import CODE_BITS as _CB
from .codes import runtime_meta
from .quant import round_elem, write_and_read

TRUTH_PROGRAMS = 256  # a truth-only launch splits heads' rows until it has this many programs
TRUTH_MIN_ROWS = 16  # ... but keeps at least this many rows per program
TRUTH_ROWS = 0  # rows per program of a truth-only launch (0: by the two rules above)
TRUTH_WARPS = 0  # warps of a truth-only launch (0: the caller's)
# a ReplaySSM scheme's segments as matrix products (:func:`_replay_segments`) instead of one
# output-only evaluation per step: off (a prototype for issue 44, not yet timed on a GPU)
SEGMENT_DOTS = False


def truth_split(SH: int, P: int, num_warps: int) -> tuple[int, int]:
    """Rows per program and warps of a truth-only launch over ``SH`` heads of ``P`` rows.

    Measured on one H200 (``experiments/diagnose/gpu_scan_split.py``, 8,192 tokens, us per
    token): a recording's 64 Mamba-2 heads (64 x 128) take 1.43 with a program per head (which
    spills registers) and 0.91 with 16 rows per program; 32 GDN heads (128 x 128) 3.02-6.08
    against 0.91-1.20. With 4 sequences (256 Mamba-2 programs already) a program per head is
    best: 1.84 against 2.41-3.16 split."""
    rows = min(P, TRUTH_ROWS) if TRUTH_ROWS else P
    while not TRUTH_ROWS and rows > TRUTH_MIN_ROWS and SH * (P // rows) < TRUTH_PROGRAMS:
        rows //= 2
    assert P % rows == 0, (P, rows)  # (tile dims are powers of 2)
    return rows, TRUTH_WARPS or num_warps


@triton.jit
def _load_step(dt_ptr, a_ptr, x_ptr, B_ptr, C_ptr, i, sh, sg, SHT, SGT, P: tl.constexpr,
               N: tl.constexpr, op, on3):
    """Inputs of step i (int64) of this head: dt, a (scalars), x [P], B, C [NB, BLK]."""
    dt = tl.load(dt_ptr + i * SHT + sh)
    a = tl.load(a_ptr + i * SHT + sh)
    x = tl.load(x_ptr + (i * SHT + sh) * P + op)
    rb = (i * SGT + sg) * N
    return dt, a, x, tl.load(B_ptr + rb + on3), tl.load(C_ptr + rb + on3)


@triton.jit
def _truth(dt_ptr, a64_ptr, x_ptr, B_ptr, C_ptr, S64_ptr, y64_ptr, n_steps, sh, sg, SHT, SGT,
           P: tl.constexpr, NB: tl.constexpr, BLK: tl.constexpr, PB: tl.constexpr, p0):
    """Float64 recurrence ``S = a S + dt x B^T``, ``y = S C`` (the oracle's order of operations)
    on rows ``[p0, p0 + PB)`` of the state (rows are independent)."""
    N: tl.constexpr = NB * BLK
    op = p0 + tl.arange(0, PB)
    on3 = tl.arange(0, NB)[:, None] * BLK + tl.arange(0, BLK)[None, :]
    off3 = op[:, None, None] * N + on3[None, :, :]
    z64 = sh.to(tl.int64) * 0
    base = sh.to(tl.int64) * (P * N)
    S = tl.load(S64_ptr + base + off3)
    ndt, na, nxv, nB, nC = _load_step(dt_ptr, a64_ptr, x_ptr, B_ptr, C_ptr, z64, sh, sg, SHT,
                                      SGT, P, N, op, on3)
    for i in range(n_steps):
        dt, a, x, B3, C3 = ndt, na, nxv, nB, nC
        ndt, na, nxv, nB, nC = _load_step(dt_ptr, a64_ptr, x_ptr, B_ptr, C_ptr,
                                          tl.minimum(z64 + i + 1, n_steps - 1), sh, sg, SHT,
                                          SGT, P, N, op, on3)  # prefetch the next step
        S = a * S + (dt * x)[:, None, None] * B3[None, :, :]
        y = tl.sum(tl.sum(S * C3[None, :, :], axis=2), axis=1)
        tl.store(y64_ptr + ((z64 + i) * SHT + sh) * P + op, y)
    tl.store(S64_ptr + base + off3, S)


@triton.jit
def _replay_segments(dt_ptr, dA_ptr, x_ptr, B_ptr, C_ptr, S, R, E, yp, kp, ph_ptr, k0u,
                     t0, n_steps, sh, sg, SHT, SGT, base_lo, base_hi, KIND, F, RF, RND, SRB, OVF,
                     EF, P: tl.constexpr, NB: tl.constexpr, BLK: tl.constexpr,
                     LB: tl.constexpr, BUF: tl.constexpr, SFLOOR: tl.constexpr,
                     SCOPE: tl.constexpr):
    """A ReplaySSM scheme (``KIND`` 1 shared, 2 split) over the window, a segment at a time as
    matrix products: with ``Lc`` the segment's cumulative log-decay, ``Y = (M o C B^T) X +
    exp(Lc) (C R^T)``, ``M[t, j] = exp(Lc_t - Lc_j) dt_j`` for ``j <= t``; at a flush the fold
    as in :func:`_scheme` (its output from the folded state where ``ph`` says so). The same
    arithmetic as the per-step evaluation in another summation order (``SEGMENT_DOTS``).
    ``S, R, E``: the state, read copy and residual at the window's start; returns them at its
    end."""
    N: tl.constexpr = NB * BLK
    op = tl.arange(0, P)
    on2 = tl.arange(0, N)
    on3 = tl.arange(0, NB)[:, None] * BLK + tl.arange(0, BLK)[None, :]
    off3 = op[:, None, None] * N + on3[None, :, :]
    lrow = tl.arange(0, LB)
    s0 = sh.to(tl.int64) * 0
    while s0 < n_steps:
        rows = s0 + lrow
        inr = rows < n_steps
        phv = tl.load(ph_ptr + t0 + rows, mask=inr, other=0)
        fl = ((phv & 1) != 0) & inr
        m = tl.minimum(tl.min(tl.where(fl, lrow + 1, LB), axis=0), n_steps - s0)
        ok = lrow < m
        X = tl.load(x_ptr + (rows[:, None] * SHT + sh) * P + op[None, :], mask=ok[:, None],
                    other=0.0).to(tl.float32)
        Xr = round_elem(X, BUF, 0, 0, 0, 0, 0, 0, 0, op[None, :])
        rb = (rows[:, None] * SGT + sg) * N + on2[None, :]
        Bm = round_elem(tl.load(B_ptr + rb, mask=ok[:, None], other=0.0).to(tl.float32), BUF, 0,
                        0, 0, 0, 0, 0, 0, on2[None, :])
        Cm = tl.load(C_ptr + rb, mask=ok[:, None], other=0.0).to(tl.float32)
        dtv = tl.load(dt_ptr + rows * SHT + sh, mask=ok, other=0.0).to(tl.float32)
        dAv = tl.load(dA_ptr + rows * SHT + sh, mask=ok, other=0.0)
        Lcv = tl.cumsum(dAv, axis=0)
        Mm = tl.where(lrow[None, :] <= lrow[:, None],
                      tl.exp(Lcv[:, None] - Lcv[None, :]) * dtv[None, :], 0.0)
        G = tl.dot(Cm, tl.trans(Bm), input_precision="ieee")
        Y = tl.dot(Mm * G, Xr, input_precision="ieee") + tl.exp(Lcv)[:, None] * tl.dot(
            Cm, tl.trans(tl.reshape(R, (P, N))), input_precision="ieee")
        last = m - 1
        at = lrow == last
        ph_last = tl.sum(tl.where(at, phv, 0), axis=0)
        if (ph_last & 1) != 0:  # the segment ends in a flush: fold, output, write
            wl = tl.sum(tl.where(at[:, None], Mm, 0.0), axis=0)  # M's last row: w_j
            fold = tl.dot(tl.trans(wl[:, None] * Xr), Bm, input_precision="ieee")
            gam = tl.exp(tl.sum(tl.where(at, Lcv, 0.0), axis=0))
            W = gam * S + tl.reshape(fold, (P, NB, BLK))
            if (ph_last & 2) != 0:  # the flush step's output from the folded state
                C3 = tl.load(C_ptr + ((s0 + last) * SGT + sg) * N + on3).to(tl.float32)
                yl = tl.sum(tl.sum(W * C3[None, :, :], axis=2), axis=1)
                Y = tl.where(at[:, None], yl[None, :], Y)
            k1 = tl.load(kp + s0 + last).to(tl.uint32, bitcast=True)
            S, E, R = write_and_read(W, E, KIND, EF, F, RF, RND, SRB, OVF, SFLOOR, SCOPE, k0u,
                                     k1, base_lo, base_hi, off3)
        tl.store(yp + (rows[:, None] * SHT + sh) * P + op[None, :], Y, mask=ok[:, None])
        s0 += m
    return S, R, E


@triton.jit
def _scheme(dt_ptr, a32_ptr, dA_ptr, x_ptr, B_ptr, C_ptr, st_ptr, rd_ptr, ef_ptr, y32_ptr,
            k1_ptr, ph_ptr, k0, t0, n_steps, sh, sg, SHT, SGT, YSTRIDE, SSTRIDE, KSTRIDE,
            IDX, CODE, EF, P: tl.constexpr,
            NB: tl.constexpr,
            BLK: tl.constexpr, LB: tl.constexpr, BUF: tl.constexpr, SFLOOR: tl.constexpr,
            SCOPE: tl.constexpr, SEGS: tl.constexpr = 0):
    """One scheme (``CODE``: kind | fmt | read fmt | rounding | overflow | SR bits) on one head.
    ``SEGS``: a ReplaySSM kind's segments as matrix products (:func:`_replay_segments`)."""
    # the fields of kernels.codes.pack (literal arithmetic; a test checks them): constexprs when
    # CODE is one (a kernel compiled for its schemes), else uniform runtime scalars (RUNTIME)
    KIND = CODE % 4  # 0 conventional, 1 shared, 2 split
    F = (CODE // 4) % 32
    RF = (CODE // 128) % 32
    RND = (CODE // 4096) % 2
    OVF = (CODE // 8192) % 2
    SRB = (CODE // 16384) % 64
    N: tl.constexpr = NB * BLK
    op = tl.arange(0, P)
    on2 = tl.arange(0, N)
    on3 = tl.arange(0, NB)[:, None] * BLK + tl.arange(0, BLK)[None, :]
    off3 = op[:, None, None] * N + on3[None, :, :]
    z64 = sh.to(tl.int64) * 0
    base = sh.to(tl.int64) * (P * N)
    base_lo = (base & 0xFFFFFFFF).to(tl.uint32)
    base_hi = (base >> 32).to(tl.uint32)
    k0u = k0.to(tl.uint32)
    # strides rebuilt as multiples of the tile / row (the host passes exact multiples): the
    # compiler then knows the alignment, vectorises state loads/stores and lays tiles out with
    # 4 consecutive columns per thread (cheap block reductions, one SR hash per 4 elements)
    sst = (SSTRIDE // (P * N)) * (P * N)
    st = st_ptr + IDX * sst + base
    rd = rd_ptr + IDX * sst + base
    yp = y32_ptr + IDX * ((YSTRIDE // P) * P)
    kp = k1_ptr + IDX * KSTRIDE
    S = tl.load(st + off3)  # state / checkpoint / master
    if EF != 0:  # error feedback: the residual carried to the next write (format id EF - 1)
        E = tl.load(ef_ptr + IDX * sst + base + off3)
    else:
        E = S
    if KIND == 2:
        R = tl.load(rd + off3)  # read copy
    else:
        R = S
    n_loop = n_steps
    if SEGS:
        if KIND != 0:  # the segments as matrix products; the per-step loop then runs no step
            S, R, E = _replay_segments(dt_ptr, dA_ptr, x_ptr, B_ptr, C_ptr, S, R, E, yp, kp,
                                       ph_ptr, k0u, t0, n_steps, sh, sg, SHT, SGT, base_lo,
                                       base_hi, KIND, F, RF, RND, SRB, OVF, EF, P, NB, BLK, LB,
                                       BUF, SFLOOR, SCOPE)
            n_loop = n_steps * 0
    lrow = tl.arange(0, LB)
    xb = tl.zeros([LB, P], tl.float32)  # buffer of the segment's inputs (buffer dtype)
    Bb = tl.zeros([LB, N], tl.float32)
    if KIND == 0:
        a_ptr = a32_ptr  # per-step decay exp(dt A)
    else:
        a_ptr = dA_ptr  # per-step log-decay dt A
    Lc = tl.full([], 0.0, tl.float32)  # cumulative log-decay since the checkpoint
    Lb = tl.zeros([LB], tl.float32)  # Lc at each buffered step
    db = tl.zeros([LB], tl.float32)  # dt of each buffered step
    ndt, na, nxv, nB, nC = _load_step(dt_ptr, a_ptr, x_ptr, B_ptr, C_ptr, z64, sh, sg, SHT,
                                      SGT, P, N, op, on3)
    nB2 = tl.zeros([N], B_ptr.dtype.element_ty)  # (defined for every kind: RUNTIME kinds)
    nC2 = nB2
    if KIND != 0:  # B and C as vectors too (the buffer's layout), prefetched as well
        nB2 = tl.load(B_ptr + (z64 * SGT + sg) * N + on2)
        nC2 = tl.load(C_ptr + (z64 * SGT + sg) * N + on2)
    for i in range(n_loop):
        dt64, a, x64, B64, C64 = ndt, na, nxv, nB, nC
        inext = tl.minimum(z64 + i + 1, n_steps - 1)
        ndt, na, nxv, nB, nC = _load_step(dt_ptr, a_ptr, x_ptr, B_ptr, C_ptr, inext, sh, sg,
                                          SHT, SGT, P, N, op, on3)  # prefetch the next step
        B2, C2 = nB2, nC2
        if KIND != 0:
            nB2 = tl.load(B_ptr + (inext * SGT + sg) * N + on2)
            nC2 = tl.load(C_ptr + (inext * SGT + sg) * N + on2)
        dt = dt64.to(tl.float32)
        x = x64.to(tl.float32)
        C3 = C64.to(tl.float32)
        if KIND == 0:
            W = a * S + (dt * x)[:, None, None] * B64.to(tl.float32)[None, :, :]
            y = tl.sum(tl.sum(W * C3[None, :, :], axis=2), axis=1)
            fl = KIND * 0 + 1  # a write every step
        else:
            ph = tl.load(ph_ptr + t0 + i)  # 4 j + flush + 2 (output from the fold)
            j = ph // 4
            xr = round_elem(x, BUF, 0, 0, 0, 0, 0, 0, 0, op)
            Br = round_elem(B2.to(tl.float32), BUF, 0, 0, 0, 0, 0, 0, 0, on2)
            Lc = Lc + a  # a = dt A here
            Lb = tl.where(lrow == j, Lc, Lb)
            db = tl.where(lrow == j, dt, db)
            w = tl.where(lrow <= j, tl.exp(Lc - Lb) * db, 0.0)
            gam = tl.exp(Lc)
            xb = tl.where(lrow[:, None] == j, xr[None, :], xb)
            Bb = tl.where(lrow[:, None] == j, Br[None, :], Bb)
            y = tl.zeros([P], tl.float32)
            if (ph & 2) == 0:  # output-only evaluation: the checkpoint is only read
                G = tl.sum(Bb * C2.to(tl.float32)[None, :], axis=1)
                y = tl.sum((w * G)[:, None] * xb, axis=0) + gam * tl.sum(
                    tl.sum(R * C3[None, :, :], axis=2), axis=1)
            W = S
            fl = ph & 1
            if fl != 0:  # flush: fold (without drafts the output from the fold)
                fold = tl.dot(tl.trans(w[:, None] * xb), Bb, input_precision="ieee")
                W = gam * S + tl.reshape(fold, (P, NB, BLK))
                if (ph & 2) != 0:
                    y = tl.sum(tl.sum(W * C3[None, :, :], axis=2), axis=1)
        if fl != 0:  # the write (one call site for every kind: one copy in a RUNTIME kernel)
            k1 = tl.load(kp + i).to(tl.uint32, bitcast=True)
            S, E, R = write_and_read(W, E, KIND, EF, F, RF, RND, SRB, OVF, SFLOOR, SCOPE, k0u,
                                     k1, base_lo, base_hi, off3)
            Lc = tl.full([], 0.0, tl.float32)
        tl.store(yp + ((z64 + i) * SHT + sh) * P + op, y)
    tl.store(st + off3, S)
    if KIND == 2:
        tl.store(rd + off3, R)
    if EF != 0:
        tl.store(ef_ptr + IDX * sst + base + off3, E)


@triton.jit(do_not_specialize=["k0", "t0", "n_steps", "H", "REP", "G", "SHT", "SGT", "YSTRIDE",
                               "SSTRIDE", "KSTRIDE"])
def mamba2_window(dt_ptr, a64_ptr, a32_ptr, dA_ptr, x_ptr, B_ptr, C_ptr, S64_ptr, st_ptr,
                  rd_ptr, ef_ptr, y64_ptr, y32_ptr, k1_ptr, ph_ptr, k0, t0, n_steps, H, REP, G,
                  SHT, SGT,
                  YSTRIDE, SSTRIDE, KSTRIDE,
                  P: tl.constexpr, NB: tl.constexpr, BLK: tl.constexpr, LB: tl.constexpr,
                  TRUTH: tl.constexpr, NSCH: tl.constexpr, BUF: tl.constexpr,
                  SFLOOR: tl.constexpr, SCOPE: tl.constexpr, ORDER: tl.constexpr,
                  CODES: tl.constexpr, EFS: tl.constexpr = 0, meta_ptr=None,
                  RUNTIME: tl.constexpr = 0, SEGS: tl.constexpr = 0):
    """One launch window: grid (S*H, TRUTH + NSCH). See the module docstring for the layout.
    ``EFS = sum ef_k 64^k``: slot k's error-feedback residual format id + 1 (0: none).

    Grid column k runs slot ``(ORDER >> 4k) & 15``: the host puts the costliest slots first, so
    their programs are dispatched first and the cheap ones fill the SMs behind them (a shorter
    tail per launch).

    ``RUNTIME``: the slots' codes are read from ``meta_ptr`` (``codes.runtime_meta``), one body
    for every scheme; ``NSCH``, ``ORDER``, ``CODES`` are then unused and ``EFS`` only says
    whether any slot has error feedback."""
    sh = tl.program_id(0)
    # int64: 9 slots take 36 bits
    if RUNTIME:  # meta: the slot of each grid column, then each slot's code and EF code
        slot = tl.load(meta_ptr + tl.program_id(1))
    else:
        slot = ((tl.full([], ORDER, tl.int64) >> (4 * tl.program_id(1))) & 15).to(tl.int32)
    sg = (sh // H) * G + (sh % H) // REP
    if TRUTH:
        if slot == 0:
            _truth(dt_ptr, a64_ptr, x_ptr, B_ptr, C_ptr, S64_ptr, y64_ptr, n_steps, sh, sg, SHT,
                   SGT, P, NB, BLK, P, 0)
    if RUNTIME:  # one body for every scheme: its fields are runtime scalars
        if slot >= TRUTH:
            k = slot - TRUTH
            _scheme(dt_ptr, a32_ptr, dA_ptr, x_ptr, B_ptr, C_ptr, st_ptr, rd_ptr, ef_ptr,
                    y32_ptr, k1_ptr, ph_ptr, k0, t0, n_steps, sh, sg, SHT, SGT, YSTRIDE,
                    SSTRIDE, KSTRIDE, k, tl.load(meta_ptr + 16 + k),
                    tl.load(meta_ptr + 32 + k) if EFS else 0,
                    P, NB, BLK, LB, BUF, SFLOOR, SCOPE, SEGS)
    else:
        for k in tl.static_range(NSCH):  # one slot per scheme; CODES = sum code_k 2^(20 k)
            if slot == TRUTH + k:
                _scheme(dt_ptr, a32_ptr, dA_ptr, x_ptr, B_ptr, C_ptr, st_ptr, rd_ptr, ef_ptr,
                        y32_ptr, k1_ptr, ph_ptr, k0, t0, n_steps, sh, sg, SHT, SGT, YSTRIDE,
                        SSTRIDE, KSTRIDE, k, (CODES // 1048576**k) % 1048576, (EFS // 64**k) % 64,
                        P, NB, BLK, LB, BUF, SFLOOR, SCOPE, SEGS)


@triton.jit(do_not_specialize=["n_steps", "H", "REP", "G", "SHT", "SGT"])
def mamba2_truth(dt_ptr, a64_ptr, x_ptr, B_ptr, C_ptr, S64_ptr, y64_ptr, n_steps, H, REP, G, SHT,
                 SGT, P: tl.constexpr, NB: tl.constexpr, BLK: tl.constexpr, PB: tl.constexpr):
    """The float64 truth alone (no scheme in the launch): grid ``(S*H, P // PB)``, a program per
    head and block of ``PB`` state rows. Rows are independent in the recurrence, so a head's
    rows split over programs: shorter steps (fewer elements and registers per program) and more
    programs for a launch of few heads (a recording: one sequence)."""
    sh = tl.program_id(0)
    sg = (sh // H) * G + (sh % H) // REP
    _truth(dt_ptr, a64_ptr, x_ptr, B_ptr, C_ptr, S64_ptr, y64_ptr, n_steps, sh, sg, SHT, SGT, P,
           NB, BLK, PB, tl.program_id(1) * PB)


def launch(*, dt, a64, a32, dA32, x, B, C, S64, st, rd, y64, y32, k1, ph, k0: int, t0: int,
           n: int, total: int, heads: int, slots: list[int], codes: list[int], truth: bool,
           blk: int, LB: int, buf: int, sfloor: int, scope: int, order: int, num_warps: int,
           maxnreg: int | None = None, ef=None, efs: int = 0, runtime: bool = False,
           warmup: bool = False):
    """One launch over steps ``[t0, t0+n)``: the truth (if ``truth``) and the schemes in storage
    slots ``slots`` (contiguous, codes ``codes``; error feedback: residuals ``ef`` shaped as
    ``st``, ``efs`` packed as ``mamba2_window``'s ``EFS``). Tensors:
    ``dt, a64, a32, dA32 (n, S*H)``,
    ``x (n, S, H, P)``, ``B, C (n, S, G, N)``, states ``S64 (S*H, P, N)``,
    ``st, rd (k, S*H, P, N)``, outputs ``y64 (n, S*H, P)``, ``y32 (k, n, S*H, P)``, SR keys
    ``k1 (k, total)``, each step's place in its ReplaySSM segment ``ph (total,)`` int32
    (``4 j + flush + 2 output-from-the-fold``, ``precsim.engines.base.segment_phase``)."""
    SH, P, N = S64.shape
    G = B.shape[2]
    assert heads % G == 0 and x.shape[-1] == P and B.shape[-1] == N and N % blk == 0
    pb, tw = truth_split(SH, P, num_warps)
    if truth and not slots and pb < P:  # the truth alone: its rows split over programs
        grid = (SH, P // pb)
        kern = (functools.partial(mamba2_truth.warmup, grid=grid) if warmup else
                mamba2_truth[grid])
        return kern(dt.reshape(n, -1), a64, x, B, C, S64, y64, n, heads, heads // G, G, SH,
                    (SH // heads) * G, P=P, NB=N // blk, BLK=blk, PB=pb,
                    num_warps=tw, enable_fp_fusion=False)
    i0 = slots[0] if slots else 0
    packed = sum(c << (_CB * k) for k, c in enumerate(codes))
    # runtime codes: one compiled kernel for every scheme (its constexprs: shapes and options)
    meta = runtime_meta(truth, codes, order, efs, S64.device) if runtime else None
    consts = (dict(NSCH=0, ORDER=0, CODES=0, EFS=int(efs != 0), RUNTIME=1) if runtime else
              dict(NSCH=len(slots), ORDER=order, CODES=packed, EFS=efs))
    grid = (SH, int(truth) + len(slots))
    # warmup: compile (or load) without launching (engines.triton._compile_together)
    kern = functools.partial(mamba2_window.warmup, grid=grid) if warmup else mamba2_window[grid]
    return kern(
        dt.reshape(n, -1), a64, a32, dA32, x, B, C, S64, st[i0:], rd[i0:],
        (st if ef is None else ef)[i0:], y64, y32[i0:],
        k1[i0:, t0:], ph, k0, t0, n, heads, heads // G, G, SH, (SH // heads) * G,
        y32.stride(0), SH * P * N, total, P=P, NB=N // blk, BLK=blk, LB=LB, TRUTH=int(truth),
        BUF=buf, SFLOOR=sfloor, SCOPE=scope, meta_ptr=meta, SEGS=int(SEGMENT_DOTS), **consts,
        num_warps=num_warps,
        enable_fp_fusion=False,
        **({"maxnreg": maxnreg} if maxnreg else {}))
