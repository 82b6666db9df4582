"""precsim.record (precsim.models.recording) on tiny random-initialised checkpoints of every
supported class (``conftest.CONFIGS``): the recorded traces replay each layer's own outputs,
the bf16 trace, the bad inputs' one-line errors, and what an interrupted or repeated recording
leaves."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

tf = pytest.importorskip("transformers")

from conftest import ATTN, CONFIGS, ScanCapture  # noqa: E402
from conftest import record_error_line as fail_line  # noqa: E402

from precsim import models, oracle  # noqa: E402
from precsim.errors import PrecsimError  # noqa: E402
from precsim.models import load  # noqa: E402
from precsim.record import main as record_main  # noqa: E402


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_recorded_traces_reproduce_each_layers_own_outputs(tiny_ckpt, arch, tmp_path):
    """A document recorded in chunks (the model's cache between them; the last chunk a
    one-token decode step) replays, in the float64 oracle from a zero state, the outputs of the
    model's own scan in one pass over the document."""
    model, tok = models.load_model(tiny_ckpt[arch])
    ids = np.random.default_rng(1).integers(0, 96, 13)
    np.save(tmp_path / "ids.npy", ids)
    assert record_main(["--model", str(tiny_ckpt[arch]), "--out", str(tmp_path / "rec"),
                        "--ids-file", str(tmp_path / "ids.npy"), "--chunk", "6"]) == 0
    cap = ScanCapture()
    with torch.no_grad(), models.Hook(model, cap):
        model(input_ids=torch.as_tensor(ids)[None], use_cache=False)
    layers = models.ssm_layers(model)
    meta = json.loads((tmp_path / "rec" / "record.json").read_text())
    assert [m["layer"] for m in meta["layers"]] == [i for i, _, _ in layers] == sorted(cap.steps)
    from precsim.workload import load_trace_arrays

    for idx, _, fam in layers:
        tr = {k: np.asarray(v) for k, v in load_trace_arrays(tmp_path / "rec" /
                                                             f"layer_{idx:02d}").items()}
        own = torch.cat(cap.outputs[idx])[:, 0].double().numpy()
        y = oracle.decode(tr)
        assert y.shape == own.shape == (13, *own.shape[1:])
        err = np.abs(y - own).max() / np.abs(own).max()
        assert err < 2e-5, (arch, idx, err)
        if fam == "mamba2":
            assert (tr["A"] < 0).all() and (tr["dt"] > 0).all() and "D" in tr
            assert tr["B"].shape[1] == 2  # per group, not per head
        else:
            # per key head (transformers < 5.2x expands them to the value heads first)
            assert (tr["g"] <= 0).all() and tr["k"].shape[1] in (2, 4)
            # L2-normalised (eps 1e-6 only shrinks) and q carries the 1/sqrt(K) scale
            K = tr["k"].shape[-1]
            nq, nk = np.linalg.norm(tr["q"], axis=-1), np.linalg.norm(tr["k"], axis=-1)
            assert (nq <= K ** -0.5 * (1 + 1e-5)).all() and (nk <= 1 + 1e-5).all()


def test_bf16_trace_is_the_fp32_trace_rounded_and_half_the_bytes(tiny_ckpt, tmp_path):
    np.save(tmp_path / "ids.npy", np.arange(40) % 96)
    for dt in ("fp32", "bf16"):
        assert record_main(["--model", str(tiny_ckpt["Mamba2ForCausalLM"]), "--out",
                            str(tmp_path / dt), "--ids-file", str(tmp_path / "ids.npy"),
                            "--dtype", dt, "--layers", "1"]) == 0
    from precsim.workload import load_trace_arrays

    a = load_trace_arrays(tmp_path / "fp32" / "layer_01")
    b = load_trace_arrays(tmp_path / "bf16" / "layer_01")
    for k in ("dt", "x", "B", "C"):
        want = torch.from_numpy(np.array(a[k])).to(torch.bfloat16).float().numpy()
        assert np.array_equal(np.asarray(b[k]), want), k
    meta = json.loads((tmp_path / "bf16" / "record.json").read_text())
    H, P, N, G = 4, 16, 16, 2
    per = 2 * (H * P + 2 * G * N + H)  # bytes per token and layer in bf16
    assert meta["bytes"] <= 40 * per + 6 * 256  # + the .npy headers and A, D
    assert [m["layer"] for m in meta["layers"]] == [1]


