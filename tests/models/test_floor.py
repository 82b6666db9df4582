"""Whole-model verdicts against their floor (issue 39): the FP32 state and the model's own noise
beside every run, bootstrap intervals, verdicts that recommend nothing below the floor, and
``model.mode=generate`` checked against a token-by-token free-running decode."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from conftest import MODEL_SCHEMES as SCHEMES
from conftest import build, kl_cfg, one_line_errors, run_main

from precsim.models.metrics import boot_ci, docs_to_separate
from precsim.models.run import prepare, run_model_kl


@pytest.fixture(scope="module")
def m2(tmp_path_factory):
    """A tiny Mamba-2 whose SSM layers matter (slowly decaying heads, weights N(0, 0.2^2)), and
    four 24-token documents of ids."""
    root = tmp_path_factory.mktemp("floor")
    build("Mamba2ForCausalLM", 0.2, slow_decay=True).save_pretrained(root / "m2")
    np.save(root / "ids.npy", np.random.default_rng(2).integers(0, 96, (4, 24)))
    return root


def _cfg(root, schemes=SCHEMES, steps=24, **over):
    over.setdefault("metrics__baseline", "fp32")
    return kl_cfg(root / "m2", schemes, steps, model__ids=str(root / "ids.npy"),
                   run__seqs=4, **over)


def test_the_floor_is_in_every_whole_model_result(m2):
    """The FP32 state against float64 and the noise run against the baseline are measured in
    every run; with float32 weights the FP32 state's KL is float32 noise (<= 1e-10 here, the
    NVFP4 schemes' >= 1e-5), and the noise run's is the same order; each scheme's KL is against
    the FP32 state (the FP32 scheme itself: 0)."""
    r = run_model_kl(_cfg(m2, model__dtype="float32"), "cpu", progress=False)
    f = r.info["floor"]
    assert f["baseline"] == "fp32" and f["baseline_name"] == "fp32"
    assert 0 < f["fp32_vs_fp64"]["kl"] < 1e-10 and 0 < f["noise"]["kl"] < 1e-10
    assert f["dither"] == 2.0 ** -24 and f["model_dtype"] == "float32"
    last = {row["scheme"]: row for row in r.rows if row["step"] == 24}
    assert last["fp32"]["kl"] == 0 and last["fp32"]["top1"] == 1
    assert last["shared"]["kl"] > 1e-5 and last["split"]["kl"] > 1e-6
    # against fp64 the same schemes differ by the FP32 state's own (tiny) distance
    r64 = run_model_kl(_cfg(m2, model__dtype="float32", metrics__baseline="fp64"), "cpu",
                       progress=False)
    last64 = {row["scheme"]: row for row in r64.rows if row["step"] == 24}
    assert last64["fp32"]["kl"] == pytest.approx(f["fp32_vs_fp64"]["kl"], rel=1e-6)
    assert last64["split"]["kl"] == pytest.approx(last["split"]["kl"], rel=1e-3)


def test_a_bf16_floor_above_the_budget_recommends_nothing(m2, tmp_path, capsys, monkeypatch):
    """bf16 weights: the model's own noise (SSM outputs dithered at 2^-8) is far above float32
    noise; with a budget below it the verdict names the floor, model.dtype=float32 and the least
    budget the floor allows, and recommends no scheme; the table and summary.json carry it."""
    monkeypatch.chdir(tmp_path)
    rc, out, err = run_main(["experiment=model_kl", f"model.path={m2 / 'm2'}",
                             f"model.ids={m2 / 'ids.npy'}", "run.steps=24", "run.seqs=4",
                             "metrics.window=8", "replay.buffer_len=4", "model.dtype=bfloat16",
                             "metrics.budget=1e-7", "run.progress=false", "metrics.plot=false",
                             f"hydra.run.dir={tmp_path / 'run'}"], capsys)
    assert rc == 0, err
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    noise = s["info"]["floor"]["noise"]["kl"]
    assert noise > 1e-7 and s["info"]["floor"]["model_dtype"] == "bfloat16"
    assert "recommended:" not in out
    line = next(ln for ln in out.splitlines() if ln.startswith("NO recommendation"))
    assert "model.dtype=float32" in line and "exceeds the budget 1e-07" in line
    assert f"{noise:.3g}" in line
    assert "the model's own noise:" in out and "FP32 state vs float64:" in out
    assert "floor: FP32 state vs float64 KL" in out  # the table's line


def test_a_scheme_within_the_noise_says_so(m2):
    """A scheme no different from the baseline reads 'within the floor's noise' when its KL is
    at or below the noise run's interval: the verdict does not call it a difference."""
    from precsim.report import run_verdict

    summary = {"steps": 24, "figures": {
        "a": {"final": {"kl": 1e-6, "kl_lo": 5e-7, "kl_hi": 2e-6}},
        "b": {"final": {"kl": 1e-3, "kl_lo": 5e-4, "kl_hi": 2e-3}}},
        "schemes": {"a": {}, "b": {}}, "cost": {"a": {"bytes_per_step": 100},
                                                "b": {"bytes_per_step": 50}},
        "info": {"workload": "model", "floor": {
            "baseline": "fp32", "baseline_name": "fp32", "model_dtype": "bfloat16",
            "dither": 2 ** -8,
            "fp32_vs_fp64": {"kl": 0.0, "kl_lo": 0.0, "kl_hi": 0.0, "top1": 1, "flip_rate": 0},
            "noise": {"kl": 2e-6, "kl_lo": 1e-6, "kl_hi": 4e-6, "top1": 1, "flip_rate": 0,
                      "per_doc_kl": [1e-6, 3e-6]},
            "schemes": {}}}}
    text = run_verdict(summary, "kl", 1e-2, "/x")
    a = next(ln for ln in text.splitlines() if ln.strip().startswith("a "))
    b = next(ln for ln in text.splitlines() if ln.strip().startswith("b "))
    assert "within the floor's noise" in a and "within the floor's noise" not in b


