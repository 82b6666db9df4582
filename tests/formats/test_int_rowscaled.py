"""Integer element formats (int8, int16) and row-scaled formats ``<elem>_b<B>``.

References are written here: ties-to-even on integers by integer arithmetic, scales as
``float32(amax) / float32(element max)``, element casts of float formats through ml_dtypes.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import precsim.formats as pf
import pytest
import torch

f32 = np.float32


def rne_int(y, qmax):
    """Round half to even on |y| <= qmax, written with floor and parity (no np.rint)."""
    a = np.minimum(np.abs(y.astype(np.float64)), qmax)
    lo = np.floor(a)
    d = a - lo
    up = (d > 0.5) | ((d == 0.5) & (lo % 2 == 1))
    return np.copysign(lo + up, y)


def same_bits(a, b):
    a = a.numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
    b = b.numpy() if isinstance(b, torch.Tensor) else np.asarray(b)
    it = np.int64 if a.dtype == np.float64 else np.int32
    return a.dtype == b.dtype and np.array_equal(a.view(it), b.view(it))


@pytest.mark.parametrize("name,qmax", [("int8", 127), ("int16", 32767)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_value_midpoint_and_neighbour(name, qmax, dtype):
    k = np.arange(-qmax, qmax + 1, dtype=dtype)
    mids = k[:-1] + dtype(0.5)
    x = np.concatenate([k, mids, np.nextafter(mids, dtype(np.inf)),
                        np.nextafter(mids, dtype(-np.inf))])
    want = rne_int(x, qmax).astype(dtype)
    assert same_bits(pf.quantize(x, name), want)
    assert same_bits(pf.quantize(torch.from_numpy(x), name), torch.from_numpy(want))
    assert pf.quantize(np.array([2.5, 3.5, -2.5, -0.5], dtype), name).tolist() == [2, 4, -2, -0.0]


def test_saturation_nan_and_overflow_modes():
    x = np.array([127.4, 127.5, 128.0, 1e30, -np.inf, np.inf, np.nan, -0.0], f32)
    got = pf.quantize(x, "int8")
    assert got[:6].tolist() == [127, 127, 127, 127, -127, 127]
    assert np.isnan(got[6]) and np.signbit(got[7])
    ieee = pf.quantize(x, "int8", overflow="ieee")
    assert ieee[0] == 127 and np.isnan(ieee[1:7]).all()  # 127.5 ties to 128: out of range
    sr = pf.quantize(np.full(4096, 126.75, f32), "int8", "sr", seed=1, overflow="ieee")
    assert set(np.unique(sr).tolist()) == {126.0, 127.0}
    sr = pf.quantize(np.full(4096, 127.25, f32), "int8", "sr", seed=1, overflow="ieee")
    assert np.isnan(sr).any() and (sr == 127).any()
    assert pf.get("int8").bits_per_element == 8 and pf.get("int16").bits_per_element == 16


@pytest.mark.parametrize("name", ["int8", "int8_b16"])
def test_sr_is_unbiased(name):
    n = 100_000
    if name == "int8":
        x = np.full(n, f32(3.3), f32)
        gap = 1.0
    else:  # every row: an anchor setting scale = 127/127 = 1, then 15 copies of 3.3
        rows = -(-n // 15)
        x = np.full((rows, 16), f32(3.3), f32)
        x[:, 0] = 127.0
        gap = 1.0
    out = pf.quantize(x, name, "sr", seed=11)
    v = out[..., 1:] if name != "int8" else out
    frac = float(f32(3.3)) - 3.0
    se = gap * math.sqrt(frac * (1 - frac) / v.size)
    assert set(np.unique(v).tolist()) == {3.0, 4.0}
    assert abs(float(v.astype(np.float64).mean()) - float(f32(3.3))) < 4 * se


def ref_scaled(x, el, block):
    """Row-scaled definition: scale = float32(block amax) / float32(element max) (float32)."""
    dt = x.dtype
    xb = x.reshape(*x.shape[:-1], -1, block)
    fmt = pf.get(el)
    with np.errstate(all="ignore"):
        s = np.abs(xb).max(axis=-1, keepdims=True).astype(f32) / f32(fmt.max_value)
        s = np.where(np.isfinite(s), s, np.nan).astype(dt)
        y = np.clip(xb / np.where(s > 0, s, 1), -fmt.max_value, fmt.max_value)
        if fmt.kind == "int":
            q = rne_int(y, fmt.qmax)
        else:
            q = y.astype(f32).astype(getattr(ml_dtypes, {"fp8_e4m3": "float8_e4m3fn",
                                                          "fp8_e5m2": "float8_e5m2"}[el]))
        q = q.astype(dt)
        out = np.where(s > 0, q * s, xb * 0)
    return out.reshape(x.shape).astype(dt), q.reshape(x.shape), s


def octave_rows(dtype, rows=64, cols=64, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)) * np.exp2(rng.integers(-60, 60, (rows, 1)))
    x[3] = 0.0  # an all-zero row
    x[4, :] = -0.0
    x[5, :] = 1e-3
    x[5, 7] = 1e6  # a single outlier
    return x.astype(dtype)


@pytest.mark.parametrize("el", ["int8", "int16"])
@pytest.mark.parametrize("block", [16, 64])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rowscaled_int_matches_definition(el, block, dtype):
    x = octave_rows(dtype)
    want, q, s = ref_scaled(x, el, block)
    name = f"{el}_b{block}"
    assert same_bits(pf.quantize(x, name), want)
    assert same_bits(pf.quantize(torch.from_numpy(x), name), want)
    assert np.all(want[3] == 0) and np.all(np.signbit(want[4]))
    # the outlier's row: the small values flush to zero, the max lands on ±element max
    qm = pf.get(el).qmax
    assert np.abs(q).max(axis=-1).max() == qm
    if block == 64:
        assert np.count_nonzero(want[5]) == 1 and q[5, 7] == qm


@pytest.mark.parametrize("el", ["fp8_e4m3", "fp8_e5m2"])
def test_rowscaled_fp8_matches_ml_dtypes(el):
    x = octave_rows(np.float32, seed=1)
    want, _, _ = ref_scaled(x, el, 32)
    assert same_bits(pf.quantize(x, f"{el}_b32"), want)
    assert same_bits(pf.quantize(torch.from_numpy(x), f"{el}_b32"), want)


@pytest.mark.parametrize("name", ["int8_b32", "int16_b16", "fp8_e4m3_b32", "fp16_b64"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rowscaled_sr_numpy_equals_torch(name, dtype):
    x = octave_rows(dtype, seed=2)
    a = pf.quantize(x, name, "sr", seed=3, stream=4)
    b = pf.quantize(torch.from_numpy(x), name, "sr", seed=3, stream=4)
    assert same_bits(a, b)
    rne = pf.quantize(x, name)
    assert not np.array_equal(a, rne)


def test_names_bits_and_errors():
    f = pf.get("int8_b32")
    assert isinstance(f, pf.ScaledFormat) and f is pf.get("INT8_b32")
    assert f.bits_per_element == 9.0 and pf.get("int16_b128").bits_per_element == 16.25
    assert pf.get("e4m3_b16").name == "fp8_e4m3_b16"
    with pytest.raises(pf.FormatError, match="multiple of the block size 48"):
        pf.quantize(np.zeros((2, 64), f32), "int8_b48")
    with pytest.raises(pf.FormatError, match="element format 'e8m0' cannot carry a row scale"):
        pf.get("e8m0_b16")
    for wide in ("bf16_b8", "fp32_b128", "float32_b16"):  # a max of ~3.4e38: the scale underflows
        with pytest.raises(pf.FormatError, match=r"cannot carry a row scale \(its row scale "
                                                 r"amax/3\.\d+e\+38 would be a subnormal FP32.*"
                                                 r"allowed: fp16, .*int16"):
            pf.get(wide)
    with pytest.raises(pf.FormatError, match="block size '0' is invalid"):
        pf.get("int8_b0")
    with pytest.raises(pf.FormatError, match="block size '016' is invalid"):
        pf.get("int8_b016")
    with pytest.raises(pf.FormatError, match="format='int8_bx' is unknown"):
        pf.get("int8_bx")


def test_cost_model_and_config_count_them():
    from precsim.config import to_config
    from precsim.cost import state_bytes
    from precsim.errors import PrecsimError

    assert state_bytes("int8_b64", 64, 128) == 64 * 128 * 8.5 / 8
    assert state_bytes("int8", 64, 128) == 64 * 128
    base = {"model": {"state_dim": 32, "head_dim": 8, "heads": 1}}
    to_config({**base, "schemes": {"a": {"kind": "conventional", "fmt": "int8_b32"}}})
    with pytest.raises(PrecsimError, match="model.state_dim=32 is invalid; allowed: a multiple "
                                           "of 48"):
        to_config({**base, "schemes": {"a": {"kind": "conventional", "fmt": "int8_b48"}}})
    with pytest.raises(PrecsimError, match=r"schemes.a.fmt='int8_bq' is an unknown format; "
                                           r"allowed: .*, or <element>_b<block size>"):
        to_config({**base, "schemes": {"a": {"kind": "conventional", "fmt": "int8_bq"}}})
    with pytest.raises(PrecsimError, match=r"schemes.a.fmt='bf16_b32': element format 'bf16' "
                                           r"cannot carry a row scale \(.*allowed: fp16, "):
        to_config({**base, "schemes": {"a": {"kind": "conventional", "fmt": "bf16_b32"}}})


@pytest.mark.parametrize("el", ["int8", "int16", "fp8_e4m3", "fp8_e5m2", "fp16", "fp4_e2m1"])
def test_every_row_scalable_element_keeps_a_rows_largest_value_at_small_magnitudes(el):
    """docs/formats.md: a row's largest value comes back as ``element_max * scale``, within an
    ulp of float32, at any magnitude a state reaches (rows of 1e-3 down to 1e-24: the FP32
    scale ``amax / element_max`` stays a normal number; with bf16 or fp32 elements it did not)."""
    rng = np.random.default_rng(7)
    base = rng.standard_normal((6, 64)).astype(f32)
    for mag in (1e-3, 1e-8, 1e-16, 1e-24):
        x = (base * f32(mag)).astype(f32)
        q = pf.quantize(x, f"{el}_b64")
        i = np.argmax(np.abs(x), axis=1)
        want, got = x[np.arange(6), i], q[np.arange(6), i]
        np.testing.assert_allclose(got, want, rtol=2.0**-22, err_msg=f"{el}_b64 at {mag:g}")
