"""The numba CPU engine: bit-equal quantisers, the same numbers as the torch engine, the truth."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import zlib

import ml_dtypes
import numpy as np
import pytest

numba = pytest.importorskip("numba")

from conftest import SEED_TABLE, make_trace, tiny_cfg  # noqa: E402

from precsim import formats as pf  # noqa: E402
from precsim import oracle  # noqa: E402
from precsim.config import to_config  # noqa: E402
from precsim.engines import run  # noqa: E402
from precsim.engines.held import Capture  # noqa: E402
from precsim.engines.numba import (  # noqa: E402
    event_keys,
    fmt_code,
    quantize,
    sr_lane,
    supports,
)
from precsim.engines.numba_host import run as run_numba  # noqa: E402
from precsim.engines.torch import run as run_torch  # noqa: E402

# The compiled engine: a scheme's kind and formats are constants of its task (scheme_consts),
# so every distinct scheme here is a whole task compiled (~3-4 CPU-s on 2 cores; CI's numba cache
# is always cold). The task code that depends on the format is the quantiser (qin through
# store), the same compiled code test_quantize_bit_equal checks bit for bit for every format,
# rounding, SR lane width and overflow; the engine-level runs below cover each kind of scheme
# with each class of format as master and as read copy, and each SR lane width:
ENGINE = {
    "conventional_fp32": SEED_TABLE["conventional_fp32"],  # no quantiser; the baseline
    "conventional_nvfp4_sr": SEED_TABLE["conventional_nvfp4_sr"],  # two-level block, SR 8-bit
    "conventional_int8_b32_sr": {"kind": "conventional", "fmt": "int8_b32", "rounding": "sr"},
    "shared_nvfp4_sr": SEED_TABLE["shared_nvfp4_sr"],
    "shared_fp16_b8_sr": {"kind": "shared", "fmt": "fp16_b8", "rounding": "sr"},  # part rows
    "split_fp32_nvfp4": SEED_TABLE["split_fp32_nvfp4"],  # FP32 master, block read
    "split_fp16sr_nvfp4": SEED_TABLE["split_fp16sr_nvfp4"],  # element master, SR 16-bit lanes
    "split_e5m2_mxfp4": {"kind": "split", "fmt": "fp8_e5m2", "rounding": "sr",  # 32-bit lanes
                         "read_fmt": "mxfp4"},  # an MX read copy
    "split_fp16_int8_b32": {"kind": "split", "fmt": "fp16", "read_fmt": "int8_b32"},  # RNE
}
# conventional_fp16_ieee (element RNE, IEEE overflow) runs in the non-finite and thread tests,
# error feedback in tests/engines/test_error_feedback.py and test_drafts.py (with drafts). GDN's
# task differs from Mamba-2's in the update only: test_gdn_matches_torch_engine_and_oracle runs
# every kind on it and a row-scaled read copy (a row-scaled GDN master, bit for bit against the
# torch engine: test_error_feedback.py's c_int8_ef).


def _hard_values(shape, seed=0) -> np.ndarray:
    """Float32 values over the whole range with zeros, subnormals, Inf/NaN, ties, overflow."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp(rng.uniform(-25, 25, shape))
    flat = x.reshape(-1)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -3e-40, 2e-39, 65520.0, 65519.0,
               1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 2.5, 0.75, 5.0, -0.25, 500.0, 6e4, 7e4,
               1.0625, 3.4e38, 0.015625 * 3]
    flat[:len(special)] = special
    flat[64:96] = rng.choice([0.25, 0.75, 1.25, 2.5, 3.5, 5.0], 32) * rng.choice([-1, 1], 32)
    x = x.astype(np.float32)
    x[1] = 0.0  # an all-zero matrix (NVFP4 tensor scale 0 -> 1)
    x[2, 0, :32] = np.float32(1e-44)  # subnormal blocks
    return x


CASES = [(f, r, ov, {}) for f in ("fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "mxfp4",
                                  "mxfp8")
         for r in ("rne", "sr") for ov in ("satfinite", "ieee")]
CASES += [(f, r, ov, {}) for f in ("int8", "int16") for r in ("rne", "sr")
          for ov in ("satfinite", "ieee")]
CASES += [(f, r, "satfinite", {}) for f in ("int8_b64", "int16_b8", "fp8_e4m3_b32", "fp16_b16",
                                           "fp16_b64", "fp4_e2m1_b8", "fp8_e5m2_b16")
          for r in ("rne", "sr")]
