"""Error feedback (``schemes.NAME.error_feedback``): its identities, its config errors, the same
states in every engine, its bytes in the cost model.

Write mode (the thread's, vLLM RFC #55196): at each rounding of the master ``X_t = U_t + E_{t-1}``
(``U_t`` the unrounded update or fold of the stored state), ``Q_t = Q(X_t)``,
``E_t = Q_e(X_t - Q_t)``. With an exact residual the injected rounding errors telescope:
``sum_t (Q_t - U_t) = -E_T`` (their mean, the scheme's long-run bias, is ``-E_T / T``); with no
decay the stored state is the exact state minus the last residual, ``Q_T - S_T = -E_T``; with a
decay ``0 < a_t <= 1`` (Mamba-2) ``G_t = (Q_t - S_t) + E_t`` obeys
``G_t = a_t G_{t-1} + (1 - a_t) E_{t-1}``, so ``|Q_t - S_t| <= |E_t| + max_{s<t} |E_s|``
elementwise: the state error stays within two quantisation steps at any length.
"""

from __future__ import annotations

import importlib
import os

import numpy as np
import pytest
import torch
from conftest import EF_SCHEMES, tiny_cfg

from precsim.config import SchemeConfig, to_config
from precsim.cost import scheme_cost, state_bytes
from precsim.engines import engine_module
from precsim.engines.held import compare, held_states
from precsim.errors import PrecsimError
from precsim.families import get_family
from precsim.schemes import Conventional, write_state


def _scheme(fmt, ef, rounding="rne", shape=(1, 2, 8, 16), dtype=torch.float64):
    s = Conventional(name="s", cfg=SchemeConfig(fmt=fmt, rounding=rounding, error_feedback=ef),
                     seed=0, fmt_options={}, tensor_scope="matrix")
    s.init(shape, "cpu", dtype)
    return s


def _mamba2_inputs(rng, shape, decay=True):
    S, H, P, N = shape
    return {"a": torch.from_numpy(np.exp(-rng.uniform(0, 0.05, (S, H))) if decay
                                  else np.ones((S, H))),
            "dt": torch.from_numpy(rng.uniform(0.001, 0.01, (S, H))),
            "x": torch.from_numpy(rng.standard_normal((S, H, P))),
            "B": torch.from_numpy(rng.standard_normal((S, H, N))),
            "C": torch.from_numpy(rng.standard_normal((S, H, N)))}


