"""Element rounding, compiled: float32 bit casts, the elements of a float or integer format
rounded to nearest even or stochastically (bit-equal to ``precsim.formats.core.round_float`` /
``round_int``), and the counter-based random words of ``formats.rng`` that SR reads.

The element loops (:func:`elements`, :func:`ints`) are branch-free so that LLVM vectorises them;
the quantisers of whole matrices (block and row-scaled formats) are :mod:`.quant`'s.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .cache import njit


@intrinsic
def f2i(typingctx, x):
    """float32 -> int32 with the same bits."""
    sig = types.int32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


@intrinsic
def i2f(typingctx, x):
    """int32 -> float32 with the same bits."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


_F0 = np.float32(0.0)
_F1 = np.float32(1.0)
_BIG = np.float32(8388608.0)
_NAN = np.float32(np.nan)
_INF = np.float32(np.inf)
_P264 = np.float32(2.0**64)
_P2M64 = np.float32(2.0**-64)
_MASK = 0xFFFFFFFF


@njit(cache=True, inline="always")
def _hash(lo, hi, k0, k1):
    """formats.rng: mix(mix(lo ^ k0) ^ hi ^ k1) on uint32 values held in int64."""
    x = (lo ^ k0) & _MASK
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _MASK
    x ^= x >> 15
    x = (x * 0x846CA68B) & _MASK
    x ^= x >> 16
    x = (x ^ hi ^ k1) & _MASK
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _MASK
    x ^= x >> 15
    x = (x * 0x846CA68B) & _MASK
    x ^= x >> 16
    return x


@njit(cache=True, inline="always")
def pow2(e):
    """2**e as float32 (e <= 127; subnormal powers down to 2**-149, 0 below)."""
    if e >= -126:
        return i2f(np.int32((e + 127) << 23))
    if e >= -149:
        return i2f(np.int32(1 << (e + 149)))
    return _F0


@njit(cache=True, inline="always")
def elem_consts(f, bits, ieee, el):
    """Per-format constants of :func:`round_v`: mantissa bits, emin, max, the value an
    overflow becomes, 2**bits (float32)."""
    maxv = np.float32(el[f, 2])
    ovf = maxv if not ieee else (_INF if el[f, 3] > 0 else _NAN)
    return np.int64(el[f, 0]), np.int64(el[f, 1]), maxv, ovf, np.float32(2.0 ** bits)


@njit(cache=True, inline="always")
def round_fin(x, pmin, imb, tmb, maxv, sr, sc, u):
    """:func:`round_v` for finite ``x`` with ``|x| < 2**127`` after saturation (the block
    formats' scaled elements), without branches and in 32-bit lanes (the block formats'
    element loop, so LLVM vectorises it whole): ``pmin`` = 2**emin, ``imb`` = 2**-mb,
    ``tmb`` = 2**mb, all float32. The power of two of ``x``'s binade comes from its
    exponent bits and a float max (an integer max ran in 64-bit lanes: numba widens int32
    arithmetic), ``x / q`` as one multiplication by the exact power 2**(mb - e)."""
    ix = f2i(x)
    p = max(i2f(np.int32(ix & 0x7F800000)), pmin)  # 2**max(e, emin)
    q = p * imb
    y = abs(x) * (i2f(np.int32(0x7F000000 - f2i(p))) * tmb)  # 2**-e 2**mb, exact
    if sr:
        lo = np.float32(np.int32(y))
        thr = np.float32(np.int32((y - lo) * sc))
        r = lo + (_F1 if u < thr else _F0)
    else:
        r = (y + _BIG) - _BIG
    out = min(r * q, maxv)
    return i2f(np.int32(f2i(out) | (ix & np.int32(-2147483648))))


@njit(cache=True, inline="always")
def round_v(x, mb, emin, maxv, ovf, sr, sc, u, div):
    """formats.core.round_float of float32 ``x`` to an element format (constants from
    :func:`elem_consts`, SR integer ``u``), without branches (selects only, so element loops
    vectorise); ``div`` (loop-invariant): ``emin - mb < -126`` (bf16), the quantum ``q`` or
    ``1/q`` may not be a normal float32, so both come as products of two normal powers of
    two (a ``pow2`` with branches and a division ran BF16 at 14-24 us per 64 x 128)."""
    ix = f2i(x)
    ef = (ix >> 23) & 0xFF
    e = max(ef - 127, np.int32(emin))
    if div:  # q or 1/q beyond the normal range: each as two normal powers (exact products)
        s = e - mb < -126
        sh = 64 if s else 0
        q = i2f(np.int32((e - mb + sh + 127) << 23)) * (_P2M64 if s else _F1)
        y = (abs(x) * i2f(np.int32((mb - e - sh + 127) << 23))) * (_P264 if s else _F1)
    else:
        q = i2f(np.int32((e - mb + 127) << 23))
        y = abs(x) * i2f(np.int32((mb - e + 127) << 23))
    y = min(y, _BIG)  # only Inf/NaN reach 2**23 here; keeps the conversions defined
    if sr:
        lo = np.float32(np.int32(y))
        thr = np.float32(np.int32((y - lo) * sc))
        r = lo + (_F1 if u < thr else _F0)
    else:
        r = (y + _BIG) - _BIG
    out = r * q
    out = ovf if out > maxv else out
    out = i2f(f2i(out) ^ (ix & np.int32(-2147483648)))
    spec = i2f(f2i(ovf) ^ (ix & np.int32(-2147483648)))
    spec = x if x != x else spec
    return spec if ef == 255 else out


