"""The edges a new user hits (issue 41): a bare preset name, a launcher whose plugin is missing,
a model preset a trace overrides, an inverted split, a scheme whose name no longer says what it
runs, progress when stderr is not a terminal, --help's pointers to recording and whole-model
runs, and the verdict of a Result from the Python API."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from conftest import make_trace, run_main, tiny_cfg

from precsim import report
from precsim.cli import HELP

TINY = ["model.heads=1", "model.head_dim=8", "run.steps=64", "metrics.window=32",
        "metrics.vocab=32", "run.seqs=1", "run.engine=torch", "run.progress=false",
        "metrics.plot=false"]


def _one_line(rc, out, lines, start):
    assert rc == 2 and not out and len(lines) == 1, (rc, out, lines)
    assert lines[0].startswith(f"precsim: error: {start}"), lines[0]
    return lines[0]


@pytest.mark.parametrize(("word", "meant"), [("split_nvfp4", "experiment=split_nvfp4"),
                                             ("qwen35_gdn", "model=qwen35_gdn")])
def test_a_bare_preset_name_says_which_override_it_meant(word, meant, tmp_path, monkeypatch,
                                                        capsys):
    """Hydra said "missing EQUAL"; now one line naming the word and the override it meant,
    exit 2, nothing written."""
    monkeypatch.chdir(tmp_path)
    line = _one_line(*run_main([word, "run.steps=64"], capsys), f"{word!r} is not an override")
    assert line.endswith(f"did you mean {meant}?")
    line = _one_line(*run_main(["nonsense"], capsys), "'nonsense' is not an override")
    assert "allowed: KEY=VALUE or GROUP=OPTION" in line
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("launcher", ["joblib", "joblib_gpus", "slurm_gpu"])
def test_a_launcher_without_its_plugin_names_the_extra(launcher, tmp_path, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("hydra_plugins.") else
                        real(name, *a))  # as without the sweep extra
    monkeypatch.chdir(tmp_path)
    line = _one_line(*run_main(["-m", "experiment=split_nvfp4", f"hydra/launcher={launcher}",
                                *TINY], capsys), f"hydra/launcher={launcher} needs Hydra's")
    assert "pip install 'precsim[sweep]'" in line
    assert not list(tmp_path.iterdir())


def test_a_model_preset_a_trace_would_override_is_one_line(tmp_path, monkeypatch, capsys):
    """model=gdn with a Mamba-2 trace was dropped without a word (the run replayed the trace's
    Mamba-2 layer under the name gdn)."""
    np.savez(tmp_path / "m2.npz", **make_trace("mamba2", T=64, H=1, P=4, N=16))
    monkeypatch.chdir(tmp_path)
    args = ["workload=trace", f"workload.path={tmp_path / 'm2.npz'}", "run.steps=32",
            "metrics.window=32", "run.engine=torch", "run.progress=false", "metrics.plot=false",
            f"hydra.run.dir={tmp_path / 'run'}"]
    line = _one_line(*run_main([*args, "model=gdn"], capsys), "model=gdn (family gdn) with a "
                     "Mamba-2 trace")
    assert "allowed: no model= (the trace's layer is used) or model=mamba2" in line
    assert not (tmp_path / "run").exists()
    rc, out, err = run_main([*args, "model=mamba2"], capsys)  # the trace's own family: runs
    assert rc == 0 and (tmp_path / "run" / "summary.json").is_file(), err


def test_an_overridden_preset_is_starred_and_an_inverted_split_is_noted(tmp_path, capsys):
    """schemes.split_fp32_nvfp4.read_fmt=fp8_e4m3: the table stars the name and says what it
    runs now; fmt=nvfp4 read_fmt=fp32 (the master narrower than its read copy) runs, with a
    note on stderr. The presets' own schemes are neither."""
    rc, out, err = run_main(["experiment=split_nvfp4", *TINY,
                             "schemes.split_fp32_nvfp4.read_fmt=fp8_e4m3",
                             f"hydra.run.dir={tmp_path / 'a'}"], capsys)
    assert rc == 0, err
    assert "\nsplit_fp32_nvfp4* " in out and "\nshared_nvfp4_sr " in out
    assert ("* split_fp32_nvfp4 no longer runs what its name says (its settings were "
            "overridden): split(fp32 update + fp8_e4m3 read)") in out
    assert not [ln for ln in err if "inverted" in ln]
    rc, out, err = run_main(["experiment=split_nvfp4", *TINY,
                             "schemes.split_fp32_nvfp4.fmt=nvfp4",
                             "schemes.split_fp32_nvfp4.read_fmt=fp32",
                             f"hydra.run.dir={tmp_path / 'b'}"], capsys)
    assert rc == 0
    notes = [ln for ln in err if "inverted split" in ln]
    assert len(notes) == 1 and notes[0].startswith(
        "precsim: note: schemes.split_fp32_nvfp4 is an inverted split: its master (fmt=nvfp4, "
        "4.5 bits/element) is narrower than its read copy (read_fmt=fp32, 32)")
    from importlib.resources import files

    import yaml

    from precsim.result import name_matches

    for f in files("precsim.conf").joinpath("schemes").iterdir():
        for name, s in (yaml.safe_load(f.read_text()) or {}).items():
            assert name_matches(name, s), (f.name, name)