def test_intervals_against_a_direct_bootstrap():
    """boot_ci over documents equals scipy's percentile bootstrap of the mean (to Monte Carlo
    error); over documents and seeds it is wider than over documents alone when the seeds
    differ; one document gives no interval."""
    from scipy.stats import bootstrap

    rng = np.random.default_rng(5)
    v = rng.lognormal(-8, 1.0, 40)
    lo, hi = boot_ci(v, B=20000)
    ref = bootstrap((v,), np.mean, n_resamples=20000, method="percentile",
                    random_state=1).confidence_interval
    assert lo == pytest.approx(ref.low, rel=0.03) and hi == pytest.approx(ref.high, rel=0.03)
    assert lo < v.mean() < hi
    seeds = np.concatenate([v, v * 3])  # two seeds, the second 3x the first
    lo2, hi2 = boot_ci(seeds, seeds=2, B=20000)
    lo1, hi1 = boot_ci(seeds.reshape(2, -1).mean(axis=0), B=20000)
    assert hi2 - lo2 > 1.5 * (hi1 - lo1)
    assert all(math.isnan(x) for x in boot_ci(np.array([1.0])))


def test_documents_to_separate_two_schemes():
    """The paired sample size: two schemes whose per-document difference is 1 +- 1 need about
    (1.96 + 0.84)^2 = 7.85 -> 8 documents; identical ones never separate."""
    rng = np.random.default_rng(0)
    d = rng.normal(0, 1, 100_000)
    d = (d - d.mean()) / d.std(ddof=1) + 1
    assert docs_to_separate(d, np.zeros_like(d)) == 8
    assert docs_to_separate(np.ones(5), np.ones(5)) == math.inf


def test_sr_seeds_pool_into_one_row(m2):
    """run.sr_seeds=3: an SR scheme runs under three seeds (other SR bits each), pooled into
    one row whose mean is the seeds' mean; a round-to-nearest scheme runs once."""
    r = run_model_kl(_cfg(m2, model__dtype="float32", run__sr_seeds=3), "cpu", progress=False)
    kl = r.per_step_rel_err["shared:kl"]
    assert kl.shape == (24, 12) and r.per_step_rel_err["split:kl"].shape == (24, 4)
    per_seed = kl.reshape(24, 3, 4).mean(axis=(0, 2))
    assert len(set(np.round(per_seed, 12))) == 3  # three different SR streams
    r1 = run_model_kl(_cfg(m2, model__dtype="float32"), "cpu", progress=False)
    assert np.array_equal(r1.per_step_rel_err["shared:kl"], kl[:, :4])  # seed 0 is the run's


