"""Real models (precsim.record, precsim.models) on tiny random-initialised checkpoints of every
supported class, built offline from transformers configs."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch

tf = pytest.importorskip("transformers")

from precsim import models, oracle  # noqa: E402
from precsim.errors import PrecsimError  # noqa: E402
from precsim.models import load  # noqa: E402
from precsim.models.run import run_model_kl  # noqa: E402
from precsim.record import main as record_main  # noqa: E402

ATTN = dict(num_attention_heads=2, num_key_value_heads=1, intermediate_size=32)
GDN = dict(linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
           linear_value_head_dim=8, linear_conv_kernel_dim=4, head_dim=16,
           layer_types=["linear_attention", "full_attention"])
MOE = dict(moe_intermediate_size=16, shared_expert_intermediate_size=16, num_experts=2,
           num_experts_per_tok=1)
CONFIGS = {  # class name -> (config class, arguments); vocab 96, hidden 32, 2-3 layers
    "Mamba2ForCausalLM": ("Mamba2Config", dict(
        num_hidden_layers=2, num_heads=4, head_dim=16, expand=2, state_size=16, n_groups=2,
        conv_kernel=4, chunk_size=8)),
    "NemotronHForCausalLM": ("NemotronHConfig", dict(
        num_hidden_layers=3, layers_block_type=["mamba", "attention", "mamba"],
        mamba_num_heads=4, mamba_head_dim=8, ssm_state_size=16, n_groups=2, head_dim=16, **ATTN)),
    "BambaForCausalLM": ("BambaConfig", dict(
        num_hidden_layers=2, attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=16,
        mamba_d_state=16, mamba_n_groups=2, mamba_expand=2, **ATTN)),
    "FalconH1ForCausalLM": ("FalconH1Config", dict(
        num_hidden_layers=2, mamba_n_heads=4, mamba_d_head=16, mamba_d_ssm=64, mamba_d_state=16,
        mamba_n_groups=2, mamba_expand=2, mamba_chunk_size=8, head_dim=16, **ATTN)),
    "Zamba2ForCausalLM": ("Zamba2Config", dict(
        num_hidden_layers=3, layers_block_type=["mamba", "hybrid", "mamba"], mamba_d_state=16,
        mamba_expand=2, mamba_ngroups=2, n_mamba_heads=4, chunk_size=8, use_mamba_kernels=False,
        num_mem_blocks=1, attention_head_dim=16, **ATTN)),
    "GraniteMoeHybridForCausalLM": ("GraniteMoeHybridConfig", dict(
        num_hidden_layers=2, layer_types=["mamba", "attention"], mamba_n_heads=4, mamba_d_head=16,
        mamba_n_groups=2, mamba_d_state=16, mamba_expand=2, mamba_chunk_size=8,
        num_local_experts=2, num_experts_per_tok=1, shared_intermediate_size=32,
        logits_scaling=2.0, **ATTN)),
    "Qwen3NextForCausalLM": ("Qwen3NextConfig", dict(num_hidden_layers=2, **GDN, **MOE, **ATTN)),
    "Qwen3_5ForCausalLM": ("Qwen3_5TextConfig", dict(num_hidden_layers=2, **GDN, **ATTN)),
    "Qwen3_5MoeForCausalLM": ("Qwen3_5MoeTextConfig", dict(num_hidden_layers=2, **GDN, **MOE,
                                                           num_attention_heads=2,
                                                           num_key_value_heads=1)),
}


def build(arch: str, init_range: float | None = None, slow_decay: bool = False, **extra):
    """A tiny random model of class ``arch`` (seed 0); ``init_range`` and ``slow_decay`` make
    its SSM layers matter (weights N(0, r^2), heads decaying by ~5% per token)."""
    cname, kw = CONFIGS[arch]
    cfg = getattr(tf, cname)(vocab_size=96, hidden_size=32, **{**kw, **extra})
    if init_range is not None:
        cfg.initializer_range = init_range
    torch.manual_seed(0)
    m = getattr(tf, arch)(cfg).eval()
    if slow_decay:
        with torch.no_grad():
            for _, mixer, _ in models.ssm_layers(m):
                mixer.A_log.fill_(float(np.log(0.05)))
    return m


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """Saved tiny checkpoints, one per supported class (default initialisation)."""
    root = tmp_path_factory.mktemp("ckpt")
    out = {}
    for arch in CONFIGS:
        build(arch).save_pretrained(root / arch)
        out[arch] = root / arch
    return out


@pytest.fixture(scope="module")
def kl_ckpt(tmp_path_factory):
    """Tiny checkpoints whose SSM layers matter: weights N(0, 0.2^2) and slowly decaying heads
    (so a state error persists instead of washing out in a few tokens)."""
    root = tmp_path_factory.mktemp("klckpt")
    out = {}
    for arch in CONFIGS:
        build(arch, 0.2, slow_decay=True).save_pretrained(root / arch)
        out[arch] = root / arch
    return out


def test_every_supported_class_is_tested():
    assert set(CONFIGS) == set(models.ARCHITECTURES)


class Capture:
    """Hook handler: the model's own scan, keeping each layer's inputs and outputs."""

    def __init__(self):
        self.steps, self.outputs = {}, {}

    def __call__(self, step, run_own):
        y, state = run_own()
        self.steps.setdefault(step.layer, []).append(step)
        self.outputs.setdefault(step.layer, []).append(y)
        return y, state


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_recorded_traces_reproduce_each_layers_own_outputs(ckpt, arch, tmp_path):
    """A document recorded in chunks (the model's cache between them; the last chunk a
    one-token decode step) replays, in the float64 oracle from a zero state, the outputs of the
    model's own scan in one pass over the document."""
    model, tok = models.load_model(ckpt[arch])
    ids = np.random.default_rng(1).integers(0, 96, 13)
    np.save(tmp_path / "ids.npy", ids)
    assert record_main(["--model", str(ckpt[arch]), "--out", str(tmp_path / "rec"),
                        "--ids-file", str(tmp_path / "ids.npy"), "--chunk", "6"]) == 0
    cap = Capture()
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


