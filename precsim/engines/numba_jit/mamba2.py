"""Mamba-2's compiled tasks: the float64 truth (:func:`truth_task`) and a scheme
(:func:`scheme_task`, one compiled function per scheme kind and formats) on one head over one
window, and the reassociated dot product (:func:`dot`) of its outputs and of the truths.

A scheme's task keeps its state in cache for the whole window: per step the update (the torch
engine's float32 roundings), the quantisation (``quant.store``) and the output; ReplaySSM
schemes read the host's buffer terms (``Yb``, ``Fb``: ``engines.numba_host``) and fold at each
flush.
"""

from __future__ import annotations

import functools

import numpy as np

from .cache import njit
from .codes import table_key
from .quant import store


@njit(cache=True, fastmath={"reassoc"})
def dot(s, c):
    """sum_n s[n] c[n] (float32 or float64), in whatever order vectorises (Mamba-2's output
    reductions S.C and the float64 truths: the only sums whose order differs from the torch
    engine's)."""
    acc = s[0] * c[0]
    for n in range(1, s.shape[0]):
        acc += s[n] * c[n]
    return acc


@njit(cache=True, inline="always")
def _update(S, a, dt, xv, Bv, Cv, y):
    """S = a S + (dt x) B^T row by row (the torch engine's roundings), y = S C."""
    for p in range(S.shape[0]):
        row = S[p]
        dx = dt * xv[p]
        for n in range(row.shape[0]):
            row[n] = a * row[n] + dx * Bv[n]
        y[p] = dot(row, Cv)


@njit(cache=True, inline="always")
def _truth(S, a64, dt64, x64, B64, C64, y64, sh):
    for i in range(a64.shape[0]):
        _update(S, a64[i, sh], dt64[i, sh], x64[i, sh], B64[i, sh], C64[i, sh], y64[i, sh])


@njit(cache=True, inline="always")
def _scheme(st, rd, ef, code, keys, k0, a32, dt32, x32, B32, C32, Yb, gam, Fb, y32, sh, ph,
            floor, scope_none, recip, el, kind, qfmt, qlane, qread, qef):
    """One scheme on one head over one window (which starts at a flush boundary); ``ph``:
    each step's place in its segment (``engines.base.segment_phase``); ``kind, qfmt,
    qlane, qread, qef``: its :func:`.codes.scheme_consts`."""
    n_steps = a32.shape[0]
    P, N = st.shape
    base = np.int64(sh) * P * N
    R = rd if kind == 2 else st
    seg = 0
    for i in range(n_steps):
        y = y32[i, sh]
        if kind == 0:
            _update(st, a32[i, sh], dt32[i, sh], x32[i, sh], B32[i, sh], C32[i, sh], y)
            store(st, rd, ef, code, keys[i], k0, base, floor, scope_none, recip, el, kind,
                  qfmt, qlane, qread, qef)
            continue
        Cv = C32[i, sh]
        g = gam[i, sh]
        if (ph[i] & 2) == 0:  # output-only: the checkpoint (read copy) is only read
            yb = Yb[i, sh]
            for p in range(P):
                y[p] = yb[p] + g * dot(R[p], Cv)
        if ph[i] & 1:  # flush: fold (without drafts the output from it), write
            F = Fb[seg, sh]
            for p in range(P):
                row = st[p]
                fr = F[p]
                for n in range(N):
                    row[n] = g * row[n] + fr[n]
                if ph[i] & 2:
                    y[p] = dot(row, Cv)
            store(st, rd, ef, code, keys[i], k0, base, floor, scope_none, recip, el, kind,
                  qfmt, qlane, qread, qef)
            seg += 1


@njit(cache=True, nogil=True)
def truth_task(task, S64, st, rd, ef, codes, keys, k0, a64, dt64, x64, B64, C64, y64, a32,
               dt32, x32, B32, C32, Yb, gam, Fb, y32, ph, floor, scope_none, recip, el):
    """The float64 truth's task of a window (slot 0, see :func:`scheme_task`), on head ``sh``."""
    sh = task // (st.shape[0] + 1)
    _truth(S64[sh], a64, dt64, x64, B64, C64, y64, sh)


@functools.cache
def scheme_task(consts):
    """The compiled task of a window, one (head, slot), for a scheme of
    :func:`scheme_consts` ``consts``: ``task = sh * (ns + 1) + slot``, slot 0 the truth
    (:func:`truth_task`), slot i + 1 scheme i. Tasks write disjoint state and outputs, so
    threads run different tasks at once (nogil) and the result does not depend on who ran
    what. The constants are the closure's, so numba compiles one function per scheme kind
    and formats, with only their branches (numba caches each one: a closure's constants
    are part of its cache key; so is ``TK``, the format table's fingerprint: what a format
    code means is read off ``formats.ids`` when the task compiles)."""
    K, F, LANE, FR, FE = consts
    TK = table_key()

    @njit(cache=True, nogil=True)
    def task(task, S64, st, rd, ef, codes, keys, k0, a64, dt64, x64, B64, C64, y64, a32, dt32,
             x32, B32, C32, Yb, gam, Fb, y32, ph, floor, scope_none, recip, el):
        TK  # noqa: B018 - the format table's fingerprint, in the cache key
        sh, i = task // (st.shape[0] + 1), task % (st.shape[0] + 1) - 1
        _scheme(st[i, sh], rd[i, sh], ef[i, sh], codes[i], keys[i], k0, a32, dt32, x32, B32,
                C32, Yb, gam, Fb, y32[i], sh, ph, floor, scope_none, recip, el, K, F, LANE,
                FR, FE)

    return task
