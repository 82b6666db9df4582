"""The scans of whole-model mode (precsim.models.scan, and scan_triton beside it): a dead
scheme group is reported at its first non-finite token by both."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest
import torch

tf = pytest.importorskip("transformers")

from conftest import MODEL_SCHEMES as SCHEMES  # noqa: E402


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_a_dead_scheme_is_reported_at_its_first_non_finite_token_by_both_scans(family,
                                                                              monkeypatch):
    """A scheme group whose inputs turn NaN at token 6 of a document (in a whole model: a layer
    below died there): the torch scan and the Triton scan (in the interpreter; each scan's
    check is read back at ``Chunks.settle``) both report ``dead_at`` 6 for that group only,
    and the same drift samples. Before the torch scan kept its ReplaySSM segment causal for
    non-finite inputs, the NaN reached token 5 through the Mamba-2 segment's masked products
    (0 * NaN) and it said 5 (GDN's segment, a sequential loop over the steps, was causal
    already)."""
    from precsim.config import SchemeConfig, to_config
    from precsim.models.hook import Step
    from precsim.models.scan import Chunks, Group, scan_torch
    from precsim.models.scan_triton import scan_triton

    monkeypatch.setattr("precsim.models.scan_triton.DRIFT_EVERY", 8)  # a sample every window
    T, K, H, P, G, N = 16, 2, 2, 16, 1, 16
    cfg = to_config({"schemes": SCHEMES, "replay": {"buffer_len": 4},
                     "metrics": {"window": 8}, "run": {"progress": False}})
    rng = np.random.default_rng(0)
    b = 4 * K  # the reference and three scheme groups, K documents each
    f32 = functools.partial(torch.tensor, dtype=torch.float32)
    if family == "mamba2":
        inp = {"dt": torch.tensor(rng.uniform(0.01, 0.1, (T, b, H))),
               "x": f32(rng.standard_normal((T, b, H, P))),
               "B": f32(rng.standard_normal((T, b, G, N))),
               "C": f32(rng.standard_normal((T, b, G, N)))}
        val, const = "x", {"A": -torch.ones(H)}
    else:
        kk = rng.standard_normal((T, b, G, N))
        inp = {"g": f32(-rng.uniform(0.01, 0.1, (T, b, H))),
               "beta": f32(rng.uniform(0.1, 0.9, (T, b, H))),
               "q": f32(rng.standard_normal((T, b, G, N)) / 4),
               "k": f32(kk / np.linalg.norm(kk, axis=-1, keepdims=True)),
               "v": f32(rng.standard_normal((T, b, H, P)))}
        val, const = "v", {}
    inp[val][5:, 2 * K + 1] = float("nan")  # group 2 ("shared"), its second document
    step = Step(layer=0, family=family, inp=inp, const=const, state=None, recurrent=False)
    got = {}
    for name in ("torch", "triton"):
        groups = [Group("reference", SchemeConfig(kind="shared", fmt="fp64"), reference=True),
                  *(Group(n, sc) for n, sc in cfg.schemes.items())]
        chunks = Chunks(horizon=T)
        if name == "torch":
            y = scan_torch(step, groups, K, cfg, torch.float32, chunks=chunks)
            # the dead document's rows only: the group's other document runs on, as without
            # the NaN (a task's other items in the same pass are not lost with it)
            clean = {k: v.clone() for k, v in inp.items()}
            clean[val][5:, 2 * K + 1] = clean[val][5:, 2 * K]
            y0 = scan_torch(Step(layer=0, family=family, inp=clean, const=const, state=None,
                                  recurrent=False),
                             [Group("reference", SchemeConfig(kind="shared", fmt="fp64"),
                                    reference=True),
                              *(Group(n, sc) for n, sc in cfg.schemes.items())],
                             K, cfg, torch.float32, chunks=Chunks(horizon=T))
            assert torch.isfinite(y[:, 2 * K]).all()
            assert torch.equal(y[:, 2 * K], y0[:, 2 * K])
            assert not torch.isfinite(y[5:, 2 * K + 1]).any()
            assert all(g.dead_at is None for g in groups)  # not yet read back
        else:
            scan_triton(step, groups, K, cfg, chunks=chunks)
            assert all(g.dead_at is None and not g.drift for g in groups)  # not yet read back
        chunks.settle()
        got[name] = {g.name: (g.dead_at, [t for t, *_ in g.drift.get(0, [])])
                     for g in groups[1:]}
    assert got["torch"] == {"fp32": (None, [8, 16]), "shared": (6, [8, 16]),
                            "split": (None, [8, 16])}
    assert got["triton"] == got["torch"]


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_one_token_steps_of_the_torch_scan_never_wait_for_the_gpu(family):
    """Generation's one-token steps (the torch scan continuing unfinished ReplaySSM segments,
    flushes with NVFP4-SR and NVFP4 read-copy roundings, the floor's dithered run) queue their
    work without a host synchronisation (``torch.cuda.set_sync_debug_mode("error")`` raises at
    any): a step that waits for the device stops the host from queuing the next layer's work,
    once per layer, group and token. The checks' read-back waits until ``Chunks.settle``."""
    from precsim.config import SchemeConfig, to_config
    from precsim.models.hook import Step
    from precsim.models.scan import Chunks, Group, scan

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    dev = torch.device("cuda")
    K, H, P, G, N, L, T = 2, 2, 16, 1, 16, 4, 10
    cfg = to_config({"schemes": SCHEMES, "replay": {"buffer_len": L},
                     "metrics": {"window": 64}, "run": {"progress": False}})
    groups = [Group("reference", SchemeConfig(kind="shared", fmt="fp64"), reference=True),
              *(Group(n, sc) for n, sc in cfg.schemes.items()),
              Group("noise", cfg.schemes["fp32"], dither=2.0 ** -24, role="noise")]
    b = len(groups) * K
    rng = np.random.default_rng(0)

    def f32(shape, lo=None, hi=None):
        a = rng.standard_normal(shape) if lo is None else rng.uniform(lo, hi, shape)
        return torch.tensor(a, dtype=torch.float32, device=dev)

    if family == "mamba2":
        inp = {"dt": f32((T, b, H), 0.01, 0.1), "x": f32((T, b, H, P)),
               "B": f32((T, b, G, N)), "C": f32((T, b, G, N))}
        const = {"A": -torch.ones(H, device=dev)}
    else:
        k = f32((T, b, G, N))
        inp = {"g": -f32((T, b, H), 0.01, 0.1), "beta": f32((T, b, H), 0.1, 0.9),
               "q": f32((T, b, G, N)) / 4, "k": k / torch.linalg.vector_norm(k, dim=-1,
                                                                            keepdim=True),
               "v": f32((T, b, H, P))}
        const = {}
    chunks = Chunks(horizon=T)
    torch.cuda.synchronize()
    ys = []
    try:
        with warnings.catch_warnings():  # ("a prototype feature": a warning, an error here)
            warnings.simplefilter("ignore", UserWarning)
            torch.cuda.set_sync_debug_mode("error")
        for t in range(T):  # one token a call, as write_tokens' steps (flushes at 4 and 8)
            chunks.offset = t
            step = Step(layer=0, family=family, inp={k: v[t:t + 1] for k, v in inp.items()},
                        const=const, state=None, recurrent=False)
            ys.append(scan(step, groups, K, cfg, torch.float32, chunks=chunks))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    chunks.settle()
    y = torch.cat(ys)
    assert y.shape[:2] == (T, b) and bool(torch.isfinite(y).all())
    assert all(g.dead_at is None for g in groups)
    flushes = [s.events for s in chunks.layers[0]]
    assert flushes[1] == T and flushes[2:4] == [2, 2], flushes  # conventional: every token


