"""Models whose every layer is linear attention (an all-GDN Qwen3.5, as the recall models of
experiments/recall): transformers' cache of such a model cannot say its length, which its forward
asks for whenever a cache is kept. Recording in chunks and a chunked whole-model run continue
the cache (precsim's own, :func:`precsim.models.load.first_cache`) and equal one pass."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import build, kl_cfg

from precsim.models.run import run_model_kl
from precsim.record import main as record_main

SCHEMES = {"fp32": {"kind": "conventional", "fmt": "fp32"},
           "split": {"kind": "split", "fmt": "fp32", "read_fmt": "nvfp4"}}


@pytest.fixture(scope="module")
def gdn_only(tmp_path_factory):
    root = tmp_path_factory.mktemp("gdn_only")
    build("Qwen3_5ForCausalLM", 0.2, slow_decay=True,
          layer_types=["linear_attention", "linear_attention"]).save_pretrained(root / "m")
    np.save(root / "ids.npy", np.random.default_rng(3).integers(0, 96, (2, 32)))
    np.save(root / "doc.npy", np.random.default_rng(4).integers(0, 96, 32))
    return root


def test_recording_in_chunks_equals_one_pass(gdn_only, tmp_path):
    outs = {}
    for chunk in (8, 32):
        out = tmp_path / f"rec{chunk}"
        assert record_main(["--model", str(gdn_only / "m"), "--ids-file",
                            str(gdn_only / "doc.npy"), "--out", str(out), "--chunk",
                            str(chunk)]) == 0
        outs[chunk] = out
    for f in sorted((outs[32] / "layer_00").glob("*.npy")):
        a, b = np.load(f), np.load(outs[8] / "layer_00" / f.name)
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6, err_msg=f.name)


def test_a_chunked_whole_model_run_equals_one_pass(gdn_only):
    got = {}
    for chunk in (8, 0):
        cfg = kl_cfg(gdn_only / "m", SCHEMES, 32, model__ids=str(gdn_only / "ids.npy"),
                      run__seqs=2, model__chunk=chunk, model__dtype="float32")
        r = run_model_kl(cfg, "cpu", progress=False)
        got[chunk] = {(row["scheme"], row["step"]): row["kl"] for row in r.rows}
    assert got[8].keys() == got[0].keys()
    for k, v in got[0].items():
        assert got[8][k] == pytest.approx(v, rel=1e-3, abs=1e-9), k


def test_the_cache_pickles_for_checkpoints_and_is_only_for_models_that_need_it(gdn_only):
    """A chunked run saves the model's cache in its checkpoints (torch.save): precsim's cache
    pickles; Mamba-2 (whose config also lists every layer as linear attention) keeps its own."""
    import io

    import torch
    import transformers as tf

    from precsim.models.load import first_cache

    c = first_cache(tf.AutoModelForCausalLM.from_pretrained(gdn_only / "m"))
    buf = io.BytesIO()
    torch.save(c, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=False)
    assert back.get_seq_length() == 0 and back.get_mask_sizes(5, 0) == (5, 0)
    assert first_cache(build("Mamba2ForCausalLM")) is None