def test_record_bad_inputs_are_one_line(tiny_ckpt, tmp_path, capsys):
    out = str(tmp_path / "o")
    m2 = str(tiny_ckpt["Mamba2ForCausalLM"])
    err = fail_line(capsys, ["--model", str(tmp_path / "nope"), "--tokens", "4", "--out", out])
    assert f"--model={str(tmp_path / 'nope')!r} does not exist; allowed: a local " in err
    err = fail_line(capsys, ["--model", m2, "--tokens", "0", "--out", out])
    assert "--tokens=0" in err
    err = fail_line(capsys, ["--model", m2, "--out", out])
    assert "--tokens is required" in err
    err = fail_line(capsys, ["--model", m2, "--tokens", "4", "--layers", "0,7", "--out", out])
    assert "--layers='0,7'" in err and "allowed: 0, 1" in err
    err = fail_line(capsys, ["--model", m2, "--text-file", str(tmp_path / "no.txt"), "--out",
                              out])
    assert "no.txt" in err and "does not exist" in err
    (tmp_path / "e.txt").write_text("")
    err = fail_line(capsys, ["--model", m2, "--text-file", str(tmp_path / "e.txt"), "--out",
                              out])
    assert "holds no text" in err
    (tmp_path / "t.txt").write_text("some text")
    err = fail_line(capsys, ["--model", m2, "--text-file", str(tmp_path / "t.txt"), "--out",
                              out])
    assert "needs the checkpoint's tokenizer" in err
    np.save(tmp_path / "big.npy", np.array([1, 500]))
    err = fail_line(capsys, ["--model", m2, "--ids-file", str(tmp_path / "big.npy"), "--out",
                              out])
    assert "0..95" in err
    np.save(tmp_path / "short.npy", np.arange(5))
    err = fail_line(capsys, ["--model", m2, "--ids-file", str(tmp_path / "short.npy"),
                              "--tokens", "9", "--out", out])
    assert "5 tokens, fewer than --tokens=9; allowed: --tokens <= 5 or a longer" in err
    err = fail_line(capsys, ["--model", m2, "--text-file", str(tmp_path), "--out", out])
    assert f"--text-file={str(tmp_path)!r} is a directory; allowed: a .txt file" in err
    err = fail_line(capsys, ["--model", m2, "--prompt", "hello", "--tokens", "9", "--out", out])
    assert "--prompt='hello' given but the checkpoint has no tokenizer; allowed: no --prompt" \
        in err
    err = fail_line(capsys, ["--model", m2, "--tokens", "4", "--dtype", "fp8", "--out", out])
    assert "--dtype='fp8'" in err
    assert not (tmp_path / "o" / "record.json").exists()  # nothing half-written as a result
    torch.manual_seed(0)
    llama = tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=64, hidden_size=32,
                                               num_hidden_layers=1, **ATTN))
    llama.save_pretrained(tmp_path / "llama")
    err = fail_line(capsys, ["--model", str(tmp_path / "llama"), "--tokens", "4", "--out", out])
    assert "LlamaForCausalLM" in err and "unsupported" in err
    c = tf.NemotronHConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                           layers_block_type=["attention", "mlp"], head_dim=16, **ATTN)
    tf.NemotronHForCausalLM(c).save_pretrained(tmp_path / "attn_only")
    err = fail_line(capsys, ["--model", str(tmp_path / "attn_only"), "--tokens", "4", "--out",
                              out])
    assert "NemotronHForCausalLM" in err and "no SSM layers" in err
    with pytest.raises(PrecsimError, match="model.prompt='hello' given but .* no tokenizer"):
        load.prompt_ids(None, "hello", 64)