CASES += [("nvfp4", r, "satfinite", {"scale_floor": sf, "tensor_scope": ts, "scale_mode": sm})
          for r in ("rne", "sr") for sf in ("subnormal", "normal") for ts in ("matrix", "none")
          for sm in ("reciprocal", "divide")]


# SR with 5 random bits reads 8-bit lanes (numba.sr_lane), a quantiser compiled apart from the
# default bits' 16- or 32-bit lanes (~1-3 s each): the lane code is the same for every format
# (the words, then the lanes as one view), so it is checked on one format of each class whose
# default lanes are wider (element, integer, block, row-scaled) and on every 8-bit-lane format
LANE8 = {"fp16", "int8", "mxfp8", "fp8_e4m3_b32"}


@pytest.mark.parametrize("fmt,rounding,overflow,opts", [
    pytest.param(*c, id="-".join([c[0], c[1], c[2], *c[3].values()])) for c in CASES])
def test_quantize_bit_equal(fmt, rounding, overflow, opts):
    x = _hard_values((3, 16, 64))
    five = fmt in LANE8 or sr_lane(pf.sr_bits_used(fmt, None)) == 8
    for sr_bits in ((None, 5) if rounding == "sr" and five else (None,)):
        kw = dict(seed=123, stream=77, overflow=overflow, sr_bits=sr_bits, **opts)
        got = quantize(x, fmt, rounding, **kw)
        want = pf.quantize(x, fmt, rounding, **kw)
        nan = np.isnan(want)
        np.testing.assert_array_equal(np.isnan(got), nan)
        np.testing.assert_array_equal(got.view(np.int32)[~nan], want.view(np.int32)[~nan])


@pytest.mark.parametrize("scale_mode", ["reciprocal", "divide"])
@pytest.mark.parametrize("scope", ["none", "matrix"])
def test_nvfp4_scale_mode_on_ties(scale_mode, scope):
    """One block per normal E4M3 scale ``c``: max ``6 c`` and the E2M1 halfway points ``±h c``.
    ``x / c`` is exact there and ``x * (1/c)`` is not always, so RNE tells the two scale modes
    apart on some elements (random values almost never do); the compiled quantiser follows
    either bit for bit."""
    c = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    c = c[np.isfinite(c) & (c >= 2.0**-6)]
    h = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=np.float32)
    blk = np.ones((len(c), 16), dtype=np.float32)
    blk[:, 0], blk[:, 1:8], blk[:, 8:15] = 6.0, h, -h
    x = (blk * c[:, None]).astype(np.float32)[None]
    opts = dict(tensor_scope=scope, scale_mode=scale_mode)
    want = pf.quantize(x, "nvfp4", "rne", **opts)
    other = "divide" if scale_mode == "reciprocal" else "reciprocal"
    assert (want != pf.quantize(x, "nvfp4", "rne", **{**opts, "scale_mode": other})).sum() > 20
    np.testing.assert_array_equal(quantize(x, "nvfp4", "rne", **opts).view(np.int32),
                                  want.view(np.int32))


def test_event_keys_match_formats_streams():
    ev = np.array([0, 1, 7, 4095, 2**33 + 5])
    k0, k1 = event_keys(9, "shared_nvfp4_sr", ev, 1)
    for e, k in zip(ev, k1, strict=True):
        stream = pf.stream_id(zlib.crc32(b"shared_nvfp4_sr"), int(e), 1)
        assert (k0, int(k)) == pf.stream_keys(9, stream)


def _cfg(schemes, steps=512, **over):
    d = tiny_cfg(steps=steps, schemes=schemes, workload__kind="seed_article", **over)
    d["model"].update(head_dim=16, state_dim=32)
    d["metrics"]["window"] = 128
    return to_config(d)


def _by_key(rows):
    return {(r["scheme"], r["step"]): r for r in rows}


