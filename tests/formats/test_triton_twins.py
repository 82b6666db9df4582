"""Triton twins (``kernels/quant.py``) of the new formats and options, bit for bit against
``precsim.formats`` on small tiles (CPU tensors run in Triton's interpreter)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("triton")  # on the CPU the kernels run in the interpreter (tests/conftest.py)

from precsim.kernels.quant import quantize_tiles  # noqa: E402

from precsim import formats as pf  # noqa: E402

CASES = [("nvfp4", {"scale_mode": "reciprocal"}), ("nvfp4", {"scale_mode": "divide"}),
         ("nvfp4", {"scale_mode": "reciprocal", "tensor_scope": "none"}),
         ("nvfp4", {"scale_mode": "reciprocal", "scale_floor": "normal"}),
         ("int8", {}), ("int16", {}), ("int8", {"overflow": "ieee"}),
         ("int8_b16", {}), ("int8_b64", {}), ("int16_b32", {}), ("fp8_e4m3_b16", {}),
         ("fp8_e5m2_b32", {}), ("fp16_b64", {}), ("fp4_e2m1_b16", {})]


def tile_input(name, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 4, 64)) * np.exp2(rng.integers(-20, 20, (2, 4, 1)))
    if pf.get(name).kind == "int":
        x = rng.uniform(-140, 140, (2, 4, 64))
        x[0, 0, :8] = [0.5, 1.5, 2.5, -2.5, 127.5, -127.5, 126.5, np.nan]
    x[1, 2, :] = 0.0  # an all-zero row
    x[1, 3, 5] = 1e4 * np.abs(x[1, 3]).max()  # an outlier
    if name == "nvfp4":  # matrix 0: s_t = 1, blocks with bs = 3.5 and x/bs an ulp below 3.5
        x[0] = 0.0
        x[0, 0, 0] = 2688.0
        x[0, 1:] = np.tile([21.0] + [np.nextafter(np.float32(12.25), 0)] * 15, 4)
    return torch.from_numpy(x.astype(np.float32))


@pytest.mark.parametrize("rounding", ["rne", "sr"])
@pytest.mark.parametrize("name,opts", CASES, ids=["-".join([n, *o.values()]) for n, o in CASES])
def test_twin_bit_exact(name, opts, rounding):
    x = tile_input(name)
    want = pf.quantize(x, name, rounding, seed=9, stream=77, **opts)
    got = quantize_tiles(x, name, rounding, seed=9, stream=77, **opts)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (name, opts, rounding)


@pytest.mark.parametrize("source", ["philox5", "philox7", "philox10"])
@pytest.mark.parametrize("name", ["nvfp4", "fp16", "int8", "int8_b16"])
def test_twin_philox_sr_bit_exact(name, source):
    """Philox SR in the kernel (tl.umulhi) draws the same words as NumPy/torch."""
    x = tile_input(name, seed=1)
    want = pf.quantize(x, name, "sr", seed=4, stream=2**40 + 3, sr_source=source)
    got = quantize_tiles(x, name, "sr", seed=4, stream=2**40 + 3, sr_source=source)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (name, source)


def test_scale_modes_differ_in_the_kernel_too():
    x = tile_input("nvfp4")
    a = quantize_tiles(x, "nvfp4", scale_mode="reciprocal")
    b = quantize_tiles(x, "nvfp4", scale_mode="divide")
    assert (a != b).any()


@pytest.mark.parametrize("row", [False, True])
def test_engine_runs_int_and_row_scaled_formats(row):
    """int8/int16 (ids 9, 10) and row-scaled formats (16 + element id) fit the Triton engine's
    slot codes: the engine matches the torch engine window by window."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from conftest import tiny_cfg

    from precsim.config import to_config
    from precsim.engines.torch import run as run_torch
    from precsim.engines.triton import run as run_triton
    from precsim.engines.triton import unsupported_reason

    schemes = {"conv_int8": {"kind": "conventional", "fmt": "int8", "rounding": "sr"},
               "split_int16": {"kind": "split", "fmt": "int16", "read_fmt": "int8"}}
    if row:
        schemes = {"conv_int8_b32": {"kind": "conventional", "fmt": "int8_b32", "rounding": "sr"},
                   "conv_fp8_b32": {"kind": "conventional", "fmt": "fp8_e4m3_b32"},
                   "split_fp16_int8_b32": {"kind": "split", "fmt": "fp16", "rounding": "sr",
                                           "read_fmt": "int8_b32"}}
    d = tiny_cfg("mamba2", steps=24, heads=1, schemes=schemes, metrics__window=16)
    d["model"].update(head_dim=16, state_dim=32)
    cfg = to_config(d)
    assert unsupported_reason(cfg) is None
    tri = run_triton(cfg, "cpu", progress=False)
    ref = run_torch(cfg, "cpu", progress=False)
    assert tri.engine == "triton"
    for r, s in zip(tri.rows, ref.rows, strict=True):
        assert r["scheme"] == s["scheme"]
        # a replay scheme before its first flush: float32 summation noise (< 1e-5) only
        tol = 0.5 if max(r["rel_err"], s["rel_err"]) < 1e-5 else 1e-3
        assert r["rel_err"] == pytest.approx(s["rel_err"], rel=tol)
        assert r["state_drift"] == pytest.approx(s["state_drift"], rel=1e-3)
