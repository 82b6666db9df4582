"""Randomized Hadamard rotation of the last axis, as rotated-INT/FP4 codecs apply before quantising.

``rotate(x)`` computes ``y = H (d ⊙ x) / sqrt(n)`` along the last axis (``n`` a power of two):
``H`` the Sylvester Hadamard matrix (entries ±1, ``H H = n I``), ``d`` fixed random signs drawn
from ``seed`` (bit 31 of the counter-based words of ``formats.rng``, stream ``ROTATE_STREAM``).
The transform is orthonormal, so ``rotate(.., inverse=True)`` (``x = d ⊙ H y / sqrt(n)``) undoes it
and norms are preserved (to rounding: 1e-12 relative in float64). A fast Walsh-Hadamard
transform does it in ``n log2 n`` additions plus ``n`` multiplications per row, on NumPy and torch
alike (same operation order). ``quantize(x, fmt, rotate=True)`` is
``rotate(quantize(rotate(x)), inverse=True)``: the rounding error is spread over the row, which
tames outliers before a block or row scale is taken.
"""

from __future__ import annotations

import math

import numpy as np

from precsim.errors import PrecsimError

from .rng import random_bits_numpy

ROTATE_SEED = 0x0DDBA11  # the default signs: one fixed rotation per row length
ROTATE_STREAM = 0x52_4F_54  # "ROT"


class RotateError(PrecsimError):
    """Bad rotation input (a last axis that is not a power of two)."""


def signs(n: int, seed: int = ROTATE_SEED) -> np.ndarray:
    """The ±1 float64 signs ``d`` of a rotation of length ``n`` (top bit of each random word)."""
    w = random_bits_numpy(n, seed, ROTATE_STREAM, 0)
    return np.where(w >> np.uint32(31), -1.0, 1.0)


def _fwht(x, is_torch: bool):
    """Unnormalised Walsh-Hadamard transform (Sylvester order) along the last axis."""
    n = x.shape[-1]
    lead = tuple(x.shape[:-1])
    h = 1
    while h < n:
        y = x.reshape(*lead, n // (2 * h), 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        if is_torch:
            import torch

            x = torch.stack((a + b, a - b), dim=-2).reshape(*lead, n)
        else:
            x = np.stack((a + b, a - b), axis=-2).reshape(*lead, n)
        h *= 2
    return x


def rotate(x, inverse: bool = False, seed: int = ROTATE_SEED):
    """Randomized Hadamard rotation of ``x``'s last axis (NumPy array or torch tensor, any float
    dtype; the result has x's type, shape and dtype). See the module docstring."""
    n = int(x.shape[-1]) if len(x.shape) else 0
    if n < 1 or n & (n - 1):
        raise RotateError(f"rotate: last axis length {n} (shape {tuple(x.shape)}) is invalid; "
                          f"allowed: a power of two")
    is_torch = not isinstance(x, np.ndarray)
    d = signs(n, seed)
    scale = 1.0 / math.sqrt(n)
    if is_torch:
        import torch

        d = torch.from_numpy(d).to(device=x.device, dtype=x.dtype)
    else:
        d = d.astype(x.dtype)
    if not inverse:
        return _fwht(x * d, is_torch) * scale
    return _fwht(x, is_torch) * scale * d