def test_an_interrupted_recording_removes_only_its_own_folders(tiny_ckpt, tmp_path,
                                                              monkeypatch, capsys):
    """Ctrl-C in a recording into a folder that held other things (here an all-layers replay's
    layer_00 results): the folders it made go, what was there stays (it deleted layer_00)."""
    import precsim.models.recording as rec

    out = tmp_path / "userdir"
    (out / "layer_00").mkdir(parents=True)
    (out / "layer_00" / "summary.json").write_text("precious")
    (out / "notes.txt").write_text("notes")

    def interrupted(model, ids, where, layers, **kw):
        (out / "layer_01.partial").mkdir()
        raise KeyboardInterrupt

    monkeypatch.setattr(rec, "record_document", interrupted)
    assert record_main(["--model", str(tiny_ckpt["Mamba2ForCausalLM"]), "--tokens", "4",
                        "--layers", "0,1", "--out", str(out)]) == 130
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        "layer_00", "layer_00/summary.json", "notes.txt"]
    capsys.readouterr()


def test_record_never_replaces_a_recording(tiny_ckpt, tmp_path, capsys):
    """--out holding a finished recording (record.json) is a one-line error and the recording
    is left as it was; a folder without record.json (nothing finished) may be recorded into."""
    m2, out = str(tiny_ckpt["Mamba2ForCausalLM"]), tmp_path / "rec"
    assert record_main(["--model", m2, "--tokens", "6", "--out", str(out)]) == 0
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    err = fail_line(capsys, ["--model", m2, "--tokens", "4", "--layers", "1", "--out",
                              str(out)])
    assert err == (f"precsim.record: error: --out={str(out)!r} already holds a recording "
                   "(record.json); allowed: another --out, or delete that directory first")
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before
    (tmp_path / "f").write_text("")
    err = fail_line(capsys, ["--model", m2, "--tokens", "4", "--out", str(tmp_path / "f")])
    assert "--out=" in err and "is not a directory" in err
    (tmp_path / "stale" / "layer_00").mkdir(parents=True)  # an unfinished recording's folder
    assert record_main(["--model", m2, "--tokens", "4", "--out", str(tmp_path / "stale")]) == 0
    assert json.loads((tmp_path / "stale" / "record.json").read_text())["tokens"] == 4


@pytest.mark.parametrize("sig", ["SIGINT", pytest.param("SIGTERM", marks=pytest.mark.slow)])
def test_record_interrupted_is_one_line_and_leaves_no_partial_recording(tiny_ckpt, tmp_path, sig):
    """A signal while precsim.record writes (its first layer's files are there): one line on
    stderr, no traceback, exit 128 + the signal, and nothing of the recording left (no
    layer_XX.partial or layer_XX folders; --out, made for it, removed)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "rec"
    np.save(tmp_path / "ids.npy", np.arange(1000) % 96)
    # one token per forward pass: the recording takes ~80 ms a token here, far longer than the
    # poll below needs to see its first files
    p = subprocess.Popen([sys.executable, "-m", "precsim.record", "--model",
                          str(tiny_ckpt["Mamba2ForCausalLM"]), "--ids-file",
                          str(tmp_path / "ids.npy"), "--chunk", "1", "--out", str(out)],
                         env={**os.environ, "PYTHONWARNINGS": "ignore"}, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list(out.glob("layer_00.partial/*.npy")):
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            time.sleep(0.01)
        p.send_signal(getattr(signal, sig))
        stdout, stderr = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 128 + getattr(signal, sig), stderr[-3000:]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr + stdout, stderr[-3000:]
    assert lines[0].startswith(f"precsim.record: interrupted ({sig}); nothing recorded in "
                               f"{out}"), lines
    assert not out.exists()