@intrinsic
def _mix32(typingctx, x):
    """formats.rng's mix on a uint32, in 32-bit IR (numba widens integer arithmetic to 64
    bits, which vectorises at half the width)."""
    sig = types.uint32(types.uint32)

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        v = args[0]
        for mul, sh in ((0x7FEB352D, 16), (0x846CA68B, 15)):
            v = builder.xor(v, builder.lshr(v, ir.Constant(i32, sh)))
            v = builder.mul(v, ir.Constant(i32, mul))
        return builder.xor(v, builder.lshr(v, ir.Constant(i32, 16)))

    return sig, codegen


@njit(cache=True)
def words(W, w0, k0, k1):
    """``W[k]`` = the random 32-bit word number ``w0 + k`` (formats.rng's hash)."""
    hi = np.uint32(((w0 >> 32) ^ k1) & _MASK)  # w0 + k stays within one 2**32 page below
    lo0 = np.uint32(w0 & _MASK)
    kk = np.uint32(k0)
    if (w0 & _MASK) + W.shape[0] <= _MASK:
        for k in range(W.shape[0]):
            W[k] = _mix32(_mix32((lo0 + np.uint32(k)) ^ kk) ^ hi)
    else:
        for k in range(W.shape[0]):
            w = w0 + k
            W[k] = _hash(w & _MASK, w >> 32, k0, k1)


@njit(cache=True)
def shift(ub, sh):
    """``ub >>= sh`` in place (unsigned lanes)."""
    for i in range(ub.shape[0]):
        ub[i] = ub[i] >> sh


@njit(cache=True)
def elements(x, ub, ush, sr, mb, emin, maxv, ovf, sc, div):
    """Element formats over flat ``x``, in place: element ``i`` takes lane
    ``ub[i] >> ush``. (In place on purpose: with a second array that may alias ``x``
    LLVM's overlap check fails for ``out is x`` and the loop runs scalar, 3x slower.)"""
    if sr:
        for i in range(x.shape[0]):
            u = np.float32(ub[i] >> ush)
            x[i] = round_v(x[i], mb, emin, maxv, ovf, True, sc, u, div)
    else:
        for i in range(x.shape[0]):
            x[i] = round_v(x[i], mb, emin, maxv, ovf, False, sc, _F0, div)


@njit(cache=True, inline="always")
def _round_int(x, qmax, ieee, sr, sc, u):
    """formats.core.round_int of float32 ``x`` to the integers ``-qmax..qmax`` (``qmax``
    float32; SR integer ``u``, ``sc`` = 2**bits), without branches: satfinite clamps
    first, ``ieee`` makes a result beyond qmax NaN; NaN stays NaN."""
    ax = abs(x)
    y = qmax if (not ieee and ax > qmax) else ax
    y = min(y, _BIG)  # only beyond 2**23 (ieee: NaN anyway); keeps the conversions defined
    if sr:
        lo = np.float32(np.int32(y))
        thr = np.float32(np.int32((y - lo) * sc))
        r = lo + (_F1 if u < thr else _F0)
    else:
        r = (y + _BIG) - _BIG
    r = _NAN if (ieee and r > qmax) else r
    out = i2f(np.int32(f2i(r) | (f2i(x) & np.int32(-2147483648))))
    return x if x != x else out


@njit(cache=True)
def ints(x, ub, ush, sr, qmax, ieee, sc):
    """Integer formats over flat ``x``, in place (lanes as :func:`elements`)."""
    if sr:
        for i in range(x.shape[0]):
            x[i] = _round_int(x[i], qmax, ieee, True, sc, np.float32(ub[i] >> ush))
    else:
        for i in range(x.shape[0]):
            x[i] = _round_int(x[i], qmax, ieee, False, sc, _F0)
