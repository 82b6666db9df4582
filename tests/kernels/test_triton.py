"""The Triton engine (precsim.kernels) against precsim.formats, the torch engine and the oracle.

Without CUDA the kernels run in Triton's CPU interpreter (``TRITON_INTERPRET=1``, set by
tests/conftest.py before Triton is imported), so sizes stay tiny. Skipped cleanly when Triton
is not importable.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

pytest.importorskip("triton")  # on the CPU the kernels run in the interpreter (tests/conftest.py)

from conftest import SEED_TABLE, tiny_cfg  # noqa: E402
from precsim.kernels import available  # noqa: E402
from precsim.kernels.quant import quantize_tiles  # noqa: E402
from precsim.kernels.rng import event_keys  # noqa: E402

from precsim import formats as pf  # noqa: E402
from precsim.config import to_config  # noqa: E402
from precsim.engines.torch import run as run_torch  # noqa: E402
from precsim.engines.triton import (  # noqa: E402
    Diagnosis,  # noqa: E402
    launch_ends,
    unsupported_reason,
)
from precsim.engines.triton import run as run_triton  # noqa: E402
from precsim.oracle import decode  # noqa: E402
from precsim.workload import make_workload  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _quiet_numpy():
    with np.errstate(all="ignore"):  # the interpreter computes Inf/NaN cases in NumPy
        yield


def cfg_of(family, schemes, steps=32, heads=2, P=16, N=32, **over):
    d = tiny_cfg(family, steps=steps, heads=heads, schemes=schemes, metrics__window=16, **over)
    d["model"].update(head_dim=P, state_dim=N)
    d["workload"] = {"kind": "seed_article" if family == "mamba2" else "synthetic",
                     **d.get("workload", {})}
    return to_config(d)


def rel_err_by_scheme(res):
    out: dict[str, list] = {}
    for r in res.rows:
        out.setdefault(r["scheme"], []).append(r["rel_err"])
    return {k: np.array(v) for k, v in out.items()}


def assert_rows_match(cfg, tri, ref, tol_fp32=0.5, tol=1e-3):
    """Per-window rel_err of every scheme within 1e-3 relative. Windows whose error is float32
    rounding noise (< 1e-5: fp32 schemes, a replay scheme before its first flush) only within
    ``tol_fp32``: summation order alone moves such an error."""
    a, b = rel_err_by_scheme(tri), rel_err_by_scheme(ref)
    assert a.keys() == b.keys()
    for name in cfg.schemes:
        rel = np.abs(a[name] / b[name] - 1)
        lim = np.where(np.maximum(a[name], b[name]) < 1e-5, tol_fp32, tol)
        assert (rel <= lim).all(), (name, a[name], b[name])


def test_event_keys_match_formats():
    ev = np.array([0, 1, 7, 4096, 2**31 + 5])
    k0, k1 = event_keys(123, "shared_nvfp4_sr", ev, 0)
    import zlib

    for e, k in zip(ev, k1, strict=True):
        want = pf.stream_keys(123, pf.stream_id(zlib.crc32(b"shared_nvfp4_sr"), int(e), 0))
        assert (k0, int(k)) == want


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "nvfp4",
                                 "mxfp4", "mxfp8"])
@pytest.mark.parametrize("rounding", ["rne", "sr"])
def test_quantize_bit_exact(fmt, rounding):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 4, 64, generator=g) * torch.logspace(-9, 4, 64)
    x[0, 0, :32] = 0.0
    x[0, 1, 3], x[1, 2, 40], x[1, 3, 7] = 1e-42, 3e38, -7e4
    x[1, 0, 2], x[1, 1, 9] = float("inf"), float("nan")
    x = x.to(DEV)
    for opts in ({}, {"sr_bits": 5}) + (({"scale_floor": "normal"}, {"tensor_scope": "none"})
                                        if fmt == "nvfp4" else ()):
        # reference: the NumPy path, the definition (formats' own tests tie torch-CPU to it)
        ref = torch.from_numpy(pf.quantize(x.cpu().numpy(), fmt, rounding, seed=9, stream=77,
                                           **opts))
        got = quantize_tiles(x, fmt, rounding, seed=9, stream=77, **opts).cpu()
        assert torch.equal(ref.isnan(), got.isnan()), opts
        assert torch.equal(ref.nan_to_num().view(torch.int32),
                           got.nan_to_num().view(torch.int32)), opts


def test_mamba2_matches_torch_engine_and_oracle():
    cfg = cfg_of("mamba2", {**SEED_TABLE, "conventional_fp16": {"kind": "conventional",
                                                                "fmt": "fp16"},
                            "shared_e4m3": {"kind": "shared", "fmt": "fp8_e4m3"}},
                 heads=1)
    tri = run_triton(cfg, DEV, progress=False, record_outputs=["truth"])
    ref = run_torch(cfg, DEV, progress=False)
    assert tri.engine == "triton" and "triton_fallback" not in tri.info
    assert_rows_match(cfg, tri, ref)
    y = decode(make_workload(cfg).trace(0, cfg.run.steps))
    np.testing.assert_allclose(tri.info["outputs"]["truth"][:, 0], y, rtol=0,
                               atol=1e-12 * np.abs(y).max())
    for r, s in zip(tri.rows, ref.rows, strict=True):  # drift and KL follow the same schedule
        assert r["step"] == s["step"] and r["scheme"] == s["scheme"]
        if "fp32" not in r["scheme"]:
            assert r["state_drift"] == pytest.approx(s["state_drift"], rel=1e-3)
            assert r["kl"] == pytest.approx(s["kl"], rel=2e-3)


@pytest.mark.parametrize("u_source", ["read", "master"])
def test_gdn_matches_torch_engine_and_oracle(u_source):
    sch = {k: SEED_TABLE[k] for k in ("conventional_fp32", "shared_nvfp4_sr",
                                      "split_fp16sr_nvfp4")}
    sch["conventional_bf16"] = {"kind": "conventional", "fmt": "bf16"}
    cfg = cfg_of("gdn", sch, steps=24, heads=1, replay__gdn_u_source=u_source,
                 replay__buffer_len=8)
    tri = run_triton(cfg, DEV, progress=False, record_outputs=["truth"])
    ref = run_torch(cfg, DEV, progress=False)
    assert_rows_match(cfg, tri, ref)
    y = decode(make_workload(cfg).trace(0, cfg.run.steps))
    np.testing.assert_allclose(tri.info["outputs"]["truth"][:, 0], y, rtol=0,
                               atol=1e-12 * np.abs(y).max())


def test_mx_formats_bf16_buffer_partial_segment():
    sch = {"conventional_mxfp8": {"kind": "conventional", "fmt": "mxfp8"},
           "split_fp32_mxfp4": {"kind": "split", "fmt": "fp32", "read_fmt": "mxfp4"},
           "shared_e5m2_sr": {"kind": "shared", "fmt": "fp8_e5m2", "rounding": "sr"},
           "shared_nvfp4": {"kind": "shared", "fmt": "nvfp4"}}
    # 28 steps with L = 8: windows end at flushes 16, 32->28 (a partial last segment)
    cfg = cfg_of("mamba2", sch, steps=28, heads=1, N=64, replay__buffer_dtype="bf16",
                 replay__buffer_len=8)
    tri = run_triton(cfg, DEV, progress=False, diagnosis=Diagnosis(lanes=False))
    ref = run_torch(cfg, DEV, progress=False)
    assert tri.info["launches"] == 2 * 2  # two windows x two launches (blocks 16 and 32)
    assert_rows_match(cfg, tri, ref)
    lanes = run_triton(cfg, DEV, progress=False)  # the truth, then each scheme on its own
    assert lanes.info["launches"] == 2 * 5
    assert_rows_match(cfg, lanes, ref)


def test_grouped_inputs_truth_matches_oracle():
    cfg = cfg_of("mamba2", {"conventional_fp32": SEED_TABLE["conventional_fp32"]}, steps=20,
                 heads=4, model__groups=2)
    tri = run_triton(cfg, DEV, progress=False, record_outputs=["truth"])
    y = decode(make_workload(cfg).trace(0, 20))
    np.testing.assert_allclose(tri.info["outputs"]["truth"][:, 0], y, rtol=0,
                               atol=1e-12 * np.abs(y).max())
    assert tri.rows[-1]["rel_err"] < 1e-5


def test_unsupported_settings_fall_back_to_torch():
    cfg = cfg_of("mamba2", {"s": SEED_TABLE["shared_nvfp4_sr"]}, formats__tensor_scope="tensor")
    assert "tensor_scope" in unsupported_reason(cfg)
    res = run_triton(cfg, DEV, progress=False)
    assert res.engine == "torch" and "tensor_scope" in res.info["triton_fallback"]
    cfg = cfg_of("mamba2", {"c": SEED_TABLE["conventional_fp32"]}, P=8)
    assert "power" in unsupported_reason(cfg)


def test_engine_selection_and_launch_windows():
    from precsim.engines import resolve_engine

    # kernels on a CPU tensor need the interpreter, CUDA or not
    assert available("cpu") == (os.environ.get("TRITON_INTERPRET") == "1")
    if available(DEV):
        assert resolve_engine("triton", DEV) == "triton"
    ends = np.minimum(np.arange(16, 113, 16), 100)  # no drafts: a flush every 16 steps
    assert launch_ends(ends, 32) == [32, 64, 96, 100]
    assert launch_ends(ends, 24) == [32, 48, 80, 96, 100]


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_drafts_match_torch_engine(family):
    """Speculative decoding (T = 3, a per-position profile, L = 8): the irregular segments'
    flushes, outputs within float32 reduction noise of the torch engine's at every step (the
    flush steps' outputs from the checkpoint, not the fold), the same dead step for a scheme that
    overflows at a flush (shared FP16, IEEE overflow)."""
    sch = {k: SEED_TABLE[k] for k in ("conventional_fp32", "shared_nvfp4_sr",
                                      "split_fp16sr_nvfp4")}
    sch["shared_fp16_ieee"] = {"kind": "shared", "fmt": "fp16", "overflow": "ieee"}
    cfg = cfg_of(family, sch, steps=40, heads=1, replay__drafts=3, replay__buffer_len=8,
                 replay__acceptance=[0.9, 0.7, 0.5])
    big = {"mamba2": "x", "gdn": "v"}[family]
    wl = make_workload(cfg)
    orig = type(wl).chunk

    def grow(self, t0, t1):  # inputs grow after step 24: the FP16 checkpoint overflows
        out = dict(orig(self, t0, t1))
        s = torch.where(torch.arange(t0, t1, device=out[big].device) >= 24, 1e6, 1.0)
        out[big] = out[big] * s.to(out[big].dtype).reshape(-1, *[1] * (out[big].ndim - 1))
        return out

    mp = pytest.MonkeyPatch()
    mp.setattr(type(wl), "chunk", grow)
    try:
        tri = run_triton(cfg, DEV, progress=False, record_outputs=True)
        ref = run_torch(cfg, DEV, progress=False, record_outputs=True)
    finally:
        mp.undo()
    assert tri.engine == "triton" and "triton_fallback" not in tri.info
    assert tri.info["flushes"] == ref.info["flushes"] > 40 // 8
    assert tri.schemes == ref.schemes and tri.schemes["shared_fp16_ieee"]["dead_at"] > 24
    for name in ["truth", *sch]:  # up to the dying step (the recorded outputs after it are
        # the torch engine's NaN from the next segment on, the kernels' own within the window)
        a, b = tri.info["outputs"][name], ref.info["outputs"][name]
        d = ref.schemes[name]["dead_at"] if name != "truth" else None
        a, b = a.reshape(b.shape)[:d], b[:d]
        live = np.isfinite(b)
        np.testing.assert_array_equal(np.isfinite(a), live)
        scale = np.abs(b[live]).max()
        assert np.abs(a[live] - b[live]).max() <= (1e-12 if name == "truth" else 1e-6) * scale


def test_trace_with_skip_and_a_dead_scheme(trace_file):
    """A trace with D (skip term) and a scheme that overflows to Inf: same dead_at, NaN rows and
    drift as the torch engine."""
    path, tr = trace_file("mamba2", T=40, H=1, P=16, N=32, with_D=True)
    tr["x"] *= 3e4
    np.savez(path, **tr)
    sch = {"conventional_fp32": SEED_TABLE["conventional_fp32"],
           "conventional_fp16_ieee": {"kind": "conventional", "fmt": "fp16",
                                      "overflow": "ieee"}}
    d = tiny_cfg("mamba2", steps=40, schemes=sch, metrics__window=16)
    d["workload"] = {"kind": "trace", "path": str(path)}
    tri = run_triton(to_config(d), DEV, progress=False, diagnosis=Diagnosis(poison=True))
    ref = run_torch(to_config(d), DEV, progress=False)
    assert tri.schemes["conventional_fp16_ieee"]["dead_at"] is not None
    assert tri.schemes == ref.schemes
    for r, s in zip(tri.rows, ref.rows, strict=True):
        for key in ("rel_err", "state_drift"):
            assert np.isnan(r[key]) == np.isnan(s[key]), (r, s)
            if not np.isnan(s[key]) and s[key] > 1e-5:
                assert r[key] == pytest.approx(s[key], rel=1e-3)
        for key in ("top1", "first_flip", "flipped"):  # a dead scheme disagrees (fused path)
            assert r[key] == s[key], (key, r, s)
    dead = tri.schemes["conventional_fp16_ieee"]["dead_at"]
    last = [r for r in tri.rows if r["scheme"] == "conventional_fp16_ieee"][-1]
    assert last["flipped"] == 1 and last["first_flip"] <= dead and last["top1"] < 1


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_fused_metrics_match_torch_ops(family):
    """The fused window metrics (kernels.metrics.row_stats / drift_partials) against the torch-ops
    path of DeviceAccumulator on the same kernel outputs: 2 sequences, a partial last window, a
    split scheme's read drift. Element formats: the metrics do not depend on the format, and the
    interpreter spends most of a run in block quantisation."""
    sch = {"conventional_bf16": {"kind": "conventional", "fmt": "bf16", "rounding": "sr"},
           "split_fp32_fp8": {"kind": "split", "fmt": "fp32", "read_fmt": "fp8_e4m3"}}
    d = tiny_cfg(family, steps=20, heads=1, schemes=sch, metrics__window=16)
    d["model"].update(head_dim=16, state_dim=32)
    d["workload"] = {"kind": "seed_article" if family == "mamba2" else "synthetic"}
    d["run"]["seqs"] = 2
    cfg = to_config(d)
    a = run_triton(cfg, DEV, progress=False, diagnosis=Diagnosis(fused_metrics=True))
    b = run_triton(cfg, DEV, progress=False, diagnosis=Diagnosis(fused_metrics=False))
    assert a.schemes == b.schemes
    for k in b.per_step_rel_err:
        np.testing.assert_allclose(a.per_step_rel_err[k], b.per_step_rel_err[k], rtol=1e-9)
    for r, s in zip(a.rows, b.rows, strict=True):
        assert (r["scheme"], r["step"]) == (s["scheme"], s["step"])
        for key, v in s.items():
            if isinstance(v, float) and not np.isnan(v):
                # KL: float64 noise on tiny values (normalisation summed in another order)
                tol = dict(rel=1e-2, abs=1e-15) if key.startswith("kl") else dict(rel=1e-9)
                assert r[key] == pytest.approx(v, **tol), (key, r, s)
            elif isinstance(v, float):
                assert np.isnan(r[key]), (key, r, s)


def test_dispatch_order_changes_nothing_but_the_order():
    """Costliest slots first (LPT): every slot still runs once, results are identical."""
    from precsim.kernels.codes import dispatch_order

    from precsim.engines.triton import scheme_code
    from precsim.schemes import build_schemes

    codes = [scheme_code(s.cfg) for s in build_schemes(cfg_of("mamba2", SEED_TABLE))]
    digits = [(dispatch_order(True, codes) >> (4 * k)) & 15 for k in range(6)]
    assert sorted(digits) == list(range(6)) and digits[0] == 2  # conventional_nvfp4_sr first
    assert dispatch_order(True, codes, lpt=False) == sum(k << (4 * k) for k in range(6))
    # the run: three schemes (element formats: cheap in the interpreter), LPT order (2, 3, 0, 1)
    sch = {"conventional_fp32": SEED_TABLE["conventional_fp32"],
           "conventional_fp16": {"kind": "conventional", "fmt": "fp16", "rounding": "sr"},
           "shared_bf16": {"kind": "shared", "fmt": "bf16", "rounding": "sr"}}
    cfg = cfg_of("mamba2", sch, steps=16, heads=1)
    codes = [scheme_code(s.cfg) for s in build_schemes(cfg)]
    assert dispatch_order(True, codes) == 2 | 3 << 4 | 0 << 8 | 1 << 12
    a = run_triton(cfg, DEV, progress=False, diagnosis=Diagnosis(lpt=True))
    b = run_triton(cfg, DEV, progress=False, diagnosis=Diagnosis(lpt=False))
    for k in b.per_step_rel_err:
        np.testing.assert_array_equal(a.per_step_rel_err[k], b.per_step_rel_err[k])


def test_kl_rows_fused_matches_torch_ops():
    """The fused KL (one Triton pass after the two matmuls) against the torch ops of
    Readout.kl, on differences large enough that float64 noise does not matter."""
    from precsim.metrics import Readout, kl_rows

    g = torch.Generator().manual_seed(3)
    ro = Readout(64, 48, 2.0, DEV)  # vocab not a power of two: masked lanes
    yh = torch.randn(6, 64, generator=g, dtype=torch.float64).to(DEV)
    d = (1e-2 * torch.randn(3, 6, 64, generator=g)).to(DEV)
    d[2] *= 100  # large differences: the argmax moves on some rows
    d[0, 1] = torch.nan  # a dead scheme's row: NaN KL, disagreement
    a, ta = kl_rows(ro, yh, d, False, fused=True)
    b, tb = kl_rows(ro, yh, d, False, fused=False)
    assert (b[~torch.isnan(b)] > 1e-6).all() and torch.isnan(b[0, 1])
    np.testing.assert_allclose(a.cpu().numpy(), b.cpu().numpy(), rtol=1e-9)
    np.testing.assert_array_equal(ta.cpu().numpy(), tb.cpu().numpy())
    assert tb[0, 1] == 0 and tb[0, 0] == 1 and 0 < float(tb[2].mean()) < 1  # both outcomes


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "torch-ops"])
def test_top1_and_first_flip_match_torch_engine(fused):
    """The Triton engine's divergence columns (the fused KL kernel's argmax, or the torch-ops
    path) equal the torch engine's, on schemes that flip early, late and never."""
    cfg = to_config(tiny_cfg(steps=64, run__seqs=2, metrics__window=16, schemes={
        "conventional_fp32": {"kind": "conventional", "fmt": "fp32"},
        "conventional_fp4": {"kind": "conventional", "fmt": "fp4_e2m1"},
        "shared_nvfp4_sr": {"kind": "shared", "fmt": "nvfp4", "rounding": "sr"}}))
    a = run_triton(cfg, DEV, progress=False,
                   diagnosis=Diagnosis(fused_metrics=fused, kl_tf32=False))
    b = run_torch(cfg, DEV, progress=False)
    keys = ("top1", "top1_p10", "top1_p50", "top1_p90", "first_flip", "flipped")
    assert [[r[k] for k in keys] for r in a.rows] == [[r[k] for k in keys] for r in b.rows]
    last = {r["scheme"]: r for r in b.rows if r["step"] == 64}
    assert last["conventional_fp32"]["flipped"] == 0 and last["conventional_fp4"]["flipped"] == 2