def _free_decode(model, ids, group, cfg, G):
    """Greedy free-running generation of one group, token by token through decode mode's
    per-layer schemes (an independent implementation): the G tokens written after each
    document (one document at a time)."""
    from precsim.models.decode import DecodeHandler, forward_token
    from precsim.models.hook import Hook

    out = []
    for k in range(ids.shape[0]):
        h = DecodeHandler(group, cfg, torch.float64, None)
        cache, toks = None, []
        with torch.no_grad(), Hook(model) as hook:
            hook.handler = h
            for t in range(ids.shape[1]):
                lg, cache = forward_token(model, ids[k:k + 1, t], cache, t)
            for t in range(G):
                nxt = int(torch.argmax(lg[0]))
                toks.append(nxt)
                lg, cache = forward_token(model, np.array([nxt]), cache, ids.shape[1] + t)
        out.append(toks)
    return np.array(out)


def test_generation_equals_free_running_decode_and_teacher_forced_divergence(m2):
    """model.mode=generate (float64 model: no reduction-order near-ties): every scheme's
    continuation equals a token-by-token free-running decode of that scheme; its first
    divergence equals the first argmax mismatch of the scheme teacher-forced along the
    baseline's continuation; an identity scheme (another FP32 state) is identical on every
    document."""
    from precsim.models.generate import teacher_forced_divergence
    from precsim.models.parallel import run_parallel
    from precsim.models.run import build_groups

    G, P = 10, 14  # the prompt ends inside a ReplaySSM segment (L = 4)
    # round-to-nearest schemes: SR bits depend on a document's row in the batch, and the
    # independent decode runs one document at a time
    schemes = {"fp32": SCHEMES["fp32"], "shared": {"kind": "shared", "fmt": "nvfp4"},
               "split": SCHEMES["split"], "copy": {"kind": "conventional", "fmt": "fp32"}}
    cfg = _cfg(m2, schemes, P, model__dtype="float64", model__mode="generate",
               model__new_tokens=G)
    r = run_model_kl(cfg, "cpu", progress=False)
    gen = r.info["generation"]
    assert gen["schemes"]["copy"]["identical_rate"] == 1.0
    assert gen["schemes"]["fp32"]["identical_rate"] == 1.0
    assert gen["schemes"]["shared"]["identical_rate"] < 1.0  # NVFP4 diverges somewhere
    ld = prepare(cfg, "cpu")
    groups = {g.name: g for g in build_groups(cfg, torch.float64)}
    text = r.info["generations_text"]
    base = None
    for name in ("fp32", "shared", "split"):
        toks = _free_decode(ld.model, ld.ids, groups[name], cfg, G)
        line = [ln for ln in text.splitlines() if ln.startswith(f"{name} (")][0]
        assert line.split(": ", 1)[1] == " ".join(map(str, toks[0])), name
        if name == "fp32":
            base = toks
            continue
        first = gen["schemes"][name]["first_divergence"]
        want = [None if (a == b).all() else int(np.flatnonzero(a != b)[0]) + 1
                for a, b in zip(toks, base, strict=True)]
        assert first == want, name
        # teacher-forced along the baseline's continuation, one parallel pass
        tf_ids = np.concatenate([ld.ids, base], axis=1)
        grp = [groups["reference"], groups[name]]
        grp[1].vs = 0
        out = run_parallel(ld.model, tf_ids, grp, cfg, ld.compute, "torch")
        assert teacher_forced_divergence(out[name]["arg"], P, base) == want, name


