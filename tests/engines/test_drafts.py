"""Speculative decoding (``replay.drafts``): the acceptance models (a rate, a per-position
profile, a recorded sequence) and the fused engines against the torch engine with drafts.

The numba engine's states (and residuals) are the torch engine's bit for bit at every window end,
Mamba-2 and GDN (the irregular segments, the flush-step outputs from the checkpoint, the SR events
per flush; GDN's reductions in one fixed order, ``families.base.key_dot``); GDN's outputs too,
Mamba-2's differ only by the order of the S·C output reductions. The Triton engine's twin of
these checks (interpreter) is in tests/kernels/test_triton.py.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from conftest import EF_SCHEMES, SEED_TABLE, tiny_cfg

from precsim.checkpoint import Checkpoint
from precsim.config import ef_fmt, to_config
from precsim.engines.base import (
    accepted_counts,
    flush_schedule,
    launch_ends,
    mean_accepted,
    segment_ends,
    segment_phase,
)
from precsim.engines.torch import run as run_torch
from precsim.errors import PrecsimError

PROFILE = [0.9, 0.8, 0.7, 0.6]
DYING = {"shared_fp16_ieee": {"kind": "shared", "fmt": "fp16", "overflow": "ieee"},
         "conventional_fp16_ieee": {"kind": "conventional", "fmt": "fp16", "overflow": "ieee"}}


def _draws(cfg, n):
    it = accepted_counts(cfg)
    return np.array([next(it) for _ in range(n)])


@pytest.mark.parametrize("profile", [PROFILE, [0.6, 0.3], [0.95]])
def test_profile_acceptance_statistics(profile):
    """Accepted drafts per verification: P(a = k) = p_1...p_k (1 - p_{k+1}) and the mean
    sum_k p_1...p_k (closed forms), within 5 standard errors over 40,000 verifications."""
    T = 4
    cfg = to_config(tiny_cfg(replay__drafts=T, replay__acceptance=profile))
    a = _draws(cfg, 40_000)
    p = np.array((profile + [profile[-1]] * T)[:T])  # the last entry repeats
    surv = np.concatenate(([1.0], np.cumprod(p)))  # P(a >= k), k = 0..T
    pk = surv[:-1] - surv[1:]
    pk = np.append(pk, surv[-1])
    mean = surv[1:].sum()
    assert mean_accepted(cfg.replay) == pytest.approx(mean)
    var = (pk * np.arange(T + 1) ** 2).sum() - mean**2
    assert abs(a.mean() - mean) < 5 * np.sqrt(var / len(a))
    freq = np.bincount(a, minlength=T + 1) / len(a)
    assert np.all(np.abs(freq - pk) < 5 * np.sqrt(pk * (1 - pk) / len(a)) + 1e-12)


def test_scalar_rate_is_a_flat_profile_and_the_stream_is_unchanged():
    """A scalar rate and the flat profile draw the same verifications; the draws are the
    leading successes of T uniforms per verification from the [seed, 0xACCE] stream (the
    schedule before profiles existed)."""
    kw = dict(steps=3000, replay__drafts=3, replay__buffer_len=16)
    flat = to_config(tiny_cfg(replay__acceptance=[0.7], **kw))
    rate = to_config(tiny_cfg(replay__acceptance=0.7, **kw))
    assert list(flush_schedule(flat)) == list(flush_schedule(rate))
    rng = np.random.default_rng([0, 0xACCE])
    want = []
    for _ in range(500):
        ok = rng.random(3) < 0.7
        want.append(3 if ok.all() else int(np.argmin(ok)))
    np.testing.assert_array_equal(_draws(rate, 500), want)


def test_recorded_sequence_and_phases():
    cfg = to_config(tiny_cfg(steps=40, replay__buffer_len=16, replay__drafts=4,
                             replay__accept_seq=[4, 0, 2]))
    ends = segment_ends(cfg)
    np.testing.assert_array_equal(ends, [10, 22, 34, 40])
    ph = segment_phase(ends, 40, fold_output=False)
    assert (ph[ends - 1] & 3 == 1).all() and (ph & 1).sum() == 4  # flushes, output not from fold
    np.testing.assert_array_equal(ph[:11] >> 2, [*range(10), 0])
    nod = to_config(tiny_cfg(steps=40, replay__buffer_len=16))
    ph0 = segment_phase(segment_ends(nod), 40, fold_output=True)
    np.testing.assert_array_equal(ph0 >> 2, np.arange(40) % 16)
    assert set(np.flatnonzero(ph0 & 1)) == {15, 31, 39} and ((ph0 & 2) == 2 * (ph0 & 1)).all()
    assert launch_ends(ends, 16) == [22, 34, 40]
    assert launch_ends(np.array([16, 32, 48, 64, 80, 96, 100]), 24) == [32, 48, 80, 96, 100]


@pytest.mark.parametrize("value", ["[0.9,1.5]", "[]", "abc", "[0.5,0]", "nan", "[0.5,true]"])
def test_bad_acceptance_is_one_line(value):
    from omegaconf import OmegaConf

    d = tiny_cfg(replay__drafts=2)
    d["replay"]["acceptance"] = OmegaConf.create({"v": OmegaConf.create(f"v: {value}")["v"]})[
        "v"] if value.startswith("[") else (float(value) if value == "nan" else value)
    with pytest.raises(PrecsimError) as e:
        to_config(d)
    msg = str(e.value)
    assert "replay.acceptance" in msg and "per-position" in msg and "\n" not in msg


class Grab(Checkpoint):
    """Keeps a copy of the engine's whole state at every window end (no file)."""

    def __init__(self, cfg):
        super().__init__(cfg, None, every_s=0)
        self.states: dict[int, dict] = {}

    def window(self, pos, get_state):
        self.states[pos] = copy.deepcopy({k: v for k, v in get_state().items() if k != "acc"})


