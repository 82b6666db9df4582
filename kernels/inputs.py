"""Counter-based standard normals on the device (the workloads' input generator, fused).

``precsim.workload.normals`` defines the stream: Box-Muller on two counter-based 32-bit words
per value, ``z = sqrt(-2 ln u1) cos(2 pi u2)`` with ``u1 = (w1 + 0.5) / 2^32``, ``u2 = w2 / 2^32``.
This kernel draws the same values in one pass (log/cos may differ from NumPy's in the last ulp).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .quant import as_int32
from .rng import element_index, random_bits


@triton.jit
def _normals_kernel(out_ptr, n, off_lo, off_hi, k0a, k1a, k0b, k1b, BLOCK: tl.constexpr):
    """out[i] = Box-Muller normal of element ``off + i``."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    lo, hi = element_index(off_lo.to(tl.uint32), off_hi.to(tl.uint32), i)
    w1 = random_bits(k0a.to(tl.uint32), k1a.to(tl.uint32), lo, hi)
    w2 = random_bits(k0b.to(tl.uint32), k1b.to(tl.uint32), lo, hi)
    u1 = (w1.to(tl.float64) + 0.5) * 2.3283064365386963e-10
    u2 = w2.to(tl.float64) * 2.3283064365386963e-10
    z = tl.sqrt(-2.0 * tl.log(u1)) * tl.cos(6.283185307179586 * u2)
    tl.store(out_ptr + i, z, mask=i < n)


def normals(keys_a: tuple[int, int], keys_b: tuple[int, int], n: int, offset: int,
            device) -> torch.Tensor:
    """``n`` float64 normals of elements ``offset ..``; ``keys_a``/``keys_b``: the two words'
    stream keys (``precsim.formats.stream_keys``)."""
    out = torch.empty(n, dtype=torch.float64, device=device)
    _normals_kernel[(triton.cdiv(n, 1024),)](
        out, n, as_int32(offset & 0xFFFFFFFF), as_int32(offset >> 32), as_int32(keys_a[0]),
        as_int32(keys_a[1]), as_int32(keys_b[0]), as_int32(keys_b[1]), BLOCK=1024)
    return out


@triton.jit
def _exp_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + i, tl.exp(tl.load(x_ptr + i, mask=i < n, other=0.0)), mask=i < n)


def exp_f32(x: torch.Tensor) -> torch.Tensor:
    """float32 ``tl.exp`` of a float32 tensor: the decay a fast kernel computes (mamba_ssm's
    ``selective_state_update``, fla; ``ex2.approx`` of ``x log2 e`` on NVIDIA)."""
    x = x.contiguous()
    out = torch.empty_like(x)
    _exp_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
    return out