def test_progress_lines_when_stderr_is_not_a_terminal(monkeypatch):
    """A piped run printed nothing till its end (tqdm turns itself off without a TTY): now one
    plain line every few seconds, none for a run shorter than that."""
    from precsim.config import to_config
    from precsim.engines.base import ProgressLines, progress_bar

    cfg = to_config(tiny_cfg(steps=96))
    cfg.run.progress = True
    import sys

    monkeypatch.setattr(sys, "stderr", io.StringIO())  # piped: not a TTY
    assert isinstance(progress_bar(cfg, True), ProgressLines)
    assert progress_bar(cfg, False) is None
    now = [0.0]
    buf = io.StringIO()
    bar = ProgressLines(32768, every=5.0, stream=buf, clock=lambda: now[0])
    for _ in range(32):  # 1,024 steps a second for 32 s
        now[0] += 1.0
        bar.update(1024)
    bar.close()
    lines = buf.getvalue().splitlines()
    assert len(lines) == 6, lines  # at 5, 10, ..., 30 s
    assert lines[0] == "precsim: step 5,120/32,768 (16%), 5 s, ~27 s left"
    short = io.StringIO()
    bar = ProgressLines(100, every=5.0, stream=short, clock=lambda: now[0])
    bar.update(100)
    assert short.getvalue() == ""


def test_help_points_to_recording_and_whole_model_runs():
    for needle in ("python -m precsim.record --model PATH", "experiment=model_kl model.path=PATH",
                   "workload=trace workload.path="):
        assert needle in HELP, needle


def test_a_result_of_the_api_has_the_verdict(tmp_path):
    from precsim import simulate

    cfg = tiny_cfg(steps=64, schemes={
        "conventional_fp32": {"kind": "conventional", "fmt": "fp32"},
        "split_fp32_nvfp4": {"kind": "split", "fmt": "fp32", "read_fmt": "nvfp4"}})
    r = simulate(cfg, out_dir=tmp_path / "run", progress=False)
    text = r.verdict()
    stored = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert text == report.run_verdict(stored, "rel_err", 0.0625, tmp_path / "run")
    assert "recommended:" in text and str(tmp_path / "run") in text
    assert "kl <= 1e-09" in r.verdict(metric="kl", budget=1e-9)
    again = simulate(cfg, out_dir=tmp_path / "run", progress=False)  # reused: the same verdict
    assert again.verdict() == text
    assert "recommended:" in simulate(cfg, progress=False).verdict()  # no directory
