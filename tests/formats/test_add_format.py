"""Adding a number format is one registry entry (docs/design.md, "Adding a format").

A fresh process registers OCP's FP6 E3M2 (the MX FP6 element: 1 sign, 3 exponent, 2 mantissa
bits, bias 3, no Inf or NaN, largest value 28) with one ``formats.register`` call and nothing
else, then quantises with it and runs it on every engine this machine has: the NumPy and torch
quantisers and engines, the numba quantiser and engine, and the Triton kernels (on the CPU in
Triton's interpreter, tiny sizes). The kernels' ids, classes and limits come from
``precsim.formats.ids``, read off the registry, so no kernel or engine is edited for it.

References that share none of precsim's code: ml_dtypes' ``float6_e3m2fn`` cast (RNE) for the
quantisers, and a hand-written float32 loop whose state is rounded by that cast after every
update for a conventional FP6 scheme (as ``tests/engines/test_reference.py`` does for NVFP4).
A fresh process, because the kernels compile the table they see when they are imported (a
format registered later in a process that already imported them is not theirs; in a real
addition the entry sits in ``formats/core.py``'s ``REGISTRY``, present at every import).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("ml_dtypes")

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(r'''
    import importlib.util
    import ml_dtypes
    import numpy as np
    import torch

    from precsim import formats as pf

    # the one place: a registry entry (in a real addition, a line of formats/core.py's REGISTRY)
    pf.register(pf.FloatFormat("fp6_e3m2", 3, 2, 3, 28.0, False, False,
                               description="OCP FP6 E3M2 (MX element): no Inf, no NaN"))

    from precsim.config import to_config
    from precsim.engines import numba as ne
    from precsim.engines.numpy import run as run_numpy
    from precsim.engines.torch import run as run_torch
    from precsim.formats import ids
    from precsim.workload import make_workload

    f32 = np.float32
    FMT = "fp6_e3m2"

    def fp6(x):
        """The reference: ml_dtypes' RNE cast, after the satfinite clamp."""
        return np.clip(x, f32(-28), f32(28)).astype(ml_dtypes.float6_e3m2fn).astype(f32)

    def same(a, b, what):
        a, b = np.asarray(a, f32), np.asarray(b, f32)
        assert np.array_equal(np.isnan(a), np.isnan(b)), what
        assert np.array_equal(np.nan_to_num(a).view(np.int32),
                              np.nan_to_num(b).view(np.int32)), what

    fid = ids.fmt_id(FMT)
    assert ids.id_class(fid) == ids.FLOAT and ids.limits_table()[fid].tolist() == [2, -2, 28, 0, 0]
    print("id", fid)

    # quantisers: finite values of every binade fp6 has, and beyond
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((4, 16, 32)) * np.logspace(-5, 2, 32)).astype(f32)
    x[0, 0, :16] = 0.0
    x[1, 1, 3] = -1e6
    want = fp6(x)
    same(pf.quantize(x, FMT), want, "numpy")
    same(pf.quantize(torch.from_numpy(x), FMT).numpy(), want, "torch")
    sr = pf.quantize(x, FMT, "sr", seed=5, stream=3)
    same(pf.quantize(torch.from_numpy(x), FMT, "sr", seed=5, stream=3).numpy(), sr, "torch sr")
    assert (np.abs(sr) <= 28).all() and (sr != want).any()
    checked = ["numpy", "torch"]
    if ne.available():
        same(ne.quantize(x, FMT), want, "numba")
        same(ne.quantize(x, FMT, "sr", seed=5, stream=3), sr, "numba sr")
        same(ne.quantize(x, f"{FMT}_b32", "sr", seed=5, stream=3),
             pf.quantize(x, f"{FMT}_b32", "sr", seed=5, stream=3), "numba row-scaled sr")
        checked.append("numba")
    from precsim.kernels import available as triton_available
    if importlib.util.find_spec("triton") and triton_available("cuda" if torch.cuda.is_available()
                                                               else "cpu"):
        from precsim.kernels.quant import quantize_tiles

        dev = "cuda" if torch.cuda.is_available() else "cpu"
        xt = torch.from_numpy(x[:2]).to(dev)
        same(quantize_tiles(xt, FMT).cpu().numpy(), want[:2], "triton")
        same(quantize_tiles(xt, FMT, "sr", seed=5, stream=3).cpu().numpy(), sr[:2], "triton sr")
        checked.append("triton")
    print("quantisers", " ".join(checked))

    # engines: conventional FP6 (RNE) against a float32 loop rounded by ml_dtypes; SR, a split
    # read copy and the row-scaled FP6 across the engines
    def cfg_of(schemes, steps, P=8, N=32):
        return to_config({
            "model": {"family": "mamba2", "name": "mamba2", "heads": 2, "head_dim": P,
                      "state_dim": N},
            "workload": {"kind": "seed_article"}, "schemes": schemes,
            "run": {"steps": steps, "progress": False, "seqs": 1},
            "metrics": {"window": 16, "vocab": 64, "kl": False}})

    def loop(cfg):
        T, W = cfg.run.steps, cfg.metrics.window
        tr = make_workload(cfg).trace(0, T)
        H, P, N = tr["x"].shape[1], tr["x"].shape[2], tr["B"].shape[2]
        S64, S32 = np.zeros((H, P, N)), np.zeros((H, P, N), f32)
        err, drift = np.empty(T), []
        for t in range(T):
            dt, xx, B, C = tr["dt"][t], tr["x"][t], tr["B"][t], tr["C"][t]
            a = np.exp(dt * tr["A"])
            S64 = a[:, None, None] * S64 + (dt[:, None] * xx)[:, :, None] * B[:, None, :]
            S32 = a.astype(f32)[:, None, None] * S32 + (
                (dt.astype(f32)[:, None] * xx.astype(f32))[:, :, None] * B.astype(f32)[:, None, :])
            y64, y32 = (S64 * C[:, None, :]).sum(-1), (S32 * C.astype(f32)[:, None, :]).sum(-1)
            err[t] = np.linalg.norm(y32 - y64) / np.linalg.norm(y64)
            S32 = fp6(S32)
            if (t + 1) % W == 0:
                drift.append(np.linalg.norm(S32 - S64) / np.linalg.norm(S64))
        return err.reshape(-1, W).mean(axis=1), np.array(drift)

    def col(res, scheme, key):
        return np.array([r[key] for r in res.rows if r["scheme"] == scheme])

    schemes = {"fp6": {"kind": "conventional", "fmt": FMT},
               "fp6_sr": {"kind": "conventional", "fmt": FMT, "rounding": "sr"},
               "split": {"kind": "split", "fmt": "fp32", "read_fmt": FMT},
               "rows": {"kind": "conventional", "fmt": f"{FMT}_b32", "rounding": "sr"}}
    cfg = cfg_of(schemes, 64)
    err, drift = loop(cfg)
    assert 1e-3 < err.min() and err.max() < 1  # FP6-sized errors, not float32 noise
    runs = {"numpy": run_numpy(cfg, progress=False), "torch": run_torch(cfg, "cpu", progress=False)}
    if ne.available():
        from precsim.engines.numba_host import run as run_numba

        runs["numba"] = run_numba(cfg, "cpu", progress=False)
    for name, res in runs.items():
        np.testing.assert_allclose(col(res, "fp6", "rel_err"), err, rtol=1e-6, err_msg=name)
        np.testing.assert_allclose(col(res, "fp6", "state_drift"), drift, rtol=1e-12,
                                   err_msg=name)
        for s in schemes:  # (a window of float32 noise, a split scheme's before its first
            # flush, only roughly: the outputs' summation order alone moves it)
            got, ref = col(res, s, "rel_err"), col(runs["torch"], s, "rel_err")
            tol = np.where(ref < 1e-5, 0.5, 1e-5) * ref
            assert (np.abs(got - ref) <= tol).all(), (name, s, got, ref)
    if "triton" in checked:
        from precsim.engines.triton import run as run_triton

        tcfg = cfg_of(schemes, 32, P=16, N=32)
        tri, ref = run_triton(tcfg, dev, progress=False), run_torch(tcfg, "cpu", progress=False)
        for s in schemes:
            got, want = col(tri, s, "rel_err"), col(ref, s, "rel_err")
            tol = np.where(want < 1e-5, 0.5, 1e-3) * want
            assert (np.abs(got - want) <= tol).all(), ("triton", s, got, want)
        runs["triton"] = tri
    print("engines", " ".join(runs))
