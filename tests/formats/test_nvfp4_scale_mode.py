"""NVFP4 scale application (``scale_mode``): reciprocal (default) and divide, bit for bit.

References are written here from the two formulas in float32 NumPy, with ml_dtypes for the E4M3
and E2M1 casts; the inputs are built to sit within a few ulps of E2M1 rounding midpoints after
scaling, where ``x / total`` and ``x * ((1/s_t)/bs)`` round to different E2M1 values.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import precsim.formats as pf
import pytest
import torch
from conftest import torchao_nvfp4

f32 = np.float32
MIDPOINTS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])


def ref(x, mode, scale_floor="subnormal", scope="matrix"):
    """NVFP4 of float32 ``x (M, R, C)`` from the definition, per matrix (last two axes)."""
    xb = x.reshape(*x.shape[:-1], -1, 16)
    with np.errstate(all="ignore"):
        bmax = np.abs(xb).max(axis=-1, keepdims=True)
        bs = bmax / f32(6)
        st = None
        if scope == "matrix":
            st = np.abs(x).max(axis=(-2, -1)).reshape(-1, 1, 1, 1) / f32(2688)
            st = np.where(st == 0, f32(1), st).astype(f32)
            bs = bs / st
        elif scope == "tensor":
            st = f32(np.abs(x).max()) / f32(2688)
            bs = bs / st
        bs = np.minimum(bs, f32(448))
        if scale_floor == "normal":
            bs = np.maximum(bs, f32(2.0**-6))
        bs = bs.astype(ml_dtypes.float8_e4m3fn).astype(f32)
        total = bs if st is None else (st * bs).astype(f32)
        if mode == "divide":
            xs = xb / np.where(total > 0, total, f32(1))
        else:
            b1 = np.where(bs > 0, bs, f32(1))
            inv = f32(1) / b1 if st is None else (f32(1) / st) / b1
            xs = xb * inv.astype(f32)
        q = np.clip(xs, -6, 6).astype(f32).astype(ml_dtypes.float4_e2m1fn).astype(f32)
        out = np.where(total > 0, q * total, xb * f32(0))
    return out.reshape(x.shape).astype(f32)


def midpoint_case(seed=0, M=3, R=8, C=64):
    """Each block: an anchor fixing its amax, the rest float32 neighbours of midpoint · total."""
    rng = np.random.default_rng(seed)
    x = np.zeros((M, R, C), f32)
    amax_t = np.exp2(rng.uniform(-20, 20, M)).astype(f32)
    for m in range(M):
        for r in range(R):
            for b in range(C // 16):
                bmax = f32(amax_t[m] * rng.uniform(0.05, 1.0))
                if r == 0 and b == 0:
                    bmax = amax_t[m]  # the matrix amax
                st = f32(amax_t[m]) / f32(2688)
                bs = f32(min(f32(f32(bmax / f32(6)) / st), f32(448)))
                bs = f32(np.array(bs).astype(ml_dtypes.float8_e4m3fn).astype(f32))
                total = f32(st * bs)
                mids = rng.choice(MIDPOINTS, 15) * total * rng.choice([-1, 1], 15)
                k = rng.integers(-3, 4, 15)
                vals = mids.astype(f32)
                for i in range(15):  # step k ulps away from the midpoint
                    for _ in range(abs(int(k[i]))):
                        vals[i] = np.nextafter(vals[i], f32(np.inf) if k[i] > 0 else f32(-np.inf))
                vals = np.clip(vals, -bmax, bmax)
                x[m, r, 16 * b] = bmax * rng.choice([-1, 1])
                x[m, r, 16 * b + 1:16 * (b + 1)] = vals
    return x


def same_bits(a, b):
    a = a.numpy() if isinstance(a, torch.Tensor) else a
    b = b.numpy() if isinstance(b, torch.Tensor) else b
    return np.array_equal(a.view(np.int32), b.view(np.int32))


def test_the_documented_example_rounds_differently():
    # s_t = 2688 / 2688 = 1; a block with amax 21 has bs = 3.5 (exact in E4M3); x = 12.249999
    # (the float32 below 12.25): x / 3.5 = 3.4999998 -> 3, x * float32(1/3.5) = 3.5 -> 4 (tie,
    # even), so the outputs are 10.5 (divide) and 14.0 (reciprocal)
    x = np.zeros((1, 1, 32), f32)
    x[0, 0, 0] = 2688.0
    x[0, 0, 16] = 21.0
    x[0, 0, 17] = np.nextafter(f32(12.25), f32(0))
    d = pf.quantize(x, "nvfp4", scale_mode="divide")
    r = pf.quantize(x, "nvfp4", scale_mode="reciprocal")
    assert (d[0, 0, 17], r[0, 0, 17]) == (10.5, 14.0)
    assert same_bits(d, ref(x, "divide")) and same_bits(r, ref(x, "reciprocal"))


@pytest.mark.parametrize("scope", ["matrix", "none"])
@pytest.mark.parametrize("floor", ["subnormal", "normal"])
@pytest.mark.parametrize("mode", pf.SCALE_MODES)
def test_both_modes_match_their_definition_on_midpoints(mode, floor, scope):
    x = midpoint_case(seed=1)
    want = ref(x, mode, floor, scope)
    assert same_bits(pf.quantize(x, "nvfp4", scale_floor=floor, tensor_scope=scope,
                                 scale_mode=mode), want)
    got_t = pf.quantize(torch.from_numpy(x), "nvfp4", scale_floor=floor, tensor_scope=scope,
                        scale_mode=mode)
    assert same_bits(got_t, want)


def test_midpoint_case_separates_the_modes():
    x = midpoint_case(seed=2)
    d = pf.quantize(x, "nvfp4", scale_mode="divide")
    r = pf.quantize(x, "nvfp4", scale_mode="reciprocal")
    n = int((d != r).sum())
    assert n >= 30, n  # the construction hits many midpoints where the two differ
    assert same_bits(pf.quantize(x, "nvfp4"), r)  # reciprocal is the default


def test_float64_input_uses_a_float32_factor():
    x = midpoint_case(seed=3).astype(np.float64)
    got = pf.quantize(x, "nvfp4")
    gt = pf.quantize(torch.from_numpy(x), "nvfp4").numpy()
    assert np.array_equal(got.view(np.int64), gt.view(np.int64))
    assert not np.array_equal(got, pf.quantize(x, "nvfp4", scale_mode="divide"))


def test_sr_rounds_the_scaled_value_of_the_mode():
    """SR picks one of the two E2M1 neighbours of the mode's scaled value (x/total or x*r)."""
    x = midpoint_case(seed=4)
    grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
    for mode in pf.SCALE_MODES:
        a = pf.quantize(x, "nvfp4", "sr", seed=5, scale_mode=mode)
        assert same_bits(a, pf.quantize(torch.from_numpy(x), "nvfp4", "sr", seed=5,
                                        scale_mode=mode))
        total, xs = ref_total_scaled(x, mode)
        ax = np.minimum(np.abs(xs), 6.0)
        i = np.searchsorted(grid, ax, side="right") - 1
        lo, hi = grid[i], grid[np.minimum(i + 1, 7)]
        t32 = total.astype(f32)
        lo, hi = lo.astype(f32) * t32, hi.astype(f32) * t32  # outputs are q * total in float32
        assert np.all((np.abs(a) == lo) | (np.abs(a) == hi))
        assert np.any(lo != hi)