def test_bf16_trace_is_the_fp32_trace_rounded_and_half_the_bytes(ckpt, tmp_path):
    np.save(tmp_path / "ids.npy", np.arange(40) % 96)
    for dt in ("fp32", "bf16"):
        assert record_main(["--model", str(ckpt["Mamba2ForCausalLM"]), "--out",
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


def test_hook_restores_the_model(ckpt, tmp_path):
    model, _ = models.load_model(ckpt["Mamba2ForCausalLM"])
    ids = torch.tensor([[3, 5, 7, 9]])

    def logits():
        with torch.no_grad():
            return model(input_ids=ids).logits

    before = logits()
    with torch.no_grad(), models.Hook(model, Capture()):
        model(input_ids=ids)
    assert torch.equal(before, logits())
    assert "forward" not in models.ssm_layers(model)[0][1].__dict__


def _fail_line(capsys, argv):
    capsys.readouterr()  # drop save_pretrained's progress output
    assert record_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("precsim.record: error:")
    return err


def test_record_bad_inputs_are_one_line(ckpt, tmp_path, capsys):
    out = str(tmp_path / "o")
    m2 = str(ckpt["Mamba2ForCausalLM"])
    err = _fail_line(capsys, ["--model", str(tmp_path / "nope"), "--tokens", "4", "--out", out])
    assert f"--model={str(tmp_path / 'nope')!r} does not exist; allowed: a local " in err
    err = _fail_line(capsys, ["--model", m2, "--tokens", "0", "--out", out])
    assert "--tokens=0" in err
    err = _fail_line(capsys, ["--model", m2, "--out", out])
    assert "--tokens is required" in err
    err = _fail_line(capsys, ["--model", m2, "--tokens", "4", "--layers", "0,7", "--out", out])
    assert "--layers='0,7'" in err and "allowed: 0, 1" in err
    err = _fail_line(capsys, ["--model", m2, "--text-file", str(tmp_path / "no.txt"), "--out",
                              out])
    assert "no.txt" in err and "does not exist" in err
    (tmp_path / "e.txt").write_text("")
    err = _fail_line(capsys, ["--model", m2, "--text-file", str(tmp_path / "e.txt"), "--out",
                              out])
    assert "holds no text" in err
    (tmp_path / "t.txt").write_text("some text")
    err = _fail_line(capsys, ["--model", m2, "--text-file", str(tmp_path / "t.txt"), "--out",
                              out])
    assert "needs the checkpoint's tokenizer" in err
    np.save(tmp_path / "big.npy", np.array([1, 500]))
    err = _fail_line(capsys, ["--model", m2, "--ids-file", str(tmp_path / "big.npy"), "--out",
                              out])
    assert "0..95" in err
    np.save(tmp_path / "short.npy", np.arange(5))
    err = _fail_line(capsys, ["--model", m2, "--ids-file", str(tmp_path / "short.npy"),
                              "--tokens", "9", "--out", out])
    assert "5 tokens, fewer than --tokens=9; allowed: --tokens <= 5 or a longer" in err
    err = _fail_line(capsys, ["--model", m2, "--text-file", str(tmp_path), "--out", out])
    assert f"--text-file={str(tmp_path)!r} is a directory; allowed: a .txt file" in err
    err = _fail_line(capsys, ["--model", m2, "--prompt", "hello", "--tokens", "9", "--out", out])
    assert "--prompt='hello' given but the checkpoint has no tokenizer; allowed: no --prompt" \
        in err
    err = _fail_line(capsys, ["--model", m2, "--tokens", "4", "--dtype", "fp8", "--out", out])
    assert "--dtype='fp8'" in err
    assert not (tmp_path / "o" / "record.json").exists()  # nothing half-written as a result
    torch.manual_seed(0)
    llama = tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=64, hidden_size=32,
                                               num_hidden_layers=1, **ATTN))
    llama.save_pretrained(tmp_path / "llama")
    err = _fail_line(capsys, ["--model", str(tmp_path / "llama"), "--tokens", "4", "--out", out])
    assert "LlamaForCausalLM" in err and "unsupported" in err
    c = tf.NemotronHConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                           layers_block_type=["attention", "mlp"], head_dim=16, **ATTN)
    tf.NemotronHForCausalLM(c).save_pretrained(tmp_path / "attn_only")
    err = _fail_line(capsys, ["--model", str(tmp_path / "attn_only"), "--tokens", "4", "--out",
                              out])
    assert "NemotronHForCausalLM" in err and "no SSM layers" in err
    with pytest.raises(PrecsimError, match="model.prompt='hello' given but .* no tokenizer"):
        load.prompt_ids(None, "hello", 64)