@pytest.mark.parametrize("buffer_dtype", ["fp32", "bf16"])
def test_matches_torch_engine(buffer_dtype):
    """Window rows agree with the torch engine: 1e-3 relative on every scheme whose output does
    not end in a float32 reduction of its own (the update, the quantisers, the random bits and
    the decays are the torch engine's, bit for bit; the output reductions S·C differ in order).
    Conventional FP32's rel_err *is* that reduction's rounding, so it gets 5 %, and its state
    drift (no reduction) 1e-6. A BF16 ReplaySSM buffer (the host rounds it: no new task) with
    the ReplaySSM schemes."""
    schemes = ENGINE if buffer_dtype == "fp32" else {
        k: v for k, v in ENGINE.items() if v["kind"] != "conventional"}
    cfg = _cfg(schemes, replay__buffer_dtype=buffer_dtype)
    rn = run_numba(cfg, progress=False, record_outputs=True)
    rt = run_torch(cfg, "cpu", progress=False, record_outputs=True)
    assert rn.engine == "numba" and len(rn.rows) == len(rt.rows)
    a, b = _by_key(rn.rows), _by_key(rt.rows)
    assert a.keys() == b.keys()
    for key, r in a.items():
        tol = 5e-2 if key[0] == "conventional_fp32" else 1e-3
        for m in ("rel_err", "kl"):
            assert r[m] == pytest.approx(b[key][m], rel=tol), (key, m)
        for m in ("state_drift", "read_drift"):
            if np.isfinite(b[key][m]):
                assert r[m] == pytest.approx(b[key][m], rel=1e-3), key
    for name in schemes:  # per step, outputs within a few float32 rounding steps of |y|
        yn, yt = rn.info["outputs"][name], rt.info["outputs"][name]
        scale = np.abs(yt).max()
        assert np.abs(yn - yt).max() <= 1e-4 * scale, name
    assert rn.schemes == rt.schemes


def test_sr_statistics_match_torch_engine():
    """An SR scheme with a different seed gives a different stream, and the torch engine's
    spread across seeds covers the numba engine's result (same distribution)."""
    sch = {"shared_nvfp4_sr": SEED_TABLE["shared_nvfp4_sr"]}
    vals = {}
    for eng in ("numba", "torch"):
        out = []
        for seed in (1, 2, 3):
            cfg = _cfg(sch, steps=256, run__seed=seed)
            r = run_numba(cfg, progress=False) if eng == "numba" else run_torch(
                cfg, "cpu", progress=False)
            out.append(r.rows[-1]["rel_err"])
        vals[eng] = np.array(out)
    np.testing.assert_allclose(vals["numba"], vals["torch"], rtol=1e-3)
    assert len(set(vals["numba"].round(9))) == 3  # the seed reaches the random bits


def test_truth_equals_oracle_with_D(tmp_path):
    tr = make_trace("mamba2", T=96, H=2, P=16, N=32, with_D=True)
    path = tmp_path / "t.npz"
    np.savez(path, **tr)
    cfg = to_config(tiny_cfg(steps=96, schemes={"split_fp32_nvfp4": SEED_TABLE[
        "split_fp32_nvfp4"]}, workload__kind="trace", workload__path=str(path),
        replay__buffer_len=6))
    r = run_numba(cfg, progress=False, record_outputs=True)
    y = oracle.decode(tr)
    got = r.info["outputs"]["truth"].reshape(y.shape)
    assert np.abs(got - y).max() <= 1e-12 * np.abs(y).max()
    # the metrics with the skip term (the row statistics add D x themselves): the torch engine's
    t = run_torch(cfg, "cpu", progress=False)
    for a, b in zip(r.rows, t.rows, strict=True):
        for m in ("rel_err", "kl", "top1", "state_drift", "read_drift"):
            assert a[m] == pytest.approx(b[m], rel=1e-3, nan_ok=True), (a, m)


