"""The CPU engines against references that share none of their code: a hand-written float32
NumPy loop for a conventional NVFP4 scheme (its own decays, step and an ml_dtypes NVFP4 quantiser
written from the README's definition), ``scipy.special.rel_entr`` for the KL, and the split read
copy against an RNE rounding of the master built from ml_dtypes casts."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from conftest import tiny_cfg
from scipy.special import log_softmax, rel_entr

from precsim.config import to_config
from precsim.engines.numpy import run as run_numpy
from precsim.engines.torch import run as run_torch
from precsim.metrics import Readout
from precsim.workload import make_workload

f32 = np.float32


def nvfp4_rne(x: np.ndarray) -> np.ndarray:
    """NVFP4 (README, "Block-scaled formats", defaults: one FP32 scale per matrix of the last two
    axes, subnormal scale floor, reciprocal mode) from ml_dtypes' E4M3 and E2M1 casts (RNE):
    ``s = amax / 2688``, ``bs = E4M3((block_amax / 6) / s)`` (at most 448), ``total = s bs``,
    ``q = E2M1(clamp(x ((1 / s) / bs), +-6))``, output ``q total``; float32 throughout."""
    xb = x.reshape(*x.shape[:-1], -1, 16)
    bmax = np.abs(xb).max(axis=-1, keepdims=True).astype(f32)
    s = (np.abs(x).max(axis=(-2, -1)).astype(f32) / f32(2688))[..., None, None, None]
    s = np.where(s == 0, f32(1), s)
    bs = np.minimum((bmax / f32(6)) / s, f32(448)).astype(ml_dtypes.float8_e4m3fn).astype(f32)
    r = (f32(1) / s) / np.where(bs > 0, bs, f32(1))
    q = np.clip(xb * r, f32(-6), f32(6)).astype(ml_dtypes.float4_e2m1fn).astype(f32)
    return (q * (s * bs)).reshape(x.shape)


def _mamba2_cfg(schemes, steps=128, **over):
    return to_config(tiny_cfg("mamba2", steps=steps, heads=2, schemes=schemes,
                              workload__kind="seed_article", **over))


def nvfp4_loop(cfg):
    """Per window: mean rel_err of a float32 state that is NVFP4-rounded (RNE) after every
    update, and its state drift at the window's end, against a float64 recurrence (one sequence,
    exact decays: ``float32(exp(dt A))`` from the float64 product)."""
    T, W = cfg.run.steps, cfg.metrics.window
    tr = make_workload(cfg).trace(0, T)
    H, P, N = tr["x"].shape[1], tr["x"].shape[2], tr["B"].shape[2]
    S64, S32 = np.zeros((H, P, N)), np.zeros((H, P, N), f32)
    err, drift = np.empty(T), []
    for t in range(T):
        dt, x, B, C = tr["dt"][t], tr["x"][t], tr["B"][t], tr["C"][t]
        a = np.exp(dt * tr["A"])
        S64 = a[:, None, None] * S64 + (dt[:, None] * x)[:, :, None] * B[:, None, :]
        S32 = a.astype(f32)[:, None, None] * S32 + (
            (dt.astype(f32)[:, None] * x.astype(f32))[:, :, None] * B.astype(f32)[:, None, :])
        y64, y32 = (S64 * C[:, None, :]).sum(-1), (S32 * C.astype(f32)[:, None, :]).sum(-1)
        err[t] = np.linalg.norm(y32 - y64) / np.linalg.norm(y64)
        S32 = nvfp4_rne(S32)
        if (t + 1) % W == 0:
            drift.append(np.linalg.norm(S32 - S64) / np.linalg.norm(S64))
    return err.reshape(-1, W).mean(axis=1), np.array(drift)


def _column(res, scheme, key):
    return np.array([r[key] for r in res.rows if r["scheme"] == scheme])


def test_nvfp4_quantiser_reference_matches_precsim():
    """The reference quantiser is the format's: bit for bit on states of several scales (one
    all-zero matrix included), so the loop below differs from the engines only in its own code."""
    from precsim import formats as pf

    rng = np.random.default_rng(0)
    x = (rng.standard_normal((2, 3, 8, 32)) * np.logspace(-6, 3, 32)).astype(f32)
    x[1, 2] = 0
    np.testing.assert_array_equal(nvfp4_rne(x), pf.quantize(x, "nvfp4"))


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_conventional_nvfp4_matches_an_independent_loop(engine):
    """rel_err and state drift of conventional NVFP4 (RNE) against ``nvfp4_loop``: the state is
    the same float32 arithmetic and rounding, so only the outputs' summation order differs.
    Measured (128 steps, 4 windows of 32, rel_err 0.23 -> 0.73): rel_err within 1.4e-8
    relative (torch) and 1e-16 (numpy), drift within 8e-16; tolerances 1e-6 and 1e-12 (~70x and
    ~1000x over). One E2M1 step different anywhere moves both by far more."""
    cfg = _mamba2_cfg({"nvfp4": {"kind": "conventional", "fmt": "nvfp4"}}, metrics__kl=False)
    res = run_torch(cfg, "cpu", progress=False) if engine == "torch" else \
        run_numpy(cfg, progress=False)
    err, drift = nvfp4_loop(cfg)
    np.testing.assert_allclose(_column(res, "nvfp4", "rel_err"), err, rtol=1e-6)
    np.testing.assert_allclose(_column(res, "nvfp4", "state_drift"), drift, rtol=1e-12)
    assert 0.01 < err.min() and err.max() < 1  # NVFP4-sized errors, not float32 noise


def reference_kl(y_ref, y_sim, readout, window):
    """Window means (mean over sequences) of KL(p_ref || p_sim) with ``p = softmax(scale W
    rms_normalise(y))``, all in float64 through ``scipy.special.rel_entr`` (the README's
    definition; W the engine's readout matrix)."""
    W = readout.W64.numpy()

    def p_log(y):
        y = y.reshape(*y.shape[:2], -1).astype(np.float64)  # (T, S, H*P)
        y = y / np.sqrt((y * y).mean(axis=-1, keepdims=True))
        return log_softmax(readout.scale * (y @ W.T), axis=-1)

    kl = rel_entr(np.exp(p_log(y_ref)), np.exp(p_log(y_sim))).sum(axis=-1)  # (T, S)
    return kl.reshape(-1, window, kl.shape[1]).mean(axis=1).mean(axis=1)


KL_SCHEMES = {"fp16": {"kind": "conventional", "fmt": "fp16"},
              "nvfp4": {"kind": "conventional", "fmt": "nvfp4"},
              "split": {"kind": "split", "fmt": "fp32", "read_fmt": "nvfp4"}}


def kl_deviation(engine: str) -> float:
    """Worst ``|kl / reference_kl - 1|`` of the engine's rows (2 sequences, vocab 64, 3 windows)
    against ``reference_kl`` of its own recorded outputs."""
    cfg = _mamba2_cfg(KL_SCHEMES, steps=96, run__seqs=2)
    res = (run_torch(cfg, "cpu", progress=False, record_outputs=True) if engine == "torch"
           else run_numpy(cfg, progress=False, record_outputs=True))
    out = res.info["outputs"]
    ro = Readout(cfg.model.heads * cfg.model.head_dim, cfg.metrics.vocab,
                 cfg.metrics.logit_scale, "cpu")
    dev = 0.0
    for name in KL_SCHEMES:
        want = reference_kl(out["truth"], out[name], ro, cfg.metrics.window)
        assert want.min() > 0
        dev = max(dev, float(np.abs(_column(res, name, "kl") / want - 1).max()))
    return dev


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_kl_matches_rel_entr(engine):
    """The engines' ``kl`` column against ``scipy.special.rel_entr``. The engines project the
    float32 difference ``yh_sim - yh_ref`` (not the logits) to keep tiny KLs; measured agreement
    (KL 1e-6 fp16 ... 0.8 NVFP4): within 3e-8 relative in both engines; limit 1e-6 (30x). A
    halved KL is off by 0.5."""
    assert kl_deviation(engine) < 1e-6


def split_read_mismatches(rounding: str) -> tuple[int, int]:
    """(elements where the split read copy differs from an ml_dtypes E4M3 cast of the master,
    elements) after two flushes of split(fp16/``rounding`` + fp8_e4m3 read), through
    ``precsim.schemes.Split`` (the torch engine's scheme)."""
    from precsim.families import get_family
    from precsim.schemes import build_schemes

    cfg = _mamba2_cfg({"s": {"kind": "split", "fmt": "fp16", "rounding": rounding,
                             "read_fmt": "fp8_e4m3"}})
    (s,) = build_schemes(cfg)
    s.init((1, 2, 8, 32), "cpu", torch.float32)
    wl = make_workload(cfg)
    for t0 in (0, 16):
        inp = {k: v.to(torch.float32) for k, v in wl.chunk(t0, t0 + 16).items()}
        inp["la"] = inp["dt"] * torch.as_tensor(wl.params["A"], dtype=torch.float32)
        s.run_segment(get_family("mamba2"), inp, {}, True, buffer_round=lambda v: v)
    master, read = s.state.numpy(), s.read.numpy()
    assert np.abs(master).max() < 400 and np.count_nonzero(master) > master.size // 2
    want = master.astype(ml_dtypes.float8_e4m3fn).astype(f32)
    return int(np.count_nonzero(read != want)), read.size


@pytest.mark.parametrize("rounding", ["sr", "rne"])
def test_split_read_copy_is_the_masters_rne_rounding(rounding):
    """The split scheme's read copy is the master rounded to ``read_fmt`` with RNE whatever the
    master's own rounding (README, schemes): equal, element for element, to an ml_dtypes E4M3
    cast of the master (RNE; the values stay within E4M3's range)."""
    assert split_read_mismatches(rounding)[0] == 0