def test_generate_mode_through_the_command_line(m2, tmp_path, capsys, monkeypatch):
    """The README's generation command shape: the verdict's generation block, generations.txt
    with the baseline's and each scheme's continuation."""
    monkeypatch.chdir(tmp_path)
    rc, out, err = run_main(["experiment=model_kl", f"model.path={m2 / 'm2'}",
                             f"model.ids={m2 / 'ids.npy'}", "run.steps=12", "run.seqs=2",
                             "metrics.window=4", "model.mode=generate", "model.new_tokens=6",
                             "run.progress=false", f"hydra.run.dir={tmp_path / 'g'}"], capsys)
    assert rc == 0, err
    assert "generation (6 greedy tokens after each prompt" in out
    rec = out.splitlines().index(next(ln for ln in out.splitlines()
                                      if ln.startswith("recommended:")))
    nxt = out.splitlines()[rec + 1]  # the next step: the engines' setting, or that none ships
    assert "to serve it: " in nxt or "no serving engine ships this state format yet" in nxt
    txt = (tmp_path / "g" / "generations.txt").read_text()
    assert "baseline [conventional_fp32]:" in txt and "split_fp32_nvfp4 (" in txt
    s = json.loads((tmp_path / "g" / "summary.json").read_text())
    assert "generations_text" not in s["info"]
    assert set(s["info"]["generation"]["schemes"]) == {"conventional_fp32", "shared_nvfp4_sr",
                                                       "split_fp32_nvfp4"}


