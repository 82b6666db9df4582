"""Per-layer precision (schemes.NAME.layers, experiment=per_layer) on tiny random checkpoints
built offline: a per-layer map at one format is the uniform scheme, the exact assignment, a
planted sensitive layer, the tightening on a missed verification, and the bad-input lines."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

tf = pytest.importorskip("transformers")

from conftest import run_main  # noqa: E402

from precsim import models  # noqa: E402
from precsim.config import to_config  # noqa: E402
from precsim.cost import scheme_cost  # noqa: E402
from precsim.errors import PrecsimError  # noqa: E402
from precsim.models import per_layer as pl_mod  # noqa: E402
from precsim.models.run import run_model_kl  # noqa: E402

PLANT = 1  # the planted sensitive layer of the 3-layer model


def _mamba2(path, layers: int = 3, plant: int | None = None):
    """A tiny Mamba-2 (weights N(0, 0.2^2), heads decaying ~5% per token). ``plant``: that
    layer's output is all state (D = 0) and the others' mostly their skip (D = 20), so the
    planted layer's state error dominates the logits' (measured: its NVFP4 read copy adds
    ~200x the KL any other layer's does)."""
    cfg = tf.Mamba2Config(vocab_size=96, hidden_size=32, num_hidden_layers=layers, num_heads=4,
                          head_dim=16, expand=2, state_size=16, n_groups=2, conv_kernel=4,
                          chunk_size=8, initializer_range=0.2)
    torch.manual_seed(0)
    m = tf.Mamba2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for i, mixer, _ in models.ssm_layers(m):
            mixer.A_log.fill_(float(np.log(0.05)))
            if plant is not None:
                mixer.D.fill_(0.0 if i == plant else 20.0)
    m.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("perlayer")
    np.save(root / "ids.npy", np.random.default_rng(2).integers(0, 96, (1, 32)))
    return {"plain": _mamba2(root / "plain"), "planted": _mamba2(root / "planted", plant=PLANT),
            "ids": root / "ids.npy", "root": root}


def _cfg(ck, schemes, steps=32, **over):
    d = {"model": {"path": str(ck["planted"]), "ids": str(ck["ids"])}, "schemes": schemes,
         "run": {"steps": steps, "progress": False}, "metrics": {"window": 16},
         "replay": {"buffer_len": 4}}
    for key, val in over.items():
        sec, _, k = key.partition("__")
        d.setdefault(sec, {})[k] = val
    return to_config(d)


SPLIT = {"kind": "split", "fmt": "fp32", "read_fmt": "nvfp4"}
SHARED_SR = {"kind": "shared", "fmt": "nvfp4", "rounding": "sr"}


@pytest.mark.parametrize("scheme,mode", [(SPLIT, "parallel"), (SHARED_SR, "parallel"),
                                         (SHARED_SR, "decode")])
def test_every_layer_at_one_format_is_the_uniform_scheme_bit_for_bit(ckpts, scheme, mode):
    """A per-layer map naming every SSM layer at the uniform scheme's format (its default set to
    another format, so the map decides) gives the uniform scheme's numbers exactly, SR included
    (same scheme name, same random bits); a map differing in one layer does not."""
    slot = "read_fmt" if scheme["kind"] == "split" else "fmt"
    runs = {}
    for key, layers in (("uniform", None), ("all", {0: "nvfp4", 1: "nvfp4", 2: "nvfp4",
                                                    "default": "fp16"}),
                        ("one", {1: "fp16", "default": "nvfp4"})):
        s = {**scheme, **({"layers": layers} if layers else {})}
        runs[key] = run_model_kl(_cfg(ckpts, {"s": s}, 16, model__mode=mode,
                                      model__path=str(ckpts["plain"])), "cpu", progress=False)
    u, a, o = (runs[k].per_step_rel_err for k in ("uniform", "all", "one"))
    assert u.keys() == a.keys()
    for k in u:
        assert np.array_equal(u[k], a[k]), k
    assert runs["uniform"].rows == runs["all"].rows
    assert not np.array_equal(u["s:kl"], o["s:kl"])
    assert scheme[slot] == "nvfp4"


def test_per_layer_cost_sums_each_layers_format(ckpts):
    """bytes_per_token: every SSM layer's heads at its own format (the cost model's per-head
    bytes of each format); bytes_per_step: their mean per head."""
    from precsim.result import build_summary

    c = _cfg(ckpts, {"u": SPLIT, "p": {**SPLIT, "layers": {2: "fp16", "default": "fp8_e4m3"}}},
             8, metrics__window=8)
    cost = build_summary(c, run_model_kl(c, "cpu", progress=False))["cost"]
    one = {f: scheme_cost("split", "fp32", f, family="mamba2", head_dim=16, state_dim=16,
                          buffer_len=4)["bytes_per_step"] for f in ("nvfp4", "fp16", "fp8_e4m3")}
    assert cost["u"]["bytes_per_token"] == pytest.approx(3 * 4 * one["nvfp4"])
    assert cost["p"]["bytes_per_token"] == pytest.approx(4 * (one["fp16"] + 2 * one["fp8_e4m3"]))
    assert cost["p"]["bytes_per_step"] == pytest.approx((one["fp16"] + 2 * one["fp8_e4m3"]) / 3)


def test_the_assignment_is_the_exact_knapsack():
    """Against brute force over every assignment: the same fewest bytes within the cap (and
    None exactly when no assignment fits), on random instances with unequal byte steps."""
    rng = np.random.default_rng(0)
    for _ in range(40):
        L, F = int(rng.integers(1, 6)), int(rng.integers(2, 4))
        fmts = [f"f{i}" for i in range(F)]
        cost = {f: float(rng.integers(1, 20)) for f in fmts}
        delta = {la: {f: float(rng.exponential()) for f in fmts} for la in range(L)}
        cap = float(rng.uniform(0, 2 * L))
        best = min((sum(cost[f] for f in a), sum(delta[la][f] for la, f in enumerate(a)))
                   for a in itertools.product(fmts, repeat=L)
                   if sum(delta[la][f] for la, f in enumerate(a)) <= cap) \
            if any(sum(delta[la][f] for la, f in enumerate(a)) <= cap
                   for a in itertools.product(fmts, repeat=L)) else None
        got, err = pl_mod.cheapest(delta, cost, cap)
        if best is None:
            assert got is None
            continue
        assert sum(cost[f] for f in got.values()) == pytest.approx(best[0])
        assert err == pytest.approx(sum(delta[la][f] for la, f in got.items())) and err <= cap


def test_planted_sensitive_layer_gets_the_wider_format(ckpts, tmp_path):
    """The planted layer adds the most error in every lossy format; the verified assignment puts
    a wider format there and NVFP4 everywhere else, fits the budget, and costs fewer bytes per
    token than the best uniform scheme (uniform NVFP4 misses the budget)."""
    from precsim.report import run_verdict
    from precsim.result import write_outputs

    c = _cfg(ckpts, {"split": SPLIT}, metrics__budget_metric="kl", metrics__budget=1e-3,
             per_layer__formats=["fp16", "fp8_e4m3", "nvfp4"])
    r = pl_mod.run_per_layer(c, "cpu", progress=False)
    pl = r.info["per_layer"]
    for f in ("fp8_e4m3", "nvfp4"):
        added = pl["added"][f]
        assert max(added, key=added.get) == PLANT
        assert added[PLANT] > 20 * max(v for la, v in added.items() if la != PLANT)
    a = pl["rounds"][-1]["layers"]
    assert a["default"] == "nvfp4" and set(a) == {PLANT, "default"}
    assert a[PLANT] in ("fp16", "fp8_e4m3")
    assert pl["verified"] and pl["rounds"][-1]["measured"] <= 1e-3
    assert pl["uniform"]["nvfp4"]["value"] > 1e-3  # the narrow uniform scheme misses
    best = pl["best_uniform"]
    assert best in ("fp16", "fp8_e4m3")
    assert pl["rounds"][-1]["bytes_per_token"] < pl["uniform"][best]["bytes_per_token"]
    # the verification's own figures are the run's (per_layer scheme's last window)
    assert pl["rounds"][-1]["measured"] == [x for x in r.rows if x["scheme"] == "per_layer"][-1][
        "kl"]
    s = write_outputs(c, r, tmp_path)
    assert (tmp_path / "sensitivity.csv").read_text().count("\n") == 1 + 3 * 3
    assert (tmp_path / "sensitivity.png").stat().st_size > 0
    assert s["cost"]["per_layer"]["bytes_per_token"] == pytest.approx(
        pl["rounds"][-1]["bytes_per_token"])
    text = run_verdict(s, "kl", 1e-3, tmp_path)
    assert "verified:" in text and "fewer than the best uniform" in text
    assert f"schemes.split.layers='{{{PLANT}: {a[PLANT]}, default: nvfp4}}'" in text


def test_a_missed_verification_tightens_and_is_never_called_a_fit(ckpts, monkeypatch):
    """When the verification run misses the budget the target tightens and the next assignment
    is verified again; if every round misses, the result and the verdict say NOT VERIFIED."""
    from precsim.report import run_verdict
    from precsim.result import build_summary

    real = pl_mod.final
    monkeypatch.setattr(pl_mod, "final", lambda r, name, metric: math.inf
                        if name == pl_mod.ASSIGNED else real(r, name, metric))
    c = _cfg(ckpts, {"split": SPLIT}, 16, metrics__window=8, metrics__budget_metric="kl",
             metrics__budget=1e-3, per_layer__formats=["fp16", "nvfp4"], per_layer__rounds=2,
             model__path=str(ckpts["plain"]))
    r = pl_mod.run_per_layer(c, "cpu", progress=False)
    pl = r.info["per_layer"]
    assert not pl["verified"] and len(pl["rounds"]) == 2
    assert pl["rounds"][1]["target"] < pl["rounds"][0]["target"]
    assert pl["rounds"][1]["predicted"] <= pl["rounds"][0]["predicted"]
    text = run_verdict(build_summary(c, r), "kl", 1e-3, ".")
    assert "NOT VERIFIED" in text and "verified:" not in text


def test_record_directory_replays_each_layer_at_its_format(ckpts, tmp_path):
    """workload=trace over a recording: a per-layer scheme replays each layer at that layer's
    format, the same numbers as the uniform scheme of that format."""
    from precsim.api import simulate
    from precsim.record import main as record_main

    rec = tmp_path / "rec"
    assert record_main(["--model", str(ckpts["plain"]), "--tokens", "16", "--out",
                        str(rec)]) == 0
    base = {"workload": {"kind": "trace", "path": str(rec)}, "replay": {"buffer_len": 4},
            "run": {"steps": 16, "progress": False, "device": "cpu", "engine": "torch"},
            "metrics": {"window": 8, "vocab": 8}}
    for layer, fmt in ((0, "fp16"), (1, "nvfp4")):
        w = {**base["workload"], "layer": layer}
        per = simulate({**base, "workload": w, "schemes": {
            "s": {**SPLIT, "layers": {0: "fp16", "default": "nvfp4"}}}})
        uni = simulate({**base, "workload": w, "schemes": {"s": {**SPLIT, "read_fmt": fmt}}})
        assert np.array_equal(per.per_step_rel_err["s"], uni.per_step_rel_err["s"]), layer
    with pytest.raises(PrecsimError, match=r"schemes.s.fmt='int8_b128': its block of 128 does "
                                           r"not divide the state's last axis, 16 \(the state "
                                           r"dim of the trace .*\); allowed: .* int8_b16"):
        simulate({**base, "workload": {**base["workload"], "layer": 0},
                  "schemes": {"s": {"kind": "conventional", "fmt": "int8_b128"}}})
    with pytest.raises(PrecsimError, match=r"schemes.s.layers: layer 5 is not in the recording"):
        simulate({**base, "workload": {**base["workload"], "layer": 0},
                  "schemes": {"s": {**SPLIT, "layers": {5: "fp16"}}}})


def test_out_of_memory_mid_run_is_one_line(ckpts, monkeypatch):
    """A forward pass that runs out of device memory (a hybrid's attention over a long
    document: chunk x everything before it) is a one-line error saying what to shrink."""
    from precsim.models import parallel

    def oom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 120.00 GiB")

    monkeypatch.setattr(parallel, "run_parallel", oom)
    with pytest.raises(PrecsimError, match=r"the whole-model run ran out of cpu memory \(1 "
                                           r"document\(s\) x 4 rows .*, 32 tokens each\); "
                                           r"allowed: a smaller model.chunk \(now 32 positions"):
        run_model_kl(_cfg(ckpts, {"s": SPLIT}), "cpu", progress=False)


def test_per_layer_bad_inputs_are_one_line(ckpts, tmp_path, capsys):
    def fails(schemes, match, **over):
        with pytest.raises(PrecsimError, match=match):
            run_model_kl(_cfg(ckpts, schemes, 8, metrics__window=8, **over), "cpu",
                         progress=False)

    fails({"s": {**SPLIT, "layers": {7: "fp16"}}},
          r"schemes.s.layers: layer 7 is not in Mamba2ForCausalLM at .* \(it has layers 0..2\); "
          r"allowed: the SSM layers 0, 1, 2")
    fails({"s": {**SPLIT, "layers": {0: "fp5"}}},
          r"schemes.s.layers.0='fp5' is an unknown format; allowed: ")
    fails({"s": {**SPLIT, "layers": {"first": "fp16"}}},
          r"schemes.s.layers='first' is invalid; allowed: layer indices >= 0 and default")
    fails({"s": SPLIT}, r"per_layer.formats=\['fp16'\] is invalid; allowed: two or more",
          per_layer__formats=["fp16"])
    fails({"s": SPLIT}, r"metrics.budget_metric='state_drift' is invalid; allowed: kl, rel_err "
          r"or accuracy in experiment=per_layer \(.*not state_drift\)",
          per_layer__formats=["fp16", "nvfp4"], metrics__budget_metric="state_drift")
    # a block format whose block does not divide the checkpoint's state (16 wide here)
    fails({"s": {"kind": "conventional", "fmt": "fp16", "rounding": "rne",
                 "layers": {1: "int8_b128", "default": "fp16"}}},
          r"schemes.s.layers.1='int8_b128': its block of 128 does not divide the state's last "
          r"axis, 16 \(state_dim of Mamba2ForCausalLM at .*\); allowed: a block size dividing 16 "
          r"\(e.g. int8_b16\)")
    with pytest.raises(PrecsimError, match=r"schemes.s.layers=.* is invalid; allowed: per-layer "
                                           r"formats with model.path"):
        to_config({"schemes": {"s": {**SPLIT, "layers": {0: "fp16"}}}})
    # a layer that is not an SSM layer (a hybrid's attention layer)
    cfg = tf.NemotronHConfig(vocab_size=96, hidden_size=32, num_hidden_layers=3,
                             layers_block_type=["mamba", "attention", "mamba"], mamba_num_heads=4,
                             mamba_head_dim=8, ssm_state_size=16, n_groups=2, head_dim=16,
                             num_attention_heads=2, num_key_value_heads=1, intermediate_size=32)
    torch.manual_seed(0)
    tf.NemotronHForCausalLM(cfg).save_pretrained(tmp_path / "hyb")
    fails({"s": {**SPLIT, "layers": {1: "fp16"}}},
          r"schemes.s.layers: layer 1 of NemotronHForCausalLM at .* is not an SSM layer "
          r"\(type 'full_attention'\); allowed: the SSM layers 0, 2",
          model__path=str(tmp_path / "hyb"))
    # through the command line: exit 2 and one line
    rc, _, err = run_main(["experiment=model_kl", "schemes=per_layer",
                           f"model.path={ckpts['plain']}", "schemes.split.layers={9: fp16}",
                           "run.steps=8", "metrics.window=8",
                           f"hydra.run.dir={tmp_path / 'run'}"], capsys)
    assert rc == 2 and len(err) == 1 and "layer 9 is not in Mamba2ForCausalLM" in err[0], err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_triton_scan_takes_each_layers_format(ckpts):
    """The Triton scan backend: a per-layer map at one format equals the uniform scheme, and a
    map with one layer at FP16 differs."""
    out = {}
    for key, layers in (("uniform", None), ("all", {0: "nvfp4", 1: "nvfp4", 2: "nvfp4",
                                                    "default": "fp16"}),
                        ("one", {1: "fp16", "default": "nvfp4"})):
        s = {**SHARED_SR, **({"layers": layers} if layers else {})}
        r = run_model_kl(_cfg(ckpts, {"s": s}, 32, run__engine="triton"), "cuda", progress=False)
        assert r.info["scan_backend"] == "triton"
        out[key] = r.per_step_rel_err["s:kl"]
    assert np.array_equal(out["uniform"], out["all"])
    assert not np.array_equal(out["uniform"], out["one"])


def test_a_sweep_over_per_layer_maps_and_its_report(ckpts, tmp_path, capsys):
    """A multirun over two per-layer maps; the report ranks them by bytes (a per-layer scheme's
    bytes per step: its layers' mean) and recommends the one within the budget."""
    from precsim.report import main as report_main

    sweep = tmp_path / "sw"
    rc, _, err = run_main(["-m", "experiment=model_kl", "schemes=per_layer",
                           f"model.path={ckpts['planted']}", f"model.ids={ckpts['ids']}",
                           "schemes.split.layers={1: fp16, default: nvfp4},{default: nvfp4}",
                           "run.steps=16", "metrics.window=8", "replay.buffer_len=4",
                           "metrics.plot=false", f"hydra.sweep.dir={sweep}"], capsys)
    assert rc in (0, None), err
    assert report_main([str(sweep), "--metric", "kl", "--budget", "1e-3", "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "recommended: split(fp32 update + nvfp4 read; layer 1: fp16)" in out
    assert "the next cheaper (split(fp32 update + nvfp4 read), 1,122 B) misses it" in out