def ref_total_scaled(x, mode):
    """(total, scaled elements) of the NVFP4 matrix-scope definition (float32)."""
    xb = x.reshape(*x.shape[:-1], -1, 16)
    st = np.abs(x).max(axis=(-2, -1)).reshape(-1, 1, 1, 1) / f32(2688)
    bs = np.minimum((np.abs(xb).max(axis=-1, keepdims=True) / f32(6)) / st, f32(448))
    bs = bs.astype(ml_dtypes.float8_e4m3fn).astype(f32)
    total = st * bs
    xs = xb / total if mode == "divide" else xb * ((f32(1) / st) / bs)
    return (np.broadcast_to(total, xb.shape).reshape(x.shape).astype(np.float64),
            xs.reshape(x.shape))


def test_bad_scale_mode_is_one_line():
    with pytest.raises(pf.FormatError, match=r"scale_mode='mul' is unknown; allowed: "
                                             r"reciprocal, divide"):
        pf.quantize(np.zeros((1, 16), f32), "nvfp4", scale_mode="mul")
    with pytest.raises(pf.FormatError, match="not accepted by format 'mxfp4'"):
        pf.quantize(np.zeros((1, 32), f32), "mxfp4", scale_mode="divide")


def test_config_key_validated_and_passed_through():
    from precsim.config import to_config
    from precsim.errors import PrecsimError
    from precsim.schemes import format_options

    base = {"schemes": {"a": {"kind": "conventional", "fmt": "nvfp4"}},
            "model": {"state_dim": 32, "head_dim": 8, "heads": 1}}
    cfg = to_config(base)
    assert cfg.formats.nvfp4_scale == "reciprocal"
    assert format_options(cfg)["scale_mode"] == "reciprocal"
    cfg = to_config({**base, "formats": {"nvfp4_scale": "divide"}})
    assert format_options(cfg)["scale_mode"] == "divide"
    with pytest.raises(PrecsimError, match=r"formats.nvfp4_scale='div' is unknown; allowed: "
                                           r"reciprocal, divide"):
        to_config({**base, "formats": {"nvfp4_scale": "div"}})


def test_matches_torchao_when_installed():
    x = torch.from_numpy(midpoint_case(seed=6, M=1, R=8, C=64)[0].copy())
    differs = 0
    for scope in ("tensor", "none"):
        want = torchao_nvfp4(x, scope)
        got = pf.quantize(x, "nvfp4", scale_floor="normal", tensor_scope=scope)
        assert same_bits(got, want), scope
        div = pf.quantize(x, "nvfp4", scale_floor="normal", tensor_scope=scope,
                          scale_mode="divide")
        differs += int((div != want).sum())
    assert differs > 0  # torchao multiplies by the reciprocal: divide disagrees here