def test_greedy_tokens_notice_names_the_commands_flags(ckpt, tmp_path, capsys, monkeypatch):
    """The notice while greedy tokens are generated names the flags that skip it: precsim.record's
    (--text-file / --ids-file), the config's in whole-model mode."""
    import contextlib

    from precsim.engines import base

    said = []
    monkeypatch.setattr(base, "slow_notice",
                        lambda what, *a, **k: said.append(what) or contextlib.nullcontext())
    assert record_main(["--model", str(ckpt["Mamba2ForCausalLM"]), "--tokens", "12", "--out",
                        str(tmp_path / "r")]) == 0
    assert said == ["generating 4 greedy tokens (give --text-file or --ids-file to skip this)"]
    run_model_kl(_kl_cfg(ckpt["Mamba2ForCausalLM"], SCHEMES, 12), "cpu", progress=False)
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


def test_broken_checkpoints_are_one_line_errors_and_leave_no_directory(ckpt, tmp_path, capsys,
                                                                       monkeypatch):
    """A checkpoint directory without its weights, or with a truncated or garbage weights file:
    one line naming the key (--model, model.path), the path and what is allowed, exit 2, and
    neither command leaves a directory behind (no recording, no run directory)."""
    from conftest import run_main

    monkeypatch.chdir(tmp_path)  # Hydra's default run directory: outputs/ under here
    for d, what in _broken_checkpoints(ckpt["Mamba2ForCausalLM"], tmp_path):
        err = _fail_line(capsys, ["--model", str(d), "--tokens", "4", "--out", "rec"])
        assert f"--model={str(d)!r}" in err and what in err and "; allowed: " in err, err
        rc, _, lines = run_main(["experiment=model_kl", f"model.path={d}", "run.steps=8",
                                 "metrics.window=8", "metrics.plot=false",
                                 "run.progress=false"], capsys)
        assert rc == 2 and len(lines) == 1, lines
        assert lines[0].startswith(f"precsim: error: model.path={str(d)!r}") and what in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["garbage", "noshard", "noweights",
                                                           "truncated"]


