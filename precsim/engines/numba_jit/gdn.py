"""Gated DeltaNet's compiled tasks (:func:`truth_task`, :func:`scheme_task`: as
:mod:`.mamba2`'s): a ReplaySSM output depends on the checkpoint through ``u_t``, so the host
draws only the segments' input-only matrices (``engines.numba_host``) and each task evaluates
``u_t``, the output and the fold itself (:func:`_scheme_gdn`), its reductions in the torch
engine's fixed order (``S k`` and ``S q`` by :func:`_kdots`, the sums over a segment's steps in
step order), so its states and outputs are the torch engine's bit for bit.
"""

from __future__ import annotations

import functools

import numpy as np

from .cache import njit
from .codes import table_key
from .mamba2 import dot
from .quant import store


@njit(cache=True, inline="always")
def _kdot_any(x, y, tmp):
    """sum_c x[c] y[c] in families.base.key_dot's order, bit for bit (the torch engine's
    GDN sums): with ``h = ceil(n / 2)``, ``p_c + p_{c+h}`` for ``c < n - h`` (the first
    level from the products, an odd length's middle carried), halving until one is left;
    ``tmp`` scratch of at least ``ceil(n / 2)`` elements. Separate products and adds (numba
    compiles without fastmath, so LLVM fuses no multiply-add: checked in the code)."""
    n = x.shape[0]
    h = (n + 1) // 2
    for c in range(n - h):
        tmp[c] = x[c] * y[c] + x[c + h] * y[c + h]
    if n - h < h:
        tmp[n - h] = x[n - h] * y[n - h]
    n = h
    while n > 1:
        h = (n + 1) // 2
        for c in range(n - h):
            tmp[c] = tmp[c] + tmp[c + h]
        n = h
    return tmp[0]


def _kdot_pow2(n):
    """:func:`_kdot_any` for a constant length ``n = 2**k``: the same tree with constant
    trip counts, which LLVM vectorises and unrolls (21 ns per 128-row against ~100 ns with
    runtime ones, as fast as the reassociated :func:`dot`)."""
    h0 = n // 2

    @njit(inline="always")
    def kdot(x, y, tmp):
        for c in range(h0):
            tmp[c] = x[c] * y[c] + x[c + h0] * y[c + h0]
        h = h0 // 2
        while h >= 1:
            for c in range(h):
                tmp[c] = tmp[c] + tmp[c + h]
            h //= 2
        return tmp[0]

    return kdot


_kd32, _kd64, _kd128 = (_kdot_pow2(n) for n in (32, 64, 128))


@njit(cache=True)
def _kdots(M, y, out, tmp):
    """``out[p]`` = :func:`_kdot_any` of row ``p`` of ``M`` and ``y``: the key lengths 32,
    64 and 128 with constant trip counts, chosen once per matrix (chosen per row, inside a
    row loop that also updates the row, the GDN step ran 2x slower)."""
    K = M.shape[1]
    if K == 128:
        for p in range(M.shape[0]):
            out[p] = _kd128(M[p], y, tmp)
    elif K == 64:
        for p in range(M.shape[0]):
            out[p] = _kd64(M[p], y, tmp)
    elif K == 32:
        for p in range(M.shape[0]):
            out[p] = _kd32(M[p], y, tmp)
    else:
        for p in range(M.shape[0]):
            out[p] = _kdot_any(M[p], y, tmp)


@njit(cache=True, inline="always")
def _truth_gdn(S, a64, b64, q64, k64, v64, y64, sh):
    """The float64 truth, row by row: families.gdn.step's ``u = beta (v - a row.k)``,
    ``row = a row + u k``, ``row . q``, the sums reassociated (:func:`dot`: no engine shares
    the truth's bits)."""
    for i in range(a64.shape[0]):
        a, b, k, q = a64[i, sh], b64[i, sh], k64[i, sh], q64[i, sh]
        for p in range(S.shape[0]):
            row = S[p]
            u = b * (v64[i, sh, p] - a * dot(row, k))
            for c in range(row.shape[0]):
                row[c] = a * row[c] + u * k[c]
            y64[i, sh, p] = dot(row, q)


