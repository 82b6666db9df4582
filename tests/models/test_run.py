"""Whole-model runs (precsim.models.run, experiment=model_kl): the inputs it refuses, and an
interrupted run resumed bit-identically, in process and through the command line."""

from __future__ import annotations

import json

import numpy as np
import pytest

tf = pytest.importorskip("transformers")

from conftest import MODEL_SCHEMES as SCHEMES  # noqa: E402
from conftest import interrupted, kl_cfg, one_line_errors  # noqa: E402

from precsim.errors import PrecsimError  # noqa: E402
from precsim.models.run import run_model_kl  # noqa: E402


def test_whole_model_presets_need_a_model_path(tmp_path, capsys, monkeypatch):
    """experiment=model_kl (and per_layer) without model.path is a one-line error naming the
    key, not a synthetic layer-level run."""
    monkeypatch.chdir(tmp_path)
    one_line_errors([
        (["experiment=model_kl"], "experiment=model_kl needs model.path (it runs a real "
                                  "checkpoint); allowed: model.path=DIR"),
        (["experiment=per_layer"], "experiment=per_layer needs model.path")], capsys)
    assert not list(tmp_path.iterdir())  # no run directory


def test_model_bad_inputs_are_one_line(kl_ckpt, tmp_path):
    path = kl_ckpt["Mamba2ForCausalLM"]
    with pytest.raises(PrecsimError, match="run.seqs=2 without model.text or model.ids"):
        run_model_kl(kl_cfg(path, SCHEMES, 8, run__seqs=2), "cpu", progress=False)
    (tmp_path / "x.txt").write_text("a document")
    with pytest.raises(PrecsimError, match="needs the checkpoint's tokenizer"):
        run_model_kl(kl_cfg(path, SCHEMES, 8, model__text=str(tmp_path / "x.txt")), "cpu",
                     progress=False)
    with pytest.raises(PrecsimError, match="run.engine='numba' with model.path"):
        run_model_kl(kl_cfg(path, SCHEMES, 8, run__engine="numba"), "cpu", progress=False)
    with pytest.raises(PrecsimError, match="replay.drafts=2 with model.path"):
        run_model_kl(kl_cfg(path, SCHEMES, 8, replay__drafts=2), "cpu", progress=False)
    with pytest.raises(PrecsimError, match="model.ids=.* is not a readable .npy"):
        run_model_kl(kl_cfg(path, SCHEMES, 8, model__ids=str(tmp_path / "no.npy")), "cpu",
                     progress=False)


@pytest.mark.parametrize("arch", ["Mamba2ForCausalLM", "NemotronHForCausalLM",
                                  "Qwen3_5ForCausalLM"])
def test_whole_model_run_resumes_bit_identically(kl_ckpt, arch, tmp_path, monkeypatch):
    """SIGINT at a known position stops a chunked whole-model run at the next chunk with a
    checkpoint (the model's cache, every layer's scheme states and SR counters, the metrics so
    far); the resumed run equals the uninterrupted one bit for bit."""
    from precsim.checkpoint import Checkpoint

    schemes = {**SCHEMES, "sr": {"kind": "conventional", "fmt": "fp16", "rounding": "sr"}}
    cfg = kl_cfg(kl_ckpt[arch], schemes, 40, model__chunk=8)
    ref = run_model_kl(cfg, "cpu", progress=False)
    e = interrupted(monkeypatch, "SIGINT@12", cfg, tmp_path,
                    lambda ck: run_model_kl(cfg, "cpu", progress=False, ckpt=ck))
    assert e.pos == 16 and (tmp_path / "checkpoint.pt").is_file()
    part = e.partial
    assert part.info["interrupted_at"] == 16 and max(r["step"] for r in part.rows) == 16
    assert part.rows == [r for r in ref.rows if r["step"] <= 16]
    res = run_model_kl(cfg, "cpu", progress=False, ckpt=Checkpoint(cfg, tmp_path))
    assert res.info["resumed_s"] > 0
    for name, v in ref.per_step_rel_err.items():
        np.testing.assert_array_equal(res.per_step_rel_err[name], v, err_msg=name)
    assert res.rows == ref.rows


def test_whole_model_interrupt_and_resume_through_the_command_line(kl_ckpt, tmp_path, capsys,
                                                                   monkeypatch):
    """The command line in process (``main(argv)``; a signal to a whole process, its exit status
    and its one line are tests/app/test_resume.py's, the same handlers): the interrupted model
    run says where it stopped and how to resume, the rerun resumes from the checkpoint."""
    from conftest import run_main

    out = tmp_path / "run"
    np.save(tmp_path / "ids.npy", np.random.default_rng(0).integers(0, 96, 48))
    args = ["experiment=model_kl", f"model.path={kl_ckpt['Mamba2ForCausalLM']}",
            f"model.ids={tmp_path / 'ids.npy'}", "run.steps=48", "model.chunk=16",
            "replay.buffer_len=8", "metrics.window=8", "run.progress=false",
            f"hydra.run.dir={out}"]
    monkeypatch.setenv("PRECSIM_SIGNAL_AT", "SIGINT@10")
    rc, _, lines = run_main(args, capsys)
    assert rc == 130, lines
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    assert "interrupted (SIGINT) at step 16" in lines[0] and "resume: python -m precsim" in lines[0]
    assert json.loads((out / "summary.json").read_text())["complete"] is False
    monkeypatch.delenv("PRECSIM_SIGNAL_AT")
    rc, _, lines = run_main(args, capsys)
    assert rc == 0, lines
    assert any("from its checkpoint at step 16 of 48" in ln for ln in lines), lines
    s = json.loads((out / "summary.json").read_text())
    assert s["complete"] is True and s["info"]["resumed_s"] > 0 and s["steps"] == 48
    assert not (out / "checkpoint.pt").exists()