@pytest.mark.parametrize("u_source", ["read", "master"])
def test_gdn_matches_torch_engine_and_oracle(tmp_path, u_source):
    """Gated DeltaNet: the float64 truth is the oracle's to 1e-12 (a trace, 2 heads); every
    scheme's held state (and split's read copy) and every output are the torch engine's bit for
    bit: the reductions ``S k`` and ``S q`` in families.base.key_dot's fixed order, the sums over
    a segment's steps in order, as the torch engine computes them. The window rows agree to the
    float64 truth's rounding (each engine computes the truth its own way)."""
    tr = make_trace("gdn", T=64, H=2, P=16, N=32)
    path = tmp_path / "g.npz"
    np.savez(path, **tr)
    cfg = to_config(tiny_cfg("gdn", steps=64, schemes=SEED_TABLE, workload__kind="trace",
                             workload__path=str(path), replay__buffer_len=8,
                             replay__gdn_u_source=u_source))
    assert supports(cfg) is None
    r = run_numba(cfg, progress=False, record_outputs=True)
    y = oracle.decode(tr)
    got = r.info["outputs"]["truth"].reshape(y.shape)
    assert r.engine == "numba" and np.abs(got - y).max() <= 1e-12 * np.abs(y).max()
    schemes = {**SEED_TABLE, "split_fp16_int8_b32": ENGINE["split_fp16_int8_b32"]}
    d = tiny_cfg("gdn", steps=1024, schemes=schemes, replay__gdn_u_source=u_source,
                 run__seqs=2, run__threads=1)
    d["model"].update(head_dim=16, state_dim=32, heads=4)
    d["metrics"]["window"] = 256
    cfg = to_config(d)
    cn, ct = Capture(), Capture()
    rn = run_numba(cfg, progress=False, record_outputs=True, ckpt=cn)
    rt = run_torch(cfg, "cpu", progress=False, record_outputs=True, ckpt=ct)
    assert rn.engine == "numba" and len(rn.rows) == len(rt.rows)
    shape = ct.last["schemes"][0]["state"].shape
    for i, (n, sc) in enumerate(schemes.items()):
        assert rn.schemes[n]["dead_at"] is None, n
        np.testing.assert_array_equal(cn.last["st"][i].reshape(shape),
                                      ct.last["schemes"][i]["state"], err_msg=n)
        if sc["kind"] == "split":
            np.testing.assert_array_equal(cn.last["rd"][i].reshape(shape),
                                          ct.last["schemes"][i]["read"], err_msg=n)
        np.testing.assert_array_equal(rn.info["outputs"][n], rt.info["outputs"][n], err_msg=n)
    for a, b in zip(rn.rows, rt.rows, strict=True):
        assert (a["scheme"], a["step"]) == (b["scheme"], b["step"])
        assert a["rel_err"] == pytest.approx(b["rel_err"], rel=1e-9), (a, b)


def test_nonfinite_scheme_dies_others_run_on(monkeypatch):
    sch = {"conventional_fp16_ieee": {"kind": "conventional", "fmt": "fp16", "overflow": "ieee"},
           "split_fp32_nvfp4": SEED_TABLE["split_fp32_nvfp4"]}
    cfg = _cfg(sch, steps=256)
    from precsim import workload as wmod

    orig = wmod.RandomWorkload.chunk

    def big(self, t0, t1):  # x large enough that an FP16 state overflows after a few steps
        out = dict(orig(self, t0, t1))
        out["x"] = out["x"] * 1e5
        return out

    monkeypatch.setattr(wmod.RandomWorkload, "chunk", big)
    rn = run_numba(cfg, progress=False)
    rt = run_torch(cfg, "cpu", progress=False)
    assert rn.schemes["conventional_fp16_ieee"]["dead_at"] is not None
    assert rn.schemes == rt.schemes
    last = {r["scheme"]: r for r in rn.rows if r["step"] == rn.rows[-1]["step"]}
    assert np.isfinite(last["split_fp32_nvfp4"]["rel_err"])
    assert not np.isfinite(last["conventional_fp16_ieee"]["rel_err"])


@pytest.mark.parametrize("threads", [2, 3])
def test_threads_do_not_change_results(monkeypatch, threads):
    """One thread (window after window) and several (the host overlapping the kernel, tasks
    handed out one at a time): the same rows, per-step errors, outputs, drift and dead steps,
    bit for bit, with a scheme that dies mid-run."""
    sch = {**SEED_TABLE,
           "conventional_fp16_ieee": {"kind": "conventional", "fmt": "fp16", "overflow": "ieee"}}
    from precsim import workload as wmod

    orig = wmod.RandomWorkload.chunk

    def big(self, t0, t1):  # x grows until an FP16 state overflows in the third window
        out = dict(orig(self, t0, t1))
        out["x"] = out["x"] * (1.0 if t0 < 256 else 1e5)
        return out

    monkeypatch.setattr(wmod.RandomWorkload, "chunk", big)
    res = {}
    for t in (1, threads):
        cfg = _cfg(sch, steps=512, run__threads=t)
        res[t] = run_numba(cfg, progress=False, record_outputs=True)
    a, b = res[1], res[threads]
    assert a.info["threads"] == 1 and b.info["threads"] == min(
        threads, os.cpu_count(), numba.config.NUMBA_NUM_THREADS)
    assert a.schemes == b.schemes and a.schemes["conventional_fp16_ieee"]["dead_at"] > 256
    assert len(a.rows) == len(b.rows) == 4 * len(sch)
    for ra, rb in zip(a.rows, b.rows, strict=True):
        assert ra.keys() == rb.keys()
        for k in ra:
            assert ra[k] == rb[k] or (ra[k] != ra[k] and rb[k] != rb[k]), (ra["scheme"], k)
    for k in a.info["outputs"]:
        np.testing.assert_array_equal(a.info["outputs"][k], b.info["outputs"][k])
    for k in a.per_step_rel_err:
        np.testing.assert_array_equal(a.per_step_rel_err[k], b.per_step_rel_err[k])