def test_row_stats_first_nonfinite_step_and_dead_slots():
    """kernels.metrics.row_stats against NumPy on rows (step, sequence) of 2 sequences: rel_err
    per row, each slot's first step with a non-finite output (an atomic minimum, kept across
    windows: a later window cannot move it) and a slot dead before the window reading as NaN."""
    from precsim.kernels.metrics import NO_STEP, row_stats

    rng = np.random.default_rng(3)
    k, n, S, H, P = 3, 5, 2, 2, 16
    y64 = rng.normal(size=(n, S * H, P))
    y32 = (y64[None] + 1e-3 * rng.normal(size=(k, n, S * H, P))).astype(np.float32)
    y32[1, 3, H + 1, 4] = np.inf  # slot 1: step 4 of the window, second sequence
    y32[1, 4, 0, 0] = np.nan  # and later again: the first stays
    y32[2, 2, 0, 7] = np.nan  # slot 2: step 3, first sequence
    t0 = 40
    # slot 2 died at step t0, the previous window's last: it reads as NaN in this one
    first = torch.tensor([NO_STEP, NO_STEP, t0], dtype=torch.int32, device=DEV)
    err, d, yh = row_stats(torch.from_numpy(y32).to(DEV), torch.from_numpy(y64).to(DEV), None,
                           None, first, t0, S, n * S, P, True)
    assert first.tolist() == [NO_STEP, t0 + 4, t0]
    rows = lambda a: a.reshape(*a.shape[:-3], n * S, H * P)  # noqa: E731 - (step, seq) rows
    e = np.linalg.norm(rows(y32).astype(np.float64) - rows(y64), axis=-1) / np.linalg.norm(
        rows(y64), axis=-1)
    got = err.cpu().numpy()
    np.testing.assert_allclose(got[0], e[0], rtol=1e-12)
    assert np.isnan(got[2]).all()  # dead before the window: every row NaN
    bad = ~np.isfinite(e[1])
    assert ((np.isnan(got[1]) | np.isinf(got[1])) == bad).all() and bad.sum() == 2
    np.testing.assert_allclose(got[1][~bad], e[1][~bad], rtol=1e-12)
    assert torch.isnan(d[2]).all() and d.shape == (k, n * S, H * P)
    # a later window with a non-finite output in slot 0 and again in slot 1
    y32[0, 1, 0, 0] = np.nan
    row_stats(torch.from_numpy(y32).to(DEV), torch.from_numpy(y64).to(DEV), None, None, first,
              t0 + n, S, n * S, P, False)
    assert first.tolist() == [t0 + n + 2, t0 + 4, t0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_drafts_on_the_gpu_match_torch_engine(family):
    """At a size the interpreter cannot run (8 heads of the production shape, 4,096 steps,
    T = 4, an MTP profile): the Triton engine on CUDA against the torch engine on CUDA, window
    rows within 2e-2 and the same flushes, without falling back."""
    sch = {k: SEED_TABLE[k] for k in ("conventional_fp32", "shared_nvfp4_sr",
                                      "split_fp16sr_nvfp4", "split_fp32_nvfp4")}
    P = 64 if family == "mamba2" else 128
    cfg = cfg_of(family, sch, steps=4096, heads=8, P=P, N=128, replay__drafts=4,
                 replay__acceptance=[0.9, 0.8, 0.7, 0.6])
    cfg.metrics.window = 256
    tri = run_triton(cfg, "cuda", progress=False)
    ref = run_torch(cfg, "cuda", progress=False)
    assert tri.engine == "triton" and "triton_fallback" not in tri.info
    assert tri.info["flushes"] == ref.info["flushes"]
    # SR states part by a rounding flip between the kernels' and cuBLAS's sums over 4,096 steps
    assert_rows_match(cfg, tri, ref, tol=2e-2)


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_runtime_codes_equal_per_configuration_kernels(family):
    """One kernel taking the schemes as runtime arguments (``runtime_codes``: a sweep over
    schemes compiles it once) gives the same bits as kernels compiled per configuration (in
    the interpreter; compiled, to float32 reduction order, see below): every
    kind, element, block and integer formats, RNE and SR at the three lane widths (<= 8, <= 16
    and > 16 random bits), error feedback, a split read copy, two launch groups (blocks 16 and
    32)."""
    sch = {"conv_nvfp4_sr": {"kind": "conventional", "fmt": "nvfp4", "rounding": "sr"},
           "conv_fp16_sr": {"kind": "conventional", "fmt": "fp16", "rounding": "sr"},
           "conv_int8_ef": {"kind": "conventional", "fmt": "int8", "rounding": "rne",
                            "error_feedback": "bf16"},
           "shared_bf16_sr": {"kind": "shared", "fmt": "bf16", "rounding": "sr",
                              "sr_bits": 20},
           "split_fp8_mxfp4": {"kind": "split", "fmt": "fp8_e4m3", "rounding": "sr",
                               "read_fmt": "mxfp4"}}
    cfg = cfg_of(family, sch, steps=16, heads=1)
    want = run_triton(cfg, DEV, progress=False, runtime_codes=False, record_outputs=True,
                      diagnosis=Diagnosis(lanes=False))
    got = run_triton(cfg, DEV, progress=False, runtime_codes=True, record_outputs=True)
    assert got.info["launches"] == want.info["launches"] == 2
    for name in ["truth", *sch]:
        a, b = got.info["outputs"][name], want.info["outputs"][name]
        if DEV == "cpu":  # the interpreter: NumPy sums, the same order in both kernels
            np.testing.assert_array_equal(a, b, err_msg=name)
        else:  # compiled, the two kernels may sum a head's outputs in another order: float32
            # reduction noise (measured on an H200: <= 2e-7 of the largest output, the states
            # bit-identical at this size; docs/performance.md)
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-6 * np.abs(b).max(), err_msg=name)
    # each scheme in a launch of its own (engines.triton.LANES, the default here): the same
    # kernel code per scheme, the same bits on every device (measured on an H200 too, states
    # included); the truth alone in its launch may take its rows split over programs
    # (kernels.mamba2.truth_split: another reduction order) and agrees to float64 noise
    lanes = run_triton(cfg, DEV, progress=False, runtime_codes=False, record_outputs=True)
    assert lanes.info["launches"] == 1 + len(sch)
    for name in sch:
        np.testing.assert_array_equal(lanes.info["outputs"][name], want.info["outputs"][name],
                                      err_msg=name)
    t = want.info["outputs"]["truth"]
    np.testing.assert_allclose(lanes.info["outputs"]["truth"], t, rtol=0,
                               atol=1e-14 * np.abs(t).max())
    for k in want.per_step_rel_err:  # the truth's 4e-16 moves a 1e-7 error by ~4e-9 of it
        np.testing.assert_allclose(lanes.per_step_rel_err[k], want.per_step_rel_err[k],
                                   rtol=1e-6)


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
@pytest.mark.parametrize("rows", [4, 8], ids=["rows-split", "whole-head"])
def test_truth_alone_matches_a_float64_loop(family, rows, monkeypatch):
    """A launch of the float64 truth alone (the reference of a whole-model run, a recording)
    splits each head's state rows over programs (``mamba2_truth``/``gdn_truth``, ``rows`` per
    program; ``rows = P`` is the fused kernel's truth slot): both give the float64 recurrence of
    a plain NumPy loop (2 sequences x 4 heads, 2 groups of B/C, 7 steps), outputs and final
    states."""
    import precsim.kernels.mamba2 as m2_k

    from precsim.engines.triton import kernel_sets, launch_span

    monkeypatch.setattr(m2_k, "TRUTH_ROWS", rows)
    rng = np.random.default_rng(5)
    S, H, G, P, N, n = 2, 4, 2, 8, 16, 7
    a = rng.uniform(0.8, 1.0, (n, S * H))
    st = rng.standard_normal((S * H, P, N))
    if family == "mamba2":
        dt = rng.uniform(0.01, 0.2, (n, S * H))
        x = rng.standard_normal((n, S, H, P))
        B, C = rng.standard_normal((n, S, G, N)), rng.standard_normal((n, S, G, N))
        inp = {"dt": dt, "x": x, "B": B, "C": C}
    else:
        beta = rng.uniform(0.1, 0.9, (n, S * H))
        q, k = rng.standard_normal((n, S, H, N)), rng.standard_normal((n, S, H, N)) / 4
        v = rng.standard_normal((n, S, H, P))
        inp = {"beta": beta, "q": q, "k": k, "v": v}
    want_y = np.zeros((n, S * H, P))
    want = st.copy()
    for t in range(n):
        for h in range(S * H):
            s, hh = divmod(h, H)
            if family == "mamba2":
                g = hh // (H // G)  # head hh reads group g
                want[h] = a[t, h] * want[h] + dt[t, h] * np.outer(x[t, s, hh], B[t, s, g])
                want_y[t, h] = want[h] @ C[t, s, g]
            else:
                u = beta[t, h] * (v[t, s, hh] - a[t, h] * (want[h] @ k[t, s, hh]))
                want[h] = a[t, h] * want[h] + np.outer(u, k[t, s, hh])
                want_y[t, h] = want[h] @ q[t, s, hh]
    dev = torch.device(DEV)
    tin = {k_: torch.tensor(v_, device=dev) for k_, v_ in inp.items()}
    tin.update({"_a64": torch.tensor(a, device=dev),
                "_a32": torch.tensor(a, device=dev, dtype=torch.float32),
                "_dA32": torch.tensor(np.log(a), device=dev, dtype=torch.float32)})
    S64 = torch.tensor(st, device=dev)
    z = torch.zeros((1, S * H, P, N), dtype=torch.float32, device=dev)
    y64 = torch.full((n, S * H, P), np.nan, dtype=torch.float64, device=dev)
    ph = torch.zeros(n, dtype=torch.int32, device=dev)
    k1 = torch.zeros((1, n), dtype=torch.int32, device=dev)
    launch_span(family, tin, S64, z, z.clone(), y64, z.new_empty((1, n, S * H, P)), k1, ph, 0, [],
            [], True, 0, n, n, H, 16, 16, 4, None, lpt=True, buf=0, sfloor=0, scope=0,
            u_master=False, kernels=kernel_sets(), order=lambda *a_: 0)
    np.testing.assert_allclose(y64.cpu().numpy(), want_y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(S64.cpu().numpy(), want, rtol=1e-12, atol=1e-12)


import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _add_one_for_the_launcher_test(x_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) + 1.0, mask=i < n)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_launcher_built_ahead_is_not_built_again_at_the_first_launch(tmp_path, monkeypatch):
    """engines.triton.build_launcher (what _compile_together's threads do after each compile):
    with an empty Triton cache, the kernel's first launch afterwards adds nothing to the cache
    (Triton 3.6 built a C launcher per kernel signature there, 0.2-0.5 s each, after the
    side-by-side compiles) and still runs."""
    from triton import knobs

    from precsim.engines.triton import build_launcher

    monkeypatch.setattr(knobs.cache, "dir", str(tmp_path))
    x = torch.zeros(100, device="cuda")
    kernel = _add_one_for_the_launcher_test.warmup(x, 100, BLOCK=128, grid=(1,))
    build_launcher(kernel)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    _add_one_for_the_launcher_test[(1,)](x, 100, BLOCK=128)
    torch.cuda.synchronize()
    assert float(x.sum()) == 100.0
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing new