@pytest.mark.parametrize("fmt", ["int8_b16", "fp8_e4m3", "fp16"])
def test_fp64_residual_rounding_errors_telescope(fmt):
    """FP64 residual, float64 arithmetic, Mamba-2 without decay over 2,000 steps: the sum of the
    injected rounding errors is minus the last residual (bias -E_T/T -> 0), so the stored state
    is the exact state minus that residual (within one quantisation step) -- while round to
    nearest without it drifts many steps away (increments below half a step are rounded away)."""
    fam = get_family("mamba2")
    rng = np.random.default_rng(1)
    shape = (1, 2, 8, 16)
    ef, rtn = _scheme(fmt, "fp64"), _scheme(fmt, "none")
    S = torch.zeros(shape, dtype=torch.float64)
    injected = torch.zeros(shape, dtype=torch.float64)
    T = 2000
    for _ in range(T):
        inp = _mamba2_inputs(rng, shape, decay=False)
        S, _ = fam.step(S, inp)
        U, _ = fam.step(ef.state, inp)
        ef.write(U)
        injected += ef.state - U
        rtn.write(fam.step(rtn.state, inp)[0])
    scale = S.abs().max()
    assert (injected + ef.resid).abs().max() <= 1e-12 * T * scale
    assert (ef.state - S + ef.resid).abs().max() <= 1e-12 * T * scale
    err_ef, err_rtn = (ef.state - S).abs().max(), (rtn.state - S).abs().max()
    assert err_ef <= ef.resid.abs().max() + 1e-12 * T * scale  # at most half a step
    assert err_rtn > 10 * err_ef, (err_rtn, err_ef)


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_fp64_residual_with_decay_is_bounded_by_two_steps(family):
    """With decays (and GDN's delta rule) the telescoping identity still holds exactly; Mamba-2's
    state error obeys |Q_t - S_t| <= |E_t| + max_{s<t} |E_s| at every step."""
    fam = get_family(family)
    rng = np.random.default_rng(2)
    shape = (1, 2, 8, 16)
    s = _scheme("int8_b16", "fp64")
    S = torch.zeros(shape, dtype=torch.float64)
    injected = torch.zeros(shape, dtype=torch.float64)
    emax = torch.zeros(shape, dtype=torch.float64)
    for _ in range(500):
        if family == "mamba2":
            inp = _mamba2_inputs(rng, shape)
        else:
            k = rng.standard_normal((1, 2, 16))
            inp = {"a": torch.from_numpy(np.exp(-rng.uniform(0, 0.05, (1, 2)))),
                   "beta": torch.from_numpy(rng.uniform(0.1, 0.9, (1, 2))),
                   "k": torch.from_numpy(k / np.linalg.norm(k, axis=-1, keepdims=True)),
                   "v": torch.from_numpy(rng.standard_normal((1, 2, 8))),
                   "q": torch.from_numpy(rng.standard_normal((1, 2, 16)))}
        S, _ = fam.step(S, inp)
        U, _ = fam.step(s.state, inp)
        E_prev = s.resid
        s.write(U)
        injected += s.state - U
        emax = torch.maximum(emax, E_prev.abs())  # max_{s<t} |E_s|
        if family == "mamba2":
            assert ((s.state - S).abs() <= s.resid.abs() + emax + 1e-12).all()
    assert (injected + s.resid).abs().max() <= 1e-10 * S.abs().max()


@pytest.mark.parametrize("fmt,step,expect_first", [
    # fp16: ulp(1) = 2^-10; increments 2^-12 (a quarter ulp); hand-worked k = 1..4:
    # X = 1+2^-12 -> Q 1, E 2^-12; X = 1+2^-11 (a tie) -> Q 1 (even), E 2^-11;
    # X = 1+3*2^-12 -> Q 1+2^-10, E -2^-12; X = 1+2^-10 -> Q 1+2^-10, E 0
    ("fp16", 2.0**-12, [(1, 2**-12), (1, 2**-11), (1 + 2**-10, -2**-12), (1 + 2**-10, 0)]),
    # FP8 E4M3: ulp(1) = 2^-3; increments 2^-5, the same pattern one scale up
    ("fp8_e4m3", 2.0**-5, [(1, 2**-5), (1, 2**-4), (1 + 2**-3, -2**-5), (1 + 2**-3, 0)]),
])
def test_residual_in_the_states_own_format_closed_form(fmt, step, expect_first):
    """State and residual in the same format F, state 1 then increments ``d`` of a quarter ulp,
    no decay. Closed form: ``Q_k = fl_F(1 + k d)``, ``E_k = (1 + k d) - Q_k`` (every E_k is a
    multiple of d below half an ulp, so F holds it exactly); without the residual the state
    stays at 1 (every increment rounds away)."""
    s, rtn = (_scheme(fmt, e, shape=(1, 1, 1, 16), dtype=torch.float32) for e in (fmt, "none"))
    s.write(torch.ones((1, 1, 1, 16)))
    rtn.write(torch.ones((1, 1, 1, 16)))
    cast = {"fp16": np.float16, "fp8_e4m3": None}[fmt]
    import ml_dtypes

    cast = cast or ml_dtypes.float8_e4m3fn
    for k in range(1, 65):
        s.write(s.state + step)
        rtn.write(rtn.state + step)
        exact = 1 + k * step
        q = float(np.asarray(exact, np.float64).astype(cast))
        assert (s.state == q).all() and (s.resid == exact - q).all(), k
        if k <= 4:
            assert (q, exact - q) == expect_first[k - 1]
        assert (rtn.state == 1).all()