@njit(cache=True, inline="always")
def _scheme_gdn(st, rd, ef, code, keys, k0, a32, b32, q32, k32, v32, gam, A, M, wl, y32, sh,
                ph, floor, scope_none, recip, el, u_master, kind, qfmt, qlane, qread,
                qef):
    """One GDN scheme on one head over one window (which starts at a flush boundary):
    conventional schemes step and quantise every token; ReplaySSM schemes evaluate
    families.gdn.segment output by output (``u_t`` from the checkpoint's ``S k_t`` and the
    earlier ``u_j`` of the segment, ``A``/``M``/``wl`` the host's input-only segment
    matrices) and fold, quantise and renew the read copy at a flush."""
    n_steps = a32.shape[0]
    V, K = st.shape
    base = np.int64(sh) * V * K
    R = rd if kind == 2 else st
    RU = st if u_master else R
    U = np.zeros((A.shape[2], V), dtype=np.float32)
    acc = np.empty(K, dtype=np.float32)
    tmp = np.empty(K, dtype=np.float32)
    cv = np.empty(V, dtype=np.float32)  # per row: the sum over the segment's earlier j
    sk = np.empty(V, dtype=np.float32)  # per row: S k (key_dot's order, :func:`_kdots`)
    seg = 0
    for i in range(n_steps):
        y = y32[i, sh]
        kt = k32[i, sh]
        qt = q32[i, sh]
        if kind == 0:  # families.gdn.step: u = beta (v - a S k), S = a S + u k^T, y = S q
            a, bt, vt = a32[i, sh], b32[i, sh], v32[i, sh]
            _kdots(st, kt, sk, tmp)
            for p in range(V):
                row = st[p]
                u = bt * (vt[p] - a * sk[p])
                for c in range(K):
                    row[c] = a * row[c] + u * kt[c]
            _kdots(st, qt, y, tmp)
            store(st, rd, ef, code, keys[i], k0, base, floor, scope_none, recip, el, kind,
                  qfmt, qlane, qread, qef)
            continue
        j = ph[i] >> 2
        g = gam[i, sh]
        Aj = A[seg, sh, j]
        bt = b32[i, sh]
        vt = v32[i, sh]
        cv[:] = 0.0  # corr_p = sum_{jj < j} A[j, jj] u_jj[p], in that order (rows at once)
        for jj in range(j):
            ajj = Aj[jj]
            Ujj = U[jj]
            for p in range(V):
                cv[p] += ajj * Ujj[p]
        _kdots(RU, kt, sk, tmp)
        for p in range(V):
            U[j, p] = bt * (vt[p] - g * sk[p] - cv[p])
        if (ph[i] & 2) == 0:  # output-only: the checkpoint (read copy) is only read
            Mj = M[seg, sh, j]
            cv[:] = 0.0
            for jj in range(j + 1):
                mjj = Mj[jj]
                Ujj = U[jj]
                for p in range(V):
                    cv[p] += mjj * Ujj[p]
            _kdots(R, qt, sk, tmp)
            for p in range(V):
                y[p] = cv[p] + g * sk[p]
        if ph[i] & 1:  # flush: fold (without drafts the output from it), write
            w = wl[seg, sh]
            i0 = i - j
            for p in range(V):
                row = st[p]
                for c in range(K):
                    acc[c] = 0.0
                for jj in range(j + 1):
                    wu = w[jj] * U[jj, p]
                    kj = k32[i0 + jj, sh]
                    for c in range(K):
                        acc[c] += wu * kj[c]
                for c in range(K):
                    row[c] = g * row[c] + acc[c]
            if ph[i] & 2:
                _kdots(st, qt, y, tmp)
            store(st, rd, ef, code, keys[i], k0, base, floor, scope_none, recip, el, kind,
                  qfmt, qlane, qread, qef)
            seg += 1


@njit(cache=True, nogil=True)
def truth_task(task, S64, st, rd, ef, codes, keys, k0, a64, b64, q64, k64, v64, y64, a32,
               b32, q32, k32, v32, gam, A, M, wl, y32, ph, floor, scope_none, recip, el,
               u_master):
    """:func:`.mamba2.truth_task` for Gated DeltaNet."""
    sh = task // (st.shape[0] + 1)
    _truth_gdn(S64[sh], a64, b64, q64, k64, v64, y64, sh)


@functools.cache
def scheme_task(consts):
    """:func:`.mamba2.scheme_task` for Gated DeltaNet."""
    K, F, LANE, FR, FE = consts
    TK = table_key()

    @njit(cache=True, nogil=True)
    def task(task, S64, st, rd, ef, codes, keys, k0, a64, b64, q64, k64, v64, y64, a32, b32,
             q32, k32, v32, gam, A, M, wl, y32, ph, floor, scope_none, recip, el, u_master):
        TK  # noqa: B018 - the format table's fingerprint, in the cache key (mamba2.scheme_task)
        sh, i = task // (st.shape[0] + 1), task % (st.shape[0] + 1) - 1
        _scheme_gdn(st[i, sh], rd[i, sh], ef[i, sh], codes[i], keys[i], k0, a32, b32, q32,
                    k32, v32, gam, A, M, wl, y32[i], sh, ph, floor, scope_none, recip, el,
                    u_master, K, F, LANE, FR, FE)

    return task