def _grow(monkeypatch, key, t_from, factor):
    """Inputs ``key`` times ``factor`` from step ``t_from`` on (an FP16 state overflows)."""
    from precsim import workload as wmod

    orig = wmod.RandomWorkload.chunk

    def big(self, t0, t1):
        out = dict(orig(self, t0, t1))
        scale = torch.where(torch.arange(t0, t1) >= t_from, factor, 1.0).to(out[key].dtype)
        out[key] = out[key] * scale.reshape(-1, *[1] * (out[key].ndim - 1))
        return out

    monkeypatch.setattr(wmod.RandomWorkload, "chunk", big)


def _cfg(family, **over):
    sch = {k: SEED_TABLE[k] for k in ("conventional_fp32", "shared_nvfp4_sr",
                                      "split_fp16sr_nvfp4", "split_fp32_nvfp4")}
    sch["shared_fp8_ef"] = EF_SCHEMES["s_fp8_ef"]  # (compiled once for both tests)
    d = tiny_cfg(family, steps=384, schemes={**sch, **DYING}, run__threads=1,
                 workload__kind="seed_article" if family == "mamba2" else "synthetic", **over)
    d["model"].update(head_dim=16, state_dim=32)
    d["metrics"]["window"] = 128
    return to_config(d)


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
@pytest.mark.parametrize("accept", [dict(replay__acceptance=0.7),
                                    dict(replay__acceptance=PROFILE),
                                    dict(replay__accept_seq=[3, 0, 4, 1])],
                         ids=["rate", "profile", "accept_seq"])
def test_numba_drafts_bit_identical_to_torch(monkeypatch, family, accept):
    """T = 4 drafts under each acceptance model, two schemes that die mid-run (the inputs grow
    from step 200): every live scheme's state, residual (error feedback) and split's read copy
    equal to the torch engine's bit for bit at every window end, the same flushes and dead
    steps; GDN's outputs bit for bit and its window rows to the float64 truth's rounding (each
    engine computes the truth its own way), Mamba-2's outputs within float32 reduction noise."""
    pytest.importorskip("numba")
    from precsim.engines.numba_host import run as run_numba

    _grow(monkeypatch, "x" if family == "mamba2" else "v", 200, 1e5 if family == "mamba2"
          else 1e6)
    cfg = _cfg(family, replay__drafts=4, **accept)
    gn, gt = Grab(cfg), Grab(cfg)
    rn = run_numba(cfg, progress=False, record_outputs=True, ckpt=gn)
    rt = run_torch(cfg, "cpu", progress=False, record_outputs=True, ckpt=gt)
    assert rn.engine == "numba" and "numba_fallback" not in rn.info
    assert rn.info["flushes"] == rt.info["flushes"] > 384 / 16
    assert rn.schemes == rt.schemes
    dead = {n: rn.schemes[n]["dead_at"] for n in DYING}
    assert all(d is not None and d > 200 for d in dead.values()), dead
    names = list(cfg.schemes)
    compared = 0
    for pos in sorted(set(gn.states) & set(gt.states)):  # the numba engine's window ends
        a, b = gn.states[pos], gt.states[pos]
        for i, n in enumerate(names):
            if b["dead_at"][n] is not None:
                continue
            want = b["schemes"][i]
            shape = want["state"].shape
            np.testing.assert_array_equal(a["st"][i].reshape(shape), want["state"].numpy())
            if cfg.schemes[n].kind == "split":
                np.testing.assert_array_equal(a["rd"][i].reshape(shape), want["read"].numpy())
            if ef_fmt(cfg.schemes[n]):
                assert np.abs(want["resid"].numpy()).max() > 0, n  # live
                np.testing.assert_array_equal(a["ef"][i].reshape(shape), want["resid"].numpy())
            compared += 1
    assert compared >= 3 * 5
    for n in names:
        yn, yt = rn.info["outputs"][n], rt.info["outputs"][n]
        live = np.isfinite(yt)
        np.testing.assert_array_equal(np.isfinite(yn), live)
        if family == "gdn":
            np.testing.assert_array_equal(yn, yt)
        else:
            assert np.abs(yn[live] - yt[live]).max() <= 1e-6 * np.abs(yt[live]).max(), n
    if family == "gdn":
        for a, b in zip(rn.rows, rt.rows, strict=True):
            assert (a["scheme"], a["step"]) == (b["scheme"], b["step"])
            assert a["rel_err"] == pytest.approx(b["rel_err"], rel=1e-9, nan_ok=True), (a, b)
