"""The few array operations the rounding code needs, for NumPy and for torch.

One algorithm (``formats/core.py``) runs on both backends through this shim, so the NumPy and torch
paths are the same arithmetic step for step, and RNE results are bit-identical by construction
(tests check it anyway).
"""

from __future__ import annotations

import math

import numpy as np

from .rng import random_uint_numpy, random_uint_torch


class NumpyOps:
    name = "numpy"

    abs = staticmethod(np.abs)
    floor = staticmethod(np.floor)
    rint = staticmethod(np.rint)  # round half to even
    where = staticmethod(np.where)
    minimum = staticmethod(np.minimum)
    maximum = staticmethod(np.maximum)
    copysign = staticmethod(np.copysign)

    @staticmethod
    def clip(x, m):
        return np.clip(x, -m, m)

    @staticmethod
    def div_const(a, c):
        """a / c, correctly rounded in a's dtype."""
        return a / a.dtype.type(c)

    @staticmethod
    def recip(a):
        """1 / a, correctly rounded in a's dtype."""
        return a.dtype.type(1) / a

    @staticmethod
    def exponent(ax):
        """Biased-exponent field minus the bias, for |x| (subnormals give emin-1; callers clamp)."""
        if ax.dtype == np.float64:
            return ((ax.view(np.int64) >> 52) - 1023).astype(np.int32)
        return (ax.view(np.int32) >> 23) - 127

    @staticmethod
    def pow2(e, like):
        return np.ldexp(np.ones((), dtype=like.dtype), np.minimum(e, 127).astype(np.int32))

    @staticmethod
    def full_like(x, v):
        return np.full_like(x, v)

    @staticmethod
    def amax(ax, axis, keepdims=True):
        if ax.size == 0:
            return ax
        return np.max(ax, axis=axis, keepdims=keepdims)

    @classmethod
    def block_absmax(cls, xb):
        """max |x| over the last axis of ``xb (..., nblocks, block)``, keepdims (NaN wins)."""
        return cls.amax(np.abs(xb), -1)

    @staticmethod
    def random_u(shape, bits, seed, stream, offset, like, source="hash"):
        n = int(np.prod(shape))
        r = random_uint_numpy(n, bits, seed, stream, offset, source=source)
        return r.reshape(shape).astype(like.dtype)


class TorchOps:
    name = "torch"

    abs = staticmethod(lambda x: x.abs())
    floor = staticmethod(lambda x: x.floor())
    rint = staticmethod(lambda x: x.round())  # half to even (torch.round)

    @staticmethod
    def where(c, a, b):
        import torch

        return torch.where(c, a, b)

    @staticmethod
    def minimum(a, b):
        import torch

        if not isinstance(b, torch.Tensor):
            return a.clamp(max=b)
        return torch.minimum(a, b)

    @staticmethod
    def maximum(a, b):
        import torch

        if not isinstance(b, torch.Tensor):
            return a.clamp(min=b)
        return torch.maximum(a, b)

    copysign = staticmethod(lambda a, b: a.copysign(b))
    clip = staticmethod(lambda x, m: x.clamp(-m, m))

    @staticmethod
    def div_const(a, c):
        """a / c, correctly rounded: CUDA turns division by a host scalar into a multiply by
        its reciprocal (1 ulp off at times), so the divisor lives on a's device (filled there:
        a tensor copied from the host would wait for the device at every call)."""
        import torch

        if a.device.type == "cpu":
            return a / c
        return a / torch.full((), c, dtype=a.dtype, device=a.device)

    @staticmethod
    def recip(a):
        """1 / a, correctly rounded: a tensor division (not torch.reciprocal's fast paths)."""
        import torch

        return torch.ones_like(a) / a

    @staticmethod
    def exponent(ax):
        import torch

        if ax.dtype == torch.float64:
            return (ax.view(torch.int64) >> 52) - 1023
        return (ax.view(torch.int32) >> 23) - 127

    @staticmethod
    def pow2(e, like):
        """2**e exactly, built from bits (e within the carrier's finite range)."""
        import torch

        if like.dtype == torch.float64:
            return ((e.to(torch.int64) + 1023) << 52).view(torch.float64)
        e = e.to(torch.int32).clamp(max=127)
        normal = (e + 127).clamp(min=1) << 23
        sub = torch.ones_like(e) << (e + 149).clamp(0, 22)  # float32 subnormal powers
        return torch.where(e >= -126, normal, sub).view(torch.float32)

    @staticmethod
    def full_like(x, v):
        import torch

        return torch.full_like(x, v)

    @staticmethod
    def amax(ax, axis, keepdims=True):
        if ax.numel() == 0:
            return ax
        return ax.amax(dim=axis, keepdim=keepdims)

    @staticmethod
    def block_absmax(xb):
        """max |x| over the last axis of ``xb (..., nblocks, block)``, keepdims (NaN wins)."""
        import torch

        if xb.numel() == 0:
            return xb
        if xb.device.type == "cpu":  # max-pooling beats a reduction over 16-wide rows ~2x here
            nb, b = xb.shape[-2], xb.shape[-1]
            m = torch.nn.functional.max_pool1d(xb.abs().reshape(1, -1, nb * b), b)
            return m.reshape(*xb.shape[:-1], 1)
        return xb.abs().amax(dim=-1, keepdim=True)

    @staticmethod
    def random_u(shape, bits, seed, stream, offset, like, source="hash"):
        n = math.prod(int(s) for s in shape)
        if like.device.type == "cpu":  # NumPy's uint32 hash is ~3x faster than torch int64 here
            import torch

            r = random_uint_numpy(n, bits, seed, stream, offset, source=source)
            return torch.from_numpy(r.astype(np.float32 if like.dtype == torch.float32
                                             else np.float64)).reshape(shape)
        r = random_uint_torch(n, bits, seed, stream, offset, device=like.device, source=source)
        return r.reshape(shape).to(like.dtype)


NUMPY = NumpyOps()
TORCH = TorchOps()


def ops_for(x):
    if isinstance(x, np.ndarray):
        return NUMPY
    try:
        import torch
    except ImportError:  # pragma: no cover
        torch = None
    if torch is not None and isinstance(x, torch.Tensor):
        return TORCH
    raise TypeError(
        f"quantize: x must be a numpy.ndarray or a torch.Tensor, got {type(x).__name__}"
    )
