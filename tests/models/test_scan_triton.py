"""The Triton scan of whole-model mode (precsim.models.scan_triton): against the torch scan in
Triton's interpreter on the CPU, and chunked and resumed on a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

tf = pytest.importorskip("transformers")

from conftest import MODEL_SCHEMES as SCHEMES  # noqa: E402
from conftest import build, interrupted, kl_cfg  # noqa: E402

from precsim.models.run import run_model_kl  # noqa: E402


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["Mamba2ForCausalLM", "BambaForCausalLM", "Qwen3_5ForCausalLM"])
def test_triton_backend_chunks_and_resumes_on_the_gpu(arch, tmp_path, monkeypatch):
    """On a GPU (the Triton scan): chunked equals one pass to float32 noise, and an interrupted
    chunked run resumes bit-identically."""
    from precsim.checkpoint import Checkpoint

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    # the kernels need head sizes of 16 or more
    extra = dict(linear_value_head_dim=16) if arch == "Qwen3_5ForCausalLM" else {}
    build(arch, 0.2, slow_decay=True, **extra).save_pretrained(tmp_path / arch)
    kl_ckpt = {arch: tmp_path / arch}
    schemes = {**SCHEMES, "sr": {"kind": "conventional", "fmt": "fp16", "rounding": "sr"}}
    np.save(tmp_path / "ids.npy", np.random.default_rng(0).integers(0, 96, 4096 + 40))
    over = dict(run__steps=4096 + 40, metrics__window=2048, replay__buffer_len=16,
                model__ids=str(tmp_path / "ids.npy"))
    r0 = run_model_kl(kl_cfg(kl_ckpt[arch], schemes, **over, model__chunk=0), "cuda",
                      progress=False)
    cfg = kl_cfg(kl_ckpt[arch], schemes, **over, model__chunk=2048)
    ref = run_model_kl(cfg, "cuda", progress=False)
    assert ref.engine == "model/triton", ref.info.get("scan_backend_why")
    assert ref.info["chunk"] == 2048
    for name, v in r0.per_step_rel_err.items():  # measured on one H200: <= 1.9e-4 of the
        if name.endswith(":kl"):  # largest KL (Mamba-2; the GPU's float32 kernels differ more)
            assert np.abs(ref.per_step_rel_err[name] - v).max() <= 1e-3 * np.abs(v).max() + 1e-9
    e = interrupted(monkeypatch, "SIGINT@100", cfg, tmp_path / "run",
                    lambda ck: run_model_kl(cfg, "cuda", progress=False, ckpt=ck))
    assert e.pos == 2048
    res = run_model_kl(cfg, "cuda", progress=False, ckpt=Checkpoint(cfg, tmp_path / "run"))
    for name, v in ref.per_step_rel_err.items():
        np.testing.assert_array_equal(res.per_step_rel_err[name], v, err_msg=name)


@pytest.mark.parametrize("arch", ["Mamba2ForCausalLM", "Qwen3_5ForCausalLM"])
def test_triton_scan_in_the_interpreter_matches_the_torch_scan(arch, tmp_path, monkeypatch):
    """The Triton backend of whole-model mode (``scan_triton``: launches per group and window,
    states kept between chunks, drift samples and non-finite checks read back once per forward
    pass) run on the CPU in Triton's interpreter, against the torch backend: the same per-token
    KL and state drift, in two chunks (24 tokens: 16 + 8; ~20 s in the interpreter). The
    reference's rows split over programs (``TRUTH_ROWS=8`` of the models' 16: the kernels a
    recording and a one-document run use on a GPU); Mamba-2's B/C come in 2 groups.

    Measured agreement: per-token KL within 3.7e-9 of a largest 9.7e-4 (Mamba-2) and 2.4e-7 of
    0.075 (GDN), ~250x inside the 1e-3 allowed; state drift to ~1e-8 relative."""
    import precsim.kernels.mamba2 as m2_k

    from precsim.models import parallel
    from precsim.models import run as run_mod
    from precsim.models.scan_triton import scan_triton

    extra = dict(linear_value_head_dim=16) if arch == "Qwen3_5ForCausalLM" else {}
    build(arch, 0.2, slow_decay=True, **extra).save_pretrained(tmp_path / arch)
    over = dict(replay__buffer_len=8, metrics__window=8)
    want = run_model_kl(kl_cfg(tmp_path / arch, SCHEMES, 24, **over), "cpu", progress=False)
    monkeypatch.setattr(run_mod, "backend_for", lambda *a, **k: "triton")
    monkeypatch.setattr("precsim.models.scan_triton.DRIFT_EVERY", 8)
    monkeypatch.setattr(m2_k, "TRUTH_ROWS", 8)
    monkeypatch.setattr(parallel, "scan", lambda step, groups, K, cfg_, compute, backend, chunks:
                        scan_triton(step, groups, K, cfg_, chunks=chunks))
    got = run_model_kl(kl_cfg(tmp_path / arch, SCHEMES, 24, **over, model__chunk=16), "cpu",
                       progress=False)
    assert got.engine == "model/triton" and got.info["chunk"] == 16
    for name, v in want.per_step_rel_err.items():
        if name.endswith(":kl"):  # (the FP32 scheme's KL is float32 noise, ~1e-14)
            np.testing.assert_allclose(got.per_step_rel_err[name], v, rtol=1e-3,
                                       atol=max(1e-3 * np.abs(v).max(), 1e-12), err_msg=name)
    rows = {(r["scheme"], r["step"]): r for r in want.rows}
    assert len(rows) == len(got.rows) == 3 * 3
    for r in got.rows:
        w = rows[(r["scheme"], r["step"])]
        # (float32 schemes: drift ~1e-7, summation-order noise between the backends)
        assert r["state_drift"] == pytest.approx(w["state_drift"], rel=1e-3, abs=1e-6)


@pytest.mark.gpu
def test_generation_in_batches_on_the_gpu(tmp_path):
    """On a GPU (the prompts on the Triton scan, then the torch steps): model.doc_batch=1 reads
    each prompt alone, its tail waiting in host memory, then the four documents write their
    tokens in one step loop; the round-to-nearest schemes write what one batch writes."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    build("Mamba2ForCausalLM", 0.2, slow_decay=True).save_pretrained(tmp_path / "m")
    np.save(tmp_path / "ids.npy", np.random.default_rng(3).integers(0, 96, (4, 64)))
    rne = {"fp32": SCHEMES["fp32"], "shared": {"kind": "shared", "fmt": "nvfp4"},
           "split": SCHEMES["split"]}

    def run(B):
        return run_model_kl(kl_cfg(tmp_path / "m", rne, 64, model__ids=str(tmp_path / "ids.npy"),
                                   run__seqs=4, replay__buffer_len=16, metrics__window=32,
                                   model__mode="generate", model__new_tokens=8,
                                   model__doc_batch=B), "cuda", progress=False)
    one, four = run(0), run(1)
    assert four.engine == "model/triton", four.info.get("scan_backend_why")
    assert four.info["doc_batch"] == 1 and four.info["write_docs"] == 4
    for name, g in one.info["generation"]["schemes"].items():
        assert four.info["generation"]["schemes"][name]["first_divergence"] == \
            g["first_divergence"], name
    assert four.info["generations_text"] == one.info["generations_text"]