def _one_line_errors(cases, capsys):
    from conftest import run_main

    tiny = ["run.steps=8", "metrics.window=8", "metrics.plot=false", "run.progress=false"]
    for args, want in cases:
        rc, out, lines = run_main([*args, *tiny], capsys)
        assert rc == 2 and len(lines) == 1 and not out, (args, lines)
        assert lines[0].startswith("precsim: error: ") and want in lines[0], lines


def test_model_kl_errors_name_its_keys(ckpt, tmp_path, capsys, monkeypatch):
    """A missing model.path, a directory as model.text and a document shorter than run.steps:
    one line naming the config's key (the same checks name precsim.record's flags there)."""
    monkeypatch.chdir(tmp_path)
    m2 = ckpt["Mamba2ForCausalLM"]
    np.save(tmp_path / "short.npy", np.arange(5))
    _one_line_errors([
        (["experiment=model_kl", f"model.path={tmp_path / 'nope'}"],
         f"model.path={str(tmp_path / 'nope')!r} does not exist; allowed: a local "),
        (["experiment=model_kl", f"model.path={m2}", f"model.text={tmp_path}"],
         f"model.text={str(tmp_path)!r} is a directory; allowed: a .txt file"),
        (["experiment=model_kl", f"model.path={m2}", f"model.ids={tmp_path / 'short.npy'}"],
         "has 5 tokens, fewer than run.steps=8; allowed: run.steps <= 5")], capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["short.npy"]  # no run directory


def test_whole_model_presets_need_a_model_path(tmp_path, capsys, monkeypatch):
    """experiment=model_kl (and per_layer) without model.path is a one-line error naming the
    key, not a synthetic layer-level run."""
    monkeypatch.chdir(tmp_path)
    _one_line_errors([
        (["experiment=model_kl"], "experiment=model_kl needs model.path (it runs a real "
                                  "checkpoint); allowed: model.path=DIR"),
        (["experiment=per_layer"], "experiment=per_layer needs model.path")], capsys)
    assert not list(tmp_path.iterdir())  # no run directory


def test_an_interrupted_recording_removes_only_its_own_folders(ckpt, tmp_path, monkeypatch,
                                                              capsys):
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
    assert record_main(["--model", str(ckpt["Mamba2ForCausalLM"]), "--tokens", "4",
                        "--layers", "0,1", "--out", str(out)]) == 130
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        "layer_00", "layer_00/summary.json", "notes.txt"]
    capsys.readouterr()


def test_record_never_replaces_a_recording(ckpt, tmp_path, capsys):
    """--out holding a finished recording (record.json) is a one-line error and the recording
    is left as it was; a folder without record.json (nothing finished) may be recorded into."""
    m2, out = str(ckpt["Mamba2ForCausalLM"]), tmp_path / "rec"
    assert record_main(["--model", m2, "--tokens", "6", "--out", str(out)]) == 0
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    err = _fail_line(capsys, ["--model", m2, "--tokens", "4", "--layers", "1", "--out",
                              str(out)])
    assert err == (f"precsim.record: error: --out={str(out)!r} already holds a recording "
                   "(record.json); allowed: another --out, or delete that directory first")
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before
    (tmp_path / "f").write_text("")
    err = _fail_line(capsys, ["--model", m2, "--tokens", "4", "--out", str(tmp_path / "f")])
    assert "--out=" in err and "is not a directory" in err
    (tmp_path / "stale" / "layer_00").mkdir(parents=True)  # an unfinished recording's folder
    assert record_main(["--model", m2, "--tokens", "4", "--out", str(tmp_path / "stale")]) == 0
    assert json.loads((tmp_path / "stale" / "record.json").read_text())["tokens"] == 4


@pytest.mark.parametrize("sig", ["SIGINT", pytest.param("SIGTERM", marks=pytest.mark.slow)])
def test_record_interrupted_is_one_line_and_leaves_no_partial_recording(ckpt, tmp_path, sig):
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
                          str(ckpt["Mamba2ForCausalLM"]), "--ids-file", str(tmp_path / "ids.npy"),
                          "--chunk", "1", "--out", str(out)],
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


# --- whole-model mode ------------------------------------------------------------------------


