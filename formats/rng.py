"""Counter-based random bits for stochastic rounding.

Every random bit precsim uses is a pure function of ``(seed, stream, element index)``: no state,
so a result never depends on how the work is chunked, on the device, or on the order in which
schemes run. The same function is written three times — NumPy (uint32), torch (int64 with masks)
and Triton (``kernels/rng.py``) — and tests check they agree bit for bit.

The mixer is ``lowbias32`` (C. Wellons' 32-bit integer hash, two xor-shift-multiply rounds), applied
twice: ``bits = mix(mix(lo ^ k0) ^ hi ^ k1)`` where ``lo``/``hi`` are the low/high 32 bits of the
element index and ``k0``/``k1`` are derived from the seed and the stream on the host. This is
much cheaper than Philox-4x32-10 (about 14 integer ops per word instead of ~120), which matters
for the CPU engine that rounds a whole layer state every step; its statistical quality is ample
for stochastic rounding (the SR tests check unbiasedness and the 2^-r granularity).

SR with ``r`` random bits takes them from *lanes* of one 32-bit word, as hardware does (Blackwell's
``cvt.rs...e2m1x4`` feeds four E2M1 conversions from one 32-bit register): ``slot = 8`` bits if
``r <= 8``, 16 if ``r <= 16``, else 32; element ``i`` uses word ``i // lanes`` (``lanes = 32 //
slot``) and the top ``r`` bits of its lane ``i % lanes`` (lane 0 = least significant slot).
"""

from __future__ import annotations

import sys

import numpy as np

M32 = 0xFFFFFFFF
_C1 = 0x7FEB352D
_C2 = 0x846CA68B


def mix32_int(x: int) -> int:
    """lowbias32 on a Python int (host-side key derivation)."""
    x &= M32
    x ^= x >> 16
    x = (x * _C1) & M32
    x ^= x >> 15
    x = (x * _C2) & M32
    x ^= x >> 16
    return x


def stream_keys(seed: int, stream: int) -> tuple[int, int]:
    """Derive the two 32-bit keys of a ``(seed, stream)`` pair (64-bit seed and stream)."""
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    stream = int(stream) & 0xFFFFFFFFFFFFFFFF
    k0 = mix32_int((seed & M32) ^ 0x9E3779B9)
    k0 = mix32_int(k0 ^ (seed >> 32))
    k1 = mix32_int((stream & M32) ^ 0x85EBCA6B ^ k0)
    k1 = mix32_int(k1 ^ (stream >> 32))
    return k0, k1


def stream_id(*parts: int) -> int:
    """Fold several small integers (scheme id, step, purpose, ...) into one 64-bit stream id."""
    h = 0x243F6A88
    for p in parts:
        h = mix32_int(h ^ (int(p) & M32)) ^ ((h << 7) & M32)
        h = mix32_int(h ^ ((int(p) >> 32) & M32))
    return h


def _mix_np(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(_C1)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(_C2)
    return x ^ (x >> np.uint32(16))


def random_bits_numpy(n: int, seed: int, stream: int = 0, offset: int = 0) -> np.ndarray:
    """``n`` uint32 random words for element indices ``offset .. offset+n-1``."""
    k0, k1 = stream_keys(seed, stream)
    idx = np.arange(offset, offset + n, dtype=np.uint64)
    lo = (idx & np.uint64(M32)).astype(np.uint32)
    hi = (idx >> np.uint64(32)).astype(np.uint32)
    with np.errstate(over="ignore"):
        x = _mix_np(lo ^ np.uint32(k0))
        return _mix_np(x ^ hi ^ np.uint32(k1))


def _mix_torch(x):
    x = x ^ (x >> 16)
    x = (x * _C1) & M32
    x = x ^ (x >> 15)
    x = (x * _C2) & M32
    return x ^ (x >> 16)


def random_bits_torch(n: int, seed: int, stream: int = 0, offset: int = 0, device=None):
    """Torch twin of :func:`random_bits_numpy` (int64 tensor holding uint32 values)."""
    import torch

    k0, k1 = stream_keys(seed, stream)
    idx = torch.arange(offset, offset + n, dtype=torch.int64, device=device)
    lo = idx & M32
    hi = idx >> 32
    x = _mix_torch(lo ^ k0)
    return _mix_torch(x ^ hi ^ k1)


def lane_layout(bits: int) -> tuple[int, int]:
    """(slot width, lanes per 32-bit word) for SR with ``bits`` random bits."""
    slot = 8 if bits <= 8 else 16 if bits <= 16 else 32
    return slot, 32 // slot


def random_uint_numpy(n: int, bits: int, seed: int, stream: int = 0, offset: int = 0):
    """``n`` uniform integers in [0, 2^bits) for elements ``offset ..`` (uint32 array)."""
    slot, lanes = lane_layout(bits)
    if lanes == 1:
        return random_bits_numpy(n, seed, stream, offset) >> np.uint32(32 - bits)
    w0, first = divmod(offset, lanes)
    nw = (first + n + lanes - 1) // lanes
    words = random_bits_numpy(nw, seed, stream, w0)
    if sys.byteorder == "little":  # lane k = k-th least significant slot = k-th byte/half
        u = words.view(np.uint8 if slot == 8 else np.uint16)
        if bits < slot:
            u = u >> (slot - bits)
        return u[first:first + n]
    shifts = (np.arange(lanes, dtype=np.uint32) * slot + (slot - bits)).astype(np.uint32)
    u = (words[:, None] >> shifts[None, :]) & np.uint32((1 << bits) - 1)
    return u.reshape(-1)[first:first + n]


def random_uint_torch(n: int, bits: int, seed: int, stream: int = 0, offset: int = 0,
                      device=None):
    """Torch twin of :func:`random_uint_numpy` (int64 tensor)."""
    import torch

    slot, lanes = lane_layout(bits)
    if lanes == 1:
        return random_bits_torch(n, seed, stream, offset, device) >> (32 - bits)
    w0, first = divmod(offset, lanes)
    nw = (first + n + lanes - 1) // lanes
    words = random_bits_torch(nw, seed, stream, w0, device)
    shifts = torch.arange(lanes, dtype=torch.int64, device=words.device) * slot + (slot - bits)
    u = (words[:, None] >> shifts[None, :]) & ((1 << bits) - 1)
    return u.reshape(-1)[first:first + n]