def test_bad_floor_and_generation_inputs_are_one_line(m2, tmp_path, capsys, monkeypatch):
    """model.new_tokens <= 0, run.sr_seeds <= 0, an unknown metrics.baseline, and new tokens
    beyond a model's context: one line naming the key, exit 2, nothing written."""
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "bamba"
    build("BambaForCausalLM", max_position_embeddings=16).save_pretrained(root)
    path = f"model.path={m2 / 'm2'}"
    one_line_errors([
        (["experiment=model_kl", path, "model.mode=generate", "model.new_tokens=0"],
         "model.new_tokens=0"),
        (["experiment=model_kl", path, "run.sr_seeds=0"], "run.sr_seeds=0"),
        (["experiment=model_kl", path, "metrics.baseline=fp16"],
         "metrics.baseline='fp16' is unknown; allowed: fp32, fp64"),
        (["experiment=model_kl", f"model.path={root}", "model.mode=generate",
          "model.new_tokens=9"], "model.new_tokens=9 after run.steps=8 prompt tokens is beyond"),
    ], capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bamba"]


def test_generation_after_a_triton_prompt_equals_the_torch_run(tmp_path, monkeypatch):
    """With the Triton kernels (here in the interpreter) the prompt is read by the kernels and
    their states (at a flush) become the torch schemes' for the one-token steps: every scheme
    writes the same continuation as the all-torch run, and the prompt's per-token KL agrees to
    float32 noise (the interpreter test of the Triton scan's own tolerance)."""
    import precsim.kernels.mamba2 as m2_k

    from precsim.models import parallel
    from precsim.models import run as run_mod
    from precsim.models.scan import scan as real_scan
    from precsim.models.scan_triton import scan_triton

    build("Mamba2ForCausalLM", 0.2, slow_decay=True).save_pretrained(tmp_path / "m")
    np.save(tmp_path / "ids.npy", np.random.default_rng(4).integers(0, 96, (2, 16)))
    schemes = {"fp32": SCHEMES["fp32"], "shared": {"kind": "shared", "fmt": "fp8_e4m3",
                                                   "rounding": "sr"},
               "split": SCHEMES["split"]}

    def cfg():
        return kl_cfg(tmp_path / "m", schemes, 16, model__ids=str(tmp_path / "ids.npy"),
                       run__seqs=2, model__mode="generate", model__new_tokens=6,
                       replay__buffer_len=8, metrics__window=8, metrics__baseline="fp32")

    want = run_model_kl(cfg(), "cpu", progress=False)
    monkeypatch.setattr(run_mod, "backend_for", lambda *a, **k: "triton")
    monkeypatch.setattr("precsim.models.scan_triton.DRIFT_EVERY", 8)
    monkeypatch.setattr(m2_k, "TRUTH_ROWS", 8)
    calls = []

    def scan(step, groups, K, cfg_, compute, backend, chunks):
        calls.append(backend)
        if backend == "triton":
            return scan_triton(step, groups, K, cfg_, chunks=chunks)
        return real_scan(step, groups, K, cfg_, compute, backend, chunks=chunks)

    monkeypatch.setattr(parallel, "scan", scan)
    got = run_model_kl(cfg(), "cpu", progress=False)
    assert "triton" in calls and "torch" in calls
    gw, gg = want.info["generation"]["schemes"], got.info["generation"]["schemes"]
    for name in schemes:
        assert gg[name]["first_divergence"] == gw[name]["first_divergence"], name
    tw = [ln for ln in want.info["generations_text"].splitlines() if "(" in ln]
    tg = [ln for ln in got.info["generations_text"].splitlines() if "(" in ln]
    assert tg == tw
    for name in ("shared", "split"):
        v = want.per_step_rel_err[f"{name}:kl"]
        np.testing.assert_allclose(got.per_step_rel_err[f"{name}:kl"], v, rtol=1e-3,
                                   atol=max(1e-3 * np.abs(v).max(), 1e-12))


def test_every_layer_replay_reads_schemes_against_the_models_own_output_cast(tmp_path, capsys):
    """Replaying every layer of a recording of an fp16 model: the verdict names the floor (one
    rounding of each layer's output to float16, rel_err 2.07e-4, the model's own cast), and a
    scheme reads "below floor" exactly when its worst layer's rel_err is at or below it (the FP32
    state is; the NVFP4 schemes, 8e-4 to 1.3e-3 on this tiny model over 64 steps, are not; a bf16
    model's floor, 1.66e-3, would cover them too); summary.json carries it; a one-layer replay's
    verdict names it too. The floor itself against torch's own bf16 cast of the same kind of
    values."""
    pytest.importorskip("transformers")
    from conftest import record_tiny_mamba2, run_main

    from precsim.floor import output_rounding

    x = torch.randn(1 << 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    want = float((x.to(torch.bfloat16).double() - x).norm() / x.norm())
    assert output_rounding("bfloat16") == pytest.approx(want, rel=0.05)
    assert output_rounding("float16") < output_rounding("bfloat16") / 7
    assert output_rounding("float64") is None
    rec, run = record_tiny_mamba2(tmp_path), tmp_path / "run"
    meta = json.loads((rec / "record.json").read_text())
    assert meta["model_dtype"] == "float32"
    meta["model_dtype"] = "float16"  # (as an fp16 checkpoint's recording says)
    (rec / "record.json").write_text(json.dumps(meta))
    rc, out, err = run_main(["workload=trace", f"workload.path={rec}", "run.steps=64",
                             "metrics.window=32", "run.engine=torch", "run.progress=false",
                             f"hydra.run.dir={run}"], capsys)
    assert rc == 0, err
    of = json.loads((run / "summary.json").read_text())["info"]["output_floor"]
    assert of == {"model_dtype": "float16", "rel_err": output_rounding("float16")}
    assert "floor: the model rounds each SSM layer's output to float16" in out
    rows = {ln.split()[0]: ln for ln in out.splitlines() if ln.startswith("  ")
            and ln.split()[0] in ("conventional_fp32", "shared_nvfp4_sr", "split_fp32_nvfp4")}
    for ln in rows.values():
        below = float(ln.split()[2]) <= of["rel_err"]
        assert ("below floor (0.000207)" in ln) == below, ln
    assert "below floor" in rows["conventional_fp32"] and "below floor" not in rows[
        "shared_nvfp4_sr"] + rows["split_fp32_nvfp4"], out
    # one recorded layer replayed: the same floor in its verdict
    rc, out, err = run_main(["workload=trace", f"workload.path={rec}", "workload.layer=1",
                             "run.steps=64", "metrics.window=32", "run.engine=torch",
                             "run.progress=false", f"hydra.run.dir={tmp_path / 'one'}"], capsys)
    assert rc == 0, err
    assert "floor: the model rounds each SSM layer's output to float16" in out, out
