"""Counter-based random bits for stochastic rounding (docs/formats.md, "Rounding": the generator,
the Philox option and the lane layout).

Every random bit is a pure function of ``(seed, stream, element index)``, so a result never
depends on chunking, device or scheme order. ``bits = mix(mix(lo ^ k0) ^ hi ^ k1)`` with ``mix``
= lowbias32, ``lo``/``hi`` the 32-bit halves of the index and ``k0``/``k1`` derived from the seed
and stream on the host (~14 integer ops per word against ~120 for Philox-4x32-10: the CPU engine
rounds a whole layer state every step). Written three times — NumPy (uint32), torch (int64 with
masks) and Triton (``kernels/rng.py``) — and tested bit for bit against each other; the Philox
words likewise (uint64 NumPy, 16-bit halves in torch, ``tl.umulhi``).
"""

from __future__ import annotations

import sys
import zlib

import numpy as np

M32 = 0xFFFFFFFF
_C1 = 0x7FEB352D
_C2 = 0x846CA68B

SR_SOURCES = ("hash", "philox5", "philox7", "philox10")
PHILOX_ROUNDS = {"philox5": 5, "philox7": 7, "philox10": 10}
PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57  # round multipliers
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85  # key schedule (Weyl) increments


def philox4x32_numpy(c0, c1, c2, c3, k0, k1, rounds: int):
    """Philox-4x32-``rounds`` of uint32 counters (arrays) under key (k0, k1) (ints): 4 arrays."""
    m32 = np.uint64(M32)
    c = [np.asarray(v, dtype=np.uint64) & m32 for v in (c0, c1, c2, c3)]
    k0, k1 = np.uint64(k0 & M32), np.uint64(k1 & M32)
    with np.errstate(over="ignore"):
        for r in range(rounds):
            if r:
                k0 = (k0 + np.uint64(PHILOX_W0)) & m32
                k1 = (k1 + np.uint64(PHILOX_W1)) & m32
            p0 = c[0] * np.uint64(PHILOX_M0)  # < 2^64: exact in uint64
            p1 = c[2] * np.uint64(PHILOX_M1)
            c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & m32,
                 (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & m32]
    return [v.astype(np.uint32) for v in c]


def _philox_words_numpy(n: int, k0: int, k1: int, offset: int, rounds: int) -> np.ndarray:
    j0, i0 = divmod(offset, 4)
    nb = (i0 + n + 3) // 4
    j = np.arange(j0, j0 + nb, dtype=np.uint64)
    zero = np.zeros(nb, np.uint64)
    out = philox4x32_numpy(j & np.uint64(M32), j >> np.uint64(32), zero, zero, k0, k1, rounds)
    return np.stack(out, axis=1).reshape(-1)[i0:i0 + n]


def _mulhilo_torch(a: int, b):
    """(hi, lo) 32-bit halves of the constant ``a`` times uint32 values ``b`` (int64 tensors)."""
    a_lo, a_hi = a & 0xFFFF, a >> 16
    b_lo, b_hi = b & 0xFFFF, b >> 16
    p0, p1, p2, p3 = a_lo * b_lo, a_lo * b_hi, a_hi * b_lo, a_hi * b_hi
    mid = (p0 >> 16) + (p1 & 0xFFFF) + (p2 & 0xFFFF)
    hi = p3 + (p1 >> 16) + (p2 >> 16) + (mid >> 16)
    lo = ((mid & 0xFFFF) << 16) | (p0 & 0xFFFF)
    return hi, lo


def philox4x32_torch(c0, c1, c2, c3, k0: int, k1: int, rounds: int):
    """Torch twin of :func:`philox4x32_numpy` (int64 tensors holding uint32 values)."""
    c = [c0 & M32, c1 & M32, c2 & M32, c3 & M32]
    k0, k1 = k0 & M32, k1 & M32
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + PHILOX_W0) & M32, (k1 + PHILOX_W1) & M32
        hi0, lo0 = _mulhilo_torch(PHILOX_M0, c[0])
        hi1, lo1 = _mulhilo_torch(PHILOX_M1, c[2])
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
    return c


def _philox_words_torch(n: int, k0: int, k1: int, offset: int, rounds: int, device=None):
    import torch

    j0, i0 = divmod(offset, 4)
    nb = (i0 + n + 3) // 4
    j = torch.arange(j0, j0 + nb, dtype=torch.int64, device=device)
    zero = torch.zeros_like(j)
    out = philox4x32_torch(j & M32, j >> 32, zero, zero, k0, k1, rounds)
    return torch.stack(out, dim=1).reshape(-1)[i0:i0 + n]


def mix32_int(x: int) -> int:
    """lowbias32 on a Python int (host-side key derivation)."""
    return _mix_int(x & M32)


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


def _mix_u64(x: np.ndarray) -> np.ndarray:
    """lowbias32 on uint64 arrays holding uint32 values."""
    m32 = np.uint64(M32)
    x = x ^ (x >> np.uint64(16))
    x = (x * np.uint64(_C1)) & m32
    x = x ^ (x >> np.uint64(15))
    x = (x * np.uint64(_C2)) & m32
    return x ^ (x >> np.uint64(16))