def test_gdn_threads_do_not_change_results(monkeypatch):
    """GDN on one thread and on two: the same outputs and rows bit for bit, with a scheme that
    dies mid-run (v grows until an FP16 state overflows)."""
    sch = {**SEED_TABLE,
           "conventional_fp16_ieee": {"kind": "conventional", "fmt": "fp16", "overflow": "ieee"}}
    from precsim import workload as wmod

    orig = wmod.RandomWorkload.chunk

    def big(self, t0, t1):
        out = dict(orig(self, t0, t1))
        out["v"] = out["v"] * (1.0 if t0 < 256 else 1e6)
        return out

    monkeypatch.setattr(wmod.RandomWorkload, "chunk", big)
    res = {}
    for t in (1, 2):
        d = tiny_cfg("gdn", steps=512, schemes=sch, run__threads=t)
        d["model"].update(head_dim=16, state_dim=32)
        d["metrics"]["window"] = 128
        res[t] = run_numba(to_config(d), progress=False, record_outputs=True)
    a, b = res[1], res[2]
    assert a.engine == b.engine == "numba"
    assert a.schemes == b.schemes and a.schemes["conventional_fp16_ieee"]["dead_at"] > 256
    for ra, rb in zip(a.rows, b.rows, strict=True):
        for k in ra:
            assert ra[k] == rb[k] or (ra[k] != ra[k] and rb[k] != rb[k]), (ra["scheme"], k)
    for k in a.info["outputs"]:
        np.testing.assert_array_equal(a.info["outputs"][k], b.info["outputs"][k])


def test_cpu_threads_auto():
    """run.threads=auto: all cores for a single run, shared out among a joblib sweep's jobs;
    torch ops on one thread."""
    from precsim.engines import base

    assert base.cpu_threads("auto", 8) == 8 and base.cpu_threads(0, 8) == 8
    assert base.cpu_threads(3, 8) == 3 and base.cpu_threads(16, 8) == 8
    assert base.torch_threads("auto") == 1 and base.torch_threads(0) is None
    assert base.torch_threads(2) == 2


@pytest.mark.parametrize("launcher,n_jobs,want", [
    ("hydra._internal.core_plugins.basic_launcher.BasicLauncher", None, 8),
    ("hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher", -1, 1),
    ("hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher", 2, 4),
    ("hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher", -7, 4)])
def test_cpu_threads_in_a_sweep(monkeypatch, launcher, n_jobs, want):
    """A multirun job: Hydra's basic launcher runs the jobs in turn (all cores each); joblib's
    jobs side by side share the cores (n_jobs -1 = one job per core)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from precsim.engines import base

    hc = OmegaConf.create({"mode": RunMode.MULTIRUN,
                           "launcher": {"_target_": launcher, "n_jobs": n_jobs}})
    monkeypatch.setattr(HydraConfig, "initialized", staticmethod(lambda: True))
    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: hc))
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert base.cpu_threads("auto") == want
    assert base.cpu_threads(2) == 2


def test_supports_and_dispatch():
    assert supports(_cfg(SEED_TABLE)) is None
    assert supports(_cfg(ENGINE)) is None
    assert supports(to_config(tiny_cfg("gdn"))) is None
    assert "buffer_dtype" in supports(to_config(tiny_cfg("gdn", replay__buffer_dtype="bf16")))
    assert supports(_cfg(SEED_TABLE, replay__drafts=2)) is None  # tests/engines/test_drafts.py
    assert "tensor" in supports(_cfg(SEED_TABLE, formats__tensor_scope="tensor"))
    assert "sr_source" in supports(_cfg(SEED_TABLE, formats__sr_source="philox7"))
    assert "rotate" in supports(_cfg(SEED_TABLE, formats__rotate=True))
    cfg = _cfg({"split_fp32_nvfp4": SEED_TABLE["split_fp32_nvfp4"]}, steps=128)
    cfg.run.engine = "numba"
    res = run(cfg, progress=False)
    assert res.engine == "numba" and cfg.run.threads == "auto"
    assert res.info["threads"] == min(os.cpu_count(), numba.config.NUMBA_NUM_THREADS)
    g = to_config(tiny_cfg("gdn", steps=32, run__engine="numba", replay__buffer_dtype="bf16"))
    res = run(g, progress=False)  # falls back to the torch engine with the reason
    assert res.engine == "torch" and "buffer_dtype" in res.info["numba_fallback"]


def test_auto_picks_numba_on_cpu_when_it_covers_the_config(monkeypatch):
    from precsim.engines import numba_host as nb_engine  # the registry's module
    from precsim.engines import resolve_engine

    assert resolve_engine("auto", "cpu", _cfg(SEED_TABLE)) == "numba"
    assert resolve_engine("auto", "cpu", to_config(tiny_cfg("gdn"))) == "numba"
    assert resolve_engine("auto", "cpu", to_config(tiny_cfg("gdn", replay__buffer_dtype="bf16")
                                                    )) == "torch"
    assert resolve_engine("auto", "cpu", _cfg(SEED_TABLE, formats__rotate=True)) == "torch"
    monkeypatch.setattr(nb_engine, "available", lambda: False)  # numba not installed
    assert resolve_engine("auto", "cpu", _cfg(SEED_TABLE)) == "torch"


def _python(code: str, cache, stdin: bytes = b"") -> subprocess.CompletedProcess:
    """``code`` in a new interpreter whose numba cache is the folder ``cache``."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    return subprocess.run([sys.executable, "-c", code], input=stdin, capture_output=True,
                          env=env, check=True)