def _kl_cfg(path, schemes, steps=None, **over):
    from precsim.config import to_config

    steps = over.pop("run__steps", steps)
    d = {"model": {"path": str(path)}, "schemes": schemes,
         "run": {"steps": steps, "progress": False},
         # these tests measure each scheme against the float64-state truth (the floor's own
         # tests, tests/app/test_floor.py, use the FP32-state baseline, the default)
         "metrics": {"window": min(8, steps), "baseline": "fp64"},
         "replay": {"buffer_len": 4}}
    for key, val in over.items():
        sec, _, k = key.partition("__")
        d.setdefault(sec, {})[k] = val
    return to_config(d)


SCHEMES = {"fp32": {"kind": "conventional", "fmt": "fp32"},
           "shared": {"kind": "shared", "fmt": "nvfp4", "rounding": "sr"},
           "split": {"kind": "split", "fmt": "fp32", "read_fmt": "nvfp4"}}


# float32 in parts of the model that feed a later SSM layer (attention's float32 softmax), or no
# float64 at all (the MoE classes' grouped matmul)
LOOSE = {"Qwen3NextForCausalLM", "Qwen3_5MoeForCausalLM", "GraniteMoeHybridForCausalLM",
         "NemotronHForCausalLM", "Zamba2ForCausalLM"}


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_parallel_mode_equals_decode_mode(kl_ckpt, arch, tmp_path):
    """The sequence-parallel pass and the token-by-token decode give the same per-token KL.

    Models whose SSM inputs are float64 end to end (run in float64): the NVFP4 shared (SR) and
    split schemes agree to float32 noise, measured <= 1.1e-6 of the largest KL (the gated
    RMSNorm after the scan computes in float32 even in a float64 model; the states see the same
    inputs, only the segment sums' order differs). Otherwise (float32 MoE layers; attention's
    float32 softmax before a later SSM layer) the SSM inputs differ between the two modes by
    float32 reduction-order noise (~4e-7 relative: the convolution's update path against its
    sequence path, the attention's), which can flip an NVFP4 rounding of the state: single
    tokens then differ by up to ~50% of their KL while the means agree (measured within 6%).
    FP32 states agree to 1e-11 absolute either way."""
    np.save(tmp_path / "ids.npy", np.random.default_rng(2).integers(0, 96, (1, 14)))
    wide = "float32" if arch in LOOSE else "float64"
    r = {mode: run_model_kl(_kl_cfg(kl_ckpt[arch], SCHEMES, 14, model__mode=mode,
                                    model__ids=str(tmp_path / "ids.npy"), model__dtype=wide),
                            "cpu", progress=False)
         for mode in ("parallel", "decode")}
    p, d = (r[k].per_step_rel_err for k in ("parallel", "decode"))
    assert np.abs(p["fp32:kl"] - d["fp32:kl"]).max() < 1e-11
    for n in ("shared", "split"):
        kl_p, kl_d = p[f"{n}:kl"], d[f"{n}:kl"]
        assert kl_p.max() > 1e-6, (n, kl_p.max())  # the scheme's error is visible
        if wide == "float64":
            assert np.abs(kl_p - kl_d).max() <= 1e-5 * kl_p.max(), n
            assert np.array_equal(p[f"{n}:top1"], d[f"{n}:top1"])
        else:
            assert kl_p.mean() == pytest.approx(kl_d.mean(), rel=0.15), n
    for row_p, row_d in zip(r["parallel"].rows, r["decode"].rows, strict=True):
        if row_p["state_drift"] < 1e-5:  # float32 rounding noise in both (FP32 states)
            assert row_d["state_drift"] < 1e-5
        else:
            assert row_p["state_drift"] == pytest.approx(row_d["state_drift"],
                                                         rel=1e-3 if wide == "float64" else 0.15)


@pytest.mark.parametrize("arch", ["Mamba2ForCausalLM", "Qwen3_5ForCausalLM",
                                  "FalconH1ForCausalLM", "BambaForCausalLM"])
