"""The fused CPU engine (``run.engine=numba``): the Triton engine's structure, compiled by numba.

The horizon is cut into *windows* that end at the first flush at or after each metrics window end
(the ReplaySSM buffers start empty in every window; state drift is sampled where the torch engine
samples it). Per window the host draws the inputs (``make_workload(cfg).chunk``) and computes, with
the torch engine's own float32 operations, everything that depends on the inputs only: the decays
``exp(dt A)``, the ReplaySSM decay matrices of each segment, the buffer's part of every output
(``sum_j w_j(t) (C_t . B_j) x_j``) and of every fold (``sum_j w_j x_j B_j^T``). Compiled tasks,
one per (head, slot) — slot 0 the float64 truth, then one per scheme — keep their state copies in
cache for the whole window and, per step, apply the update, the quantisation (RNE and SR,
bit-equal to :func:`precsim.formats.quantize`, same counter-based random bits) and the output in
one pass. Gated DeltaNet: a ReplaySSM output depends on the checkpoint through ``u_t``, so the
host draws only the segments' input-only matrices (:func:`_gdn_terms`) and each task evaluates
``u_t``, the output and the fold itself (:func:`_scheme_gdn`). The metrics are the torch
engine's (:class:`precsim.metrics.Accumulator`), fed once per window with rows a compiled pass
reduced (rel_err, the readout's normalised inputs).

Threads (``run.threads``, docs/performance.md): with n > 1, n - 1 worker threads
take the window's tasks (nogil calls) while the host prepares the next window and reduces the
last one's metrics, then takes tasks too; results are the same bit for bit at any n.
:func:`supports` names what is not covered (the torch engine runs it then).

Compilation: a scheme's kind and formats are constants of its compiled task (:func:`_task`,
one per :func:`scheme_consts`), so a run compiles the branches and quantisers of its own
schemes only, and numba caches each on disk (``cache=True``) for the next run.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import time

import numpy as np
import torch

from precsim import formats as pf
from precsim.formats.rng import event_keys

from ..checkpoint import Checkpoint, restore_acc
from ..config import Config, ef_fmt
from ..families import decays
from ..metrics import Accumulator, Readout
from ..result import make_result
from ..schemes import build_schemes
from ..workload import expand_groups, make_workload
from .base import (
    cpu_threads,
    flush_events,
    launch_ends,
    progress_bar,
    segment_ends,
    segment_phase,
    slow_notice,
)

NAME = "numba"

try:  # numba is optional (extra ``cpu``)
    import numba
    from llvmlite import ir
    from numba import njit, types
    from numba.core import cgutils
    from numba.extending import intrinsic, overload
except ImportError:  # pragma: no cover - exercised where numba is missing
    numba = None

# format ids (compile-time constants of a scheme's task, scheme_consts); a row-scaled format
# <element>_b<B> is the id of its element + SCALED * B (see fmt_code)
FMT_IDS = {"fp32": 0, "fp64": 0, "bf16": 1, "fp16": 2, "fp8_e4m3": 3, "fp8_e5m2": 4,
           "fp4_e2m1": 5, "nvfp4": 6, "mxfp4": 7, "mxfp8": 8, "int8": 9, "int16": 10}
SCALED = 32
KINDS = {"conventional": 0, "shared": 1, "split": 2}
# element formats 1..5 and 9..10 (rows 6..8, the block formats, unused): mantissa bits, emin,
# max (qmax for the integers), has Inf
_EL = np.array([[0, 0, 0.0, 0], [7, -126, 3.3895313892515355e38, 1], [10, -14, 65504.0, 1],
                [3, -6, 448.0, 0], [2, -14, 57344.0, 1], [1, 0, 6.0, 0], [0, 0, 0.0, 0],
                [0, 0, 0.0, 0], [0, 0, 0.0, 0], [0, 0, 127.0, 0], [0, 0, 32767.0, 0]],
               dtype=np.float64)
# scheme code columns (C_EF: the error-feedback residual's format, -1 without)
C_KIND, C_FMT, C_RND, C_BITS, C_IEEE, C_RFMT, C_EF = range(7)
NCODE = 7


def available() -> bool:
    """True when numba is importable."""
    return numba is not None


def supports(cfg: Config, device: str = "cpu") -> str | None:
    """None if the numba engine runs ``cfg``, else a one-line reason (run the torch engine)."""
    if numba is None:
        return "numba is not installed (pip install 'precsim[cpu]')"
    if cfg.model.family not in ("mamba2", "gdn"):
        return f"model.family={cfg.model.family} (the numba engine covers mamba2 and gdn)"
    if cfg.model.family == "gdn" and cfg.replay.buffer_dtype not in ("fp32", "fp64"):
        return (f"replay.buffer_dtype={cfg.replay.buffer_dtype} with gdn (the numba engine "
                "keeps a GDN buffer in fp32)")
    if cfg.formats.sr_source != "hash":
        return f"formats.sr_source={cfg.formats.sr_source} (the numba engine draws hash bits)"
    if cfg.formats.rotate:
        return "formats.rotate=true (Hadamard rotation)"
    if cfg.run.compute_dtype != "fp32":
        return f"run.compute_dtype={cfg.run.compute_dtype} (the numba engine computes in fp32)"
    for name, s in cfg.schemes.items():
        for fo in (pf.get(f) for f in (s.fmt, s.read_fmt) if f is not None):
            base = fo.element if isinstance(fo, pf.ScaledFormat) else fo
            if base.name not in FMT_IDS:
                return f"schemes.{name}: format {fo.name} is not covered by the numba engine"
            if fo.kind == "block":
                if fo.two_level and cfg.formats.tensor_scope == "tensor":
                    return ("formats.tensor_scope=tensor (an NVFP4 scale over the whole layer "
                            "couples heads)")
                if cfg.model.state_dim % fo.block:
                    return f"state_dim={cfg.model.state_dim} is not a multiple of {fo.block}"
    return None


def fmt_code(name: str) -> int:
    """The kernel's id of a format: :data:`FMT_IDS`, or for a row-scaled ``<element>_b<B>``
    the element's id + ``SCALED * B``."""
    f = pf.get(name)
    if isinstance(f, pf.ScaledFormat):
        return FMT_IDS[f.element.name] + SCALED * f.block
    return FMT_IDS[f.name]


def scheme_codes(sc) -> np.ndarray:
    """A SchemeConfig as the kernel's int row (kind, fmt, rounding, SR bits, ieee, read fmt,
    error-feedback fmt or -1)."""
    sr = sc.rounding == "sr"
    ef = ef_fmt(sc)
    return np.array([KINDS[sc.kind], fmt_code(sc.fmt), int(sr),
                     pf.sr_bits_used(sc.fmt, sc.sr_bits) if sr else 0,
                     int(sc.overflow == "ieee"),
                     fmt_code(sc.read_fmt) if sc.kind == "split" else 0,
                     fmt_code(ef) if ef else -1], dtype=np.int64)


def sr_lane(bits: int) -> int:
    """The width of the lanes an SR integer of ``bits`` bits is read from (8, 16 or 32)."""
    return 8 if bits <= 8 else (16 if bits <= 16 else 32)


def scheme_consts(code) -> tuple[int, int, int, int, int]:
    """What the compiled task of a scheme takes as constants (a :func:`scheme_codes` row): its
    kind, its format code and SR lane width (:func:`sr_lane`; 0: RNE), its read copy's format
    code (0: none) and its error-feedback residual's (-1: none)."""
    return (int(code[C_KIND]), int(code[C_FMT]),
            sr_lane(int(code[C_BITS])) if code[C_RND] else 0,
            int(code[C_RFMT]) if code[C_KIND] == KINDS["split"] else 0, int(code[C_EF]))


