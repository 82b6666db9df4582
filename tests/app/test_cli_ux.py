"""The command line as a user meets it (issue 11): the budget's verdict, unknown keys, validation
before any directory exists, reruns, help. The app runs in process through ``main(argv)``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import run_main as _run  # (exit status, stdout, stderr lines), in process

from precsim import report

# run.engine=torch: what the user meets is under test, not an engine (auto compiled a numba task
# for the suggested schemes=single split here); the card's own command below keeps auto
TINY = ["model.heads=1", "model.head_dim=8", "model.state_dim=32", "run.steps=64",
        "run.seqs=1", "metrics.window=32", "metrics.vocab=32", "run.progress=false",
        "metrics.plot=false", "run.engine=torch"]


def _one_line(rc, err, *needles):
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("precsim: error:") and "Traceback" not in err[0]
    for n in needles:
        assert n in err[0], err[0]


@pytest.mark.parametrize("arg,needle", [
    ("run.stepz=100", "unknown key run.stepz; did you mean run.steps?"),
    ("+run.stepz=100", "unknown key run.stepz; did you mean run.steps?"),
    ("metrics.windw=8", "did you mean metrics.window?"),
    ("schemes.split_fp32_nvfp4.read_fm=fp8_e4m3", "did you mean schemes.split_fp32_nvfp4.read_fmt"),
    ("schemes.candidate.fmt=fp16", "schemes=single defines it"),
    ("metrics.window=1024", "metrics.window=1024"),  # run.steps=64 in TINY
    ("metrics.budget=-1", "metrics.budget"),
    ("metrics.lengths=[0]", "metrics.lengths"),
    ("run.steps=abc", "run.steps='abc' is invalid; allowed: an integer"),  # Hydra's raw text
    ("metrics.budget=x", "metrics.budget='x' is invalid; allowed: a number"),
    ("metrics.kl=maybe", "metrics.kl='maybe' is invalid; allowed: true or false"),
    # ran to the end with every figure NaN (rc 0), or took a negative standard deviation
    ("workload.dt_noise=nan", "workload.dt_noise=nan is invalid; allowed: a number >= 0"),
    ("workload.dt_noise=-1", "workload.dt_noise=-1.0 is invalid"),
    # checked only with model.mode=generate: a negative count was taken without a word
    ("model.new_tokens=-5", "model.new_tokens=-5 is invalid; allowed: an integer >= 1"),
    # whole-model settings without model.path: a synthetic layer ran without a word (task.path:
    # a TypeError traceback after Hydra made the run directory)
    ("model.text=doc.txt", "model.text='doc.txt' is invalid; allowed: null without model.path"),
    ("model.ids=ids.npy", "model.ids='ids.npy' is invalid; allowed: null without model.path"),
    ("task.path=items.jsonl", "task.path='items.jsonl' is invalid; allowed: null without "
                              "model.path (a whole-model setting; add model.path=DIR"),
    ("task.name=passkey", "task.name='passkey' is invalid; allowed: null without model.path"),
    ("model.mode=generate", "model.mode='generate' is invalid; allowed: parallel without "
                            "model.path"),
    ("model.dtype=bfloat16", "model.dtype='bfloat16' is invalid; allowed: null without"),
    ("workload.layer=3", "workload.layer=3 is invalid; allowed: null unless workload=trace"),
])
def test_bad_override_is_one_line_and_leaves_no_directory(arg, needle, tmp_path, capsys):
    out = tmp_path / "run"
    rc, _, err = _run([*TINY, arg, f"hydra.run.dir={out}"], capsys)
    _one_line(rc, err, needle)
    assert "+run" not in err[0] and "To append" not in err[0]
    assert not out.exists()  # validated before Hydra made a directory


@pytest.mark.parametrize("arg,needle", [
    ("run.stepz=3", "unknown key run.stepz; did you mean run.steps?"),
    ("schemes.split_fp32_nvfp4.read_fm=x", "unknown key schemes.split_fp32_nvfp4.read_fm; did you "
                                           "mean schemes.split_fp32_nvfp4.read_fmt?"),
    ("schemes.mine.fmt=fp16", "this config's schemes are: conventional_fp32, shared_nvfp4_sr, "
                              "split_fp32_nvfp4; a scheme of your own"),
])
def test_cfg_job_names_a_bad_key_as_a_run_does(arg, needle, tmp_path, capsys, monkeypatch):
    """--cfg job skips the precheck: Hydra's "To append to your config use +run.stepz=3" (which
    fails too), "schemes=decay_exp defines it" for a scheme this config has (its field was the
    typo), "this config's schemes are: ?" (the recomposition took "job" for an override)."""
    monkeypatch.chdir(tmp_path)
    rc, _, err = _run(["--cfg", "job", arg], capsys)
    _one_line(rc, err, needle)
    assert "To append" not in err[0] and "defines it" not in err[0] and "?;" not in err[0]
    assert not list(tmp_path.iterdir())


def test_kl_budget_needs_the_kl(tmp_path, capsys):
    rc, _, err = _run([*TINY, "metrics.kl=false", "metrics.budget_metric=kl",
                       f"hydra.run.dir={tmp_path / 'r'}"], capsys)
    _one_line(rc, err, "metrics.kl")


def test_default_budget_is_scale_free_and_stated():
    from precsim.config import MetricsConfig

    m = MetricsConfig()
    assert (m.budget_metric, m.budget) == ("rel_err", 0.0625)
    text = report.BUDGET_MEANING["rel_err"](m.budget)
    assert "6.25%" in text and "24.1 dB" in text


def _summary(values: dict, costs: dict, metric="rel_err", steps=4096):
    kinds = {"conv": ("conventional", "fp32", None), "shared": ("shared", "nvfp4", None),
             "split": ("split", "fp32", "nvfp4")}
    return {"steps": steps, "config": {"replay": {"buffer_len": 16}},
            "figures": {n: {"final": {"step": steps, metric: v}} for n, v in values.items()},
            "schemes": {n: {"kind": kinds[n][0], "fmt": kinds[n][1], "read_fmt": kinds[n][2],
                            "rounding": "rne", "label": n, "dead_at": None} for n in values},
            "cost": {n: {"bytes_per_step": b} for n, b in costs.items()}}


def test_verdict_statuses_margin_knob_and_report_command():
    s = _summary({"conv": 2.5e-7, "shared": 0.0888, "split": 0.0442},
                 {"conv": 65536, "shared": 12234, "split": 16042})
    text = report.run_verdict(s, "rel_err", 0.0625, "/x/my run")
    lines = text.splitlines()
    status = {ln.split()[0]: ln for ln in lines if ln.startswith("  ") and ln.split()[0] in
              ("conv", "shared", "split")}
    assert "misses by 42%" in status["shared"]  # 0.0888 / 0.0625 = 1.42
    assert "fits, 29% under" in status["split"]  # 1 - 0.0442 / 0.0625 = 0.29
    assert "fits" in status["conv"]
    rec = next(ln for ln in lines if ln.startswith("recommended:"))
    assert "[split]" in rec and "16,042" in rec
    near = next(ln for ln in lines if "near miss" in ln)
    assert "shared" in near and "replay.buffer_len=32" in near
    assert "what could make it fit (at more bytes: rerun to compare)" in near
    assert lines[-1] == ("to compare with other runs: python -m precsim.report '/x/my run' "
                         "--metric rel_err --budget 0.0625")


def test_verdict_when_nothing_fits_names_the_knob():
    s = _summary({"shared": 0.3, "split": 0.08}, {"shared": 1, "split": 2})
    text = report.run_verdict(s, "rel_err", 0.0625, "d")
    assert "NO scheme is within the budget" in text and "read_fmt=fp8_e4m3" in text
    assert "recommended:" not in text


def test_card_job_recommends_split_whatever_the_sequence_count(tmp_path, capsys):
    """The card's preset at a smaller size: split fits the default budget, shared misses it,
    and the answer does not depend on run.seqs."""
    for seqs in (1, 2):
        out = tmp_path / f"s{seqs}"
        rc, stdout, err = _run(["experiment=split_nvfp4", "run.steps=1024",
                                f"run.seqs={seqs}", "run.progress=false", "metrics.plot=false",
                                f"hydra.run.dir={out}"], capsys)
        assert rc == 0, err
        assert "recommended: split(fp32 update + nvfp4 read) [split_fp32_nvfp4]" in stdout
        assert f"python -m precsim.report {out} --metric rel_err --budget 0.0625" in stdout
        line = next(ln for ln in stdout.splitlines() if ln.startswith("  shared_nvfp4_sr"))
        assert "misses" in line


def test_rerun_reuses_only_a_matching_config(tmp_path, capsys):
    out = tmp_path / "r"
    rc, _, err = _run([*TINY, f"hydra.run.dir={out}"], capsys)
    assert rc == 0, err
    files = {p.relative_to(out): p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    # same config, another budget: reused, the verdict uses the new budget, nothing is touched
    rc, stdout, err = _run([*TINY, "metrics.budget=0.5", f"hydra.run.dir={out}"], capsys)
    assert rc == 0 and "reused" in stdout and "--budget 0.5" in stdout, err
    # another config: one line, nothing is touched
    rc, _, err = _run([*TINY, "run.steps=96", f"hydra.run.dir={out}"], capsys)
    _one_line(rc, err, "run.steps=64 there, 96 now", str(out))
    assert {p.relative_to(out): p.stat().st_mtime_ns for p in out.rglob("*")
            if p.is_file()} == files


def test_a_result_written_before_a_key_existed_is_reused(tmp_path, capsys):
    """A summary.json written before a config key existed (here ``model.doc_batch``, dropped
    from it) is the same config as today's default, not "another config"; a non-default
    value of that key still is."""
    import json

    out = tmp_path / "r"
    rc, _, err = _run([*TINY, f"hydra.run.dir={out}"], capsys)
    assert rc == 0, err
    sj = out / "summary.json"
    s = json.loads(sj.read_text())
    assert s["config"]["model"].pop("doc_batch") == "auto"
    sj.write_text(json.dumps(s))
    rc, stdout, err = _run([*TINY, f"hydra.run.dir={out}"], capsys)
    assert rc == 0 and "reused" in stdout, err
    rc, _, err = _run([*TINY, "model.doc_batch=2", f"hydra.run.dir={out}"], capsys)
    _one_line(rc, err, "model.doc_batch='auto' there, 2 now", str(out))


def test_a_changed_input_file_is_not_taken_for_the_same_input(tmp_path, capsys):
    """A result (and a checkpoint) records its input files' sizes and times: the same config
    over a trace rewritten in place is a one-line error, not a reuse of the old numbers."""
    import numpy as np
    from conftest import make_trace

    from precsim.checkpoint import Checkpoint
    from precsim.config import to_config
    from precsim.result import inputs_changed

    trace = tmp_path / "t.npz"
    np.savez(trace, **make_trace("mamba2", T=64, H=1, P=8, N=32))
    out = tmp_path / "r"
    args = ["workload=trace", f"workload.path={trace}", "run.steps=64", "metrics.window=32",
            "metrics.vocab=32", "run.progress=false", "metrics.plot=false", f"hydra.run.dir={out}"]
    rc, _, err = _run(args, capsys)
    assert rc == 0, err
    rc, stdout, err = _run(args, capsys)
    assert rc == 0 and "reused" in stdout, err
    files = {p.relative_to(out): p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    np.savez(trace, **make_trace("mamba2", T=64, H=1, P=8, N=32, seed=5))  # same path
    rc, _, err = _run(args, capsys)
    _one_line(rc, err, "made from other inputs (workload.path: the file changed", str(out))
    assert {p.relative_to(out): p.stat().st_mtime_ns for p in out.rglob("*")
            if p.is_file()} == files
    # a checkpoint keeps them too (what resume compares); a directory input: a file added
    rec = tmp_path / "rec"
    (rec / "layer_00").mkdir(parents=True)
    (rec / "record.json").write_text("{}")
    cfg = to_config({"workload": {"kind": "trace", "path": str(rec)},
                     "schemes": {"c": {"kind": "conventional", "fmt": "fp16"}}})
    saved = Checkpoint(cfg, tmp_path)._inputs()
    assert inputs_changed(saved, cfg) is None
    # what runs and tools write there is not the input: a run folder inside it, a git index
    for f in ("replay0/summary.json", "replay0/precsim.log", "replay0/.hydra/config.yaml",
              ".git/index", "layer_00/metrics.csv", "layer_00/error_vs_length.png"):
        (rec / f).parent.mkdir(parents=True, exist_ok=True)
        (rec / f).write_text("x")
    assert inputs_changed(saved, cfg) is None
    (rec / "layer_00" / "x.npy").write_bytes(b"0")
    assert inputs_changed(saved, cfg) == "workload.path: layer_00/x.npy is new"


def test_a_non_finite_trace_value_is_named_by_its_index(tmp_path, capsys):
    import numpy as np
    from conftest import make_trace

    tr = make_trace("mamba2", T=64, H=1, P=8, N=32)
    tr["x"][10, 0, 3] = np.nan
    np.savez(tmp_path / "t.npz", **tr)
    rc, _, err = _run(["workload=trace", f"workload.path={tmp_path / 't.npz'}", "run.steps=64",
                       "metrics.window=32", f"hydra.run.dir={tmp_path / 'r'}"], capsys)
    _one_line(rc, err, "x has a non-finite value at index (10, 0, 3); allowed: finite numbers")
    both = {**make_trace("gdn", T=64, H=1, P=8, N=32), **make_trace("mamba2", T=64, H=1, P=8,
                                                                      N=32)}
    np.savez(tmp_path / "both.npz", **both)  # it ran as Mamba-2, silently
    rc, _, err = _run(["workload=trace", f"workload.path={tmp_path / 'both.npz'}",
                       "run.steps=64", "metrics.window=32", f"hydra.run.dir={tmp_path / 'b'}"],
                      capsys)
    _one_line(rc, err, "name both families")


def test_a_layer_of_a_single_trace_file_is_one_line(tmp_path, capsys):
    """workload.layer=3 with one layer's .npz (no record.json): the file was replayed as if it
    were layer 3, without a word."""
    import numpy as np
    from conftest import make_trace

    np.savez(tmp_path / "t.npz", **make_trace("mamba2", T=64, H=1, P=8, N=32))
    rc, _, err = _run(["workload=trace", f"workload.path={tmp_path / 't.npz'}", "run.steps=64",
                       "metrics.window=32", "workload.layer=3", f"hydra.run.dir={tmp_path / 'r'}"],
                      capsys)
    _one_line(rc, err, f"workload.layer=3 with workload.path='{tmp_path / 't.npz'}', one layer's "
              "trace (no record.json); allowed: null, or the precsim.record directory")
    assert not (tmp_path / "r").exists()


def test_without_the_kl_the_table_has_no_kl_column(tmp_path, capsys):
    rc, stdout, err = _run([*TINY, "schemes=single", "metrics.kl=false",
                            f"hydra.run.dir={tmp_path / 'r'}"], capsys)
    assert rc == 0, err
    head = next(ln for ln in stdout.splitlines() if ln.startswith("scheme"))
    assert "KL(final)" not in head and "err(final)" in head
    row = next(ln for ln in stdout.splitlines() if ln.startswith("candidate"))
    assert "nan" not in row


def test_version_is_precsims(capsys):
    from precsim import __version__

    rc, stdout, err = _run(["--version"], capsys)
    assert rc == 0 and stdout.strip() == f"precsim {__version__}" and not err


def test_an_output_path_that_is_a_file_is_one_line_before_any_work(tmp_path, capsys):
    """It ran the whole simulation and then ended in a FileExistsError traceback."""
    f = tmp_path / "afile"
    f.write_text("x")
    for key in ("run.out_dir", "hydra.run.dir"):
        rc, stdout, err = _run([*TINY, f"{key}={f}"], capsys)
        _one_line(rc, err, f"{key}='{f}' is an existing file", "allowed: a directory")
        assert "engine=" not in stdout  # nothing ran
    assert f.read_text() == "x"


def test_api_follows_the_same_rule(tmp_path):
    from precsim import simulate
    from precsim.errors import PrecsimError

    cfg = {"schemes": {"c": {"kind": "conventional", "fmt": "fp16"}},
           "model": {"heads": 1, "head_dim": 4, "state_dim": 16},
           "run": {"steps": 64, "progress": False}, "metrics": {"window": 32, "vocab": 32,
                                                                "plot": False}}
    first = simulate(cfg, out_dir=tmp_path)
    before = (tmp_path / "summary.json").read_bytes()
    again = simulate(cfg, out_dir=tmp_path)
    assert again.info.get("reused") and [r["step"] for r in again.rows] == [32, 64]
    assert again.rows[-1]["rel_err"] == pytest.approx(first.rows[-1]["rel_err"], rel=1e-6)
    with pytest.raises(PrecsimError, match="another config .*run.steps=64 there, 128 now"):
        simulate({**cfg, "run": {"steps": 128, "progress": False}}, out_dir=tmp_path)
    assert (tmp_path / "summary.json").read_bytes() == before
    with pytest.raises(PrecsimError, match="unknown key run.stepz; did you mean run.steps"):
        simulate({**cfg, "run": {"stepz": 128}})


def test_lengths_that_no_window_ends_at_are_not_reported(tmp_path, capsys):
    out = tmp_path / "r"
    rc, stdout, _ = _run([*TINY, "run.steps=128", "metrics.window=64",
                          "metrics.lengths=[32,64,128]", f"hydra.run.dir={out}"], capsys)
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    figs = s["figures"]["split_fp32_nvfp4"]
    assert "32" not in figs and {"64", "128"} <= set(figs)
    assert s["lengths_skipped"] == [32] and "metrics.lengths [32] not reported" in stdout


def test_remove_stub_keeps_a_directory_with_results(tmp_path):
    from precsim.rundir import remove_stub

    stub = tmp_path / "stub"
    (stub / ".hydra").mkdir(parents=True)
    (stub / "precsim.log").write_text("")
    remove_stub(stub, "precsim")
    assert not stub.exists()
    kept = tmp_path / "kept"
    (kept / ".hydra").mkdir(parents=True)
    (kept / "summary.json").write_text("{}")
    remove_stub(kept, "precsim")
    assert (kept / "summary.json").is_file()


def test_help_describes_and_survives_a_closed_pipe(tmp_path):
    r = subprocess.run(f"{sys.executable} -m precsim --help | head -1", shell=True, cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.startswith("precsim: how far") and r.stderr == ""
    full = subprocess.run([sys.executable, "-m", "precsim", "--help"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60).stdout
    for needle in ("python -m precsim experiment=split_nvfp4", "-m experiment=precision_sweep",
                   "python -m precsim.report DIR", "metrics.csv", "summary.json",
                   "error_vs_length.png", "run.out_dir", "precision_sweep|seed_table"):
        assert needle in full, needle
    assert "powered by Hydra" not in full and not list(tmp_path.iterdir())


def test_report_help_is_plain_text(capsys):
    with pytest.raises(SystemExit):
        report.main(["--help"])
    text = capsys.readouterr().out
    assert "``" not in text and "--metric" in text and "relative RMS error" in text


@pytest.mark.parametrize("arg", ["schemes.mine={kind: split, fmt: fp32, read_fmt: nvfp4}",
                                 "schemes.mine.fmt=fp16",
                                 # with + Hydra's line was "Invalid type assigned: dict is not a
                                 # subclass of SchemeConfig. value: {}; full_key: mine"
                                 "+schemes.mine.fmt=fp16",
                                 "+schemes.mine={kind: split, fmt: fp32, read_fmt: nvfp4}"])
def test_a_new_scheme_error_suggests_commands_that_run(arg, tmp_path, capsys):
    """Adding a scheme the preset lacks: the one-line error names the preset's schemes and
    suggests forms that work (a typed Dict[str, SchemeConfig] takes no new key by override);
    both suggestions then run."""
    import shlex

    rc, _, err = _run([*TINY, arg, f"hydra.run.dir={tmp_path / 'bad'}"], capsys)
    _one_line(rc, err, "conventional_fp32, shared_nvfp4_sr, split_fp32_nvfp4", "schemes=single")
    replace = shlex.split(err[0].split("replace them all: ", 1)[1])
    assert replace[0] == "~schemes" and replace[1].startswith("+schemes={mine:")
    for i, extra in enumerate((replace, ["schemes=single", "schemes.candidate.kind=split",
                                         "schemes.candidate.read_fmt=nvfp4"])):
        rc, out, err = _run([*TINY, *extra, f"hydra.run.dir={tmp_path / str(i)}"], capsys)
        assert rc == 0, err