@pytest.mark.parametrize("L,steps,drafts", [(8, 40, 3), (16, 37, 0)])
def test_segment_dots_equal_the_per_step_evaluation(L, steps, drafts, monkeypatch):
    """``kernels.mamba2.SEGMENT_DOTS`` (a ReplaySSM segment's outputs as matrix products, the
    issue-44 prototype): every scheme's outputs equal the per-step evaluation's to float32
    summation order (1e-6 of the largest), regular and draft-shortened segments, an unflushed
    last segment, NVFP4-SR and FP16-SR masters, a split read copy, error feedback; a
    conventional scheme (no segments) bit for bit; the per-window figures within 1e-3."""
    from precsim.kernels import mamba2 as km

    sch = {"shared_nvfp4_sr": {"kind": "shared", "fmt": "nvfp4", "rounding": "sr"},
           "split_fp16sr_nvfp4": {"kind": "split", "fmt": "fp16", "rounding": "sr",
                                  "read_fmt": "nvfp4"},
           "replay_int8_ef": {"kind": "shared", "fmt": "int8_b128", "rounding": "rne",
                              "error_feedback": "int8_b128"},
           "conventional_nvfp4_sr": {"kind": "conventional", "fmt": "nvfp4", "rounding": "sr"}}
    cfg = cfg_of("mamba2", sch, steps=steps, heads=1, N=128, replay__buffer_len=L,
                 replay__drafts=drafts)  # (N: the INT8 format's 128-element blocks)
    want = run_triton(cfg, DEV, progress=False, record_outputs=list(sch))
    monkeypatch.setattr(km, "SEGMENT_DOTS", True)
    got = run_triton(cfg, DEV, progress=False, record_outputs=list(sch))
    for n in sch:
        a, b = got.info["outputs"][n], want.info["outputs"][n]
        assert np.isfinite(b).all() and np.abs(b).max() > 0, n
        if n.startswith("conventional"):
            np.testing.assert_array_equal(a, b, err_msg=n)
        else:
            assert 0 < np.abs(a - b).max() <= 1e-6 * np.abs(b).max(), n
    assert_rows_match(cfg, got, want)  # (per-window error, drift and KL on the same schedule)
