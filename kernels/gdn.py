"""Fused Gated DeltaNet decode kernel: the float64 truth and every scheme over one window.

Same layout as :mod:`precsim.kernels.mamba2` (grid ``(seqs * heads, slots)``, a program per head
and slot, tiles ``[V, NB, BLK]`` with the key axis blocked, states in global memory between
launches, launches cover whole ReplaySSM segments). Here ``P`` names the value dim V.

Recurrence: ``u_t = beta_t (v_t - alpha_t S_{t-1} k_t)``,
``S_t = alpha_t S_{t-1} + u_t k_t^T``, ``o_t = S_t q_t``. ReplaySSM evaluates it output-only from
a buffer of the segment's ``(u_j, k_j)`` (buffer dtype), as the torch engine does:
``alpha_t S_{t-1} k_t = gamma_t (M k_t) + sum_{j<t} w_j(t) (k_j . k_t) u_j`` with ``M`` the read
copy or the master (``U_MASTER``, ``replay.gdn_u_source``), ``gamma_t = exp(Lc_t)`` and
``w_j(t) = exp(Lc_t - Lc_j)`` from the float32 cumulative log-decay ``Lc_t = sum_{i<=t} g_i``
since the checkpoint; ``o_t = gamma_t (R q_t) + sum_{j<=t} w_j(t) (q_t . k_j) u_j``; at a flush
``fold = gamma M + (w u)^T K`` (one IEEE float32 ``tl.dot``).

Inputs (one window, time-major): ``a64 (n, S*H)`` float64, ``a32`` float32 (``exp(g)``,
computed on the host as the torch engine does), ``g32`` (float32 log-decay), ``beta (n, S*H)``,
``q, k (n, S*H, K)``, ``v (n, S*H, V)`` float64.
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl

from .codes import CODE_BITS as _CB
from .codes import runtime_meta
from .mamba2 import truth_split
from .quant import round_elem, write_and_read


@triton.jit
def _load_step(a_ptr, b_ptr, q_ptr, k_ptr, v_ptr, i, sh, SHT, P: tl.constexpr, K: tl.constexpr,
               op, ok3):
    """Inputs of step i (int64): alpha, beta (scalars), q, k [NB, BLK], v [P]."""
    a = tl.load(a_ptr + i * SHT + sh)
    beta = tl.load(b_ptr + i * SHT + sh)
    rk = (i * SHT + sh) * K
    return a, beta, tl.load(q_ptr + rk + ok3), tl.load(k_ptr + rk + ok3), \
        tl.load(v_ptr + (i * SHT + sh) * P + op)


@triton.jit
def _truth(a64_ptr, b_ptr, q_ptr, k_ptr, v_ptr, S64_ptr, y64_ptr, n_steps, sh, SHT,
           P: tl.constexpr, NB: tl.constexpr, BLK: tl.constexpr, PB: tl.constexpr, p0):
    """Float64 recurrence in corrected-value form (the oracle's order of operations) on value
    rows ``[p0, p0 + PB)`` of the state (rows are independent: ``u`` is per row)."""
    K: tl.constexpr = NB * BLK
    op = p0 + tl.arange(0, PB)
    ok3 = tl.arange(0, NB)[:, None] * BLK + tl.arange(0, BLK)[None, :]
    off3 = op[:, None, None] * K + ok3[None, :, :]
    z64 = sh.to(tl.int64) * 0
    base = sh.to(tl.int64) * (P * K)
    S = tl.load(S64_ptr + base + off3)
    na, nb, nq, nk, nv = _load_step(a64_ptr, b_ptr, q_ptr, k_ptr, v_ptr, z64, sh, SHT, P, K, op,
                                    ok3)
    for i in range(n_steps):
        a, beta, q3, k3, v = na, nb, nq, nk, nv
        na, nb, nq, nk, nv = _load_step(a64_ptr, b_ptr, q_ptr, k_ptr, v_ptr,
                                        tl.minimum(z64 + i + 1, n_steps - 1), sh, SHT, P, K, op,
                                        ok3)  # prefetch the next step
        Sk = tl.sum(tl.sum(S * k3[None, :, :], axis=2), axis=1)
        u = beta * (v - a * Sk)
        S = a * S + u[:, None, None] * k3[None, :, :]
        y = tl.sum(tl.sum(S * q3[None, :, :], axis=2), axis=1)
        tl.store(y64_ptr + ((z64 + i) * SHT + sh) * P + op, y)
    tl.store(S64_ptr + base + off3, S)


@triton.jit
def _scheme(a32_ptr, g32_ptr, b_ptr, q_ptr, k_ptr, v_ptr, st_ptr, rd_ptr, ef_ptr, y32_ptr,
            k1_ptr, ph_ptr, k0, t0, n_steps, sh, SHT, YSTRIDE, SSTRIDE, KSTRIDE,
            IDX, CODE, EF, P: tl.constexpr,
            NB: tl.constexpr, BLK: tl.constexpr,
            LB: tl.constexpr, BUF: tl.constexpr, SFLOOR: tl.constexpr, SCOPE: tl.constexpr,
            U_MASTER: tl.constexpr):
    """One scheme (``CODE`` as in ``mamba2._scheme``) on one head."""
    # the fields of kernels.codes.pack (literal arithmetic; a test checks them): constexprs when
    # CODE is one (a kernel compiled for its schemes), else uniform runtime scalars (RUNTIME)
    KIND = CODE % 4  # 0 conventional, 1 shared, 2 split
    F = (CODE // 4) % 32
    RF = (CODE // 128) % 32
    RND = (CODE // 4096) % 2
    OVF = (CODE // 8192) % 2
    SRB = (CODE // 16384) % 64
    K: tl.constexpr = NB * BLK
    op = tl.arange(0, P)
    ok2 = tl.arange(0, K)
    ok3 = tl.arange(0, NB)[:, None] * BLK + tl.arange(0, BLK)[None, :]
    off3 = op[:, None, None] * K + ok3[None, :, :]
    z64 = sh.to(tl.int64) * 0
    base = sh.to(tl.int64) * (P * K)
    base_lo = (base & 0xFFFFFFFF).to(tl.uint32)
    base_hi = (base >> 32).to(tl.uint32)
    k0u = k0.to(tl.uint32)
    # strides rebuilt as multiples of the tile / row (the host passes exact multiples): the
    # compiler then knows the alignment, vectorises state loads/stores and lays tiles out with
    # 4 consecutive columns per thread (cheap block reductions, one SR hash per 4 elements)
    sst = (SSTRIDE // (P * K)) * (P * K)
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
    lrow = tl.arange(0, LB)
    Ub = tl.zeros([LB, P], tl.float32)  # buffer of corrected values u_j (buffer dtype)
    Kb = tl.zeros([LB, K], tl.float32)  # buffer of keys k_j (buffer dtype)
    if KIND == 0:
        a_ptr = a32_ptr  # per-step decay alpha = exp(g)
    else:
        a_ptr = g32_ptr  # per-step log-decay g
    Lc = tl.full([], 0.0, tl.float32)  # cumulative log-decay since the checkpoint
    Lb = tl.zeros([LB], tl.float32)  # Lc at each buffered step
    na, nb, nq, nk, nv = _load_step(a_ptr, b_ptr, q_ptr, k_ptr, v_ptr, z64, sh, SHT, P, K, op,
                                    ok3)
    nk2 = tl.zeros([K], k_ptr.dtype.element_ty)  # (defined for every kind: RUNTIME kinds)
    nq2 = nk2
    if KIND != 0:  # k and q as vectors too (the buffer's layout), prefetched as well
        nk2 = tl.load(k_ptr + (z64 * SHT + sh) * K + ok2)
        nq2 = tl.load(q_ptr + (z64 * SHT + sh) * K + ok2)
    for i in range(n_steps):
        a, b64, q64, k64, v64 = na, nb, nq, nk, nv
        inext = tl.minimum(z64 + i + 1, n_steps - 1)
        na, nb, nq, nk, nv = _load_step(a_ptr, b_ptr, q_ptr, k_ptr, v_ptr, inext, sh, SHT, P, K,
                                        op, ok3)  # prefetch the next step
        k2v, q2v = nk2, nq2
        if KIND != 0:
            nk2 = tl.load(k_ptr + (inext * SHT + sh) * K + ok2)
            nq2 = tl.load(q_ptr + (inext * SHT + sh) * K + ok2)
        beta = b64.to(tl.float32)
        q3 = q64.to(tl.float32)
        v = v64.to(tl.float32)
        if KIND == 0:
            k3 = k64.to(tl.float32)
            Sk = tl.sum(tl.sum(S * k3[None, :, :], axis=2), axis=1)
            u = beta * (v - a * Sk)
            W = a * S + u[:, None, None] * k3[None, :, :]
            y = tl.sum(tl.sum(W * q3[None, :, :], axis=2), axis=1)
            fl = KIND * 0 + 1  # a write every step
        else:
            ph = tl.load(ph_ptr + t0 + i)  # 4 j + flush + 2 (output from the fold)
            j = ph // 4
            k3 = round_elem(k64.to(tl.float32), BUF, 0, 0, 0, 0, 0, 0, 0, ok3)
            k2 = round_elem(k2v.to(tl.float32), BUF, 0, 0, 0, 0, 0, 0, 0, ok2)
            Lc = Lc + a  # a = g here
            gam = tl.exp(Lc)
            w = tl.where(lrow < j, tl.exp(Lc - Lb), 0.0)  # strictly earlier steps
            if U_MASTER or KIND == 1:
                Mk = tl.sum(tl.sum(S * k3[None, :, :], axis=2), axis=1)
            else:
                Mk = tl.sum(tl.sum(R * k3[None, :, :], axis=2), axis=1)
            KK = tl.sum(Kb * k2[None, :], axis=1)
            corr = tl.sum((w * KK)[:, None] * Ub, axis=0)
            u = round_elem(beta * (v - gam * Mk - corr), BUF, 0, 0, 0, 0, 0, 0, 0, op)
            Ub = tl.where(lrow[:, None] == j, u[None, :], Ub)
            Kb = tl.where(lrow[:, None] == j, k2[None, :], Kb)
            Lb = tl.where(lrow == j, Lc, Lb)
            w = tl.where(lrow <= j, tl.exp(Lc - Lb), 0.0)
            y = tl.zeros([P], tl.float32)
            if (ph & 2) == 0:  # output-only evaluation: the checkpoint is only read
                q2 = q2v.to(tl.float32)
                QK = tl.sum(Kb * q2[None, :], axis=1)
                y = tl.sum((w * QK)[:, None] * Ub, axis=0) + gam * tl.sum(
                    tl.sum(R * q3[None, :, :], axis=2), axis=1)
            W = S
            fl = ph & 1
            if fl != 0:  # flush: fold (without drafts the output from the fold)
                fold = tl.dot(tl.trans(w[:, None] * Ub), Kb, input_precision="ieee")
                W = gam * S + tl.reshape(fold, (P, NB, BLK))
                if (ph & 2) != 0:
                    y = tl.sum(tl.sum(W * q3[None, :, :], axis=2), axis=1)
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


@triton.jit(do_not_specialize=["k0", "t0", "n_steps", "SHT", "YSTRIDE", "SSTRIDE", "KSTRIDE"])
def gdn_window(a64_ptr, a32_ptr, g32_ptr, b_ptr, q_ptr, k_ptr, v_ptr, S64_ptr, st_ptr, rd_ptr,
               ef_ptr, y64_ptr, y32_ptr, k1_ptr, ph_ptr, k0, t0, n_steps, SHT, YSTRIDE, SSTRIDE,
               KSTRIDE,
               P: tl.constexpr, NB: tl.constexpr, BLK: tl.constexpr, LB: tl.constexpr,
               TRUTH: tl.constexpr, NSCH: tl.constexpr, BUF: tl.constexpr,
               SFLOOR: tl.constexpr, SCOPE: tl.constexpr, U_MASTER: tl.constexpr,
               ORDER: tl.constexpr,
               CODES: tl.constexpr, EFS: tl.constexpr = 0, meta_ptr=None,
               RUNTIME: tl.constexpr = 0):
    """One launch window: grid (S*H, TRUTH + NSCH); grid column k runs slot
    ``(ORDER >> 4k) & 15`` (costliest first, see ``mamba2_window``; ``EFS`` and ``RUNTIME`` as
    there)."""
    sh = tl.program_id(0)
    # int64: 9 slots take 36 bits
    if RUNTIME:  # meta: the slot of each grid column, then each slot's code and EF code
        slot = tl.load(meta_ptr + tl.program_id(1))
    else:
        slot = ((tl.full([], ORDER, tl.int64) >> (4 * tl.program_id(1))) & 15).to(tl.int32)
    if TRUTH:
        if slot == 0:
            _truth(a64_ptr, b_ptr, q_ptr, k_ptr, v_ptr, S64_ptr, y64_ptr, n_steps, sh, SHT, P,
                   NB, BLK, P, 0)
    if RUNTIME:  # one body for every scheme: its fields are runtime scalars
        if slot >= TRUTH:
            k = slot - TRUTH
            _scheme(a32_ptr, g32_ptr, b_ptr, q_ptr, k_ptr, v_ptr, st_ptr, rd_ptr, ef_ptr,
                    y32_ptr, k1_ptr, ph_ptr, k0, t0, n_steps, sh, SHT, YSTRIDE, SSTRIDE,
                    KSTRIDE, k, tl.load(meta_ptr + 16 + k),
                    tl.load(meta_ptr + 32 + k) if EFS else 0,
                    P, NB, BLK, LB, BUF, SFLOOR, SCOPE, U_MASTER)
    else:
        for k in tl.static_range(NSCH):  # one slot per scheme; CODES = sum code_k 2^(20 k)
            if slot == TRUTH + k:
                _scheme(a32_ptr, g32_ptr, b_ptr, q_ptr, k_ptr, v_ptr, st_ptr, rd_ptr, ef_ptr,
                        y32_ptr, k1_ptr, ph_ptr, k0, t0, n_steps, sh, SHT, YSTRIDE, SSTRIDE,
                        KSTRIDE, k, (CODES // 1048576**k) % 1048576, (EFS // 64**k) % 64,
                        P, NB, BLK, LB, BUF, SFLOOR, SCOPE, U_MASTER)


@triton.jit(do_not_specialize=["n_steps", "SHT"])
def gdn_truth(a64_ptr, b_ptr, q_ptr, k_ptr, v_ptr, S64_ptr, y64_ptr, n_steps, SHT,
              P: tl.constexpr, NB: tl.constexpr, BLK: tl.constexpr, PB: tl.constexpr):
    """The float64 truth alone: grid ``(S*H, V // PB)``, a program per head and block of ``PB``
    value rows (see ``mamba2.mamba2_truth``)."""
    _truth(a64_ptr, b_ptr, q_ptr, k_ptr, v_ptr, S64_ptr, y64_ptr, n_steps, tl.program_id(0), SHT,
           P, NB, BLK, PB, tl.program_id(1) * PB)


def launch(*, a64, a32, g32, beta, q, k, v, S64, st, rd, y64, y32, k1, ph, k0: int, t0: int,
           n: int, total: int, slots: list[int], codes: list[int], truth: bool, blk: int, LB: int,
           buf: int, sfloor: int, scope: int, order: int, u_master: bool, num_warps: int,
           maxnreg: int | None = None, ef=None, efs: int = 0, runtime: bool = False,
           warmup: bool = False):
    """One launch over steps ``[t0, t0+n)`` (see ``mamba2.launch``). Tensors: ``a64, a32, g32,
    beta (n, S*H)``, ``q, k (n, S, H, K)``, ``v (n, S, H, V)``, states ``(S*H, V, K)``."""
    SH, P, K = S64.shape
    assert v.shape[-1] == P and k.shape[-1] == K and K % blk == 0
    pb, tw = truth_split(SH, P, num_warps)
    if truth and not slots and pb < P:  # the truth alone: its rows split over programs
        grid = (SH, P // pb)
        kern = functools.partial(gdn_truth.warmup, grid=grid) if warmup else gdn_truth[grid]
        return kern(a64, beta.reshape(n, SH), q, k, v, S64, y64, n, SH, P=P, NB=K // blk,
                    BLK=blk, PB=pb, num_warps=tw, enable_fp_fusion=False)
    i0 = slots[0] if slots else 0
    packed = sum(c << (_CB * j) for j, c in enumerate(codes))
    # runtime codes: one compiled kernel for every scheme (its constexprs: shapes and options)
    meta = runtime_meta(truth, codes, order, efs, S64.device) if runtime else None
    consts = (dict(NSCH=0, ORDER=0, CODES=0, EFS=int(efs != 0), RUNTIME=1) if runtime else
              dict(NSCH=len(slots), ORDER=order, CODES=packed, EFS=efs))
    grid = (SH, int(truth) + len(slots))
    # warmup: compile (or load) without launching (engines.triton._compile_together)
    kern = functools.partial(gdn_window.warmup, grid=grid) if warmup else gdn_window[grid]
    return kern(
        a64, a32, g32, beta.reshape(n, SH), q, k, v, S64, st[i0:], rd[i0:],
        (st if ef is None else ef)[i0:], y64, y32[i0:],
        k1[i0:, t0:], ph, k0, t0, n, SH, y32.stride(0), SH * P * K, total, P=P,
        NB=K // blk, BLK=blk, LB=LB, TRUTH=int(truth), BUF=buf, SFLOOR=sfloor,
        SCOPE=scope, U_MASTER=int(u_master), meta_ptr=meta, **consts,
        num_warps=num_warps,
        enable_fp_fusion=False, **({"maxnreg": maxnreg} if maxnreg else {}))