def test_a_run_compiles_its_own_formats_only_and_caches_them(tmp_path):
    """With an empty numba cache a run of conventional FP32 and split FP32 + FP8 (RNE) compiles
    one quantiser, FP8 E4M3's, and no other format's (the engine once compiled them all), and
    says so once on stderr; the next process, on 2 threads (a helper would compile what is
    missing), finds every function in the cache: no notice, the same rows."""
    cfg = tiny_cfg(steps=64, schemes={
        "conventional_fp32": {"kind": "conventional", "fmt": "fp32"},
        "split_fp32_fp8": {"kind": "split", "fmt": "fp32", "read_fmt": "fp8_e4m3"}})
    code = f"""
import json
from precsim.config import to_config
from precsim.engines.numba_host import run
from precsim.engines.numba_jit import quant
typed, impl = [], quant._qin_impl
quant._qin_impl = lambda f, lane: typed.append((f, lane)) or impl(f, lane)
cfg = to_config(json.loads({json.dumps(json.dumps(cfg))}))
cfg.run.threads = THREADS
res = run(cfg, progress=False)
print(json.dumps([sorted({{t for t in typed if t[0] > 0}}), res.rows]))
"""
    first = _python(code.replace("THREADS", "1"), tmp_path)
    second = _python(code.replace("THREADS", "2"), tmp_path)
    (typed1, rows1), (typed2, rows2) = (json.loads(r.stdout) for r in (first, second))
    assert typed1 == [[fmt_code("fp8_e4m3"), 0]] and typed2 == []
    assert first.stderr.decode().count("compiling the fused CPU engine") == 1
    assert "compiling" not in second.stderr.decode()
    assert rows1 == rows2


def test_compile_helper_fills_the_cache_the_engine_reads(tmp_path):
    """What the compile helper (``compile_tasks``, fed a pickled signature on stdin) compiles is
    what the engine then finds in the cache for the same signature."""
    from precsim.engines.numba import row_stats_signature

    _python("from precsim.engines.numba import compile_tasks; compile_tasks()", tmp_path,
            pickle.dumps([(None, None, row_stats_signature())]))
    check = ("from precsim.engines import numba as nb, numba_host as h; "
             "print(h._cached(nb.row_stats, nb.row_stats_signature()))")
    assert _python(check, tmp_path).stdout.strip() == b"True"
    assert _python(check, tmp_path / "empty").stdout.strip() == b"False"


def test_without_numba_auto_falls_back_and_numba_is_refused_in_one_line():
    """numba is optional (extra ``cpu``): without it the engine module still imports,
    ``run.engine=auto`` on the CPU resolves to another engine and the numba engine's one-line
    reason names the extra (no ImportError)."""
    code = ("import sys; sys.modules['numba'] = None\n"
            "from precsim.engines import engine_module, resolve_engine\n"
            "print(resolve_engine('auto', 'cpu'))\n"
            "print('refused:', engine_module('numba').supports(None, 'cpu'))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-800:]
    first, second = r.stdout.splitlines()[:2]
    assert first in ("torch", "numpy") and second.startswith("refused:") and "[cpu]" in second