def test_write_state_numpy_equals_torch():
    """The NumPy and torch engines share write_state: the same bits from NumPy and torch."""
    rng = np.random.default_rng(3)
    x, e = rng.standard_normal((2, 2, 8, 32)).astype(np.float32)
    sc = SchemeConfig(fmt="fp8_e4m3_b32", rounding="sr", error_feedback="int8_b32")
    from precsim.schemes import quantize_state

    def q(v, f, r, p):
        return quantize_state(v, f, r, name="s", event=5, purpose=p, seed=0, sc=sc,
                              fmt_options={}, layer_scope=False)

    a = write_state(x, e, sc, q)
    b = write_state(torch.from_numpy(x), torch.from_numpy(e), sc, q)
    for u, v in zip(a, b, strict=True):
        np.testing.assert_array_equal(u.view(np.int32), v.numpy().view(np.int32))


@pytest.mark.parametrize("override,msg", [
    ({"error_feedback": "int5"}, "schemes.s.error_feedback='int5' is an unknown format; "
                                 "allowed: none, fp64"),
    ({"fmt": "fp32", "error_feedback": "fp16"}, "schemes.s.error_feedback='fp16' with "
                                                "fmt='fp32': the state is not rounded"),
    ({"error_feedback": "int8_b128"}, "model.state_dim=32 must be a multiple of 128"),
    ({"error_feedback": "e8m0"}, "cannot hold a state"),
])
def test_config_errors(override, msg):
    d = tiny_cfg(schemes={"s": {"kind": "conventional", "fmt": "fp16", **override}})
    with pytest.raises(PrecsimError) as e:
        to_config(d)
    assert "\n" not in str(e.value)
    assert msg.split("must")[0] in str(e.value), str(e.value)


def test_cli_rejects_an_unknown_residual_format(capsys):
    from conftest import run_main

    rc, out, err = run_main(["experiment=split_nvfp4", "run.steps=64", "metrics.window=32",
                             "schemes.shared_nvfp4_sr.error_feedback=int5"], capsys)
    assert rc == 2 and len(err) == 1, err
    assert "schemes.shared_nvfp4_sr.error_feedback='int5' is an unknown format; allowed: none, " \
        in err[0]


def test_cost_hand_count():
    """P = 64, N = 128: INT8 block 128 = 8 + 32/128 bits = 8,448 B; FP16 16,384 B."""
    kw = dict(family="mamba2", head_dim=64, state_dim=128, buffer_len=16)
    assert state_bytes("int8_b128", 64, 128) == 8448
    base = scheme_cost("conventional", "int8_b128", None, **kw)
    c = scheme_cost("conventional", "int8_b128", None, error_feedback="fp16", **kw)
    assert base["bytes_per_step"] == 2 * 8448 and base["resid_read"] == 0
    assert c["resid_read"] == c["resid_write"] == 16384
    assert c["bytes_per_step"] == 2 * 8448 + 2 * 16384  # 49,664: the residual costs 2.9x
    c = scheme_cost("conventional", "int8_b128", None, error_feedback="int8_b128", **kw)
    assert c["bytes_per_step"] == 4 * 8448  # an INT8 residual: as a 16.5-bit state
    # ReplaySSM: the residual moves once per flush, 2 B(F_e) / L per step
    s0 = scheme_cost("shared", "fp8_e4m3_b128", None, **kw)
    s1 = scheme_cost("shared", "fp8_e4m3_b128", None, error_feedback="int8_b128", **kw)
    assert s1["bytes_per_step"] - s0["bytes_per_step"] == 2 * 8448 / 16 == 1056
    sp = scheme_cost("split", "fp16", "nvfp4", error_feedback="fp16", **kw)
    assert sp["resid_read"] == 16384 / 16
    assert scheme_cost("shared", "fp16", None, error_feedback="none", **kw) == \
        scheme_cost("shared", "fp16", None, **kw)


# ---------------------------------------------------------------------------------------------
# the engines: the same states and residuals

SCHEMES = EF_SCHEMES


