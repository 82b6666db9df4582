"""Counter-based random bits inside Triton kernels: the twin of ``precsim.formats.rng``.

A 32-bit word is ``mix(mix(lo ^ k0) ^ hi ^ k1)`` with ``mix`` = lowbias32, ``lo``/``hi`` the
32-bit halves of the word index and ``(k0, k1)`` the keys of the ``(seed, stream)`` pair. SR with
``r`` random bits packs lanes as ``formats.rng.random_uint_*`` does: a slot of 8 bits if r <= 8,
16 if r <= 16, else 32; element ``i`` (flat index in the ``(seqs, H, rows, cols)`` state) uses
word ``i // lanes`` and the top r bits of lane ``i % lanes`` (lane 0 least significant).

The keys are derived on the host (:func:`event_keys`, from ``formats.rng``, vectorised over
events: one stream per quantisation event, ``stream_id(crc32(scheme), event, purpose)``), so the
kernel only hashes.
In-kernel SR (:func:`sr_increment`) hashes each word once and feeds its lanes to ``lanes``
consecutive elements (a quarter of the hashing for E2M1/FP8-class SR with <= 8 bits).
Tests check both halves bit for bit against ``precsim.formats``.
"""

from __future__ import annotations

import triton
import triton.language as tl
from precsim.formats.rng import event_keys  # noqa: F401 - the engines' host-side keys


@triton.jit
def mix32(x):
    """lowbias32 on a uint32 tensor (wrapping multiplies)."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit
def random_bits(k0, k1, lo, hi):
    """uint32 random words of elements ``(hi << 32) | lo``; k0, k1 uint32 scalars."""
    return mix32(mix32(lo ^ k0) ^ hi ^ k1)


@triton.jit
def philox_word(k0, k1, lo, hi, ROUNDS: tl.constexpr):
    """uint32 word ``w = (hi << 32) | lo`` of the Philox-4x32-ROUNDS stream under key (k0, k1):
    output ``w % 4`` of the block with counter ``(w // 4 lo, w // 4 hi, 0, 0)``."""
    c0 = (lo >> 2) | (hi << 30)
    c1 = hi >> 2
    c2 = tl.zeros_like(lo)
    c3 = tl.zeros_like(lo)
    a0 = k0
    a1 = k1
    for r in tl.static_range(ROUNDS):
        if r > 0:
            a0 = a0 + 0x9E3779B9
            a1 = a1 + 0xBB67AE85
        m0 = tl.full(c0.shape, 0xD2511F53, tl.uint32)
        m1 = tl.full(c0.shape, 0xCD9E8D57, tl.uint32)
        hi0 = tl.umulhi(m0, c0)
        lo0 = m0 * c0
        hi1 = tl.umulhi(m1, c2)
        lo1 = m1 * c2
        n0 = hi1 ^ c1 ^ a0
        n2 = hi0 ^ c3 ^ a1
        c0 = n0
        c1 = lo1
        c2 = n2
        c3 = lo0
    i = lo & 3
    return tl.where(i == 0, c0, tl.where(i == 1, c1, tl.where(i == 2, c2, c3)))


@triton.jit
def word_of(k0, k1, lo, hi, SRC: tl.constexpr):
    """Random word of index ``(hi << 32) | lo``: SRC 0 = the hash, 1/2/3 = Philox 5/7/10."""
    if SRC == 0:
        w = random_bits(k0, k1, lo, hi)
    elif SRC == 1:
        w = philox_word(k0, k1, lo, hi, 5)
    elif SRC == 2:
        w = philox_word(k0, k1, lo, hi, 7)
    else:
        w = philox_word(k0, k1, lo, hi, 10)
    return w


SRC_IDS = {"hash": 0, "philox5": 1, "philox7": 2, "philox10": 3}


@triton.jit
def sr_increment(thr, k0, k1, base_lo, base_hi, off, BITS, SRC: tl.constexpr = 0):
    """1.0 where SR rounds up (``u < thr``), else 0.0, for a 3D tile ``[R, C, K]``.

    ``thr``: float32 thresholds in [0, 2^BITS], ``off``: int32 element offsets (x's shape);
    ``u``: the top BITS bits of lane ``i % lanes`` of word ``i // lanes``, ``i = base + off``.
    With several lanes per word (BITS <= 16) the word of each run of ``lanes`` elements is
    hashed once, not once per element (:func:`_sr_lanes`).

    ``BITS`` is a constexpr (one lane layout compiled) or a runtime scalar (the three layouts,
    chosen per call on a uniform scalar); ``SRC`` (the random source, ``SRC_IDS``) is always a
    constexpr.
    """
    if BITS <= 8:
        inc = _sr_lanes(thr, k0, k1, base_lo, base_hi, off, BITS, SRC, 2)
    elif BITS <= 16:
        inc = _sr_lanes(thr, k0, k1, base_lo, base_hi, off, BITS, SRC, 1)
    else:
        ilo, ihi = element_index(base_lo, base_hi, off)
        shift = (tl.zeros([], tl.int32) + 32 - BITS).to(tl.uint32)
        u = word_of(k0, k1, ilo, ihi, SRC) >> shift
        inc = tl.where(u.to(tl.float32) < thr, 1.0, 0.0)
    return inc


@triton.jit
def _sr_lanes(thr, k0, k1, base_lo, base_hi, off, BITS, SRC: tl.constexpr, SH: tl.constexpr):
    """:func:`sr_increment` with ``2**SH`` lanes (of ``32 >> SH`` bits) per word: the tile is
    viewed as ``[R, C, K / lanes, lanes]``, the hash runs on ``[R, C, K / lanes]`` and is
    broadcast over the lanes. That needs what every caller's tile has: each run of ``lanes``
    along the last axis holds consecutive elements and ``base + off`` of its first is a multiple
    of ``lanes`` (``base`` a multiple of the tile size; K a multiple of lanes)."""
    LANES: tl.constexpr = 1 << SH
    SLOT: tl.constexpr = 32 >> SH
    R: tl.constexpr = off.shape[0]
    C: tl.constexpr = off.shape[1]
    K: tl.constexpr = off.shape[2]
    Q: tl.constexpr = K // LANES
    o4 = tl.reshape(off, (R, C, Q, LANES))
    t4 = tl.reshape(thr, (R, C, Q, LANES))
    lo, hi = element_index(base_lo, base_hi, tl.min(o4, axis=3))  # first element of a word
    w = word_of(k0, k1, (lo >> SH) | (hi << (32 - SH)), hi >> SH, SRC)  # [R, C, Q]
    lane = tl.arange(0, LANES)
    shift = (lane * SLOT + (SLOT - BITS)).to(tl.uint32)
    mask = ((tl.zeros([], tl.int32) + 1 << BITS) - 1).to(tl.uint32)
    u = (w[:, :, :, None] >> shift[None, None, None, :]) & mask
    return tl.reshape(tl.where(u.to(tl.float32) < t4, 1.0, 0.0), (R, C, K))


@triton.jit
def element_index(base_lo, base_hi, off):
    """(lo, hi) uint32 halves of ``base + off``; base as two uint32 scalars, off int32 >= 0."""
    lo = base_lo + off.to(tl.uint32)
    hi = base_hi + (lo < base_lo).to(tl.uint32)
    return lo, hi
