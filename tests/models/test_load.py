"""precsim.models.load on tiny random-initialised checkpoints: every supported class, the
documents (text files, greedy tokens), and the one-line errors of a missing or broken checkpoint,
a bad document and an unsupported transformers release."""

from __future__ import annotations

import json

import numpy as np
import pytest

tf = pytest.importorskip("transformers")

from conftest import (  # noqa: E402
    CONFIGS,
    build,
    kl_cfg,
    one_line_errors,
)
from conftest import MODEL_SCHEMES as SCHEMES  # noqa: E402
from conftest import record_error_line as fail_line  # noqa: E402

from precsim import models  # noqa: E402
from precsim.errors import PrecsimError  # noqa: E402
from precsim.models import load  # noqa: E402
from precsim.models.run import run_model_kl  # noqa: E402
from precsim.record import main as record_main  # noqa: E402


def test_every_supported_class_is_tested():
    assert set(CONFIGS) == set(models.ARCHITECTURES)


def test_greedy_tokens_notice_names_the_commands_flags(tiny_ckpt, tmp_path, capsys, monkeypatch):
    """The notice while greedy tokens are generated names the flags that skip it: precsim.record's
    (--text-file / --ids-file), the config's in whole-model mode."""
    import contextlib

    from precsim.engines import base

    said = []
    monkeypatch.setattr(base, "slow_notice",
                        lambda what, *a, **k: said.append(what) or contextlib.nullcontext())
    assert record_main(["--model", str(tiny_ckpt["Mamba2ForCausalLM"]), "--tokens", "12", "--out",
                        str(tmp_path / "r")]) == 0
    assert said == ["generating 4 greedy tokens (give --text-file or --ids-file to skip this)"]
    run_model_kl(kl_cfg(tiny_ckpt["Mamba2ForCausalLM"], SCHEMES, 12), "cpu", progress=False)
    assert said[1] == "generating 4 greedy tokens (give model.text or model.ids to skip this)"


def _broken_checkpoints(good, root):
    """Copies of the checkpoint ``good`` whose weights are missing or damaged: (name, what the
    error says)."""
    import shutil

    out = []
    for name, what in (("noweights", "holds no weights (no model.safetensors"),
                       ("truncated", "weights file model.safetensors is truncated or corrupt"),
                       ("garbage", "weights file model.safetensors is truncated or corrupt"),
                       ("noshard", "weights file model-00002-of-00002.safetensors is missing")):
        d = root / name
        shutil.copytree(good, d)
        w = d / "model.safetensors"
        if name == "noweights":
            w.unlink()
        elif name == "truncated":  # a copy cut short: the header is whole, the data is not
            w.write_bytes(w.read_bytes()[:w.stat().st_size // 2])
        elif name == "garbage":
            w.write_bytes(np.random.default_rng(0).bytes(1000))
        else:  # a sharded checkpoint's index naming a shard that is not there
            w.rename(d / "model-00001-of-00002.safetensors")
            (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
                "a": "model-00001-of-00002.safetensors",
                "b": "model-00002-of-00002.safetensors"}}))
        out.append((d, what))
    return out


def test_broken_checkpoints_are_one_line_errors_and_leave_no_directory(tiny_ckpt, tmp_path,
                                                                       capsys, monkeypatch):
    """A checkpoint directory without its weights, or with a truncated or garbage weights file:
    one line naming the key (--model, model.path), the path and what is allowed, exit 2, and
    neither command leaves a directory behind (no recording, no run directory)."""
    from conftest import run_main

    monkeypatch.chdir(tmp_path)  # Hydra's default run directory: outputs/ under here
    for d, what in _broken_checkpoints(tiny_ckpt["Mamba2ForCausalLM"], tmp_path):
        err = fail_line(capsys, ["--model", str(d), "--tokens", "4", "--out", "rec"])
        assert f"--model={str(d)!r}" in err and what in err and "; allowed: " in err, err
        rc, _, lines = run_main(["experiment=model_kl", f"model.path={d}", "run.steps=8",
                                 "metrics.window=8", "metrics.plot=false",
                                 "run.progress=false"], capsys)
        assert rc == 2 and len(lines) == 1, lines
        assert lines[0].startswith(f"precsim: error: model.path={str(d)!r}") and what in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["garbage", "noshard", "noweights",
                                                           "truncated"]


def test_model_kl_errors_name_its_keys(tiny_ckpt, tmp_path, capsys, monkeypatch):
    """A missing model.path, a directory as model.text and a document shorter than run.steps:
    one line naming the config's key (the same checks name precsim.record's flags there)."""
    monkeypatch.chdir(tmp_path)
    m2 = tiny_ckpt["Mamba2ForCausalLM"]
    np.save(tmp_path / "short.npy", np.arange(5))
    one_line_errors([
        (["experiment=model_kl", f"model.path={tmp_path / 'nope'}"],
         f"model.path={str(tmp_path / 'nope')!r} does not exist; allowed: a local "),
        (["experiment=model_kl", f"model.path={m2}", f"model.text={tmp_path}"],
         f"model.text={str(tmp_path)!r} is a directory; allowed: a .txt file"),
        (["experiment=model_kl", f"model.path={m2}", f"model.ids={tmp_path / 'short.npy'}"],
         "has 5 tokens, fewer than run.steps=8; allowed: run.steps <= 5")], capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["short.npy"]  # no run directory


def test_documents_from_text_files(tmp_path):
    """Text documents (.txt one, .jsonl one per line) through a tokenizer; bad files are one
    line each."""

    class Tok:  # byte-level: a token per UTF-8 byte
        def __call__(self, text):
            return {"input_ids": list(text.encode())}

    model = build("Mamba2ForCausalLM")
    (tmp_path / "a.txt").write_text("hello world, this is a document")
    ids, src = load.documents(model, Tok(), n_docs=1, n_tokens=5, text=tmp_path / "a.txt")
    assert ids.tolist() == [list(b"hello")] and "a.txt" in src
    (tmp_path / "d.jsonl").write_text('{"text": "abcdefgh"}\n\n{"text": "ijklmnop"}\n')
    ids, _ = load.documents(model, Tok(), n_docs=2, n_tokens=4, text=tmp_path / "d.jsonl")
    assert ids.tolist() == [list(b"abcd"), list(b"ijkl")]
    with pytest.raises(PrecsimError, match="holds 2 document"):
        load.documents(model, Tok(), n_docs=3, n_tokens=4, text=tmp_path / "d.jsonl")
    with pytest.raises(PrecsimError, match="document 0 .* 8 tokens, fewer than run.steps=9"):
        load.documents(model, Tok(), n_docs=1, n_tokens=9, text=tmp_path / "d.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"txt": 1}\n')
    with pytest.raises(PrecsimError, match="line 2 is not a JSON object"):
        load.documents(model, Tok(), n_docs=1, n_tokens=2, text=tmp_path / "bad.jsonl")
    (tmp_path / "e.txt").write_text("  \n")
    with pytest.raises(PrecsimError, match="holds no text"):
        load.documents(model, Tok(), n_docs=1, n_tokens=2, text=tmp_path / "e.txt")


def test_unsupported_transformers_release_is_one_line(monkeypatch):
    monkeypatch.setattr(load, "installed_version", lambda: "4.57.1")
    with pytest.raises(PrecsimError, match=r"transformers 4.57.1 is unsupported; allowed: >=5"):
        load.require_transformers()