def event_keys(seed: int, scheme: str, events, purpose: int) -> tuple[int, np.ndarray]:
    """``k0`` (int) and ``k1`` (uint32 array, one per event) of the SR streams of ``scheme``:
    ``stream_keys(seed, stream_id(crc32(scheme), event, purpose))`` vectorised over events (the
    fused engines derive their keys on the host; their kernels only hash)."""
    m32 = np.uint64(M32)
    k0 = stream_keys(seed, 0)[0]  # k0 depends on the seed only
    parts = np.broadcast_arrays(*[np.asarray(p, dtype=np.uint64) for p in (
        zlib.crc32(scheme.encode()), np.asarray(events, np.int64), purpose)])
    h = np.full(parts[0].shape, 0x243F6A88, dtype=np.uint64)
    for p in parts:
        h = _mix_u64(h ^ (p & m32)) ^ ((h << np.uint64(7)) & m32)
        h = _mix_u64(h ^ ((p >> np.uint64(32)) & m32))
    k1 = _mix_u64((h & m32) ^ np.uint64(0x85EBCA6B) ^ np.uint64(k0))
    k1 = _mix_u64(k1 ^ (h >> np.uint64(32)))
    return int(k0), k1.astype(np.uint32)


def _mix_np(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(_C1)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(_C2)
    return x ^ (x >> np.uint32(16))


def random_bits_numpy(n: int, seed: int, stream: int = 0, offset: int = 0,
                      source: str = "hash") -> np.ndarray:
    """``n`` uint32 random words for element indices ``offset .. offset+n-1``."""
    k0, k1 = stream_keys(seed, stream)
    if source != "hash":
        return _philox_words_numpy(n, k0, k1, offset, PHILOX_ROUNDS[source])
    idx = np.arange(offset, offset + n, dtype=np.uint64)
    lo = (idx & np.uint64(M32)).astype(np.uint32)
    hi = (idx >> np.uint64(32)).astype(np.uint32)
    with np.errstate(over="ignore"):
        x = _mix_np(lo ^ np.uint32(k0))
        return _mix_np(x ^ hi ^ np.uint32(k1))


def _mix_int(x):
    """lowbias32 of uint32 values held in Python ints or int64 tensors (masked to 32 bits)."""
    x = x ^ (x >> 16)
    x = (x * _C1) & M32
    x = x ^ (x >> 15)
    x = (x * _C2) & M32
    return x ^ (x >> 16)


def random_bits_torch(n: int, seed: int, stream: int = 0, offset: int = 0, device=None,
                      source: str = "hash"):
    """Torch twin of :func:`random_bits_numpy` (int64 tensor holding uint32 values)."""
    import torch

    k0, k1 = stream_keys(seed, stream)
    if source != "hash":
        return _philox_words_torch(n, k0, k1, offset, PHILOX_ROUNDS[source], device)
    idx = torch.arange(offset, offset + n, dtype=torch.int64, device=device)
    lo = idx & M32
    hi = idx >> 32
    x = _mix_int(lo ^ k0)
    return _mix_int(x ^ hi ^ k1)


def lane_layout(bits: int) -> tuple[int, int]:
    """(slot width, lanes per 32-bit word) for SR with ``bits`` random bits."""
    slot = 8 if bits <= 8 else 16 if bits <= 16 else 32
    return slot, 32 // slot


def random_uint_numpy(n: int, bits: int, seed: int, stream: int = 0, offset: int = 0,
                      source: str = "hash"):
    """``n`` uniform integers in [0, 2^bits) for elements ``offset ..`` (uint32 array)."""
    slot, lanes = lane_layout(bits)
    if lanes == 1:
        return random_bits_numpy(n, seed, stream, offset, source) >> np.uint32(32 - bits)
    w0, first = divmod(offset, lanes)
    nw = (first + n + lanes - 1) // lanes
    words = random_bits_numpy(nw, seed, stream, w0, source)
    if sys.byteorder == "little":  # lane k = k-th least significant slot = k-th byte/half
        u = words.view(np.uint8 if slot == 8 else np.uint16)
        if bits < slot:
            u = u >> (slot - bits)
        return u[first:first + n]
    shifts = (np.arange(lanes, dtype=np.uint32) * slot + (slot - bits)).astype(np.uint32)
    u = (words[:, None] >> shifts[None, :]) & np.uint32((1 << bits) - 1)
    return u.reshape(-1)[first:first + n]


def random_uint_torch(n: int, bits: int, seed: int, stream: int = 0, offset: int = 0,
                      device=None, source: str = "hash"):
    """Torch twin of :func:`random_uint_numpy` (int64 tensor)."""
    import torch

    slot, lanes = lane_layout(bits)
    if lanes == 1:
        return random_bits_torch(n, seed, stream, offset, device, source) >> (32 - bits)
    w0, first = divmod(offset, lanes)
    nw = (first + n + lanes - 1) // lanes
    words = random_bits_torch(nw, seed, stream, w0, device, source)
    shifts = torch.arange(lanes, dtype=torch.int64, device=words.device) * slot + (slot - bits)
    u = (words[:, None] >> shifts[None, :]) & ((1 << bits) - 1)
    return u.reshape(-1)[first:first + n]