def _bits_equal(a, b):
    return np.array_equal(np.asarray(a, np.float32).view(np.int32),
                          np.asarray(b, np.float32).view(np.int32))


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_cpu_engines_hold_the_same_bits(family):
    """Every scheme's state and residual bit-equal in the torch and numba engines (Mamba-2: no
    reduction in the update, the fold's sum the same torch call; GDN: its reductions in one
    fixed order, ``families.base.key_dot``); every conventional one in the NumPy engine too (the
    family's one step). The NumPy engine's ReplaySSM evaluates another formula (another
    summation order): Mamba-2's fold within float32 rounding, GDN's window rows below."""
    pytest.importorskip("numba")
    cfg = to_config(tiny_cfg(family, steps=64, schemes=SCHEMES, replay__buffer_len=8,
                             run__threads=1))
    h = {e: held_states(e, cfg) for e in ("torch", "numpy", "numba")}
    for n, sc in SCHEMES.items():
        for j in (0, 1):
            assert _bits_equal(h["torch"][n][j], h["numba"][n][j]), (n, j)
            if sc["kind"] == "conventional":
                assert _bits_equal(h["torch"][n][j], h["numpy"][n][j]), (n, j)
        if sc["kind"] != "conventional" and family == "mamba2":  # Q + E: the fold within E's
            q, e = h["torch"][n]  # rounding
            np.testing.assert_allclose(sum(h["numpy"][n]), q + e, rtol=0,
                                       atol=np.abs(e).max() / 64 + 1e-6 * np.abs(q).max())
        if "error_feedback" in sc:
            assert np.abs(h["torch"][n][1]).max() > 0, n  # the residual is live


def test_gdn_numpy_engine_agrees():
    """GDN's NumPy engine (its ReplaySSM another formula, another summation order, whose rounding
    flips persist in a rounded state): the window rows within 2% of the torch engine's
    (measured 7e-5; its conventional schemes' states are bit-equal, above)."""
    cfg = to_config(tiny_cfg("gdn", steps=64, schemes=SCHEMES, replay__buffer_len=8,
                             run__threads=1))
    rows = {e: engine_module(e).run(cfg, "cpu", progress=False)
            .rows for e in ("torch", "numpy")}
    for a, b in zip(rows["numpy"], rows["torch"], strict=True):
        assert a["scheme"] == b["scheme"]
        assert a["rel_err"] == pytest.approx(b["rel_err"], rel=2e-2), a["scheme"]


def _triton_cfg(family, device):
    # 16 steps, L = 8: two flushes, the second folding the first's residual back in (the
    # interpreter spends ~0.3 s a step here; 32 steps took 19 s)
    d = tiny_cfg(family, steps=16, schemes={k: v for k, v in SCHEMES.items() if k != "c_fp16"},
                 replay__buffer_len=8, metrics__window=16, run__device=device)
    d["model"].update(head_dim=16, state_dim=32)
    return to_config(d)


def _triton_vs_torch(device):
    cfg = _triton_cfg("mamba2", device)
    c = compare(held_states("torch", cfg, device), held_states("triton", cfg, device), cfg)
    for n, r in c.items():  # conventional: bit-equal; replay: Q + E within E's rounding
        assert r["ok"], (n, r)
        assert r["resid_bits"] or cfg.schemes[n].kind != "conventional"
    cfg = _triton_cfg("gdn", device)
    ta = importlib.import_module("precsim.engines.triton").run(cfg, device, progress=False)
    tb = importlib.import_module("precsim.engines.torch").run(cfg, device, progress=False)
    for r, s in zip(ta.rows, tb.rows, strict=True):  # FP32: its error is summation order
        tol = 0.5 if s["rel_err"] < 1e-5 else 2e-2
        assert r["rel_err"] == pytest.approx(s["rel_err"], rel=tol), r["scheme"]


def test_triton_matches_torch_in_the_interpreter():
    """Triton's kernels (interpreter, tiny sizes) against the torch engine: Mamba-2 states and
    conventional residuals bit for bit; GDN's window rows close."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("no CUDA and no TRITON_INTERPRET")
    _triton_vs_torch("cpu" if not torch.cuda.is_available() else "cuda")


@pytest.mark.gpu
def test_triton_matches_torch_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    _triton_vs_torch("cuda")