''')


def test_a_format_registered_in_one_place_runs_on_every_engine():
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if "TRITON_INTERPRET" not in env:
        import torch

        if not torch.cuda.is_available():
            env["TRITON_INTERPRET"] = "1"
    p = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert "quantisers numpy torch" in out and "engines numpy torch" in out, out


def test_ids_are_read_off_the_registry():
    """The kernel ids, classes and limits ``formats.ids`` derives are the ones the kernels were
    written with (ids in registry order; row-scaled = 16 + the element's id; the numba code adds
    32 x the block), and the scheme kinds are the schemes'."""
    import numpy as np
    from precsim.formats import ids

    from precsim import schemes

    assert ids.fmt_ids() == {"fp64": 0, "fp32": 0, "bf16": 1, "fp16": 2, "fp8_e4m3": 3,
                             "fp8_e5m2": 4, "fp4_e2m1": 5, "nvfp4": 6, "mxfp4": 7, "mxfp8": 8,
                             "int8": 9, "int16": 10}
    assert [ids.id_class(i) for i in range(11)] == [ids.NONE] + [ids.FLOAT] * 5 + [
        ids.TWO_LEVEL, ids.MX, ids.MX, ids.INT, ids.INT]
    assert ids.fmt_id("int8_b128") == 25 and ids.fmt_code("int8_b128") == 25 + 32 * 128
    assert ids.split_code(ids.fmt_code("fp8_e4m3_b16")) == (19, 16)
    assert ids.id_class(19) == ids.ROW and ids.element_id(19) == 3 and ids.is_block(19)
    lim = ids.limits_table()
    np.testing.assert_array_equal(lim[[1, 2, 3, 4, 5, 9, 10], :4], [
        [7, -126, 3.3895313892515355e38, 1], [10, -14, 65504.0, 1], [3, -6, 448.0, 0],
        [2, -14, 57344.0, 1], [1, 0, 6.0, 0], [0, 0, 127.0, 0], [0, 0, 32767.0, 0]])
    assert lim[:, 4].tolist() == [0] * 9 + [1, 1]
    assert ids.block_params(6) == {"element": 5, "block": 16, "element_max": 6.0, "scale": 3,
                                   "scale_max": 448.0, "scale_min_normal": 0.015625,
                                   "tensor_max": 2688.0}
    assert ids.block_params(7)["emax"] == 2 and ids.block_params(8)["emax"] == 8
    assert not ids.covered("e8m0")
    assert ids.SCHEME_KINDS == tuple(schemes.SCHEMES)