def test_reference_is_the_models_own_forward_in_float64(kl_ckpt, arch, tmp_path):
    """The reference group (a float64 state in every SSM layer) gives the model's own logits
    when the model runs in float64 (its own chunked scan: rounding apart, the same function),
    and an fp64 scheme equals the reference."""
    np.save(tmp_path / "ids.npy", np.arange(3, 19)[None])
    r = run_model_kl(_kl_cfg(kl_ckpt[arch], {"fp64": {"kind": "conventional", "fmt": "fp64"}},
                             16, model__dtype="float64", model__ids=str(tmp_path / "ids.npy")),
                     "cpu", progress=False)
    assert r.per_step_rel_err["fp64"].max() < 1e-12
    model, _ = models.load_model(kl_ckpt[arch], dtype="float64")
    from precsim.models.parallel import ScanHandler
    from precsim.models.scan import REFERENCE, Group

    cfg = _kl_cfg(kl_ckpt[arch], SCHEMES, 16)
    with torch.no_grad():
        own = model(input_ids=torch.arange(3, 19)[None], use_cache=False).logits
        with models.Hook(model, ScanHandler([Group("reference", REFERENCE, True)], 1, cfg,
                                            torch.float64, "torch")):
            ours = model(input_ids=torch.arange(3, 19)[None], use_cache=False).logits
    # (the gated RMSNorm after the scan rounds to float32: ~6e-8 apart where a value's float32
    # rounding differs)
    assert torch.allclose(ours, own, rtol=1e-6, atol=1e-6 * float(own.abs().max()))


def test_layer_outputs_equal_the_layer_engine_on_each_groups_inputs(kl_ckpt, tmp_path):
    """Per layer, each scheme's outputs in whole-model mode are the torch layer engine's outputs
    of that scheme on the inputs the layer saw for that scheme (RNE formats; 16 tokens = whole
    segments, so both flush alike)."""
    from precsim.config import to_config
    from precsim.engines.torch import run as run_torch
    from precsim.models import scan as scan_mod
    from precsim.models.parallel import ScanHandler

    schemes = {"shared": {"kind": "shared", "fmt": "nvfp4"},
               "split": {"kind": "split", "fmt": "fp32", "read_fmt": "fp8_e4m3"},
               "c8": {"kind": "conventional", "fmt": "fp8_e4m3"}}
    cfg = _kl_cfg(kl_ckpt["Mamba2ForCausalLM"], schemes, 16)
    seen = []

    class Keep(ScanHandler):
        def __call__(self, step, run_own):
            y, st = super().__call__(step, run_own)
            seen.append((step, y))
            return y, st

    model, _ = models.load_model(kl_ckpt["Mamba2ForCausalLM"])
    groups = [scan_mod.Group("reference", scan_mod.REFERENCE, True),
              *(scan_mod.Group(n, cfg.schemes[n]) for n in schemes)]
    with torch.no_grad(), models.Hook(model, Keep(groups, 1, cfg, torch.float32, "torch")):
        model(input_ids=torch.arange(5, 21)[None].repeat(len(groups), 1), use_cache=False)
    assert [s.layer for s, _ in seen] == [0, 1]
    for step, y in seen:
        for gi, g in enumerate(groups[1:], 1):
            tr = {k: v[:, gi].double().numpy() for k, v in step.inp.items()}
            tr.update({k: v.double().numpy() for k, v in step.const.items()})
            np.savez(tmp_path / f"t{gi}.npz", **tr)
            c = to_config({"workload": {"kind": "trace", "path": str(tmp_path / f"t{gi}.npz")},
                           "schemes": {g.name: schemes[g.name]},
                           "run": {"steps": 16, "progress": False, "device": "cpu"},
                           "replay": {"buffer_len": 4}, "metrics": {"window": 8, "vocab": 8}})
            out = run_torch(c, "cpu", progress=False, record_outputs=True).info["outputs"]
            assert np.array_equal(out[g.name][:, 0], y[:, gi].numpy()), (step.layer, g.name)


@pytest.mark.parametrize("arch,ratio", [("Mamba2ForCausalLM", 2.0),
                                        ("Qwen3NextForCausalLM", 1.3)])
