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
host draws only the segments' input-only matrices (``numba_host._gdn_terms``) and each task
evaluates ``u_t``, the output and the fold itself (:func:`_scheme_gdn`), its reductions in the
torch engine's fixed order (``S k`` and ``S q`` by :func:`_kdots`, the sums over a segment's steps
in step order), so its states and outputs are the torch engine's bit for bit. The metrics are the
torch engine's (:class:`precsim.metrics.Accumulator`), fed once per window with rows a compiled
pass reduced (rel_err, the readout's normalised inputs).

Threads (``run.threads``, docs/performance.md): with n > 1, n - 1 worker threads
take the window's tasks (nogil calls) while the host prepares the next window and reduces the
last one's metrics, then takes tasks too; results are the same bit for bit at any n.
:func:`supports` names what is not covered (the torch engine runs it then).

Compilation: a scheme's kind and formats are constants of its compiled task (:func:`_task`,
one per :func:`scheme_consts`), so a run compiles the branches and quantisers of its own
schemes only, and numba caches each on disk (``cache=True``) for the next run. numba keys its
cache on the contents of the file that defines the compiled code, so this module holds the
compiled kernels and what they need only; the host driver (windows, inputs, threads, metrics,
checkpoints: :func:`run`) is :mod:`precsim.engines.numba_host`, and a change there, or a new
release that leaves this file as it is, keeps the compiled code.
"""

from __future__ import annotations

import functools

import numpy as np

from precsim import formats as pf
from precsim.formats import ids
from precsim.formats.rng import event_keys  # noqa: F401 - re-exported (the host, tests)

from ..config import Config, ef_fmt

NAME = "numba"

try:  # numba is optional (extra ``cpu``)
    import numba
    from llvmlite import ir
    from numba import njit, types
    from numba.core import cgutils
    from numba.extending import intrinsic, overload
except ImportError:  # pragma: no cover - exercised where numba is missing
    numba = None

# formats and scheme kinds as the compiled code knows them: precsim.formats.ids (a format's code,
# ids.fmt_code, is a compile-time constant of a scheme's task, scheme_consts; its limits come in
# as the array limits() at run time)
KINDS = ids.KIND_IDS


def table_key() -> int:
    """``formats.ids.table_key`` as a 48-bit int: a closure constant of every compiled task, so
    numba's on-disk cache (keyed on this file and a closure's constants) never serves code
    compiled for another format table."""
    return int(ids.table_key()[:12], 16)


def limits() -> np.ndarray:
    """The element limits the compiled quantisers read (``formats.ids.limits_table``: per format
    id mantissa bits, emin, largest value, Inf, integer)."""
    return ids.limits_table()


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
            if not ids.covered(base.name):
                return f"schemes.{name}: format {fo.name} is not covered by the numba engine"
            if fo.kind == "block":
                if fo.two_level and cfg.formats.tensor_scope == "tensor":
                    return ("formats.tensor_scope=tensor (an NVFP4 scale over the whole layer "
                            "couples heads)")
                if cfg.model.state_dim % fo.block:
                    return f"state_dim={cfg.model.state_dim} is not a multiple of {fo.block}"
    return None


def fmt_code(name: str) -> int:
    """The compiled code's constant for a format: ``formats.ids.fmt_code`` (its id, plus
    ``SCALED_STRIDE`` x the block of a row-scaled ``<element>_b<B>``)."""
    return ids.fmt_code(name)


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
    def _scaled(x, B, ef, isint, ub, ush, sr, bits, el):
        """A row-scaled format ``<element>_b<B>`` over flat ``x``, in place, as
        ``formats.ScaledFormat``: per block of ``B`` elements the FP32 scale ``max|x| / emax``
        (one float32 division; NaN if the block holds NaN or Inf), the elements divided by it
        (1 for a zero scale) and clipped to +-emax, rounded (element format ``ef``, satfinite;
        lanes as :func:`_elements`) and multiplied back. Three passes that each vectorise (one
        pass with the rounding inside the block loop ran 4-10x slower). ``isint``: the element
        is an integer format."""
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
        if isint:
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

    @njit(cache=True, inline="always")
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
        # the format's constants, read off formats.ids: its class, a row-scaled format's block
        # (BLK) and element (EF, EFI: an integer), a block format's block (BLKF), element (ef),
        # element max, MX exponent offset (emaxe) and two-level scale (SID: its id; TMX: the
        # per-matrix scale's divisor; SMN: the smallest normal scale)
        FID, BLK = ids.split_code(F)
        CLS = ids.id_class(FID) if F > 0 else ids.NONE
        TWO, ELEM, ROWF = CLS == ids.TWO_LEVEL, CLS in (ids.FLOAT, ids.INT), CLS == ids.ROW
        EF = ids.element_id(FID) if CLS != ids.NONE else 0
        EFI = CLS != ids.NONE and ids.id_class(EF) == ids.INT
        bp = ids.block_params(FID) if CLS in (ids.TWO_LEVEL, ids.MX) else {}
        BLKF, EMX = bp.get("block", 32), bp.get("element_max", 1.0)
        EMAXE, SID = bp.get("emax", 0), bp.get("scale", 0)
        TMX, SMN = bp.get("tensor_max", 1.0), bp.get("scale_min_normal", 0.0)
        SR, LN = LANE > 0, LANE or 8
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
            if ROWF:  # <element>_b<B>: one FP32 scale per B elements
                _scaled(x, BLK, EF, EFI, W.view(UT)[uoff:], ush, SR, bits, el)
                return
            if ELEM and EFI:  # the integers -qmax..qmax
                qmax, sc = np.float32(el[F, 2]), np.float32(2.0 ** bits)
                _ints(x, W.view(UT)[uoff:], ush, SR, qmax, ieee, sc)
                return
            if ELEM:
                mb, emin, maxv, ovf, sc = _consts(F, bits, ieee, el)
                div = emin - mb < -126
                _elements(x, W.view(UT)[uoff:], ush, SR, mb, emin, maxv, ovf, sc, div)
                return
            nb = P * N // BLKF
            ef = EF
            emaxe = EMAXE
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
            if TWO:
                s_t = _F1
                if not scope_none:
                    m = bmx[0]
                    for g in range(1, nb):  # (bmx.max() compiled for ~1 s)
                        m = np.int32(max(m, bmx[g]))
                    s_t = _i2f(m) / np.float32(TMX)
                    if s_t == 0:
                        s_t = _F1
                r_t = _F1 / s_t
                lo = np.float32(SMN) if floor else _F0
                m4, e4, x4 = np.int64(el[SID, 0]), np.int64(el[SID, 1]), np.float32(el[SID, 2])
                # scope none == a tensor scale of 1: bs / 1, 1 * bs and (1 / 1) / bs are exact
                for g in range(nb):  # branch-free (vectorises); a NaN/Inf block max selects NaN
                    bm = bmx[g]
                    bs = (_i2f(bm) / np.float32(EMX)) / s_t
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
            mul = recip or not TWO
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
        TK = table_key()

        @njit(cache=True)
        def many(X, bits, ieee, floor, scope_none, recip, k0, k1, el):
            TK  # noqa: B018 - the format table's fingerprint, in the cache key (see _task)
            out = np.empty_like(X)
            MP = X.shape[1] * X.shape[2]
            for m in range(X.shape[0]):
                _quant(X[m], out[m], F, LANE, bits, ieee, floor, scope_none, recip, m * MP, k0,
                       k1, el)
            return out

        return many

    @njit(cache=True, fastmath={"reassoc"})
    def _dot(s, c):
        """sum_n s[n] c[n] (float32 or float64), in whatever order vectorises (Mamba-2's output
        reductions S.C and the float64 truths: the only sums whose order differs from the torch
        engine's)."""
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

    @njit(cache=True, inline="always")
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
    def _kdot_any(x, y, tmp):
        """sum_c x[c] y[c] in families.base.key_dot's order, bit for bit (the torch engine's
        GDN sums): with ``h = ceil(n / 2)``, ``p_c + p_{c+h}`` for ``c < n - h`` (the first
        level from the products, an odd length's middle carried), halving until one is left;
        ``tmp`` scratch of at least ``ceil(n / 2)`` elements. Separate products and adds (numba
        compiles without fastmath, so LLVM fuses no multiply-add: checked in the code)."""
        n = x.shape[0]
        h = (n + 1) // 2
        for c in range(n - h):
            tmp[c] = x[c] * y[c] + x[c + h] * y[c + h]
        if n - h < h:
            tmp[n - h] = x[n - h] * y[n - h]
        n = h
        while n > 1:
            h = (n + 1) // 2
            for c in range(n - h):
                tmp[c] = tmp[c] + tmp[c + h]
            n = h
        return tmp[0]

    def _kdot_pow2(n):
        """:func:`_kdot_any` for a constant length ``n = 2**k``: the same tree with constant
        trip counts, which LLVM vectorises and unrolls (21 ns per 128-row against ~100 ns with
        runtime ones, as fast as the reassociated :func:`_dot`)."""
        h0 = n // 2

        @njit(inline="always")
        def kdot(x, y, tmp):
            for c in range(h0):
                tmp[c] = x[c] * y[c] + x[c + h0] * y[c + h0]
            h = h0 // 2
            while h >= 1:
                for c in range(h):
                    tmp[c] = tmp[c] + tmp[c + h]
                h //= 2
            return tmp[0]

        return kdot

    _kd32, _kd64, _kd128 = (_kdot_pow2(n) for n in (32, 64, 128))

    @njit(cache=True)
    def _kdots(M, y, out, tmp):
        """``out[p]`` = :func:`_kdot_any` of row ``p`` of ``M`` and ``y``: the key lengths 32,
        64 and 128 with constant trip counts, chosen once per matrix (chosen per row, inside a
        row loop that also updates the row, the GDN step ran 2x slower)."""
        K = M.shape[1]
        if K == 128:
            for p in range(M.shape[0]):
                out[p] = _kd128(M[p], y, tmp)
        elif K == 64:
            for p in range(M.shape[0]):
                out[p] = _kd64(M[p], y, tmp)
        elif K == 32:
            for p in range(M.shape[0]):
                out[p] = _kd32(M[p], y, tmp)
        else:
            for p in range(M.shape[0]):
                out[p] = _kdot_any(M[p], y, tmp)

    @njit(cache=True, inline="always")
    def _truth_gdn(S, a64, b64, q64, k64, v64, y64, sh):
        """The float64 truth, row by row: families.gdn.step's ``u = beta (v - a row.k)``,
        ``row = a row + u k``, ``row . q``, the sums reassociated (:func:`_dot`: no engine shares
        the truth's bits)."""
        for i in range(a64.shape[0]):
            a, b, k, q = a64[i, sh], b64[i, sh], k64[i, sh], q64[i, sh]
            for p in range(S.shape[0]):
                row = S[p]
                u = b * (v64[i, sh, p] - a * _dot(row, k))
                for c in range(row.shape[0]):
                    row[c] = a * row[c] + u * k[c]
                y64[i, sh, p] = _dot(row, q)

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
        tmp = np.empty(K, dtype=np.float32)
        cv = np.empty(V, dtype=np.float32)  # per row: the sum over the segment's earlier j
        sk = np.empty(V, dtype=np.float32)  # per row: S k (key_dot's order, :func:`_kdots`)
        seg = 0
        for i in range(n_steps):
            y = y32[i, sh]
            kt = k32[i, sh]
            qt = q32[i, sh]
            if kind == 0:  # families.gdn.step: u = beta (v - a S k), S = a S + u k^T, y = S q
                a, bt, vt = a32[i, sh], b32[i, sh], v32[i, sh]
                _kdots(st, kt, sk, tmp)
                for p in range(V):
                    row = st[p]
                    u = bt * (vt[p] - a * sk[p])
                    for c in range(K):
                        row[c] = a * row[c] + u * kt[c]
                _kdots(st, qt, y, tmp)
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
            _kdots(RU, kt, sk, tmp)
            for p in range(V):
                U[j, p] = bt * (vt[p] - g * sk[p] - cv[p])
            if (ph[i] & 2) == 0:  # output-only: the checkpoint (read copy) is only read
                Mj = M[seg, sh, j]
                cv[:] = 0.0
                for jj in range(j + 1):
                    mjj = Mj[jj]
                    Ujj = U[jj]
                    for p in range(V):
                        cv[p] += mjj * Ujj[p]
                _kdots(R, qt, sk, tmp)
                for p in range(V):
                    y[p] = cv[p] + g * sk[p]
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
                    _kdots(st, qt, y, tmp)
                _store(st, rd, ef, code, keys[i], k0, base, floor, scope_none, recip, el, kind,
                       qfmt, qlane, qread, qef)
                seg += 1

    @njit(cache=True, nogil=True)
    def _truth_task_gdn(task, S64, st, rd, ef, codes, keys, k0, a64, b64, q64, k64, v64, y64, a32,
                        b32, q32, k32, v32, gam, A, M, wl, y32, ph, floor, scope_none, recip, el,
                        u_master):
        """:func:`_truth_task` for Gated DeltaNet."""
        sh = task // (st.shape[0] + 1)
        _truth_gdn(S64[sh], a64, b64, q64, k64, v64, y64, sh)

    @functools.cache
    def _task_gdn(consts):
        """:func:`_task` for Gated DeltaNet."""
        K, F, LANE, FR, FE = consts
        TK = table_key()

        @njit(cache=True, nogil=True)
        def task(task, S64, st, rd, ef, codes, keys, k0, a64, b64, q64, k64, v64, y64, a32, b32,
                 q32, k32, v32, gam, A, M, wl, y32, ph, floor, scope_none, recip, el, u_master):
            TK  # noqa: B018 - the format table's fingerprint, in the cache key (see _task)
            sh, i = task // (st.shape[0] + 1), task % (st.shape[0] + 1) - 1
            _scheme_gdn(st[i, sh], rd[i, sh], ef[i, sh], codes[i], keys[i], k0, a32, b32, q32,
                        k32, v32, gam, A, M, wl, y32[i], sh, ph, floor, scope_none, recip, el,
                        u_master, K, F, LANE, FR, FE)

        return task

    @njit(cache=True, nogil=True)
    def _truth_task(task, S64, st, rd, ef, codes, keys, k0, a64, dt64, x64, B64, C64, y64, a32,
                    dt32, x32, B32, C32, Yb, gam, Fb, y32, ph, floor, scope_none, recip, el):
        """The float64 truth's task of a window (slot 0, see :func:`_task`), on head ``sh``."""
        sh = task // (st.shape[0] + 1)
        _truth(S64[sh], a64, dt64, x64, B64, C64, y64, sh)

    @functools.cache
    def _task(consts):
        """The compiled task of a window, one (head, slot), for a scheme of
        :func:`scheme_consts` ``consts``: ``task = sh * (ns + 1) + slot``, slot 0 the truth
        (:func:`_truth_task`), slot i + 1 scheme i. Tasks write disjoint state and outputs, so
        threads run different tasks at once (nogil) and the result does not depend on who ran
        what. The constants are the closure's, so numba compiles one function per scheme kind
        and formats, with only their branches (numba caches each one: a closure's constants
        are part of its cache key; so is ``TK``, the format table's fingerprint: what a format
        code means is read off ``formats.ids`` when the task compiles)."""
        K, F, LANE, FR, FE = consts
        TK = table_key()

        @njit(cache=True, nogil=True)
        def task(task, S64, st, rd, ef, codes, keys, k0, a64, dt64, x64, B64, C64, y64, a32, dt32,
                 x32, B32, C32, Yb, gam, Fb, y32, ph, floor, scope_none, recip, el):
            TK  # noqa: B018 - the format table's fingerprint, in the cache key
            sh, i = task // (st.shape[0] + 1), task % (st.shape[0] + 1) - 1
            _scheme(st[i, sh], rd[i, sh], ef[i, sh], codes[i], keys[i], k0, a32, dt32, x32, B32,
                    C32, Yb, gam, Fb, y32[i], sh, ph, floor, scope_none, recip, el, K, F, LANE,
                    FR, FE)

        return task

    @njit(cache=True, nogil=True)
    def row_stats(y32, y64, x64, x32, D64, D32, P, kl, err, s_ss, d, yh):
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


def task_function(gdn: bool | None, consts: tuple[int, ...] | None):
    """The compiled task of the float64 truth (``consts`` None) or of a scheme of
    :func:`scheme_consts` ``consts``, Mamba-2 or (``gdn``) Gated DeltaNet; ``gdn`` None: the
    window's row statistics (``row_stats``)."""
    if gdn is None:
        return row_stats
    if consts is None:
        return _truth_task_gdn if gdn else _truth_task
    return (_task_gdn if gdn else _task)(tuple(consts))


def row_stats_signature() -> tuple:
    """The argument types the host calls ``row_stats`` with (C-contiguous arrays, an int, a
    bool)."""
    f32, f64 = np.float32, np.float64
    return tuple(numba.typeof(np.zeros((0,) * nd, dt) if nd else dt) for nd, dt in (
        (3, f32), (2, f64), (2, f64), (2, f32), (1, f64), (1, f32), (0, 0), (0, True), (2, f64),
        (2, f64), (3, f32), (2, f64)))


def compile_tasks() -> None:
    """A helper process's work (:func:`precsim.engines.numba_host.compile_ahead`): compile the
    functions read from stdin (a pickled list of :func:`task_function`'s ``(gdn, consts)`` and
    a signature) into numba's cache."""
    import pickle
    import sys

    for gdn, consts, sig in pickle.load(sys.stdin.buffer):
        task_function(gdn, consts).compile(sig)


def task_order(codes: np.ndarray, heads: int) -> np.ndarray:
    """The windows' tasks (head, slot) costliest first (a thread that takes the last task then
    waits the least): slots by a static estimate (block formats, then SR, then quantising every
    step), heads in order within a slot."""
    cost = [0] + [2 * ids.is_block(ids.split_code(c[C_FMT])[0])
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
        scale_mode == "reciprocal", k0, k1, limits())
    return out.reshape(x.shape)

