"""The Hydra app: presets compose, a run writes its files, bad input is one line and exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import make_trace, run_main
from hydra import compose, initialize_config_module

from precsim.cli import register_configs
from precsim.config import to_config

FAST = ["run.steps=64", "model.heads=2", "model.head_dim=8", "model.state_dim=32",
        "run.seqs=2", "metrics.window=32", "metrics.vocab=64", "run.progress=false"]


def _cli(args, cwd, timeout=120):
    env = dict(os.environ, PYTHONWARNINGS="ignore", MPLBACKEND="Agg")
    return subprocess.run([sys.executable, "-m", "precsim", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


# the app in process, main(argv): what a subprocess adds (the interpreter's exit, os._exit after
# flushing) has its own test, test_run_into_hydras_directory_flushes_everything_and_times_its_phases
_main = run_main


def _compose(overrides):
    register_configs()
    with initialize_config_module(config_module="precsim.conf", version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


@pytest.mark.parametrize("exp,model,n", [("split_nvfp4", "mamba2", 3), ("seed_table", "mamba2", 5),
                                          ("seed_table", "gdn", 5), ("split_nvfp4", "gdn", 3)])
def test_presets_compose(exp, model, n):
    cfg = to_config(_compose([f"experiment={exp}", f"model={model}"]))
    assert len(cfg.schemes) == n and cfg.model.family == model
    if exp == "seed_table":
        assert set(cfg.schemes) == {"conventional_fp32", "conventional_nvfp4_sr",
                                    "shared_nvfp4_sr", "split_fp32_nvfp4", "split_fp16sr_nvfp4"}
        assert cfg.workload.kind == "seed_article" and cfg.run.steps == 32768


@pytest.mark.parametrize("model,family", [(None, "mamba2"), ("qwen35_gdn", "gdn")])
def test_engines_preset(model, family):
    """experiment=engines: the engines' candidates as named in conf/schemes/engines.yaml, on the
    Nemotron-3-Super layer (or Qwen3.5's), 32,768 steps; every row-scaled block divides the
    state's last axis, and the Triton engine runs all of them (row scales included)."""
    from precsim import formats as pf
    from precsim.engines.triton import unsupported_reason

    cfg = to_config(_compose(["experiment=engines"] + ([f"model={model}"] if model else [])))
    assert cfg.model.family == family and cfg.run.steps == 32768
    assert cfg.model.name == (model or "nemotron3_super") and cfg.replay.buffer_len == 16
    got = {(s.kind, s.fmt, s.rounding, s.read_fmt, s.error_feedback)
           for s in cfg.schemes.values()}
    want = {("conventional", "fp32", "rne", None, "none"), ("shared", "fp16", "sr", None, "none"),
            ("split", "fp32", "rne", "nvfp4", "none")} | {
        ("conventional", f, r, None, "none") for f in ("fp16", "bf16", "int8_b128",
                                                       "fp8_e4m3_b128") for r in ("rne", "sr")
    } | {("conventional", f, "rne", None, f) for f in ("int8_b128", "fp8_e4m3_b128")}  # EF
    assert got == want and len(cfg.schemes) == len(want)
    assert cfg.schemes["shared_fp16_sr"].label == "ReplaySSM L=16 FP16-SR"
    for s in cfg.schemes.values():
        for f in {s.fmt, s.error_feedback} - {"none"}:
            block = getattr(pf.get(f), "block", None)
            assert block is None or cfg.model.state_dim % block == 0
    assert unsupported_reason(cfg) is None  # the kernels hold row-scaled formats too


def test_no_packaged_config_sets_hydra_mode():
    """The command line skips Hydra's probe composition for ``hydra.mode`` (one_composition)
    on the ground that no packaged config sets it: a preset that did would be run in the other
    mode. Every YAML under conf/ (a ``hydra:`` block: the primary config, _global_ presets)."""
    from pathlib import Path

    import precsim.conf
    import yaml

    files = list(Path(precsim.conf.__file__).parent.rglob("*.yaml"))
    assert len(files) > 10
    for f in files:
        d = yaml.safe_load(f.read_text()) or {}
        assert "mode" not in (d.get("hydra") or {}), f


def test_one_composition_per_command(tmp_path, capsys, monkeypatch):
    """A run and a one-line error each compose the config once (Hydra's main alone composed it
    twice), with the same outcome; an override of hydra.mode still gets Hydra's probe."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    calls = []
    orig = ConfigLoaderImpl.load_configuration
    monkeypatch.setattr(ConfigLoaderImpl, "load_configuration",
                        lambda self, *a, **k: calls.append(1) or orig(self, *a, **k))
    out = tmp_path / "run"
    rc, _, err = _main(["experiment=split_nvfp4", *FAST, "run.engine=torch", "metrics.plot=false",
                        f"hydra.run.dir={out}"], capsys)
    assert rc == 0 and (out / "summary.json").is_file() and len(calls) == 1, (err, calls)
    calls.clear()
    rc, _, err = _main(["experiment=split_nvfp4", "replay.buffer_len=0",
                        f"hydra.run.dir={tmp_path / 'bad'}"], capsys)
    assert rc == 2 and "replay.buffer_len" in err[0] and len(calls) == 1
    calls.clear()
    rc, _, err = _main(["experiment=split_nvfp4", *FAST, "run.engine=torch", "hydra.mode=RUN",
                        "metrics.plot=false", f"hydra.run.dir={tmp_path / 'm'}"], capsys)
    assert rc == 0 and len(calls) == 2, (err, calls)


def test_real_layer_presets():
    cfg = to_config(_compose(["model=nemotron3_super"]))
    assert (cfg.model.heads, cfg.model.head_dim, cfg.model.state_dim) == (128, 64, 128)
    cfg = to_config(_compose(["model=qwen35_gdn"]))
    assert (cfg.model.family, cfg.model.head_dim, cfg.model.state_dim) == ("gdn", 128, 128)


def test_run_writes_files_and_reuses_when_complete(tmp_path, capsys):
    """A run writes its files, table and verdict; the same command again reuses them. The torch
    engine: this is about the app, not an engine (run.engine=auto picking numba is
    tests/engines/test_engine_numba.py's)."""
    out = tmp_path / "run"
    args = ["experiment=split_nvfp4", *FAST, "run.engine=torch", f"hydra.run.dir={out}"]
    rc, stdout, err = _main(args, capsys)
    assert rc == 0, err
    for f in ("metrics.csv", "summary.json", "error_vs_length.png", "per_step.npz"):
        assert (out / f).is_file(), f
    header = (out / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"scheme", "step", "rel_err", "state_drift", "kl", "top1", "top1_p50", "first_flip",
            "flipped"} <= set(header)
    s = json.loads((out / "summary.json").read_text())
    assert s["complete"] and s["steps"] == 64 and s["engine"] == "torch"
    assert set(s["figures"]) == {"conventional_fp32", "shared_nvfp4_sr", "split_fp32_nvfp4"}
    assert "conventional_fp32" in stdout and "1st flip" in stdout  # the table
    fin = s["figures"]["conventional_fp32"]["final"]
    assert fin["top1"] == 1.0 and fin["flipped"] == 0 and fin["first_flip"] == 64
    # 64 steps: split misses the 6.25% budget (rel_err 0.064), shared by far (0.12)
    assert "recommended: conventional(fp32) [conventional_fp32]" in stdout
    split = next(ln for ln in stdout.splitlines() if ln.startswith("  split_fp32_nvfp4 "))
    assert "misses by" in split
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    rc, stdout, _ = _main(args, capsys)
    assert rc == 0 and "reused" in stdout
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name in before} == before


def test_run_into_hydras_directory_flushes_everything_and_times_its_phases(tmp_path, capsys,
                                                                           monkeypatch):
    """No output directory given: the app validates the config itself (no second composition),
    the process ends with os._exit after flushing, so the last line of the verdict must be on
    stdout; summary.json says where the time went. A bad value there leaves no directory (in
    process: the directory is Hydra's, not the process's)."""
    r = _cli(["experiment=split_nvfp4", *FAST], tmp_path)
    assert r.returncode == 0, r.stderr
    runs = list((tmp_path / "outputs" / "split_nvfp4").iterdir())
    assert len(runs) == 1
    assert r.stdout.rstrip().splitlines()[-1].startswith(
        "to compare with other runs: python -m precsim.report")
    ph = json.loads((runs[0] / "summary.json").read_text())["info"]["phases_s"]
    assert 0 <= ph["files"] < 600 and (0 < ph["startup"] < 600 or sys.platform != "linux"), ph
    bad = tmp_path / "bad"
    bad.mkdir()
    monkeypatch.chdir(bad)
    rc, out, err = _main(["experiment=split_nvfp4", *FAST, "replay.buffer_len=0"], capsys)
    assert rc == 2 and len(err) == 1 and "replay.buffer_len" in err[0], err
    assert "Traceback" not in out
    assert list(bad.iterdir()) == []  # the stub and its empty parents are gone


BAD = {
    "unknown_format": (["schemes.split_fp32_nvfp4.read_fmt=nvfp5"], "read_fmt"),
    "unknown_scheme_kind": (["schemes.shared_nvfp4_sr.kind=weird"], "kind"),
    "buffer_len_zero": (["replay.buffer_len=0"], "replay.buffer_len"),
    "drafts_gt_L": (["replay.buffer_len=4", "replay.drafts=5"], "replay.drafts"),
    "acceptance_profile": (["replay.drafts=2", "replay.acceptance=[0.9,1.5]"],
                           "replay.acceptance=[0.9, 1.5] is invalid; allowed: a probability"),
    "negative_steps": (["run.steps=-3"], "run.steps"),
    "unknown_key": (["run.stepz=3"], "run.stepz"),
    "wrong_type": (["run.steps=abc"], "run.steps"),
    "unknown_model": (["model=foo"], "model='foo' is unknown; allowed: gdn, mamba2"),
    "trace_without_path": (["workload=trace"], "workload.path"),
    "trace_missing_file": (["workload=trace", "workload.path=/nonexistent.npz"],
                           "workload.path"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line(case, tmp_path, capsys):
    args, key = BAD[case]
    out = tmp_path / "o"
    rc, stdout, err = _main(["experiment=split_nvfp4", *args, f"hydra.run.dir={out}"], capsys)
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("precsim: error:") and key in err[0]
    assert "Traceback" not in stdout and not out.exists()


def _bad_traces():
    good = make_trace("mamba2", T=32, H=2, P=4, N=16)
    cases = {}
    t = dict(good)
    del t["C"]
    cases["missing_key"] = (t, "'C'")
    t = dict(good, x=good["x"][:, :, :3][:, :1])
    cases["wrong_shape"] = (t, "shape")
    t = dict(good)
    t["B"] = good["B"].copy()
    t["B"][3, 1, 2] = np.nan
    cases["nan_value"] = (t, "non-finite")
    t = dict(good, A=-good["A"])
    cases["positive_A"] = (t, "A=")
    g = make_trace("gdn", T=32, H=2, P=4, N=16)
    cases["gdn_beta_out_of_range"] = (dict(g, beta=g["beta"] + 1.0), "beta")
    cases["too_many_steps"] = (good, "run.steps=64")
    # "run.steps=64 exceeds the trace length T=0; allowed: 1..0"
    cases["no_steps"] = ({k: v[:0] if v.ndim > 1 else v for k, v in good.items()},
                         "dt has shape (0, 2), no steps; allowed: a trace of at least one step")
    return cases


@pytest.mark.parametrize("case", list(_bad_traces()))
def test_bad_trace_is_one_line(case, tmp_path, capsys):
    tr, needle = _bad_traces()[case]
    path = tmp_path / "t.npz"
    np.savez(path, **tr)
    rc, _, err = _main(["experiment=split_nvfp4", *FAST, "workload=trace", f"workload.path={path}",
                        "run.seqs=1", f"hydra.run.dir={tmp_path / 'o'}"], capsys)
    assert rc == 2 and len(err) == 1 and needle in err[0], err


def test_a_trace_key_that_is_not_read_is_named_and_a_path_without_workload_trace_refused(
        tmp_path, capsys):
    """A trace key the family does not read (a dt_bias beside dt: the run would not add it) is
    named in the run's log; workload.path without workload=trace ran the synthetic inputs in
    the trace's place, saying nothing: now one line, exit 2, nothing written."""
    tr = make_trace("mamba2", T=64, H=2, P=8, N=16)
    path = tmp_path / "m.npz"
    np.savez(path, **tr, dt_bias=np.zeros(2))
    out = tmp_path / "o"
    rc, stdout, err = _main(["experiment=split_nvfp4", *FAST, "workload=trace",
                             f"workload.path={path}", "run.seqs=1", f"hydra.run.dir={out}"],
                            capsys)
    assert rc == 0, err
    line = "trace m.npz: keys 'dt_bias' are not read (not Mamba-2 inputs); the inputs: "
    assert line in (out / "precsim.log").read_text() and line in stdout
    rc, _, err = _main(["experiment=split_nvfp4", *FAST, f"workload.path={path}",
                        f"hydra.run.dir={tmp_path / 'o2'}"], capsys)
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith(f"precsim: error: workload.path='{path}' is invalid; allowed: null "
                             "with workload.kind=synthetic"), err
    assert not (tmp_path / "o2").exists()


def test_trace_run_uses_trace_shape(tmp_path, capsys):
    tr = make_trace("gdn", T=64, H=3, P=8, N=16)
    path = tmp_path / "g.npz"
    np.savez(path, **{k: v.astype(np.float32) for k, v in tr.items()})
    out = tmp_path / "o"
    rc, _, err = _main(["experiment=split_nvfp4", *FAST, "workload=trace", "run.engine=torch",
                        f"workload.path={path}", "run.seqs=1", f"hydra.run.dir={out}"], capsys)
    assert rc == 0, err
    s = json.loads((out / "summary.json").read_text())
    assert s["config"]["model"]["family"] == "gdn" and s["config"]["model"]["heads"] == 3


def test_python_api_without_hydra(tmp_path):
    from precsim import simulate

    res = simulate({"schemes": {"c": {"kind": "conventional", "fmt": "fp16"}},
                    "model": {"heads": 1, "head_dim": 4, "state_dim": 16},
                    "run": {"steps": 64, "progress": False},
                    "metrics": {"window": 32, "vocab": 32}}, out_dir=tmp_path)
    assert [r["step"] for r in res.rows] == [32, 64]
    assert (tmp_path / "summary.json").is_file()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_validation_error_exits_2_through_the_process(device, tmp_path):
    """A whole process (its warm-up thread started: CUDA's initialisation where a GPU is)
    ending in a one-line error exits 2, not with a signal (on the H200 it once aborted with
    `terminate called without an active exception`, exit 134)."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    r = _cli(["workload=trace", "workload.path=/no/such/dir", f"run.device={device}",
              f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.count("\n") == 1 and "workload.path" in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()