def test_dither_is_the_documented_perturbation_in_place_or_not():
    """``scan.dither``: each dithering group's rows times ``1 + d (2u - 1)`` in float64, rounded
    to y's dtype, u from a generator seeded by (seed, layer, offset, group index); the other
    rows untouched; the in-place form (the scans' fresh outputs) the same bits as the copy."""
    from precsim.models.scan import REFERENCE, Group, dither

    gs = [Group("ref", REFERENCE, reference=True), Group("a", REFERENCE),
          Group("n", REFERENCE, dither=2.0 ** -8)]
    for dt in (torch.float32, torch.bfloat16):
        y = torch.randn(9, 3 * 2, 4, 5).to(dt)
        gen = torch.Generator().manual_seed((7 * 1_000_003 + 3 * 7_919 + 64 * 104_729 + 2)
                                            % 2 ** 63)
        u = torch.rand((9, 2, 4, 5), generator=gen, dtype=torch.float64)
        want = y.clone()
        want[:, 4:6] = (y[:, 4:6].double() * (1 + 2.0 ** -8 * (2 * u - 1))).to(dt)
        copy = dither(y, gs, 2, 7, 3, 64)
        assert torch.equal(copy, want) and not torch.equal(copy, y)
        z = y.clone()
        assert dither(z, gs, 2, 7, 3, 64, inplace=True) is z and torch.equal(z, want)
