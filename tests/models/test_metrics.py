"""Whole-model metrics (precsim.models.metrics): the schemes ranked by KL and state drift, the
top-1 agreement and its first flip."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("transformers")

from conftest import MODEL_SCHEMES as SCHEMES  # noqa: E402
from conftest import kl_cfg  # noqa: E402

from precsim.models.run import run_model_kl  # noqa: E402


@pytest.mark.parametrize("arch,ratio", [("Mamba2ForCausalLM", 2.0),
                                        ("Qwen3NextForCausalLM", 1.3)])
def test_model_shared_nvfp4_sr_drifts_more_than_split(kl_ckpt, arch, ratio, tmp_path):
    """Whole-model metrics rank the schemes: a shared NVFP4-SR checkpoint is worse than a split
    NVFP4 read copy over an FP32 master (KL and state drift), over 2 documents. KL ratios
    measured: 5.3 (Mamba-2), 1.66 (GDN, whose outputs read the NVFP4 copy through u too)."""
    np.save(tmp_path / "ids.npy", np.random.default_rng(3).integers(0, 96, (2, 96)))
    r = run_model_kl(kl_cfg(kl_ckpt[arch], SCHEMES, 96, model__ids=str(tmp_path / "ids.npy"),
                             run__seqs=2, replay__buffer_len=16, metrics__window=32,
                             replay__gdn_u_source="master"),
                     "cpu", progress=False)
    last = {row["scheme"]: row for row in r.rows if row["step"] == 96}
    assert last["shared"]["kl"] > ratio * last["split"]["kl"] > 0
    assert last["split"]["kl"] > 1e3 * last["fp32"]["kl"]
    # (GDN's master reads itself: with gdn_u_source=read the read copy's error leaks in)
    assert last["shared"]["state_drift"] > 2 * last["split"]["state_drift"]
    assert {"kl_p10", "kl_p90"} <= set(last["shared"])


def test_model_top1_and_first_flip_of_a_flipping_scheme(kl_ckpt):
    """Whole-model divergence columns: the window means and the first flip of the per-token
    top-1 agreement, with a state in FP4 that flips."""
    r = run_model_kl(kl_cfg(kl_ckpt["Mamba2ForCausalLM"],
                             {"fp4": {"kind": "conventional", "fmt": "fp4_e2m1"}}, 16),
                     "cpu", progress=False)
    t1 = r.per_step_rel_err["fp4:top1"][:, 0]
    assert set(np.unique(t1)) <= {0.0, 1.0} and t1.min() == 0.0
    first = int(np.flatnonzero(t1 == 0)[0]) + 1
    assert r.info["first_flip"]["fp4"] == [first]
    for row in r.rows:  # windows of 8 tokens
        assert row["top1"] == pytest.approx(t1[row["step"] - 8:row["step"]].mean())
        assert row["flipped"] == int(first <= row["step"])
