"""The window's row statistics (:func:`row_stats`), compiled: what the metrics
(:class:`precsim.metrics.Accumulator`) reduce of every output row, in one pass."""

from __future__ import annotations

import numpy as np

from .cache import njit


@njit(cache=True, nogil=True)
def row_stats(y32, y64, x64, x32, D64, D32, P, kl, err, s_ss, d, yh):
    """Per output row (a step of one sequence, width W = H*P) of every scheme, as the torch
    ops of ``Accumulator`` (and the Triton engine's ``row_stats``) compute them: the outputs
    with the skip term ``D x`` (float32 for the schemes, float64 for the truth; ``x64``
    empty without D), ``err (k, rows)`` rel_err, ``s_ss`` the sum of squares (not finite iff
    an output is not) and, if ``kl``, the readout's inputs ``yh (rows, W)`` (the truth,
    RMS-normalised) and ``d (k, rows, W)`` float32 = yh_sim - yh_ref. One pass instead of a
    float64 copy of every scheme and ~10 torch passes over it."""
    k, rows, W = y32.shape
    has_d = x64.shape[0] > 0
    ys = np.empty(W)
    for r in range(rows):
        rr = 0.0
        for c in range(W):
            v = y64[r, c]
            if has_d:
                v = v + D64[c // P] * x64[r, c]
            yh[r, c] = v
            rr += v * v
        rms_r = np.sqrt(rr / W)
        if not rms_r > 0:
            rms_r = 1.0
        for i in range(k):
            ss = 0.0
            ee = 0.0
            for c in range(W):
                u = y32[i, r, c]
                if has_d:
                    u = u + D32[c // P] * x32[r, c]
                v = np.float64(u)
                ys[c] = v
                ss += v * v
                e = v - yh[r, c]
                ee += e * e
            err[i, r] = np.sqrt(ee) / np.sqrt(rr)
            s_ss[i, r] = ss
            if kl:
                rms_s = np.sqrt(ss / W)
                if not rms_s > 0:
                    rms_s = 1.0
                for c in range(W):
                    d[i, r, c] = np.float32(ys[c] / rms_s - yh[r, c] / rms_r)
        for c in range(W):
            yh[r, c] = yh[r, c] / rms_r