# ---------------------------------------------------------------------------------------------
# compiled kernels

if numba is not None:

    @intrinsic
    def _f2i(typingctx, x):
        """float32 -> int32 with the same bits."""
        sig = types.int32(types.float32)

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], ir.IntType(32))

        return sig, codegen

    @intrinsic
    def _i2f(typingctx, x):
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
    def _pow2(e):
        """2**e as float32 (e <= 127; subnormal powers down to 2**-149, 0 below)."""
        if e >= -126:
            return _i2f(np.int32((e + 127) << 23))
        if e >= -149:
            return _i2f(np.int32(1 << (e + 149)))
        return _F0

    @njit(cache=True, inline="always")
    def _consts(f, bits, ieee, el):
        """Per-format constants of :func:`_round_v`: mantissa bits, emin, max, the value an
        overflow becomes, 2**bits (float32)."""
        maxv = np.float32(el[f, 2])
        ovf = maxv if not ieee else (_INF if el[f, 3] > 0 else _NAN)
        return np.int64(el[f, 0]), np.int64(el[f, 1]), maxv, ovf, np.float32(2.0 ** bits)

    @njit(cache=True, inline="always")
    def _round_fin(x, pmin, imb, tmb, maxv, sr, sc, u):
        """:func:`_round_v` for finite ``x`` with ``|x| < 2**127`` after saturation (the block
        formats' scaled elements), without branches and in 32-bit lanes (the block formats'
        element loop, so LLVM vectorises it whole): ``pmin`` = 2**emin, ``imb`` = 2**-mb,
        ``tmb`` = 2**mb, all float32. The power of two of ``x``'s binade comes from its
        exponent bits and a float max (an integer max ran in 64-bit lanes: numba widens int32
        arithmetic), ``x / q`` as one multiplication by the exact power 2**(mb - e)."""
        ix = _f2i(x)
        p = max(_i2f(np.int32(ix & 0x7F800000)), pmin)  # 2**max(e, emin)
        q = p * imb
        y = abs(x) * (_i2f(np.int32(0x7F000000 - _f2i(p))) * tmb)  # 2**-e 2**mb, exact
        if sr:
            lo = np.float32(np.int32(y))
            thr = np.float32(np.int32((y - lo) * sc))
            r = lo + (_F1 if u < thr else _F0)
        else:
            r = (y + _BIG) - _BIG
        out = min(r * q, maxv)
        return _i2f(np.int32(_f2i(out) | (ix & np.int32(-2147483648))))

    @njit(cache=True, inline="always")
    def _round_v(x, mb, emin, maxv, ovf, sr, sc, u, div):
        """formats.core.round_float of float32 ``x`` to an element format (constants from
        :func:`_consts`, SR integer ``u``), without branches (selects only, so element loops
        vectorise); ``div`` (loop-invariant): ``emin - mb < -126`` (bf16), the quantum ``q`` or
        ``1/q`` may not be a normal float32, so both come as products of two normal powers of
        two (a ``_pow2`` with branches and a division ran BF16 at 14-24 us per 64 x 128)."""
        ix = _f2i(x)
        ef = (ix >> 23) & 0xFF
        e = max(ef - 127, np.int32(emin))
        if div:  # q or 1/q beyond the normal range: each as two normal powers (exact products)
            s = e - mb < -126
            sh = 64 if s else 0
            q = _i2f(np.int32((e - mb + sh + 127) << 23)) * (_P2M64 if s else _F1)
            y = (abs(x) * _i2f(np.int32((mb - e - sh + 127) << 23))) * (_P264 if s else _F1)
        else:
            q = _i2f(np.int32((e - mb + 127) << 23))
            y = abs(x) * _i2f(np.int32((mb - e + 127) << 23))
        y = min(y, _BIG)  # only Inf/NaN reach 2**23 here; keeps the conversions defined
        if sr:
            lo = np.float32(np.int32(y))
            thr = np.float32(np.int32((y - lo) * sc))
            r = lo + (_F1 if u < thr else _F0)
        else:
            r = (y + _BIG) - _BIG
        out = r * q
        out = ovf if out > maxv else out
        out = _i2f(_f2i(out) ^ (ix & np.int32(-2147483648)))
        spec = _i2f(_f2i(ovf) ^ (ix & np.int32(-2147483648)))
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
    def _words(W, w0, k0, k1):
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
    def _shift(ub, sh):
        """``ub >>= sh`` in place (unsigned lanes)."""
        for i in range(ub.shape[0]):
            ub[i] = ub[i] >> sh

    @njit(cache=True)
    def _elements(x, ub, ush, sr, mb, emin, maxv, ovf, sc, div):
        """Element formats over flat ``x``, in place: element ``i`` takes lane
        ``ub[i] >> ush``. (In place on purpose: with a second array that may alias ``x``
        LLVM's overlap check fails for ``out is x`` and the loop runs scalar, 3x slower.)"""
        if sr:
            for i in range(x.shape[0]):
                u = np.float32(ub[i] >> ush)
                x[i] = _round_v(x[i], mb, emin, maxv, ovf, True, sc, u, div)
        else:
            for i in range(x.shape[0]):
                x[i] = _round_v(x[i], mb, emin, maxv, ovf, False, sc, _F0, div)

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
        out = _i2f(np.int32(_f2i(r) | (_f2i(x) & np.int32(-2147483648))))
        return x if x != x else out

    @njit(cache=True)
    def _ints(x, ub, ush, sr, qmax, ieee, sc):
        """Integer formats over flat ``x``, in place (lanes as :func:`_elements`)."""
        if sr:
            for i in range(x.shape[0]):
                x[i] = _round_int(x[i], qmax, ieee, True, sc, np.float32(ub[i] >> ush))
        else:
            for i in range(x.shape[0]):
                x[i] = _round_int(x[i], qmax, ieee, False, sc, _F0)

    @njit(cache=True, inline="always")
    def _scaled(x, B, ef, ub, ush, sr, bits, el):
        """A row-scaled format ``<element>_b<B>`` over flat ``x``, in place, as
        ``formats.ScaledFormat``: per block of ``B`` elements the FP32 scale ``max|x| / emax``
        (one float32 division; NaN if the block holds NaN or Inf), the elements divided by it
        (1 for a zero scale) and clipped to +-emax, rounded (element format ``ef``, satfinite;
        lanes as :func:`_elements`) and multiplied back. Three passes that each vectorise (one
        pass with the rounding inside the block loop ran 4-10x slower)."""
        emax = np.float32(el[ef, 2])
        nb = x.shape[0] // B
        tot = np.empty(nb, dtype=np.float32)
        for g in range(nb):
            b0 = g * B
            bm = np.int32(0)
            if B % 16 == 0:
                for k in range(B // 16):
                    bm = np.int32(max(bm, _absmax16(x, b0 + 16 * k)))
            else:
                for j in range(B):
                    bm = np.int32(max(bm, _f2i(x[b0 + j]) & np.int32(0x7FFFFFFF)))
            tot[g] = _i2f(bm) / emax if bm < 0x7F800000 else _NAN
        x2 = x.reshape(nb, B)
        for g in range(nb):
            safe = tot[g] if tot[g] > 0 else _F1
            for j in range(B):
                x2[g, j] = min(max(x2[g, j] / safe, -emax), emax)
        mb, emin, maxv, ovf, sc = _consts(ef, bits, False, el)
        if ef >= 9:
            _ints(x, ub, ush, sr, emax, False, sc)
        else:
            _elements(x, ub, ush, sr, mb, emin, maxv, ovf, sc, emin - mb < -126)
        for g in range(nb):
            t = tot[g]
            for j in range(B):
                x2[g, j] = x2[g, j] * t

    @njit(cache=True, inline="always")
    def _blk_el(v, fg, tg, mul, sr, u, pmin, imb, tmb, maxv, maxe, sc):
        """One block element: ``v * fg`` (``mul``) or ``v / fg``, clipped, rounded, ``* tg``."""
        xs = min(max(v * fg if mul else v / fg, -maxe), maxe)
        return _round_fin(xs, pmin, imb, tmb, maxv, sr, sc, u) * tg

    def _blocks(x, fac, tot, mul, ub, blk, sr, pmin, imb, tmb, maxv, maxe, sc):
        """Block formats over flat ``x``, in place (see :func:`_elements`; lane ``ub[i]`` is
        element ``i``'s SR integer, already shifted): block ``g`` (``blk`` elements) is
        ``x * fac[g]`` (``mul``) or ``x / fac[g]``, rounded, times ``tot[g]``. Compiled code
        only, ``blk`` and ``sr`` constants: :func:`_blocks_impl`."""
        raise NotImplementedError("precsim.engines.numba._blocks runs compiled only")

    @overload(_blocks, prefer_literal=True)
    def _blocks_typed(x, fac, tot, mul, ub, blk, sr, pmin, imb, tmb, maxv, maxe, sc):
        if isinstance(blk, types.IntegerLiteral) and isinstance(sr, types.BooleanLiteral):
            return _blocks_impl(blk.literal_value, sr.literal_value)
        return None

    @functools.cache
    def _blocks_impl(BLK, SR):
        """:func:`_blocks` for blocks of ``BLK`` (16 or 32) elements, SR or RNE: a constant
        inner trip count (vectorised whole; the branch on ``mul`` is loop-invariant), and one
        loop nest compiled instead of four."""

        def blocks(x, fac, tot, mul, ub, blk, sr, pmin, imb, tmb, maxv, maxe, sc):
            nb = fac.shape[0]
            x2 = x.reshape(nb, BLK)
            if SR:
                u2 = ub[:nb * BLK].reshape(nb, BLK)
                for g in range(nb):
                    fg, tg = fac[g], tot[g]
                    for j in range(BLK):
                        u = np.float32(u2[g, j])
                        x2[g, j] = _blk_el(x2[g, j], fg, tg, mul, True, u, pmin, imb, tmb, maxv,
                                           maxe, sc)
            else:
                for g in range(nb):
                    fg, tg = fac[g], tot[g]
                    for j in range(BLK):
                        x2[g, j] = _blk_el(x2[g, j], fg, tg, mul, False, _F0, pmin, imb, tmb,
                                           maxv, maxe, sc)

        return blocks

    def _vec_absmax(width):
        """An intrinsic ``f(x, b0)``: the largest ``|x|`` bit pattern (as int32) of the
        ``width`` float32 elements from ``x[b0]``, by one vector load and LLVM's unsigned max
        reduction. (The scalar loop compiled to compare-and-branch chains whose branches
        mispredicted on state data: 5-6 us of NVFP4's 11 us per 64 x 128 state.)"""

        @intrinsic
        def absmax(typingctx, x, b0):
            sig = types.int32(x, b0)

            def codegen(context, builder, signature, args):
                i32 = ir.IntType(32)
                vty = ir.VectorType(i32, 16)
                ary = context.make_array(signature.args[0])(context, builder, args[0])
                ptr = builder.gep(ary.data, [args[1]])
                mask = ir.Constant(vty, [0x7FFFFFFF] * 16)
                red = ir.FunctionType(i32, [vty])
                fn = cgutils.get_or_insert_function(builder.module, red,
                                                    "llvm.vector.reduce.umax.v16i32")
                best = None
                for k in range(width // 16):
                    p = builder.gep(ptr, [ir.Constant(ir.IntType(64), 16 * k)]) if k else ptr
                    v = builder.and_(builder.load(p, typ=vty, align=4) if ptr.type.is_opaque
                                     else builder.load(builder.bitcast(p, vty.as_pointer()),
                                                       align=4), mask)
                    m = builder.call(fn, [v])
                    best = m if best is None else builder.select(
                        builder.icmp_unsigned(">", m, best), m, best)
                return best

            return sig, codegen

        return absmax

    _absmax16, _absmax32 = _vec_absmax(16), _vec_absmax(32)

    @njit(cache=True)
    def _quant(M, out, f, lane, bits, ieee, floor, scope_none, recip, base, k0, k1, el):
        """Fake-quantise one C-contiguous float32 matrix ``M (P, N)`` into ``out`` (may alias M):
        a copy, then :func:`_qin` on ``out``."""
        if not (out.ctypes.data == M.ctypes.data):
            o, m = out.reshape(out.size), M.reshape(M.size)
            for i in range(o.size):  # (``out[:, :] = M``: its broadcasting compiled for ~7 s)
                o[i] = m[i]
        _qin(out, f, lane, bits, ieee, floor, scope_none, recip, base, k0, k1, el)

    def _qin(X, f, lane, bits, ieee, floor, scope_none, recip, base, k0, k1, el):
        """Fake-quantise one C-contiguous float32 matrix ``X (P, N)`` in place to the format of
        code ``f`` (:func:`fmt_code`; 0 or below: unchanged), stochastically with ``bits``
        random bits read from ``lane``-bit lanes (:func:`sr_lane`), or RNE if ``lane`` is 0.
        Compiled code only, ``f`` and ``lane`` constants (literal ints): numba compiles
        :func:`_qin_impl` of that format and rounding, nothing of the others."""
        raise NotImplementedError("precsim.engines.numba._qin runs compiled only")

    @overload(_qin, prefer_literal=True)
    def _qin_typed(X, f, lane, bits, ieee, floor, scope_none, recip, base, k0, k1, el):
        if isinstance(f, types.IntegerLiteral) and isinstance(lane, types.IntegerLiteral):
            return _qin_impl(f.literal_value, lane.literal_value)
        return None

    @functools.cache
    def _qin_impl(F, LANE):
        """:func:`_qin` for format code ``F`` and SR lanes of ``LANE`` bits (0: RNE). Element
        formats per element, block formats along the last axis (NVFP4's FP32 scale over the matrix
        unless ``scope_none``; its scales applied as reciprocals if ``recip``, else divided).
        Elements are numbered ``base + p*N + n`` for SR; the random words come in one pass and
        are read back as lanes (little-endian: lane ``j`` of a word is its ``j``-th 8/16-bit
        slot in memory). One array argument: with a second one that may alias it (the former
        ``_quant(M, out)`` body) NVFP4-SR on a 64 x 128 state took 9.5 us, here 5.3 us.
        ``F`` and ``LANE`` are constants of the closure, so numba prunes every other format's
        branches before typing: a run compiles the paths of the formats it uses (one quantiser
        with the format a runtime argument compiled all of them at each lane width, ~45 s of
        the first process of ``experiment=split_nvfp4`` on 2 cores)."""
        BLK, EF = divmod(F, SCALED)  # a row-scaled format's block and element format
        SR, LN = LANE > 0, LANE or 8
        BLKF = 16 if F == FMT_IDS["nvfp4"] else 32  # a block format's block
        UT = {8: np.uint8, 16: np.uint16, 32: np.uint32}[LN]

        def qin(X, f, lane, bits, ieee, floor, scope_none, recip, base, k0, k1, el):
            P, N = X.shape
            if F <= 0:
                return
            x = X.reshape(P * N)
            lanes = 32 // LN
            uoff = base % lanes
            W = np.empty((uoff + P * N + lanes - 1) // lanes if SR else 1, dtype=np.uint32)
            if SR:
                _words(W, base // lanes, k0, k1)
            ush = LN - bits
            if F >= SCALED:  # <element>_b<B>: one FP32 scale per B elements
                _scaled(x, BLK, EF, W.view(UT)[uoff:], ush, SR, bits, el)
                return
            if F >= 9:  # the integers -qmax..qmax
                qmax, sc = np.float32(el[F, 2]), np.float32(2.0 ** bits)
                _ints(x, W.view(UT)[uoff:], ush, SR, qmax, ieee, sc)
                return
            if F <= 5:
                mb, emin, maxv, ovf, sc = _consts(F, bits, ieee, el)
                div = emin - mb < -126
                _elements(x, W.view(UT)[uoff:], ush, SR, mb, emin, maxv, ovf, sc, div)
                return
            nb = P * N // BLKF
            ef = 5 if F != 8 else 3
            emaxe = 2 if ef == 5 else 8
            maxe = np.float32(el[ef, 2])
            mb, emin, maxv, ovf, sc = _consts(ef, bits, False, el)
            bmx = np.empty(nb, dtype=np.int32)
            if BLKF == 16:
                for g in range(nb):
                    bmx[g] = _absmax16(x, g * 16)
            else:
                for g in range(nb):
                    bmx[g] = _absmax32(x, g * 32)
            tot = np.empty(nb, dtype=np.float32)
            fac = np.empty(nb, dtype=np.float32)
            if F == 6:
                s_t = _F1
                if not scope_none:
                    m = bmx[0]
                    for g in range(1, nb):  # (bmx.max() compiled for ~1 s)
                        m = np.int32(max(m, bmx[g]))
                    s_t = _i2f(m) / np.float32(2688.0)
                    if s_t == 0:
                        s_t = _F1
                r_t = _F1 / s_t
                lo = np.float32(0.015625) if floor else _F0
                m4, e4, x4 = np.int64(el[3, 0]), np.int64(el[3, 1]), np.float32(el[3, 2])
                # scope none == a tensor scale of 1: bs / 1, 1 * bs and (1 / 1) / bs are exact
                for g in range(nb):  # branch-free (vectorises); a NaN/Inf block max selects NaN
                    bm = bmx[g]
                    bs = (_i2f(bm) / np.float32(6.0)) / s_t
                    bs = x4 if bs > x4 else bs
                    bs = lo if bs < lo else bs
                    bs = _round_v(bs, m4, e4, x4, x4, False, _F0, _F0, False)
                    total = s_t * bs
                    tot[g] = total if bm < 0x7F800000 else _NAN
                    rf = r_t / (bs if bs > 0 else _F1)
                    fac[g] = rf if recip else (total if total > 0 else _F1)
            else:
                for g in range(nb):
                    bm = bmx[g]
                    e = min(max(((bm >> 23) & 0xFF) - 127 - emaxe, -127), 127)
                    tot[g] = _pow2(e) if bm < 0x7F800000 else _NAN
                    fac[g] = _F1 / _pow2(e)  # exact: x * 2**-e == x / 2**e, subnormals included
            mul = recip or F != 6
            pmin, imb, tmb = _pow2(emin), _pow2(-mb), _pow2(mb)
            if SR and ush:  # each lane's top ``bits`` bits, the SR integer, before the loop
                _shift(W.view(UT), ush)
            for g in range(nb):  # a NaN block: finite factors, the NaN comes from its total
                if not tot[g] == tot[g]:
                    fac[g] = _F1
            _blocks(x, fac, tot, mul, W.view(UT)[uoff:], BLKF, SR, pmin, imb, tmb, maxv, maxe,
                    sc)

        return qin

    @functools.cache
    def _quantize_many(F, LANE):
        """:func:`quantize`'s compiled loop for format code ``F`` and SR lanes of ``LANE``
        bits: every matrix of ``X (M, P, N)`` float32 (matrix m's elements start at
        ``m*P*N``) quantised into a new array, on one thread (a parallel loop took ~2 s longer
        to compile per format)."""

        @njit(cache=True)
        def many(X, bits, ieee, floor, scope_none, recip, k0, k1, el):
            out = np.empty_like(X)
            MP = X.shape[1] * X.shape[2]
            for m in range(X.shape[0]):
                _quant(X[m], out[m], F, LANE, bits, ieee, floor, scope_none, recip, m * MP, k0,
                       k1, el)
            return out

        return many

    @njit(cache=True, fastmath={"reassoc"})
    def _dot(s, c):
        """sum_n s[n] c[n] (float32 or float64), in whatever order vectorises (the outputs' S.C
        reductions are the only sums whose order differs from the torch engine's)."""
        acc = s[0] * c[0]
        for n in range(1, s.shape[0]):
            acc += s[n] * c[n]
        return acc

    @njit(cache=True, inline="always")
    def _update(S, a, dt, xv, Bv, Cv, y):
        """S = a S + (dt x) B^T row by row (the torch engine's roundings), y = S C."""
        for p in range(S.shape[0]):
            row = S[p]
            dx = dt * xv[p]
            for n in range(row.shape[0]):
                row[n] = a * row[n] + dx * Bv[n]
            y[p] = _dot(row, Cv)

    @njit(cache=True)
    def _truth(S, a64, dt64, x64, B64, C64, y64, sh):
        for i in range(a64.shape[0]):
            _update(S, a64[i, sh], dt64[i, sh], x64[i, sh], B64[i, sh], C64[i, sh], y64[i, sh])

    @njit(cache=True, inline="always")
    def _store(st, rd, ef, code, key, k0, base, floor, scope_none, recip, el, kind, qfmt, qlane,
               qread, qef):
        """Round a scheme's state after an update or a fold: the master in its format and
        rounding (SR event key ``key``), then a split scheme's read copy from it (RNE). With
        error feedback (``ef`` the residual) first ``X = st + ef``, then ``ef = Q_e(X - Q(X))``
        (RNE), as ``schemes.write_state``. ``kind, qfmt, qlane, qread, qef``: the scheme's
        :func:`scheme_consts` (constants: only its own branches and formats are compiled)."""
        if qef >= 0:
            X = st.reshape(st.size)
            E = ef.reshape(ef.size)
            for c in range(X.size):
                X[c] = X[c] + E[c]
                E[c] = X[c]
        _qin(st, qfmt, qlane, code[C_BITS], code[C_IEEE] != 0, floor, scope_none, recip, base, k0,
             np.int64(key), el)
        if qef >= 0:
            for c in range(X.size):
                E[c] = E[c] - X[c]
            _qin(ef, qef, 0, 0, code[C_IEEE] != 0, floor, scope_none, recip, base, 0, 0, el)
        if kind == 2:
            _quant(st, rd, qread, 0, 0, False, floor, scope_none, recip, base, 0, 0, el)

    @njit(cache=True, inline="always")
    def _scheme(st, rd, ef, code, keys, k0, a32, dt32, x32, B32, C32, Yb, gam, Fb, y32, sh, ph,
                floor, scope_none, recip, el, kind, qfmt, qlane, qread, qef):
        """One scheme on one head over one window (which starts at a flush boundary); ``ph``:
        each step's place in its segment (``engines.base.segment_phase``); ``kind, qfmt,
        qlane, qread, qef``: its :func:`scheme_consts`."""
        n_steps = a32.shape[0]
        P, N = st.shape
        base = np.int64(sh) * P * N
        R = rd if kind == 2 else st
        seg = 0
        for i in range(n_steps):
            y = y32[i, sh]
            if kind == 0:
                _update(st, a32[i, sh], dt32[i, sh], x32[i, sh], B32[i, sh], C32[i, sh], y)
                _store(st, rd, ef, code, keys[i], k0, base, floor, scope_none, recip, el, kind,
                       qfmt, qlane, qread, qef)
                continue
            Cv = C32[i, sh]
            g = gam[i, sh]
            if (ph[i] & 2) == 0:  # output-only: the checkpoint (read copy) is only read
                yb = Yb[i, sh]
                for p in range(P):
                    y[p] = yb[p] + g * _dot(R[p], Cv)
            if ph[i] & 1:  # flush: fold (without drafts the output from it), write
                F = Fb[seg, sh]
                for p in range(P):
                    row = st[p]
                    fr = F[p]
                    for n in range(N):
                        row[n] = g * row[n] + fr[n]
                    if ph[i] & 2:
                        y[p] = _dot(row, Cv)
                _store(st, rd, ef, code, keys[i], k0, base, floor, scope_none, recip, el, kind,
                       qfmt, qlane, qread, qef)
                seg += 1

    @njit(cache=True, inline="always")
    def _gdn_step(row, a, beta, v, k, q):
        """One row of families.gdn.step: ``u = beta (v - a row.k)``, ``row = a row + u k``
        (the torch engine's roundings), returns ``row . q``."""
        u = beta * (v - a * _dot(row, k))
        for c in range(row.shape[0]):
            row[c] = a * row[c] + u * k[c]
        return _dot(row, q)

    @njit(cache=True)
    def _truth_gdn(S, a64, b64, q64, k64, v64, y64, sh):
        for i in range(a64.shape[0]):
            for p in range(S.shape[0]):
                y64[i, sh, p] = _gdn_step(S[p], a64[i, sh], b64[i, sh], v64[i, sh, p],
                                          k64[i, sh], q64[i, sh])

    @njit(cache=True, inline="always")
    def _scheme_gdn(st, rd, ef, code, keys, k0, a32, b32, q32, k32, v32, gam, A, M, wl, y32, sh,
                    ph, floor, scope_none, recip, el, u_master, kind, qfmt, qlane, qread,
                    qef):
        """One GDN scheme on one head over one window (which starts at a flush boundary):
        conventional schemes step and quantise every token; ReplaySSM schemes evaluate
        families.gdn.segment output by output (``u_t`` from the checkpoint's ``S k_t`` and the
        earlier ``u_j`` of the segment, ``A``/``M``/``wl`` the host's input-only segment
        matrices) and fold, quantise and renew the read copy at a flush."""
        n_steps = a32.shape[0]
        V, K = st.shape
        base = np.int64(sh) * V * K
        R = rd if kind == 2 else st
        RU = st if u_master else R
        U = np.zeros((A.shape[2], V), dtype=np.float32)
        acc = np.empty(K, dtype=np.float32)
        cv = np.empty(V, dtype=np.float32)  # per row: the sum over the segment's earlier j
        seg = 0
        for i in range(n_steps):
            y = y32[i, sh]
            kt = k32[i, sh]
            qt = q32[i, sh]
            if kind == 0:
                for p in range(V):
                    y[p] = _gdn_step(st[p], a32[i, sh], b32[i, sh], v32[i, sh, p], kt, qt)
                _store(st, rd, ef, code, keys[i], k0, base, floor, scope_none, recip, el, kind,
                       qfmt, qlane, qread, qef)
                continue
            j = ph[i] >> 2
            g = gam[i, sh]
            Aj = A[seg, sh, j]
            bt = b32[i, sh]
            vt = v32[i, sh]
            cv[:] = 0.0  # corr_p = sum_{jj < j} A[j, jj] u_jj[p], in that order (rows at once)
            for jj in range(j):
                ajj = Aj[jj]
                Ujj = U[jj]
                for p in range(V):
                    cv[p] += ajj * Ujj[p]
            for p in range(V):
                U[j, p] = bt * (vt[p] - g * _dot(RU[p], kt) - cv[p])
            if (ph[i] & 2) == 0:  # output-only: the checkpoint (read copy) is only read
                Mj = M[seg, sh, j]
                cv[:] = 0.0
                for jj in range(j + 1):
                    mjj = Mj[jj]
                    Ujj = U[jj]
                    for p in range(V):
                        cv[p] += mjj * Ujj[p]
                for p in range(V):
                    y[p] = cv[p] + g * _dot(R[p], qt)
            if ph[i] & 1:  # flush: fold (without drafts the output from it), write
                w = wl[seg, sh]
                i0 = i - j
                for p in range(V):
                    row = st[p]
                    for c in range(K):
                        acc[c] = 0.0
                    for jj in range(j + 1):
                        wu = w[jj] * U[jj, p]
                        kj = k32[i0 + jj, sh]
                        for c in range(K):
                            acc[c] += wu * kj[c]
                    for c in range(K):
                        row[c] = g * row[c] + acc[c]
                    if ph[i] & 2:
                        y[p] = _dot(row, qt)
                _store(st, rd, ef, code, keys[i], k0, base, floor, scope_none, recip, el, kind,
                       qfmt, qlane, qread, qef)
                seg += 1

    @functools.cache
    def _task_gdn(consts):
        """:func:`_task` for Gated DeltaNet."""
        K, F, LANE, FR, FE = consts

        @njit(cache=True, nogil=True)
        def task(task, S64, st, rd, ef, codes, keys, k0, a64, b64, q64, k64, v64, y64, a32, b32,
                 q32, k32, v32, gam, A, M, wl, y32, ph, floor, scope_none, recip, el, u_master):
            nt = st.shape[0] + 1
            sh = task // nt
            slot = task % nt
            if slot == 0:
                _truth_gdn(S64[sh], a64, b64, q64, k64, v64, y64, sh)
            else:
                i = slot - 1
                _scheme_gdn(st[i, sh], rd[i, sh], ef[i, sh], codes[i], keys[i], k0, a32, b32,
                            q32, k32, v32, gam, A, M, wl, y32[i], sh, ph, floor, scope_none,
                            recip, el, u_master, K, F, LANE, FR, FE)

        return task

    @functools.cache
    def _task(consts):
        """The compiled task of a window, one (head, slot), for schemes of
        :func:`scheme_consts` ``consts`` (any of them runs the truth): ``task = sh * (ns + 1) +
        slot``, slot 0 the truth, slot i + 1 scheme i. Tasks write disjoint state and outputs,
        so threads run different tasks at once (nogil) and the result does not depend on who
        ran what. The constants are the closure's, so numba compiles one function per scheme
        kind and formats, with only their branches (numba caches each one: a closure's
        constants are part of its cache key)."""
        K, F, LANE, FR, FE = consts

        @njit(cache=True, nogil=True)
        def task(task, S64, st, rd, ef, codes, keys, k0, a64, dt64, x64, B64, C64, y64, a32, dt32,
                 x32, B32, C32, Yb, gam, Fb, y32, ph, floor, scope_none, recip, el):
            nt = st.shape[0] + 1
            sh = task // nt
            slot = task % nt
            if slot == 0:
                _truth(S64[sh], a64, dt64, x64, B64, C64, y64, sh)
            else:
                i = slot - 1
                _scheme(st[i, sh], rd[i, sh], ef[i, sh], codes[i], keys[i], k0, a32, dt32, x32,
                        B32, C32, Yb, gam, Fb, y32[i], sh, ph, floor, scope_none, recip, el, K, F,
                        LANE, FR, FE)

        return task

    @njit(cache=True, nogil=True)
    def _row_stats(y32, y64, x64, x32, D64, D32, P, kl, err, s_ss, d, yh):
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


def task_order(codes: np.ndarray, heads: int) -> np.ndarray:
    """The windows' tasks (head, slot) costliest first (a thread that takes the last task then
    waits the least): slots by a static estimate (block formats, then SR, then quantising every
    step), heads in order within a slot."""
    cost = [0] + [2 * (FMT_IDS["nvfp4"] <= c[C_FMT] <= FMT_IDS["mxfp8"] or c[C_FMT] >= SCALED)
                  + (c[C_RND] != 0) + (c[C_KIND] == KINDS["conventional"]) for c in codes]
    nt = len(cost)
    slots = sorted(range(nt), key=lambda s: -cost[s])
    return np.array([sh * nt + s for s in slots for sh in range(heads)], dtype=np.int64)


def quantize(x: np.ndarray, fmt: str, rounding: str = "rne", *, seed: int = 0, stream: int = 0,
             sr_bits: int | None = None, overflow: str = "satfinite",
             scale_floor: str = "subnormal", tensor_scope: str = "matrix",
             scale_mode: str = "reciprocal") -> np.ndarray:
    """The compiled quantiser on a float32 array ``(..., R, C)`` (matrices = last two axes).

    Equals ``precsim.formats.quantize(x, fmt, rounding, seed=seed, stream=stream, ...)`` bit for
    bit (tests check); tensor_scope ``tensor`` is not covered.
    """
    if tensor_scope == "tensor":
        raise ValueError("tensor_scope='tensor' is not covered by the numba quantiser")
    x = np.ascontiguousarray(x, dtype=np.float32)
    X = x.reshape(-1, *x.shape[-2:]) if x.ndim >= 2 else x.reshape(1, 1, -1)
    sr = rounding == "sr"
    k0, k1 = pf.stream_keys(seed, stream)
    bits = pf.sr_bits_used(fmt, sr_bits) if sr else 0
    out = _quantize_many(fmt_code(fmt), sr_lane(bits) if sr else 0)(
        X, bits, overflow == "ieee", scale_floor == "normal", tensor_scope == "none",
        scale_mode == "reciprocal", k0, k1, _EL)
    return out.reshape(x.shape)


# ---------------------------------------------------------------------------------------------
# host driver


def _segment_decays(la32, lens, Sq: int, H: int):
    """A window's ReplaySSM segments (lengths ``lens`` from its start), grouped by length:
    yields ``(segs, idx, k, m, Lc, decay)`` for the ``k`` segments ``segs`` of ``m`` steps
    (their steps ``idx``, ``(k*m,)``), ``Lc (k, m, S, H)`` the cumulative float32 log-decays and
    ``decay (k, S, H, m, m)`` = exp(Lc_t - Lc_j) for j <= t, 0 above (families' decay_matrices,
    batched over the segments)."""
    lens = np.asarray(lens)
    starts = np.concatenate(([0], np.cumsum(lens)[:-1]))
    for m in np.unique(lens)[::-1].tolist():
        segs = np.flatnonzero(lens == m)
        k = len(segs)
        idx = torch.from_numpy((starts[segs][:, None] + np.arange(m)).reshape(-1))
        Lc = torch.cumsum(la32[idx].reshape(k, m, Sq, H), 1)
        Lh = Lc.permute(0, 2, 3, 1)  # (k, S, H, m)
        causal = torch.ones(m, m, dtype=torch.bool).tril()
        decay = torch.exp(torch.where(causal, Lh[..., :, None] - Lh[..., None, :],
                                      torch.tensor(float("-inf"))))
        yield torch.from_numpy(segs), idx, k, m, Lc, decay


def _buffer_terms(dt32, la32, x, B, C, lens, Sq: int, H: int):
    """Input-only ReplaySSM terms of a window (torch, float32, the torch engine's operations):
    ``gam (n, SH)`` = exp(Lc_t), ``Yb (n, SH, P)`` = the buffer's part of each output and
    ``Fb (nseg, SH, P, N)`` = the buffer's part of each fold. Segments of lengths ``lens`` from
    the window's start; ``la32`` the float32 log-decays (the torch engine's: float64 ``dt A``
    rounded once, not a float32 product)."""
    n = dt32.shape[0]
    SH = Sq * H
    P, N = x.shape[-1], B.shape[-1]
    gam = torch.empty((n, SH), dtype=torch.float32)
    Yb = torch.empty((n, SH, P), dtype=torch.float32)
    Fb = torch.empty((len(lens), SH, P, N), dtype=torch.float32)
    for segs, sl, k, m, Lc, decay in _segment_decays(la32, lens, Sq, H):
        W = decay * dt32[sl].reshape(k, m, Sq, H).permute(0, 2, 3, 1)[..., None, :]
        xs = x[sl].reshape(k, m, Sq, H, P)
        Bs = B[sl].reshape(k, m, Sq, H, N)
        Cs = C[sl].reshape(k, m, Sq, H, N)
        G = torch.einsum("ktshn,kjshn->kshtj", Cs, Bs)
        Y = torch.einsum("kshtj,kjshp->ktshp", W * G, xs)
        Yb[sl] = Y.reshape(k * m, SH, P)
        gam[sl] = torch.exp(Lc).reshape(k * m, SH)
        w_last = W[..., -1, :].permute(0, 3, 1, 2)  # (k, m, S, H)
        F = torch.einsum("kjshp,kjshn->kshpn", w_last[..., None] * xs, Bs)
        Fb[segs] = F.reshape(k, SH, P, N)
    return gam, Yb, Fb


def _gdn_terms(la32, q, k, lens, L: int, Sq: int, H: int):
    """Input-only ReplaySSM terms of a GDN window (torch, float32, families.gdn.segment's
    operations): ``gam (n, SH)`` = exp(Lc_t), per segment ``A (nseg, SH, L, L)`` the strictly
    lower ``decay * (k_t . k_j)``, ``M`` the lower ``decay * (q_t . k_j)`` and ``wl (nseg, SH,
    L)`` the last row of ``decay``. Segments of lengths ``lens`` (at most L) from the window's
    start."""
    n = la32.shape[0]
    SH = Sq * H
    Kd = k.shape[-1]
    nseg = len(lens)
    gam = torch.empty((n, SH), dtype=torch.float32)
    A = torch.zeros((nseg, SH, L, L), dtype=torch.float32)
    M = torch.zeros_like(A)
    wl = torch.zeros((nseg, SH, L), dtype=torch.float32)
    for segs, sl, kk, m, Lc, decay in _segment_decays(la32, lens, Sq, H):
        ks = k[sl].reshape(kk, m, Sq, H, Kd)
        qs = q[sl].reshape(kk, m, Sq, H, Kd)
        KK = torch.einsum("ktshc,kjshc->kshtj", ks, ks)
        QK = torch.einsum("ktshc,kjshc->kshtj", qs, ks)
        A[segs, :, :m, :m] = (decay * KK).tril(-1).reshape(kk, SH, m, m)
        M[segs, :, :m, :m] = (decay * QK).reshape(kk, SH, m, m)
        wl[segs, :, :m] = decay[..., -1, :].reshape(kk, SH, m)
        gam[sl] = torch.exp(Lc).reshape(kk * m, SH)
    return gam, A, M, wl


def run(cfg: Config, device: str = "cpu", progress: bool = True, record_outputs: bool = False,
        ckpt: Checkpoint | None = None):
    """Run ``cfg`` on the fused CPU engine; the same ``Result`` as the torch engine's.

    ``record_outputs`` keeps every output in ``info["outputs"]`` (tests, small runs); ``ckpt``
    saves and restores its state (:mod:`precsim.checkpoint`).
    """
    t_start = time.perf_counter()
    wl = make_workload(cfg)  # first: a trace fixes model.family and the shape
    reason = supports(cfg, device)
    if reason is not None:  # the torch engine runs it, with a note
        import logging

        from . import torch as torch_engine

        logging.getLogger("precsim").warning(
            "precsim: the numba engine does not support %s; running the torch engine", reason)
        res = torch_engine.run(cfg, device, progress=progress, record_outputs=record_outputs,
                               ckpt=ckpt)
        res.info["numba_fallback"] = reason
        return res
    threads = min(cpu_threads(cfg.run.threads), numba.config.NUMBA_NUM_THREADS)
    ck = ckpt or Checkpoint(cfg, None)
    ck.start(NAME, "cpu", t_start)
    m = cfg.model
    Sq, H, P, N = cfg.run.seqs, m.heads, m.head_dim, m.state_dim
    SH = Sq * H
    steps, L = cfg.run.steps, cfg.replay.buffer_len
    schemes = build_schemes(cfg)
    ns = len(schemes)
    codes = np.stack([scheme_codes(s.cfg) for s in schemes]) if ns else np.zeros((0, NCODE),
                                                                                   np.int64)
    S64 = np.zeros((SH, P, N))
    st = np.zeros((ns, SH, P, N), dtype=np.float32)
    rd = np.zeros_like(st)
    # error feedback's residuals (empty matrices when no scheme has it)
    ef = np.zeros((ns, SH, P, N) if (codes[:, C_EF] >= 0).any() else (ns, SH, 0, 0), np.float32)
    k0 = pf.stream_keys(cfg.run.seed, 0)[0]
    ev = np.arange(steps, dtype=np.int64)
    seg_ends = segment_ends(cfg)  # the flushes (speculative decoding: irregular segments)
    flush_ev = flush_events(seg_ends, steps)
    phase = segment_phase(seg_ends, steps, cfg.replay.drafts == 0)
    keys = np.zeros((ns, steps), dtype=np.uint32)
    for i, s in enumerate(schemes):
        if s.cfg.rounding == "sr":
            keys[i] = event_keys(cfg.run.seed, s.name, ev if not s.replay else flush_ev, 0)[1]
    gdn = cfg.model.family == "gdn"
    A64 = None if gdn else np.asarray(wl.params["A"], dtype=np.float64)
    D = wl.params.get("D")
    D64 = torch.as_tensor(D, dtype=torch.float64) if D is not None else None
    readout = Readout(H * P, cfg.metrics.vocab, cfg.metrics.logit_scale, "cpu") \
        if cfg.metrics.kl else None
    acc = Accumulator([s.name for s in schemes], cfg.metrics.window, readout)
    bufdt = cfg.replay.buffer_dtype
    floor, scope_none = cfg.formats.scale_floor == "normal", cfg.formats.tensor_scope == "none"
    recip = cfg.formats.nvfp4_scale == "reciprocal"
    bar = progress_bar(cfg, progress)
    names = ["truth", *(s.name for s in schemes)]
    recorded: dict[str, list] = {n: [] for n in names}
    dead_at: list[int | None] = [None] * ns
    t_kernel: list[float] = []

    def lens(t0: int, t1: int) -> np.ndarray:
        """The lengths of the segments of steps [t0, t1) (t0 and t1 are flushes)."""
        e = seg_ends[(seg_ends > t0) & (seg_ends <= t1)]
        return np.diff(e, prepend=t0)

    def prepare(t0: int, t1: int) -> dict:
        """The window's inputs, decays and buffer terms (host, torch/NumPy)."""
        n = t1 - t0
        raw_t = expand_groups(wl.chunk(t0, t1), H)
        raw = {k: v.numpy() for k, v in raw_t.items()}
        if gdn:
            return prepare_gdn(t0, t1, raw_t, raw)
        dt_t = torch.from_numpy(raw["dt"]).to(torch.float32)  # (n, S, H)
        x_t = torch.from_numpy(raw["x"]).to(torch.float32)
        B_t = torch.from_numpy(raw["B"]).to(torch.float32)
        C_t = torch.from_numpy(raw["C"]).to(torch.float32)
        dec = decays("mamba2", raw_t, {"A": torch.as_tensor(A64)}, torch.float32,
                     cfg.model.decay_exp)  # the torch engine's decays
        xb, Bb = x_t, B_t
        if bufdt not in ("fp32", "fp64"):
            xb, Bb = pf.quantize(x_t, bufdt, "rne"), pf.quantize(B_t, bufdt, "rne")
        gam, Yb, Fb = _buffer_terms(dt_t.reshape(n, Sq, H), dec["la"], xb, Bb, C_t, lens(t0, t1),
                                    Sq, H)
        y64 = np.empty((n, SH, P))
        y32 = np.empty((ns, n, SH, P), dtype=np.float32)
        args = (S64, st, rd, ef, codes, np.ascontiguousarray(keys[:, t0:t1]), k0,
                np.exp(raw["dt"] * A64).reshape(n, SH),
                np.ascontiguousarray(raw["dt"].reshape(n, SH)),
                np.ascontiguousarray(raw["x"].reshape(n, SH, P)),
                np.ascontiguousarray(raw["B"].reshape(n, SH, N)),
                np.ascontiguousarray(raw["C"].reshape(n, SH, N)), y64,
                dec["a"].reshape(n, SH).numpy(), dt_t.reshape(n, SH).numpy(),
                x_t.reshape(n, SH, P).numpy(), B_t.reshape(n, SH, N).numpy(),
                C_t.reshape(n, SH, N).numpy(), Yb.numpy(), gam.numpy(), Fb.numpy(), y32,
                phase[t0:t1], floor, scope_none, recip, _EL)
        return {"t0": t0, "t1": t1, "x": raw["x"], "x_t": x_t, "y64": y64, "y32": y32,
                "args": args, "next": itertools.count()}

    u_master = cfg.replay.gdn_u_source == "master"

    def prepare_gdn(t0: int, t1: int, raw_t: dict, raw: dict) -> dict:
        """:func:`prepare` for Gated DeltaNet: the inputs in float64 (the truth) and float32, the
        decays and the segments' input-only matrices (:func:`_gdn_terms`)."""
        n = t1 - t0
        f32 = {k: torch.from_numpy(raw[k]).to(torch.float32) for k in ("beta", "q", "k", "v")}
        dec = decays("gdn", raw_t, {}, torch.float32, cfg.model.decay_exp)
        gam, Am, Mm, wlast = _gdn_terms(dec["la"], f32["q"], f32["k"], lens(t0, t1), L, Sq, H)

        def flat(a, *tail):
            return np.ascontiguousarray(a.reshape(n, SH, *tail))

        y64 = np.empty((n, SH, P))
        y32 = np.empty((ns, n, SH, P), dtype=np.float32)
        args = (S64, st, rd, ef, codes, np.ascontiguousarray(keys[:, t0:t1]), k0,
                flat(np.exp(raw["g"])), flat(raw["beta"]), flat(raw["q"], N), flat(raw["k"], N),
                flat(raw["v"], P), y64, flat(dec["a"].numpy()), flat(f32["beta"].numpy()),
                flat(f32["q"].numpy(), N), flat(f32["k"].numpy(), N), flat(f32["v"].numpy(), P),
                gam.numpy(), Am.numpy(), Mm.numpy(), wlast.numpy(), y32, phase[t0:t1], floor,
                scope_none, recip, _EL, u_master)
        return {"t0": t0, "t1": t1, "x": None, "x_t": None, "y64": y64, "y32": y32,
                "args": args, "next": itertools.count()}

    # each task's compiled function: its scheme's formats (slot 0, the truth: any of them)
    fns = [(_task_gdn if gdn else _task)(scheme_consts(c)) for c in [*codes[:1], *codes]] \
        if ns else [(_task_gdn if gdn else _task)((0, 0, 0, 0, -1))]
    calls = [(fns[t % (ns + 1)], t) for t in task_order(codes, SH).tolist()]
    ntask = len(calls)

    def kernel(w: dict) -> None:
        """Take the window's tasks one at a time until none is left (any number of threads:
        the workers and, between its own work, the host)."""
        tk = time.perf_counter()
        args, cnt = w["args"], w["next"]
        while (j := next(cnt)) < ntask:  # itertools.count: one task per caller, atomic
            fn, t = calls[j]
            fn(t, *args)
        t_kernel.append(time.perf_counter() - tk)  # summed: the kernel's seconds, all threads

    def snapshot(w: dict) -> None:
        """The held states at the window's end, if a drift sample is due (before the next
        window's kernel overwrites them)."""
        if acc.want_drift(w["t1"]):
            w["states"] = (S64.copy(), st.copy(), rd.copy()) if overlap else (S64, st, rd)

    W = H * P
    D64n = np.asarray(D, dtype=np.float64) if D is not None else np.zeros(0)
    want_kl = readout is not None

    def finish(w: dict) -> None:
        """Dead schemes, the metrics (rows by ``_row_stats``, the KL from them), the drift
        sample, the outputs kept, the bar."""
        t0, t1 = w["t0"], w["t1"]
        n = t1 - t0
        rows = n * Sq
        err, s_ss, yh = np.empty((ns, rows)), np.empty((ns, rows)), np.empty((rows, W))
        d = np.empty((ns, rows, W) if want_kl else (0, 0, 0), dtype=np.float32)
        no = np.zeros((0, 0))
        x64 = np.ascontiguousarray(w["x"]).reshape(rows, W) if D is not None else no
        _row_stats(w["y32"].reshape(ns, rows, W), w["y64"].reshape(rows, W), x64,
                   x64.astype(np.float32), D64n, D64n.astype(np.float32), P, want_kl, err, s_ss,
                   d, yh)
        cuts = []
        for i in range(ns):
            if dead_at[i] is None:  # the first step with a non-finite output (any sequence)
                bad = ~np.isfinite(s_ss[i]).reshape(n, Sq).all(axis=1)
                if bad.any():
                    dead_at[i] = t0 + int(np.argmax(bad)) + 1
            cuts.append(_dead_cut(dead_at[i], t0, n, seg_ends))
            err[i, cuts[i] * Sq:] = math.nan  # after the dying segment: NaN outputs
            if want_kl:
                d[i, cuts[i] * Sq:] = math.nan
        acc.push_rows(torch.from_numpy(err).view(ns, n, Sq),
                      torch.from_numpy(yh).view(n, Sq, W) if want_kl else None,
                      torch.from_numpy(d).view(ns, n, Sq, W) if want_kl else None)
        if record_outputs:
            y_ref = torch.from_numpy(w["y64"]).view(n, Sq, H, P)
            if D64 is not None:
                y_ref = y_ref + D64[:, None] * torch.from_numpy(w["x"])
            recorded["truth"].append(y_ref.numpy())
            for i, s in enumerate(schemes):
                y = torch.from_numpy(w["y32"][i]).view(n, Sq, H, P)
                if D64 is not None:
                    y = y + D64.to(torch.float32)[:, None] * w["x_t"]
                y = y.clone()
                y[cuts[i]:] = math.nan
                recorded[s.name].append(y.numpy())
        if "states" in w:
            s64, s32, r32 = w["states"]
            def v4(a):
                return torch.from_numpy(a).view(Sq, H, P, N)

            acc.record_drift(t1, v4(s64), {s.name: None if dead_at[i] is not None else {
                "state": v4(s32[i]), **({"read": v4(r32[i])} if s.kind == "split" else {})}
                for i, s in enumerate(schemes)})
        if bar is not None:
            bar.update(n)

    # With more than one thread, threads - 1 workers take the window's tasks while the host
    # draws the next window's inputs and reduces the last window's metrics (torch, one thread),
    # then takes tasks too: the cores stay busy whichever side has more to do (a numba parallel
    # kernel beside the host thread oversubscribed the cores). One thread: window after window.
    overlap = threads > 1
    ends = launch_ends(seg_ends, cfg.metrics.window)
    t0 = 0
    saved = ck.resume()
    if saved is not None:  # the arrays in place: every window's arguments refer to them
        t0, dead_at[:] = saved["pos"], saved["dead"]
        for a, k in ((S64, "S64"), (st, "st"), (rd, "rd"), (ef, "ef")):
            a[...] = saved.get(k, a)
        restore_acc(acc, saved["acc"])
        ends = [e for e in ends if e > t0]
        if bar is not None:
            bar.update(t0)

    def whole(pos: int):  # the state when window ``pos`` is finished and the next not started
        return lambda: {"pos": pos, "S64": S64, "st": st, "rd": rd, "ef": ef, "dead": dead_at,
                        "acc": acc,
                        "dead_at": {s.name: dead_at[i] for i, s in enumerate(schemes)}}

    first = slow_notice("compiling the fused CPU engine (the first run after an install; numba "
                        "caches it on disk)", bar is not None, after=4.0)
    if not overlap:
        for t1 in ends:
            w = prepare(t0, t1)
            with first if t0 == 0 else contextlib.nullcontext():
                kernel(w)
            snapshot(w)
            finish(w)
            t0 = t1
            ck.window(t1, whole(t1))
    else:
        from concurrent.futures import ThreadPoolExecutor, wait

        with ThreadPoolExecutor(threads - 1, thread_name_prefix="precsim-numba") as pool:
            futs, prev = [], None
            for t1 in ends:
                w = prepare(t0, t1)
                if prev is not None:
                    with first if prev["t0"] == 0 else contextlib.nullcontext():
                        kernel(prev)  # the host's share of the running window
                        wait(futs)
                    for f in futs:
                        f.result()
                    snapshot(prev)
                    if ck.due(prev["t1"]):  # whole: finish it before the next one starts
                        finish(prev)
                        ck.window(prev["t1"], whole(prev["t1"]))
                        prev = None
                futs = [pool.submit(kernel, w) for _ in range(threads - 1)]
                if prev is not None:
                    finish(prev)
                prev, t0 = w, t1
            kernel(prev)
            for f in futs:
                f.result()
            snapshot(prev)
            finish(prev)
    acc.finish()
    if bar is not None:
        bar.close()
    for i, s in enumerate(schemes):
        s.dead_at = dead_at[i]
    n_flush = len(seg_ends)
    info = {"flushes": n_flush, "workload": cfg.workload.kind,
            "mean_segment": steps / max(n_flush, 1), "kernel_s": sum(t_kernel),
            "threads": threads, **ck.info()}
    if record_outputs:
        info["outputs"] = {k: np.concatenate(v) for k, v in recorded.items()}
    return make_result(cfg, acc, {s.name: s.dead_at for s in schemes}, engine=NAME,
                       device="cpu", t_start=t_start, info=info)


def _dead_cut(dead_at: int | None, t0: int, n: int, seg_ends: np.ndarray) -> int:
    """The torch engine's dead-scheme rule: a segment with a non-finite output marks the scheme
    dead at that step and its outputs read as NaN from the end of that segment on (it stops
    running). The first of the window's ``n`` steps (from ``t0``) that reads as NaN (``n``:
    none)."""
    if dead_at is None:
        return n
    end = int(seg_ends[np.searchsorted(seg_ends, dead_at - 1, side="right")]) \
        if dead_at - 1 < seg_ends[-1] else seg_ends[-1]
    return min(n, max(0, end - t0))
