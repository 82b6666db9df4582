"""Shared fixtures: tiny configs and trace files."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

# one intra-op thread, as the engines' run.threads=auto: torch's OpenMP workers spin, and with two
# on a busy 2-core machine tests/engines/test_decays.py took 79 s against 11 s with one (the
# float64 truth's tiny einsums went from ~45 us to ~24 ms each)
torch.set_num_threads(1)
if not torch.cuda.is_available():  # Triton kernels run in the interpreter on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")


def tiny_cfg(family="mamba2", steps=96, heads=2, schemes=None, **over):
    """A small, fast config dict (validated by precsim.config.to_config)."""
    dims = {"mamba2": (8, 32), "gdn": (16, 32)}[family]
    cfg = {
        "model": {"family": family, "name": family, "heads": heads, "head_dim": dims[0],
                  "state_dim": dims[1]},
        "schemes": schemes or {"conventional_fp32": {"kind": "conventional", "fmt": "fp32"}},
        "run": {"steps": steps, "progress": False, "seqs": 1},
        "metrics": {"window": 32, "vocab": 64},
    }
    for key, val in over.items():
        sec, _, k = key.partition("__")
        cfg.setdefault(sec, {})[k] = val
    return cfg


def run_main(args, capsys):
    """(exit status, stdout, non-empty stderr lines) of the app run in process,
    ``precsim.cli.main(argv)``. An interrupted command marks its line said for the process's
    watchdog (checkpoint.mark_said): the mark is put back, as a new process would start."""
    from precsim.checkpoint import mark_said, said_why
    from precsim.cli import main

    said = said_why()
    try:
        rc = main(list(args))
    except SystemExit as e:
        rc = e.code
    finally:
        mark_said(said)
    cap = capsys.readouterr()
    return rc, cap.out, [ln for ln in cap.err.splitlines() if ln.strip()]


def make_trace(family="mamba2", T=64, H=2, P=4, N=8, seed=0, with_D=False):
    rng = np.random.default_rng(seed)
    if family == "mamba2":
        tr = {"A": -rng.uniform(0.01, 1.0, H), "dt": np.log1p(np.exp(rng.normal(size=(T, H)))),
              "x": rng.normal(size=(T, H, P)), "B": rng.normal(size=(T, H, N)),
              "C": rng.normal(size=(T, H, N))}
        if with_D:
            tr["D"] = rng.normal(size=H)
        return tr
    q = rng.normal(size=(T, H, N))
    k = rng.normal(size=(T, H, N))
    q /= np.linalg.norm(q, axis=-1, keepdims=True) * np.sqrt(N)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    return {"g": -rng.uniform(0.001, 0.5, (T, H)), "beta": rng.uniform(0.05, 0.95, (T, H)),
            "q": q, "k": k, "v": rng.normal(size=(T, H, P))}


@pytest.fixture
def trace_file(tmp_path):
    def _make(family="mamba2", **kw):
        tr = make_trace(family, **kw)
        path = tmp_path / f"{family}.npz"
        np.savez(path, **tr)
        return path, tr
    return _make


# the article's five configurations, as the preset the CLI uses
SEED_TABLE = yaml.safe_load((Path(__file__).resolve().parents[1] / "conf" / "schemes" /
                             "seed_table.yaml").read_text())


# error feedback on every kind of scheme (tests/engines/test_error_feedback.py; the resume test
# runs two of them, so the numba engine compiles them once for both)
EF_SCHEMES = {
    "c_int8_ef": {"kind": "conventional", "fmt": "int8_b16", "error_feedback": "fp16"},
    "c_fp8sr_ef": {"kind": "conventional", "fmt": "fp8_e4m3", "rounding": "sr",
                   "error_feedback": "fp8_e4m3"},
    "c_fp16": {"kind": "conventional", "fmt": "fp16"},
    "s_fp8_ef": {"kind": "shared", "fmt": "fp8_e4m3", "error_feedback": "fp32"},
    "sp_ef": {"kind": "split", "fmt": "bf16", "read_fmt": "nvfp4", "error_feedback": "int8_b16"},
}


def torchao_nvfp4(x: torch.Tensor, scope: str) -> torch.Tensor:
    """torchao's NVFP4 fake quantisation of a float32 ``(m, k)`` tensor (``scope``: "tensor" with
    a per-tensor FP32 scale, "none" without), dequantised. torchao is in the ``test`` extra (the
    production quantiser the NVFP4 tests compare against): missing, or with an API this helper
    does not know, the test fails rather than skips."""
    from torchao.prototype.mx_formats import kernels as kern
    from torchao.prototype.mx_formats import nvfp4_tensor as nvt

    missing = [a for m, a in ((nvt, "nvfp4_quantize"), (nvt, "per_tensor_amax_to_scale"),
                              (kern, "unpack_uint4"), (kern, "f4_unpacked_to_f32"))
               if not hasattr(m, a)]
    assert not missing, f"torchao's nvfp4 API differs from the one this helper knows: {missing}"
    m, k = x.shape
    pts = None if scope == "none" else nvt.per_tensor_amax_to_scale(x.abs().max())
    scales, packed = nvt.nvfp4_quantize(x, 16, pts)
    q = kern.f4_unpacked_to_f32(kern.unpack_uint4(packed)).view(m, k // 16, 16)
    total = scales.to(torch.float32).view(m, k // 16, 1)
    if pts is not None:
        total = pts * total
    return (q * total).view(m, k)


def load_script(path, name: str | None = None):
    """A script (``experiments/``, ``tests/gpu/``) imported as a module (it is not a package),
    registered in ``sys.modules`` under ``name`` first, as importlib's recipe does: a function of
    the script then pickles by reference (gpu_check.py's forked oracle workers), which fails
    for a module that ``sys.modules`` does not hold."""
    import importlib.util

    path = Path(path)
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


# -- no test writes inside the repository ------------------------------------------------------
REPO = Path(__file__).resolve().parents[1]
# what a command run from the repository leaves there: Hydra's default run and sweep directories
# (outputs/NAME/DATE_ID, multirun/NAME/DATE_ID)
_HYDRA_DEFAULTS = ("outputs", "multirun")


def interrupted(monkeypatch, at: str, cfg, path, run):
    """What ``run(ckpt)`` raises when ``PRECSIM_SIGNAL_AT=at`` (``SIGINT@STEP``: the signal at
    that step) interrupts it under precsim's signal handlers, with a Checkpoint of ``cfg`` in
    ``path``: the Interrupted (the handlers restored and the variable unset after)."""
    from precsim.checkpoint import Checkpoint, Interrupted, install_handlers, restore_handlers

    monkeypatch.setenv("PRECSIM_SIGNAL_AT", at)
    old = install_handlers()
    try:
        with pytest.raises(Interrupted) as e, Checkpoint(cfg, path) as ck:
            run(ck)
    finally:
        restore_handlers(old)
        monkeypatch.delenv("PRECSIM_SIGNAL_AT")
    return e.value


def _left_in_repo() -> set[str]:
    return {p.relative_to(REPO).as_posix() for d in _HYDRA_DEFAULTS
            for p in (REPO / d).glob("*/*")}


@pytest.fixture(autouse=True)
def _nothing_left_in_the_repository():
    """Fail a test that leaves a run or sweep directory in the repository's outputs/ or
    multirun/ (a stat of two folders per test): it must write under tmp_path (hydra.run.dir=,
    hydra.sweep.dir=, run.out_dir= or cwd=tmp_path). Under pytest-xdist another worker's test
    running at the same moment may be the one to blame."""
    before = _left_in_repo()
    yield
    new = _left_in_repo() - before
    if new:  # a stub another process is about to remove (a failed run's) is not left behind
        import time

        time.sleep(1.0)
        new = sorted(new & _left_in_repo())
    if new:
        pytest.fail(f"the test left {', '.join(new)} in the repository ({REPO}); write under "
                    "tmp_path: hydra.run.dir=, hydra.sweep.dir=, run.out_dir= or cwd=tmp_path",
                    pytrace=False)


def record_tiny_mamba2(tmp_path):
    """A tiny random Mamba-2 (seed 0; 2 layers, 4 heads x 16, 2 groups) recorded over 64 token
    ids (both layers) by ``precsim.record``: the record directory ``tmp_path/rec``."""
    import numpy as np
    import torch
    import transformers as tf

    from precsim.record import main as record_main

    torch.manual_seed(0)
    tf.Mamba2ForCausalLM(tf.Mamba2Config(
        vocab_size=96, hidden_size=32, num_hidden_layers=2, num_heads=4, head_dim=16, expand=2,
        state_size=16, n_groups=2, conv_kernel=4, chunk_size=8)).save_pretrained(tmp_path / "m")
    np.save(tmp_path / "ids.npy", np.random.default_rng(1).integers(0, 96, 64))
    rec = tmp_path / "rec"
    assert record_main(["--model", str(tmp_path / "m"), "--ids-file", str(tmp_path / "ids.npy"),
                        "--layers", "0,1", "--out", str(rec)]) == 0
    return rec


# -- tiny real models (tests/models/, tests/report/) --------------------------------------------
# Random-initialised checkpoints of every supported class, built offline from transformers
# configs (seed 0): the whole-model tests' models. transformers is imported when a model is
# built (a test without it skips).

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
    tf = pytest.importorskip("transformers")
    from precsim import models

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


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """Saved tiny checkpoints, one per supported class (default initialisation)."""
    root = tmp_path_factory.mktemp("ckpt")
    out = {}
    for arch in CONFIGS:
        build(arch).save_pretrained(root / arch)
        out[arch] = root / arch
    return out


@pytest.fixture(scope="session")
def kl_ckpt(tmp_path_factory):
    """Tiny checkpoints whose SSM layers matter: weights N(0, 0.2^2) and slowly decaying heads
    (so a state error persists instead of washing out in a few tokens)."""
    root = tmp_path_factory.mktemp("klckpt")
    out = {}
    for arch in CONFIGS:
        build(arch, 0.2, slow_decay=True).save_pretrained(root / arch)
        out[arch] = root / arch
    return out


class ScanCapture:
    """Hook handler: the model's own scan, keeping each layer's inputs and outputs."""

    def __init__(self):
        self.steps, self.outputs = {}, {}

    def __call__(self, step, run_own):
        y, state = run_own()
        self.steps.setdefault(step.layer, []).append(step)
        self.outputs.setdefault(step.layer, []).append(y)
        return y, state


# three schemes of whole-model mode: FP32, a shared NVFP4-SR state, a split NVFP4 read copy
MODEL_SCHEMES = {"fp32": {"kind": "conventional", "fmt": "fp32"},
                 "shared": {"kind": "shared", "fmt": "nvfp4", "rounding": "sr"},
                 "split": {"kind": "split", "fmt": "fp32", "read_fmt": "nvfp4"}}


def kl_cfg(path, schemes, steps=None, **over):
    """A whole-model config of the checkpoint ``path`` (``section__key=value`` overrides)."""
    from precsim.config import to_config

    steps = over.pop("run__steps", steps)
    d = {"model": {"path": str(path)}, "schemes": schemes,
         "run": {"steps": steps, "progress": False},
         # these tests measure each scheme against the float64-state truth (the floor's own
         # tests, tests/models/test_floor.py, use the FP32-state baseline, the default)
         "metrics": {"window": min(8, steps), "baseline": "fp64"},
         "replay": {"buffer_len": 4}}
    for key, val in over.items():
        sec, _, k = key.partition("__")
        d.setdefault(sec, {})[k] = val
    return to_config(d)


def record_error_line(capsys, argv):
    """precsim.record's one-line error (exit 2) for ``argv``."""
    from precsim.record import main as record_main

    capsys.readouterr()  # drop save_pretrained's progress output
    assert record_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("precsim.record: error:")
    return err


def one_line_errors(cases, capsys):
    """Each ``(args, want)``: the app, at a tiny size, exits 2 with one line holding ``want``."""
    tiny = ["run.steps=8", "metrics.window=8", "metrics.plot=false", "run.progress=false"]
    capsys.readouterr()  # drop what came before (save_pretrained's progress bars on stderr)
    for args, want in cases:
        rc, out, lines = run_main([*args, *tiny], capsys)
        assert rc == 2 and len(lines) == 1 and not out, (args, lines)
        assert lines[0].startswith("precsim: error: ") and want in lines[0], lines