def test_model_shared_nvfp4_sr_drifts_more_than_split(kl_ckpt, arch, ratio, tmp_path):
    """Whole-model metrics rank the schemes: a shared NVFP4-SR checkpoint is worse than a split
    NVFP4 read copy over an FP32 master (KL and state drift), over 2 documents. KL ratios
    measured: 5.3 (Mamba-2), 1.66 (GDN, whose outputs read the NVFP4 copy through u too)."""
    np.save(tmp_path / "ids.npy", np.random.default_rng(3).integers(0, 96, (2, 96)))
    r = run_model_kl(_kl_cfg(kl_ckpt[arch], SCHEMES, 96, model__ids=str(tmp_path / "ids.npy"),
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
    r = run_model_kl(_kl_cfg(kl_ckpt["Mamba2ForCausalLM"],
                             {"fp4": {"kind": "conventional", "fmt": "fp4_e2m1"}}, 16),
                     "cpu", progress=False)
    t1 = r.per_step_rel_err["fp4:top1"][:, 0]
    assert set(np.unique(t1)) <= {0.0, 1.0} and t1.min() == 0.0
    first = int(np.flatnonzero(t1 == 0)[0]) + 1
    assert r.info["first_flip"]["fp4"] == [first]
    for row in r.rows:  # windows of 8 tokens
        assert row["top1"] == pytest.approx(t1[row["step"] - 8:row["step"]].mean())
        assert row["flipped"] == int(first <= row["step"])


def test_model_bad_inputs_are_one_line(kl_ckpt, tmp_path):
    path = kl_ckpt["Mamba2ForCausalLM"]
    with pytest.raises(PrecsimError, match="run.seqs=2 without model.text or model.ids"):
        run_model_kl(_kl_cfg(path, SCHEMES, 8, run__seqs=2), "cpu", progress=False)
    (tmp_path / "x.txt").write_text("a document")
    with pytest.raises(PrecsimError, match="needs the checkpoint's tokenizer"):
        run_model_kl(_kl_cfg(path, SCHEMES, 8, model__text=str(tmp_path / "x.txt")), "cpu",
                     progress=False)
    with pytest.raises(PrecsimError, match="run.engine='numba' with model.path"):
        run_model_kl(_kl_cfg(path, SCHEMES, 8, run__engine="numba"), "cpu", progress=False)
    with pytest.raises(PrecsimError, match="replay.drafts=2 with model.path"):
        run_model_kl(_kl_cfg(path, SCHEMES, 8, replay__drafts=2), "cpu", progress=False)
    with pytest.raises(PrecsimError, match="model.ids=.* is not a readable .npy"):
        run_model_kl(_kl_cfg(path, SCHEMES, 8, model__ids=str(tmp_path / "no.npy")), "cpu",
                     progress=False)


def test_a_whole_model_verdict_says_what_its_budget_measures():
    from precsim.report import run_verdict

    summary = {"steps": 8, "info": {"workload": "model"}, "schemes": {"a": {}},
               "figures": {"a": {"final": {"kl": 1e-3, "rel_err": 1e-2}}},
               "cost": {"a": {"bytes_per_step": 100}}}
    assert "the model's own next-token distributions" in run_verdict(summary, "kl", 0.01, ".")
    assert "logits' relative RMS error" in run_verdict(summary, "rel_err", 0.1, ".")
    summary["info"]["workload"] = "synthetic"
    assert "layer output's RMS error" in run_verdict(summary, "rel_err", 0.1, ".")


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_chunked_parallel_mode_equals_one_pass(kl_ckpt, arch):
    """``model.chunk``: the documents through the model in chunks of positions (its cache and
    every layer's group states carried on; the last chunk a one-token step) give the one-pass
    metrics to float32 reduction-order noise (attention over a cache, the conv from its state):
    measured on these models <= 3.4e-5 of the largest KL on an Intel Xeon and <= 1.4e-4 on an
    AMD EPYC (Zamba2; the same 1.2e-4 / 1.4e-4 there at 2e6ec49, before the floor's groups: the
    CPU's float32 kernels' reduction order, not the batch) and <= 4.3e-7 in rel_err."""
    r0 = run_model_kl(_kl_cfg(kl_ckpt[arch], SCHEMES, 25, model__chunk=0), "cpu", progress=False)
    r1 = run_model_kl(_kl_cfg(kl_ckpt[arch], SCHEMES, 25, model__chunk=8), "cpu", progress=False)
    assert r0.info["chunk"] == 25 and r1.info["chunk"] == 8
    for name, v in r0.per_step_rel_err.items():
        w = r1.per_step_rel_err[name]
        if name.endswith(":kl"):
            assert np.abs(w - v).max() <= 3e-4 * np.abs(v).max() + 1e-12, name
        elif name.endswith(":top1"):
            assert (w == v).mean() >= 0.96, name  # a near-tie may flip
        else:
            assert np.abs(w - v).max() <= 5e-6, name
    d0, d1 = ([r["state_drift"] for r in r.rows if r["scheme"] == "shared"] for r in (r0, r1))
    assert d0 == pytest.approx(d1, rel=1e-4)  # NVFP4 drift (FP32's is float32 noise itself)


@pytest.mark.parametrize("arch", ["Mamba2ForCausalLM", "NemotronHForCausalLM",
                                  "Qwen3_5ForCausalLM"])
def test_whole_model_run_resumes_bit_identically(kl_ckpt, arch, tmp_path, monkeypatch):
    """SIGINT at a known position stops a chunked whole-model run at the next chunk with a
    checkpoint (the model's cache, every layer's scheme states and SR counters, the metrics so
    far); the resumed run equals the uninterrupted one bit for bit."""
    from precsim.checkpoint import Checkpoint, Interrupted, install_handlers, restore_handlers

    schemes = {**SCHEMES, "sr": {"kind": "conventional", "fmt": "fp16", "rounding": "sr"}}
    cfg = _kl_cfg(kl_ckpt[arch], schemes, 40, model__chunk=8)
    ref = run_model_kl(cfg, "cpu", progress=False)
    monkeypatch.setenv("PRECSIM_SIGNAL_AT", "SIGINT@12")
    old = install_handlers()
    try:
        with pytest.raises(Interrupted) as e, Checkpoint(cfg, tmp_path) as ck:
            run_model_kl(cfg, "cpu", progress=False, ckpt=ck)
    finally:
        restore_handlers(old)
    assert e.value.pos == 16 and (tmp_path / "checkpoint.pt").is_file()
    part = e.value.partial
    assert part.info["interrupted_at"] == 16 and max(r["step"] for r in part.rows) == 16
    assert part.rows == [r for r in ref.rows if r["step"] <= 16]
    monkeypatch.delenv("PRECSIM_SIGNAL_AT")
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


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["Mamba2ForCausalLM", "BambaForCausalLM", "Qwen3_5ForCausalLM"])
def test_triton_backend_chunks_and_resumes_on_the_gpu(arch, tmp_path, monkeypatch):
    """On a GPU (the Triton scan): chunked equals one pass to float32 noise, and an interrupted
    chunked run resumes bit-identically."""
    from precsim.checkpoint import Checkpoint, Interrupted, install_handlers, restore_handlers

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
    r0 = run_model_kl(_kl_cfg(kl_ckpt[arch], schemes, **over, model__chunk=0), "cuda",
                      progress=False)
    cfg = _kl_cfg(kl_ckpt[arch], schemes, **over, model__chunk=2048)
    ref = run_model_kl(cfg, "cuda", progress=False)
    assert ref.engine == "model/triton", ref.info.get("scan_backend_why")
    assert ref.info["chunk"] == 2048
    for name, v in r0.per_step_rel_err.items():  # measured on one H200: <= 1.9e-4 of the
        if name.endswith(":kl"):  # largest KL (Mamba-2; the GPU's float32 kernels differ more)
            assert np.abs(ref.per_step_rel_err[name] - v).max() <= 1e-3 * np.abs(v).max() + 1e-9
    monkeypatch.setenv("PRECSIM_SIGNAL_AT", "SIGINT@100")
    old = install_handlers()
    try:
        with pytest.raises(Interrupted) as e, Checkpoint(cfg, tmp_path / "run") as ck:
            run_model_kl(cfg, "cuda", progress=False, ckpt=ck)
    finally:
        restore_handlers(old)
    assert e.value.pos == 2048
    monkeypatch.delenv("PRECSIM_SIGNAL_AT")
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
    want = run_model_kl(_kl_cfg(tmp_path / arch, SCHEMES, 24, **over), "cpu", progress=False)
    monkeypatch.setattr(run_mod, "backend_for", lambda *a, **k: "triton")
    monkeypatch.setattr("precsim.models.scan_triton.DRIFT_EVERY", 8)
    monkeypatch.setattr(m2_k, "TRUTH_ROWS", 8)
    monkeypatch.setattr(parallel, "scan", lambda step, groups, K, cfg_, compute, backend, chunks:
                        scan_triton(step, groups, K, cfg_, chunks=chunks))
    got = run_model_kl(_kl_cfg(tmp_path / arch, SCHEMES, 24, **over, model__chunk=16), "cpu",
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
