"""Checks before any work (issue 41): a run too large for this machine's memory, an output path
that cannot be written, a report's input that cannot be read, a recording with a bad layer. Each
is one line on stderr, exit status 2, no traceback, and nothing written anywhere."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import make_trace, run_main

from precsim import report

TINY = ["model.heads=1", "model.head_dim=8", "model.state_dim=32", "run.steps=64",
        "run.seqs=1", "metrics.window=32", "metrics.vocab=32", "run.progress=false",
        "metrics.plot=false", "run.engine=torch"]
ROOT_WHY = ("running as root: permission bits do not stop root, so the read-only case is "
            "emulated through os.access (test_*_emulated) instead")


def _one_line(rc, err, *needles) -> str:
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith(("precsim: error:", "precsim-report: error:",
                              "precsim.record: error:")), err
    assert "Traceback" not in err[0]
    for n in needles:
        assert n in err[0], err[0]
    return err[0]


def _files(d: Path) -> set[str]:
    return {p.relative_to(d).as_posix() for p in d.rglob("*")}


@pytest.fixture
def deny(monkeypatch):
    """``deny(path)``: os.access says no write access to ``path`` (what a read-only directory
    is to a user who is not root; root passes permission bits, so tests emulate it)."""
    real = os.access
    denied: list[Path] = []

    def access(p, mode, *a, **k):
        if Path(os.path.abspath(p)) in denied and mode & (os.W_OK | os.R_OK):
            return False
        return real(p, mode, *a, **k)

    monkeypatch.setattr(os, "access", access)
    return lambda p: denied.append(Path(os.path.abspath(p)))


# -- memory ------------------------------------------------------------------------------------
@pytest.mark.parametrize("steps", ["10000000000000", "2000000000"])
def test_a_run_too_large_for_memory_is_one_line_before_any_allocation(tmp_path, steps):
    """run.steps=1e13 ended in a 70-line traceback (`Unable to allocate 72.8 TiB`) and a run
    directory with error.txt; 2e9 was killed by the OOM killer after 57 s at 24 GB, no message.
    Under an address-space limit (so the test never depends on this machine's RAM) both are one
    line naming run.steps with the figures and how far to turn it, and nothing is written."""
    limit = 8 << 30

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    env = {**os.environ, "MPLBACKEND": "Agg"}
    env.pop("PRECSIM_SIGNAL_AT", None)
    r = subprocess.run([sys.executable, "-m", "precsim", "experiment=split_nvfp4",
                        f"run.steps={steps}", "run.device=cpu", "metrics.plot=false"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                       preexec_fn=cap)
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    line = _one_line(r.returncode, err, f"run.steps={steps} needs about", "of host memory",
                     "available:", "RLIMIT_AS 8.0 GiB", "allowed: run.steps <= ~")
    assert "per-step figures" in line and " on numba/cpu" in line  # the parts, the time
    most = int(line.split("run.steps <= ~")[1].split()[0].replace(",", ""))
    assert 0 < most < int(steps)
    assert not r.stdout.strip()
    assert _files(tmp_path) == set()  # no outputs/, no .hydra, no log


def test_the_estimate_grows_with_what_the_engines_keep():
    """The parts follow the shapes: per-step figures linear in run.steps, the windows' in
    metrics.window and metrics.vocab (the KL's logits), the states in run.seqs."""
    from precsim.config import to_config
    from precsim.preflight import estimate, long_run_note

    def est(**over):
        cfg = {"schemes": {"a": {"kind": "conventional", "fmt": "fp16"},
                           "b": {"kind": "split", "fmt": "fp32", "read_fmt": "nvfp4"}},
               "model": {"heads": 4, "head_dim": 16, "state_dim": 32},
               "run": {"steps": 4096, "seqs": 2}, "metrics": {"window": 256, "vocab": 256}}
        for k, v in over.items():
            sec, key = k.split("__")
            cfg[sec][key] = v
        return estimate(to_config(cfg), "cpu", "numba")

    a, b = est(), est(run__steps=4096 * 64)
    assert b.host["per-step figures"] == pytest.approx(64 * a.host["per-step figures"], rel=0.01)
    assert b.host["windows"] == a.host["windows"] and b.seconds > 60 * a.seconds
    assert est(metrics__window=1024).host["windows"] > 3.5 * a.host["windows"]
    assert est(metrics__vocab=4096).host["windows"] > 3 * a.host["windows"]
    assert est(metrics__kl=False).host["windows"] < a.host["windows"]
    assert est(run__seqs=8).host["states"] == pytest.approx(4 * a.host["states"])
    # a run of hours says so before it starts (a short one says nothing)
    assert long_run_note(a) is None
    note = long_run_note(est(run__steps=10**9))
    assert note.startswith("precsim: this run takes ~") and " on numba/cpu " in note


@pytest.mark.slow
def test_the_host_estimate_is_within_a_factor_of_two_of_the_peak(tmp_path):
    """Honest, not just safe: the estimate against the measured peak RSS of a run whose arrays
    outweigh the process (a long metrics window with the KL's logits: 1.74 GiB measured against
    2.3 GiB estimated on the 2-core VM, 2026-12-03)."""
    from precsim.cli import compose_config, register_configs
    from precsim.preflight import estimate

    args = ["experiment=split_nvfp4", "model.heads=1", "model.head_dim=4", "model.state_dim=16",
            "run.steps=16384", "metrics.window=8192", "run.engine=torch", "metrics.plot=false",
            "run.progress=false"]
    register_configs()
    e = estimate(compose_config(args), "cpu", "torch")
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    r = subprocess.run([sys.executable, "-m", "precsim", *args, f"hydra.run.dir={tmp_path / 'r'}"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    assert peak > before * 1024  # this child set the children's peak
    assert 0.5 < e.host_total / peak < 2.0, (e.host, peak)


# -- paths -------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["hydra.run.dir", "run.out_dir"])
def test_a_run_directory_under_a_file_is_one_line(tmp_path, capsys, key):
    """It was a NotADirectoryError traceback once Hydra made the directory."""
    f = tmp_path / "afile"
    f.write_text("x")
    rc, out, err = run_main([*TINY, f"{key}={f / 'run'}"], capsys)
    _one_line(rc, err, f"{key}='{f / 'run'}' is under a file ({f})", "allowed: a directory")
    assert "engine=" not in out and _files(tmp_path) == {"afile"} and f.read_text() == "x"


def test_a_sweep_directory_under_a_file_is_one_line(tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("x")
    rc, _, err = run_main(["-m", *TINY, "replay.buffer_len=8,16", f"hydra.sweep.dir={f / 's'}"],
                          capsys)
    _one_line(rc, err, f"hydra.sweep.dir='{f / 's'}' is under a file")
    assert _files(tmp_path) == {"afile"}


@pytest.mark.parametrize("sweep", [False, True])
def test_a_read_only_run_or_sweep_directory_is_one_line_emulated(tmp_path, capsys, deny, sweep):
    """A read-only parent (a PermissionError traceback before); os.access's answer, as for a
    user who is not root, emulated."""
    ro = tmp_path / "ro"
    ro.mkdir()
    deny(ro)
    key = "hydra.sweep.dir" if sweep else "hydra.run.dir"
    args = ["-m", *TINY, "replay.buffer_len=8,16"] if sweep else TINY
    rc, _, err = run_main([*args, f"{key}={ro / 'out'}"], capsys)
    _one_line(rc, err, f"{key}='{ro / 'out'}' is under a read-only directory ({ro})")
    assert _files(tmp_path) == {"ro"}


@pytest.mark.skipif(os.geteuid() == 0, reason=ROOT_WHY)
def test_a_read_only_run_directory_is_one_line(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        rc, _, err = run_main([*TINY, f"hydra.run.dir={ro / 'out'}"], capsys)
        _one_line(rc, err, "is under a read-only directory")
        assert _files(ro) == set()
    finally:
        ro.chmod(0o755)


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_run_directory_where_no_directory_can_be_made_is_one_line(capsys):
    """Under /proc the permission bits let root through, yet no directory can be made there:
    Hydra's FileNotFoundError traceback before; now the probe's one line (a user who is not
    root hears that /proc is read-only)."""
    rc, out, err = run_main([*TINY, "hydra.run.dir=/proc/precsim_run"], capsys)
    line = _one_line(rc, err, "hydra.run.dir='/proc/precsim_run'", "allowed: a directory")
    assert ("cannot be made under /proc (" in line) or ("read-only directory (/proc)" in line)
    assert "engine=" not in out


def test_the_default_run_directory_in_a_read_only_working_directory(tmp_path, capsys, deny,
                                                                    monkeypatch):
    """No hydra.run.dir: Hydra's outputs/ under the working directory is checked too."""
    monkeypatch.chdir(tmp_path)
    deny(tmp_path)
    rc, _, err = run_main(TINY, capsys)
    _one_line(rc, err, "hydra.run.dir='outputs' is under a read-only directory")
    assert _files(tmp_path) == set()


def test_record_out_under_a_file_or_read_only_is_one_line(tmp_path, capsys, deny):
    """precsim.record --out: checked before the model is read (the model here does not even
    exist: the out check comes first)."""
    pytest.importorskip("transformers")
    from precsim.record import main as record_main

    f = tmp_path / "afile"
    f.write_text("x")
    np.save(tmp_path / "ids.npy", np.arange(8))
    base = ["--model", str(tmp_path / "no_model"), "--ids-file", str(tmp_path / "ids.npy")]
    rc = record_main([*base, "--out", str(f / "rec")])
    _one_line(rc, [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()],
              f"--out='{f / 'rec'}' is under a file")
    ro = tmp_path / "ro"
    ro.mkdir()
    deny(ro)
    rc = record_main([*base, "--out", str(ro)])
    _one_line(rc, [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()],
              f"--out='{ro}' is read-only")
    assert _files(tmp_path) == {"afile", "ids.npy", "ro"}


@pytest.mark.parametrize("mode", [os.R_OK, os.W_OK])
def test_report_on_an_unreadable_or_read_only_dir_is_one_line(tmp_path, capsys, monkeypatch,
                                                              mode):
    """precsim.report DIR: unreadable (nothing to list) or read-only (its sweep_summary.csv and
    plots cannot be written): one line before any work (PermissionError tracebacks before)."""
    d = tmp_path / "runs"
    d.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, m, *a, **k: False if (
        Path(p) == d and m & mode) else real(p, m, *a, **k))
    with pytest.raises(SystemExit) as e:
        report.main([str(d)])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    _one_line(e.value.code, err, f"DIR='{d}' is " + ("not readable" if mode == os.R_OK
                                                   else "read-only"))
    assert _files(tmp_path) == {"runs"}


# -- a recording, every layer before the first runs --------------------------------------------
def _recording(root: Path, families=("mamba2", "mamba2"), T=64) -> Path:
    root.mkdir()
    layers = []
    for i, fam in enumerate(families):
        d = root / f"layer_{i:02d}"
        d.mkdir()
        tr = make_trace(fam, T=T, H=1, P=8, N=32, seed=i)
        for k, v in tr.items():
            np.save(d / f"{k}.npy", v.astype(np.float32))
        layers.append({"layer": i, "file": d.name, "family": fam,
                       "shapes": {k: list(v.shape) for k, v in tr.items() if v.ndim > 1}})
    (root / "record.json").write_text(json.dumps({"layers": layers, "steps": T}))
    return root


REPLAY = ["workload=trace", "run.steps=64", "metrics.window=32", "metrics.vocab=32",
          "run.progress=false", "metrics.plot=false", "run.engine=torch"]


def test_a_truncated_layer_fails_before_the_first_layer_runs(tmp_path, capsys):
    """layer_01 cut short: it failed only after layer_00 had run and been written."""
    rec = _recording(tmp_path / "rec")
    x = rec / "layer_01" / "x.npy"
    x.write_bytes(x.read_bytes()[:-100])
    out = tmp_path / "run"
    rc, stdout, err = run_main([*REPLAY, f"workload.path={rec}", f"hydra.run.dir={out}"], capsys)
    _one_line(rc, err, f"workload.path='{rec}': layer_01 is not a readable trace")
    assert not out.exists() and "layer   0" not in stdout


def test_a_gdn_layer_in_a_mamba2_recording_is_refused(tmp_path, capsys):
    """It replayed silently as GDN."""
    rec = _recording(tmp_path / "rec")
    gdn = _recording(tmp_path / "gdn", families=("gdn",))
    (rec / "layer_02").mkdir()
    for f in (gdn / "layer_00").iterdir():
        (rec / "layer_02" / f.name).write_bytes(f.read_bytes())
    out = tmp_path / "run"
    rc, _, err = run_main([*REPLAY, f"workload.path={rec}", f"hydra.run.dir={out}"], capsys)
    _one_line(rc, err, "layer_02 holds a gdn trace in a mamba2 recording",
              "allowed: mamba2 layers only")
    assert not out.exists()
    # a layer shorter than run.steps, or of another shape than record.json says: also up front
    rec2 = _recording(tmp_path / "rec2")
    meta = json.loads((rec2 / "record.json").read_text())
    meta["layers"][1]["shapes"]["x"] = [64, 1, 16]
    (rec2 / "record.json").write_text(json.dumps(meta))
    rc, _, err = run_main([*REPLAY, f"workload.path={rec2}", f"hydra.run.dir={out}"], capsys)
    _one_line(rc, err, "layer_01/x has shape (64, 1, 8), record.json says (64, 1, 16)")
    assert not out.exists()


# -- run.out_dir leaves nothing elsewhere ------------------------------------------------------
def test_out_dir_holds_hydras_files_and_the_log(tmp_path, capsys, monkeypatch):
    """run.out_dir=DIR left outputs/NAME/DATE/ (with .hydra/ and the only precsim.log) in the
    working directory, which the report then listed as an incomplete run."""
    cwd, out = tmp_path / "cwd", tmp_path / "x"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    rc, stdout, err = run_main([*TINY, f"run.out_dir={out}"], capsys)
    assert rc == 0, err
    assert _files(cwd) == set()
    assert {"summary.json", "precsim.log", ".hydra/config.yaml"} <= _files(out)
    assert "engine=" in (out / "precsim.log").read_text()
    assert [j.status for j in report.collect(out)] == ["complete"]
