"""Divergence metrics: the readout's per-step top-1 agreement (``top1``) and the first flip
(``first_flip`` / ``flipped``), against an independent NumPy computation of the argmaxes and
against outputs constructed to flip at known steps."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import tiny_cfg

from precsim.config import to_config
from precsim.engines.numpy import run as run_numpy
from precsim.engines.torch import run as run_torch
from precsim.metrics import Accumulator, DeviceAccumulator, Readout
from precsim.result import summary_figures

SCHEMES = {
    "conventional_fp32": {"kind": "conventional", "fmt": "fp32"},
    "conventional_fp4": {"kind": "conventional", "fmt": "fp4_e2m1"},
    "shared_nvfp4_sr": {"kind": "shared", "fmt": "nvfp4", "rounding": "sr"},
    "split_fp32_nvfp4": {"kind": "split", "fmt": "fp32", "read_fmt": "nvfp4"},
}


def _numpy_divergence(out: dict, name: str, W: np.ndarray, scale: float, window: int):
    """Per window: (step, top1 mean, top1 per sequence, first_flip censored, flipped) from the
    recorded outputs ``(T, S, H, P)``, in float64 NumPy: logits_ref = scale W yhat_ref,
    logits_sim = logits_ref + scale W (yhat_sim - yhat_ref); agreement = same argmax and all
    finite."""
    T, S = out["truth"].shape[:2]
    yr = out["truth"].reshape(T, S, -1).astype(np.float64)
    ys = out[name].reshape(T, S, -1).astype(np.float64)

    def norm(y):
        rms = np.sqrt(np.mean(y * y, axis=-1, keepdims=True))
        return y / np.where(rms > 0, rms, 1.0)

    lr = scale * norm(yr) @ W.T
    ls = lr + scale * (norm(ys) - norm(yr)) @ W.T
    agree = (ls.argmax(-1) == lr.argmax(-1)) & np.isfinite(ls).all(-1)  # (T, S)
    first = np.array([np.flatnonzero(~agree[:, s])[0] + 1 if (~agree[:, s]).any() else 0
                      for s in range(S)])
    rows = []
    for end in range(window, T + 1, window):
        per_seq = agree[end - window:end].mean(axis=0)
        hit = (first > 0) & (first <= end)
        rows.append((end, per_seq.mean(), per_seq, np.where(hit, first, end).mean(),
                     int(hit.sum())))
    return rows


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_top1_and_first_flip_match_numpy_argmaxes(engine):
    cfg = to_config(tiny_cfg(steps=96, schemes=SCHEMES, run__seqs=3, metrics__window=32))
    r = {"torch": run_torch, "numpy": run_numpy}[engine](cfg, "cpu", progress=False,
                                                         record_outputs=True)
    H, P = cfg.model.heads, cfg.model.head_dim
    W = Readout(H * P, cfg.metrics.vocab, cfg.metrics.logit_scale, "cpu").W64.numpy()
    flipped_any = False
    for name in SCHEMES:
        mine = [row for row in r.rows if row["scheme"] == name]
        want = _numpy_divergence(r.info["outputs"], name, W, cfg.metrics.logit_scale, 32)
        assert [row["step"] for row in mine] == [w[0] for w in want]
        for row, (_, top1, per_seq, ff, nflip) in zip(mine, want, strict=True):
            assert row["top1"] == pytest.approx(top1, abs=1e-12)
            assert row["top1_p50"] == pytest.approx(np.percentile(per_seq, 50), abs=1e-12)
            assert row["top1_p10"] == pytest.approx(np.percentile(per_seq, 10), abs=1e-12)
            assert row["first_flip"] == pytest.approx(ff, abs=1e-12)
            assert row["flipped"] == nflip
            flipped_any |= nflip > 0
    assert flipped_any  # the comparison saw flips, not only agreement
    fp4 = [row for row in r.rows if row["scheme"] == "conventional_fp4"][-1]
    assert fp4["flipped"] == 3 and fp4["first_flip"] <= 8 and fp4["top1"] < 0.5  # early
    fig = summary_figures(r.rows, [32], 96)
    assert fig["conventional_fp32"]["final"]["flipped"] == 0
    assert fig["conventional_fp32"]["final"]["first_flip"] == 96  # censored at the run length
    assert fig["conventional_fp32"]["final"]["top1"] == 1.0
    assert fig["conventional_fp4"]["final"]["first_flip"] == fp4["first_flip"]


def test_fp64_scheme_never_flips():
    cfg = to_config(tiny_cfg(steps=64, run__seqs=2, run__compute_dtype="fp64", schemes={
        "c64": {"kind": "conventional", "fmt": "fp64"},
        "fp4": {"kind": "conventional", "fmt": "fp4_e2m1"}}))
    r = run_torch(cfg, "cpu", progress=False)
    c64 = [row for row in r.rows if row["scheme"] == "c64"]
    assert all(row["top1"] == 1.0 and row["top1_p10"] == 1.0 for row in c64)
    assert all(row["flipped"] == 0 and row["first_flip"] == row["step"] for row in c64)
    fp4 = [row for row in r.rows if row["scheme"] == "fp4"]
    assert fp4[-1]["flipped"] == 2 and fp4[-1]["first_flip"] < 16


@pytest.mark.parametrize("acc_cls", [Accumulator, DeviceAccumulator])
def test_constructed_flips_and_a_dead_scheme(acc_cls):
    """Outputs built to flip at known steps: ``-y`` negates the logits, so the argmax moves;
    a dead scheme (None / NaN) disagrees from its first step on."""
    g = torch.Generator().manual_seed(7)
    T, S, H, P = 24, 2, 2, 8
    y_ref = torch.randn(T, S, H, P, generator=g, dtype=torch.float64)
    flip = y_ref.clone()
    flip[4, 1] *= -1  # step 5 of sequence 1
    flip[13, 1] *= -1
    flip[17, 0] *= -1  # step 18 of sequence 0
    acc = acc_cls(["same", "flip", "dead"], 8, Readout(H * P, 32, 3.0, "cpu"))
    for a in range(0, T, 6):  # pushed in pieces that do not line up with the windows
        dead = None if acc_cls is Accumulator else torch.full_like(y_ref[a:a + 6], math.nan)
        acc.push(y_ref[a:a + 6], {"same": y_ref[a:a + 6].to(torch.float32),
                                  "flip": flip[a:a + 6], "dead": dead})
    acc.finish()
    if acc_cls is DeviceAccumulator:
        acc.to_host({"same": None, "flip": None, "dead": 1})
    rows = {(r["scheme"], r["step"]): r for r in acc.rows()}
    for end in (8, 16, 24):
        assert rows["same", end]["top1"] == 1.0 and rows["same", end]["flipped"] == 0
        assert rows["dead", end]["top1"] == 0.0 and rows["dead", end]["first_flip"] == 1.0
    assert rows["flip", 8]["top1"] == pytest.approx((1 + 7 / 8) / 2)
    assert (rows["flip", 8]["first_flip"], rows["flip", 8]["flipped"]) == ((8 + 5) / 2, 1)
    assert (rows["flip", 16]["first_flip"], rows["flip", 16]["flipped"]) == ((16 + 5) / 2, 1)
    assert rows["flip", 16]["top1"] == pytest.approx((1 + 7 / 8) / 2)
    assert (rows["flip", 24]["first_flip"], rows["flip", 24]["flipped"]) == ((18 + 5) / 2, 2)
    assert rows["flip", 24]["top1_p10"] == pytest.approx(np.percentile([7 / 8, 1], 10))
