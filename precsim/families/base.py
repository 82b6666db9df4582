"""What the family modules share: the synthetic workloads' transforms, the causal decay matrices
of a ReplaySSM segment and the fixed-order key-axis dot products."""

from __future__ import annotations

import numpy as np
import torch

KEY_DOT_CHUNK = 1 << 24  # elements of one product tensor of :func:`key_dot`


def inv_softplus(y):
    return y + np.log(-np.expm1(-y))


def softplus(xp, x):
    """``log(1 + e^x)`` in the array library ``xp`` (NumPy or torch), as the workloads take it."""
    return xp.logaddexp(x * 0.0, x)


def unit(xp, x):
    """``x / ||x||_2`` over the last axis (``xp``: NumPy or torch)."""
    return x / xp.sqrt((x * x).sum(-1))[..., None]


_CAUSAL: dict = {}  # (m, device) -> the (m, m) lower-triangular mask (read only)


def causal_mask(m: int, device) -> torch.Tensor:
    """The ``(m, m)`` boolean mask ``j <= t``, built once per length and device (a one-token
    generation step would otherwise build it at every segment of every group)."""
    key = (m, device)
    mask = _CAUSAL.get(key)
    if mask is None:
        mask = _CAUSAL[key] = torch.ones(m, m, dtype=torch.bool, device=device).tril()
    return mask


def decay_matrices(la: torch.Tensor):
    """Cumulative log-decay ``Lc (m,S,H)`` and ``D[s,h,t,j] = Lc_t - Lc_j`` masked to j <= t."""
    Lc = torch.cumsum(la, 0)
    Lh = Lc.permute(1, 2, 0)
    D = Lh[..., :, None] - Lh[..., None, :]
    causal = causal_mask(la.shape[0], D.device)
    # (-inf as a scalar: a tensor built from a host value on a GPU is a copy that waits for the
    # device, at every segment)
    return Lc, torch.where(causal, D, float("-inf"))


def key_dot(S, x):
    """``sum_c S[..., c] x[..., c]`` over the key axis (the last, length ``n``) in one fixed,
    documented order, so that every engine that implements it gets the same float bits (the
    numba engine's ``_kdots``): the products ``p_c``, then, while ``n > 1``, with
    ``h = ceil(n / 2)``: ``p_c <- p_c + p_{c+h}`` for ``c < n - h`` (an odd length carries its
    middle element), ``n <- h``. A pairwise tree (error ~ log2(n) ulp, as accurate as BLAS's
    sums), written as elementwise products and adds (each exactly rounded, no fused
    multiply-add). ``S (..., V, K)``, ``x (..., K)`` broadcast against ``S``'s leading axes
    with ``V`` inserted: returns ``(..., V)``. NumPy or torch. A leading axis of ``x`` beyond
    ``S``'s (a segment's steps) is taken in chunks of at most ``KEY_DOT_CHUNK`` product
    elements. float64 (the truth, whose bits no two engines share: each computes it its own
    way) keeps the library's sums, as before this order was fixed: ``(S x).sum(-1)`` for one
    step, an einsum over a segment (the tree costs ~10x a matmul there)."""
    torch_ = torch.is_tensor(S)
    xv = x[..., None, :]
    if S.dtype == (torch.float64 if torch_ else np.float64):
        return (S * xv).sum(-1) if xv.ndim <= S.ndim else (torch if torch_ else np).einsum(
            "...vk,...k->...v", S, x)
    per = int(np.prod(np.broadcast_shapes(S.shape, xv.shape[1:]))) if xv.ndim > S.ndim else 0
    if per and xv.shape[0] > 1 and xv.shape[0] * per > KEY_DOT_CHUNK:
        step = max(1, KEY_DOT_CHUNK // per)
        parts = [key_dot(S, x[i:i + step]) for i in range(0, x.shape[0], step)]
        return torch.cat(parts) if torch_ else np.concatenate(parts)
    p = S * xv
    n = p.shape[-1]
    while n > 1:
        h = (n + 1) // 2
        top = p[..., :n - h] + p[..., h:n]
        if n - h < h:  # odd: the middle element carried
            mid = p[..., n - h:h]
            top = torch.cat((top, mid), -1) if torch_ else np.concatenate((top, mid), -1)
        p, n = top, h
    return p[..., 0]


def step_dots(x, k):
    """``x_t . k_j`` over the key axis for every pair of a segment's steps, in
    :func:`key_dot`'s order: ``x, k (..., m, S, H, K)`` -> ``(..., S, H, t, j)``. Not an einsum:
    a BLAS product's summation order depends on the CPU's kernels and on the batch shape (on an
    AVX2-only AMD EPYC, MKL gave another order for 8 segments batched than for each one alone,
    where an AVX-512 Xeon gave the same), so the torch engine (one segment) and the numba
    engine's host (a window's segments batched) would not share the bits; elementwise products
    and adds are exactly rounded on every ISA. float64 keeps the einsum (as :func:`key_dot`)."""
    if x.dtype == (torch.float64 if torch.is_tensor(x) else np.float64):
        return (torch if torch.is_tensor(x) else np).einsum("...tshc,...jshc->...shtj", x, k)
    return key_dot(k.movedim(-4, -2), x.movedim(-4, 0)).movedim(0, -2)
