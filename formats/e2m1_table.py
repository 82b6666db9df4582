"""E2M1 stochastic rounding by table (CPU torch, float32): the conventional NVFP4-SR scheme
re-quantises a whole layer state every step, and this is the CPU engine's hottest loop
(:func:`precsim.formats.core.quantize_block` takes it where :func:`e2m1_table_ok` holds).

With 8 random bits, SR of a float32 y to E2M1 (saturating at 6) depends on y only through its
top 18 bits: sign, exponent and 9 mantissa bits fix the lower grid neighbour ``lo`` and the
threshold ``thr = floor(frac * 256)`` (the quantum is at least 2^-1 and frac is read to 2^-8 of
it, i.e. to 2^-9 absolute at most: bits below 2^-9 of a value in [2^e, 2^e+1) are mantissa bits
9+ of it). So ``T[bits(y) >> 14]`` holds ``256 * code(lo) + thr`` and the result is
``V[T[.] + (255 - u)]``: adding 255 - u carries into the code iff u < thr, which is exactly the
rule of :func:`precsim.formats.core.round_float` (up iff u < thr). Codes 0..7 are the magnitudes,
8 is NaN, and the negative half of both tables mirrors the positive one. Bit-identical to the
generic path (tests/formats/test_formats.py checks every case), in 6 passes over the state
instead of ~20.
"""

from __future__ import annotations

import numpy as np

from ._ops import TORCH
from .rng import random_uint_numpy

_E2M1_TABLES: dict = {}


def e2m1_tables():
    """The tables ``T`` (18 bits of y -> code and threshold) and ``V`` (code -> value)."""
    import torch

    if "t" not in _E2M1_TABLES:
        grid = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
        rep = (np.arange(1 << 17, dtype=np.uint32) << np.uint32(14)).view(np.float32)
        y = rep.astype(np.float64)
        with np.errstate(invalid="ignore"):
            fin = np.minimum(np.where(np.isnan(y), 0.0, y), 6.0)  # +Inf and > 6 saturate
        lo = np.searchsorted(grid, fin, side="right") - 1
        step = np.where(lo < 7, grid[np.minimum(lo + 1, 7)] - grid[lo], 1.0)
        thr = np.where(lo < 7, np.floor((fin - grid[lo]) / step * 256), 0).astype(np.int64)
        pos = np.where(np.isnan(y), 8 * 256, lo * 256 + thr)
        t = np.concatenate([pos, pos + 9 * 256]).astype(np.int32)  # sign bit set: 2nd half
        v = np.concatenate([grid, [np.nan]])
        v = np.repeat(np.concatenate([v, -v]), 256).astype(np.float32)
        _E2M1_TABLES["t"] = torch.from_numpy(t)
        _E2M1_TABLES["v"] = torch.from_numpy(v)
    return _E2M1_TABLES["t"], _E2M1_TABLES["v"]


def e2m1_table_ok(xb, el, rounding, ops, sr_bits) -> bool:
    """The table applies: CPU torch float32, SR to E2M1 with 8 random bits."""
    return (ops is TORCH and rounding == "sr" and el.name == "fp4_e2m1"
            and int(sr_bits or el.default_sr_bits) == 8
            and str(xb.dtype) == "torch.float32" and xb.device.type == "cpu")


def e2m1_sr_table(y, *, seed, stream, offset, sr_source="hash"):
    """SR of float32 ``y`` (any sign, unclipped) to E2M1 with 8 random bits, by table."""
    import torch

    t_tab, v_tab = e2m1_tables()
    u = random_uint_numpy(y.numel(), 8, seed, stream, offset, source=sr_source)
    ubar = torch.from_numpy(np.subtract(255, u, dtype=np.int32))
    idx = (y.contiguous().view(torch.int32) >> 14).bitwise_and_(0x3FFFF).view(-1)
    code = t_tab.index_select(0, idx).add_(ubar)
    return v_tab.index_select(0, code).view(y.shape)
