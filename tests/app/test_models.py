"""Real models (precsim.record, precsim.models) on tiny random-initialised checkpoints."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

tf = pytest.importorskip("transformers")

from precsim import models, oracle  # noqa: E402
from precsim.errors import PrecsimError  # noqa: E402
from precsim.record import main as record_main  # noqa: E402


def _mamba2():
    c = tf.Mamba2Config(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_heads=4,
                        head_dim=16, expand=2, state_size=16, n_groups=2, conv_kernel=4,
                        chunk_size=8)
    return tf.Mamba2ForCausalLM(c)


def _nemotron_h():
    c = tf.NemotronHConfig(vocab_size=96, hidden_size=32, num_hidden_layers=3,
                           layers_block_type=["mamba", "attention", "mamba"], mamba_num_heads=4,
                           mamba_head_dim=8, ssm_state_size=16, n_groups=2, num_attention_heads=2,
                           num_key_value_heads=1, head_dim=16, intermediate_size=32)
    return tf.NemotronHForCausalLM(c)


def _bamba():
    c = tf.BambaConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, attn_layer_indices=[1],
                       mamba_n_heads=4, mamba_d_head=16, mamba_d_state=16, mamba_n_groups=2,
                       mamba_expand=2, num_attention_heads=2, num_key_value_heads=1,
                       intermediate_size=32)
    return tf.BambaForCausalLM(c)


def _qwen3_next():
    c = tf.Qwen3NextConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                           intermediate_size=32, moe_intermediate_size=16,
                           shared_expert_intermediate_size=16, num_experts=2,
                           num_experts_per_tok=1, linear_num_value_heads=4,
                           linear_num_key_heads=2, linear_key_head_dim=16,
                           linear_value_head_dim=8, linear_conv_kernel_dim=4,
                           layer_types=["linear_attention", "full_attention"])
    return tf.Qwen3NextForCausalLM(c)


BUILDERS = {"mamba2": _mamba2, "nemotron_h": _nemotron_h, "bamba": _bamba,
            "qwen3_next": _qwen3_next}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """Saved tiny checkpoints (random weights, seed 0), one per architecture."""
    root = tmp_path_factory.mktemp("ckpt")
    out = {}
    for name, build in BUILDERS.items():
        torch.manual_seed(0)
        m = build().eval()
        m.save_pretrained(root / name)
        out[name] = root / name
    return out


@pytest.mark.parametrize("arch", list(BUILDERS))
def test_recorded_inputs_reproduce_each_layers_own_outputs(ckpt, arch):
    model, tok = models.load_model(ckpt[arch])
    assert tok is None
    ids, source = models.prompt_ids(tok, None, 96)
    assert source == "fixed ids"
    seq, rec = models.record(model, ids, 12)
    assert len(seq) == len(ids) + 12
    layers = models.ssm_layers(model)
    assert layers and sorted(rec.inputs) == [i for i, _, _ in layers]
    for idx, _, fam in layers:
        tr = models.trace_arrays(rec.inputs[idx])
        own = torch.stack(rec.outputs[idx]).double().numpy()  # the model's function outputs
        y = oracle.decode(tr)  # float64 recurrence from a zero state
        assert y.shape == own.shape == (len(seq), *own.shape[1:])
        err = np.abs(y - own).max() / np.abs(own).max()
        assert err < 2e-5, (arch, idx, err)
        if fam == "mamba2":
            assert (tr["A"] < 0).all() and (tr["dt"] > 0).all() and "D" in tr
        else:
            assert (tr["g"] <= 0).all()
            # L2-normalised (eps 1e-6 only shrinks) and q carries the 1/sqrt(K) scale
            K = tr["k"].shape[-1]
            nq, nk = np.linalg.norm(tr["q"], axis=-1), np.linalg.norm(tr["k"], axis=-1)
            assert (nq <= K ** -0.5 * (1 + 1e-5)).all() and (nk <= 1 + 1e-5).all()


def test_hook_restores_the_model(ckpt):
    model, _ = models.load_model(ckpt["mamba2"])
    ids = [3, 5, 7, 9]

    def logits():
        cache, out = None, []
        with torch.no_grad():
            for t in ids:
                lg, cache = models.forward_token(model, t, cache)
                out.append(lg)
        return torch.stack(out)

    before = logits()
    models.record(model, ids, 1)
    assert torch.equal(before, logits())
    assert "forward" not in models.ssm_layers(model)[0][1].__dict__


def test_record_cli_writes_traces_that_replay(ckpt, tmp_path):
    from precsim.config import to_config
    from precsim.engines.torch import run as run_torch

    out = tmp_path / "rec"
    assert record_main(["--model", str(ckpt["qwen3_next"]), "--tokens", "6", "--out",
                        str(out)]) == 0
    meta = json.loads((out / "record.json").read_text())
    assert meta["model_class"] == "Qwen3NextForCausalLM"
    assert [lay["layer"] for lay in meta["layers"]] == [0]
    assert meta["prompt_source"] == "fixed ids" and meta["steps"] == len(meta["tokens"])
    cfg = to_config({"workload": {"kind": "trace", "path": str(out), "layer": 0},
                     "schemes": {"c": {"kind": "conventional", "fmt": "fp32"}},
                     "run": {"steps": meta["steps"], "progress": False, "device": "cpu"},
                     "metrics": {"window": 4, "vocab": 16}})
    r = run_torch(cfg, "cpu", progress=False, record_outputs=True)
    with np.load(out / "layer_00.npz") as z:
        truth = oracle.decode(dict(z))
    assert np.allclose(r.info["outputs"]["truth"][:, 0], truth, rtol=1e-10, atol=1e-12)


def _fail_line(capsys, argv):
    capsys.readouterr()  # drop save_pretrained's progress output
    assert record_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("precsim.record: error:")
    return err


def test_record_bad_inputs_are_one_line(ckpt, tmp_path, capsys):
    out = str(tmp_path / "o")
    err = _fail_line(capsys, ["--model", str(tmp_path / "nope"), "--tokens", "4", "--out", out])
    assert "nope" in err
    err = _fail_line(capsys, ["--model", str(ckpt["mamba2"]), "--tokens", "0", "--out", out])
    assert "--tokens=0" in err
    torch.manual_seed(0)
    llama = tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=64, hidden_size=32,
                                               num_hidden_layers=1, num_attention_heads=2,
                                               num_key_value_heads=1, intermediate_size=32))
    llama.save_pretrained(tmp_path / "llama")
    err = _fail_line(capsys, ["--model", str(tmp_path / "llama"), "--tokens", "4", "--out", out])
    assert "LlamaForCausalLM" in err and "unsupported" in err
    c = tf.NemotronHConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                           layers_block_type=["attention", "mlp"], num_attention_heads=2,
                           num_key_value_heads=1, head_dim=16, intermediate_size=32)
    tf.NemotronHForCausalLM(c).save_pretrained(tmp_path / "attn_only")
    err = _fail_line(capsys, ["--model", str(tmp_path / "attn_only"), "--tokens", "4", "--out",
                              out])
    assert "NemotronHForCausalLM" in err and "no SSM layers" in err
    with pytest.raises(PrecsimError, match="no tokenizer"):
        models.prompt_ids(None, "hello", 64)


def test_record_module_exits_2_with_one_line(tmp_path):
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "precsim.record", "--model", str(tmp_path / "x"),
                        "--tokens", "3", "--out", str(tmp_path / "o")], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "x" in p.stderr


# --- whole-model mode ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kl_ckpt(tmp_path_factory):
    """Tiny checkpoints whose SSM layers matter: weights N(0, 0.2^2) and slowly decaying heads
    (so a state error persists instead of washing out in a few tokens)."""
    root = tmp_path_factory.mktemp("klckpt")
    out = {}
    for name in ("mamba2", "qwen3_next"):
        torch.manual_seed(0)
        cfg = BUILDERS[name]().config
        cfg.initializer_range = 0.2
        torch.manual_seed(0)
        m = type(BUILDERS[name]())(cfg).eval()
        with torch.no_grad():
            for _, mixer, _ in models.ssm_layers(m):
                mixer.A_log.fill_(float(np.log(0.05)))
        m.save_pretrained(root / name)
        out[name] = root / name
    return out


def _kl_cfg(path, schemes, steps, **run):
    from precsim.config import to_config

    return to_config({"model": {"path": str(path)}, "schemes": schemes,
                      "run": {"steps": steps, "progress": False, **run},
                      "metrics": {"window": min(8, steps)}})


@pytest.mark.parametrize("arch", ["mamba2", "qwen3_next"])
def test_model_fp32_scheme_matches_and_fp64_scheme_is_the_models_decode(kl_ckpt, arch):
    from precsim.models import run_model_kl

    r = run_model_kl(_kl_cfg(kl_ckpt[arch], {"fp32": {"kind": "conventional", "fmt": "fp32"}},
                             10), "cpu", progress=False)
    assert r.info["kl"]["fp32"].shape == (10,)
    assert r.info["kl"]["fp32"].max() < 1e-6
    assert r.info["top1"]["fp32"].min() == 1.0
    assert r.info["first_flip"]["fp32"] is None
    assert r.rows[-1]["flipped"] == 0 and r.rows[-1]["first_flip"] == 10  # censored
    assert {"scheme", "step", "rel_err", "kl", "kl_p50", "state_drift"} <= set(r.rows[-1])
    # the reference is the model's own decode: a float64 state stepped by precsim gives the
    # model's logits to float32 tolerance at every token
    r64 = run_model_kl(_kl_cfg(kl_ckpt[arch], {"fp64": {"kind": "conventional", "fmt": "fp64"}},
                               10, compute_dtype="fp64"), "cpu", progress=False)
    assert r64.per_step_rel_err["fp64"].max() < 2e-6


def test_model_replacement_is_wired_to_the_layer(kl_ckpt, monkeypatch):
    """The same comparison fails when the hooked inputs are slightly wrong (B scaled by 1e-3)."""
    from precsim.models import run_model_kl

    own = models._mamba2_step

    def perturbed(*a, **k):
        st = own(*a, **k)
        st.inp["B"] = st.inp["B"] * 1.001
        return st

    monkeypatch.setattr(models, "_mamba2_step", perturbed)
    r = run_model_kl(_kl_cfg(kl_ckpt["mamba2"], {"fp64": {"kind": "conventional", "fmt": "fp64"}},
                             6, compute_dtype="fp64"), "cpu", progress=False)
    assert r.per_step_rel_err["fp64"].max() > 2e-5


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["mamba2", "qwen3_next"])
def test_model_shared_nvfp4_sr_drifts_more_than_split(kl_ckpt, arch):
    from precsim.models import run_model_kl

    r = run_model_kl(_kl_cfg(kl_ckpt[arch], {
        "shared": {"kind": "shared", "fmt": "nvfp4", "rounding": "sr"},
        "split": {"kind": "split", "fmt": "fp32", "read_fmt": "nvfp4"}}, 64), "cpu",
        progress=False)
    last = {row["scheme"]: row for row in r.rows if row["step"] == 64}
    assert last["shared"]["kl"] > last["split"]["kl"] > 0
    # (GDN's split master drifts too: with gdn_u_source=read the read copy's error leaks in)
    assert last["shared"]["state_drift"] > 2 * last["split"]["state_drift"]


def test_model_top1_and_first_flip_of_a_flipping_scheme(kl_ckpt):
    """Whole-model divergence columns: the window means and the first flip of the per-token
    top-1 agreement (``info``), with a state in FP4 that flips."""
    from precsim.models import run_model_kl

    r = run_model_kl(_kl_cfg(kl_ckpt["mamba2"], {"fp4": {"kind": "conventional",
                                                         "fmt": "fp4_e2m1"}}, 16),
                     "cpu", progress=False)
    t1 = r.info["top1"]["fp4"]
    assert set(np.unique(t1)) <= {0.0, 1.0} and t1.min() == 0.0
    first = int(np.flatnonzero(t1 == 0)[0]) + 1
    assert r.info["first_flip"]["fp4"] == first
    for row in r.rows:  # windows of 8 tokens
        assert row["top1"] == pytest.approx(t1[row["step"] - 8:row["step"]].mean())
        assert row["flipped"] == int(first <= row["step"])
        assert row["first_flip"] == (first if first <= row["step"] else row["step"])
