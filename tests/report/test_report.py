"""precsim.report on a synthetic sweep directory with known numbers (no simulation runs)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from precsim import report
from precsim.result import rows_to_csv

LENGTHS = (256, 1024, 4096)
# scheme -> (label, kind, fmt, rounding, read_fmt)
SPECS = {
    "conventional_fp32": ("conventional(fp32)", "conventional", "fp32", "rne", None),
    "shared_nvfp4_sr": ("shared(nvfp4/sr)", "shared", "nvfp4", "sr", None),
    "split_fp32_nvfp4": ("split(fp32 update + nvfp4 read)", "split", "fp32", "rne", "nvfp4"),
}
# job -> buffer_len, {scheme: (bytes/step, kl at 4096)}; kl at 1024 is half, at 256 a quarter
JOBS = {
    "0_replay.buffer_len=8": (8, {"conventional_fp32": (65536, 1e-12),
                                  "shared_nvfp4_sr": (9434.5, 5e-2),
                                  "split_fp32_nvfp4": (17050, 4e-4)}),
    "1_replay.buffer_len=16": (16, {"conventional_fp32": (65536, 1e-12),
                                    "shared_nvfp4_sr": (12234.25, 3e-2),
                                    "split_fp32_nvfp4": (16042, 6e-4)}),
    "2_replay.buffer_len=64": (64, {"split_fp32_nvfp4": (15000, 1.6e-3)}),
}
SCALE = {256: 0.25, 1024: 0.5, 4096: 1.0}


def _fig(kl: float) -> dict:
    return {"rel_err": 10 * kl, "kl": kl, "state_drift": kl / 10, "read_drift": None}


def write_job(path: Path, buffer_len: int, schemes: dict, steps: int = 4096,
              dead: dict | None = None) -> None:
    """A run directory as precsim writes it: metrics.csv, summary.json, .hydra/overrides.yaml."""
    path.mkdir(parents=True)
    (path / ".hydra").mkdir()
    (path / ".hydra" / "overrides.yaml").write_text(
        f"- experiment=split_nvfp4\n- replay.buffer_len={buffer_len}\n- run.progress=false\n")
    rows, figures, info, cost = [], {}, {}, {}
    for name, (b, kl) in schemes.items():
        label, kind, fmt, rnd, rf = SPECS[name]
        info[name] = {"kind": kind, "label": label, "fmt": fmt, "rounding": rnd,
                      "read_fmt": rf, "dead_at": (dead or {}).get(name)}
        cost[name] = {"bytes_per_step": b, "fraction_of_fp32": b / 65536,
                      "roofline_speedup": 65536 / b, "state_transfers_per_step": 1.0}
        figures[name] = {}
        for L in [x for x in LENGTHS if x <= steps] + ([steps] if steps not in LENGTHS else []):
            v = kl * SCALE.get(L, 1.0)
            rows.append({"scheme": name, "step": L, **{k: x for k, x in _fig(v).items()
                                                       if x is not None}})
            if L in LENGTHS:
                figures[name][str(L)] = _fig(v)
        figures[name]["final"] = {"step": steps, **_fig(kl)}
    rows.sort(key=lambda r: r["step"])
    (path / "metrics.csv").write_text(rows_to_csv(rows))
    summary = {"complete": True, "steps": steps, "figures": figures, "schemes": info,
               "cost": cost, "config": {"replay": {"buffer_len": buffer_len}}}
    (path / "summary.json").write_text(json.dumps(summary))


@pytest.fixture
def sweep(tmp_path) -> Path:
    root = tmp_path / "sweep"
    for name, (bl, schemes) in JOBS.items():
        write_job(root / name, bl, schemes)
    bad = root / "3_replay.buffer_len=128"
    (bad / ".hydra").mkdir(parents=True)
    (bad / ".hydra" / "overrides.yaml").write_text("- replay.buffer_len=128\n")
    (bad / "error.txt").write_text("PrecsimError: something broke\n\nTraceback ...\n")
    (root / ".submitit" / "123").mkdir(parents=True)  # hidden folders are not jobs
    return root


def _run(capsys, *args) -> tuple[int, str]:
    """The report's CLI; these fixtures are built around the KL, so --metric kl unless given
    (the report's default metric is rel_err)."""
    args = [str(a) for a in args]
    if "--metric" not in args and "--help" not in args:
        args += ["--metric", "kl"]
    code = report.main(args)
    return code, capsys.readouterr().out


def test_summary_csv_one_row_per_job_and_scheme(sweep, capsys):
    code, out = _run(capsys, sweep)
    assert code == 0 and "3/4 jobs complete" in out and "failed" in out
    with open(sweep / report.CSV_FILE) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 + 3 + 1 + 1
    for col in ("replay.buffer_len", "experiment", "scheme", "kl@256", "kl@4096",
                "rel_err@1024", "kl@final", "bytes_per_step", "status"):
        assert col in rows[0], col
    assert "run.progress" not in rows[0]
    split16 = next(r for r in rows if r["job"] == "1_replay.buffer_len=16"
                   and r["scheme"] == "split_fp32_nvfp4")
    assert float(split16["kl@4096"]) == pytest.approx(6e-4)
    assert float(split16["kl@1024"]) == pytest.approx(3e-4)
    assert float(split16["bytes_per_step"]) == 16042 and split16["buffer_len"] == "16"
    failed = next(r for r in rows if r["job"] == "3_replay.buffer_len=128")
    assert failed["status"] == "failed" and "something broke" in failed["error"]
    assert {r["replay.buffer_len"] for r in rows} == {"8", "16", "64", "128"}
    for png in (report.ERROR_PLOT, report.PARETO_PLOT):
        assert (sweep / png).read_bytes()[:4] == b"\x89PNG"


def test_recommendation_cheapest_within_budget(sweep, capsys):
    code, out = _run(capsys, sweep, "--metric", "kl", "--budget", "1e-3", "--horizon", "131072",
                     "--extrapolate", "--no-plots")
    assert code == 0
    assert "no run reached the horizon; figures at length 4,096 used" in out
    rec = out.split("recommended:")[1]
    assert rec.splitlines()[0].strip().startswith("split(fp32 update + nvfp4 read)")
    assert "1_replay.buffer_len=16" in rec.splitlines()[0]
    assert "16,042 bytes/step/head; kl=0.0006 at length 4,096" in out
    # margin: 1e-3 / 6e-4 = 1.67x; runner-up (L=8, 17,050 B) +6.3%; L=64 is cheaper but misses
    assert "1.67x under the budget" in out and "+6.3%" in out
    assert "next cheaper (split(fp32 update + nvfp4 read), 15,000 B) misses it with kl=0.0016" \
        in out
    runners = out.split("runners-up")[1].splitlines()[1:]
    assert "17,050" in runners[0] and "buffer_len=8" in runners[0]
    assert "65,536" in runners[1] and "conventional(fp32)" in runners[1]
    assert len(runners) == 2  # the FP32 baseline of two jobs is one configuration


def test_horizon_picks_the_largest_reported_length(sweep, capsys):
    # at 1024 the L=64 split has kl = 8e-4: now it fits and is the cheapest
    code, out = _run(capsys, sweep, "--budget", "1e-3", "--horizon", "2000", "--no-plots")
    assert code == 0 and "figures at length 1,024 used" in out
    assert "15,000 bytes/step/head; kl=0.0008 at length 1,024" in out


def test_nothing_fits_says_so(sweep, capsys):
    code, out = _run(capsys, sweep, "--budget", "1e-15", "--no-plots")
    assert code == 0
    assert "NO configuration is within the budget" in out
    assert "most accurate is conventional(fp32)" in out and "recommended" not in out


@pytest.mark.parametrize(("metric", "budget", "best"), [
    pytest.param("rel_err", "1e-2", "16,042", id="rel_err"),  # rel_err = 10 * kl
    pytest.param("state_drift", "1e-2", "9,434", id="state_drift"),  # drift = kl / 10
])
def test_other_metrics(sweep, capsys, metric, budget, best):
    code, out = _run(capsys, sweep, "--metric", metric, "--budget", budget, "--no-plots")
    assert code == 0 and f"{best}" in out.split("recommended:")[1].splitlines()[1]


def test_dead_scheme_never_recommended(tmp_path, capsys):
    write_job(tmp_path / "0", 16, {"shared_nvfp4_sr": (9000, 1e-9),
                                   "conventional_fp32": (65536, 1e-12)},
              dead={"shared_nvfp4_sr": 100})
    code, out = _run(capsys, tmp_path, "--budget", "1e-3", "--no-plots")
    assert code == 0 and "recommended: conventional(fp32)" in out


def test_single_run_dir(tmp_path, capsys):
    write_job(tmp_path / "run", 16, JOBS["1_replay.buffer_len=16"][1], steps=1024)
    code, out = _run(capsys, tmp_path / "run", "--budget", "1e-3", "--horizon", "131072",
                     "--extrapolate")
    assert code == 0 and "1/1 jobs complete" in out
    assert "figures at length 1,024 used" in out and "16,042 bytes" in out
    assert (tmp_path / "run" / report.CSV_FILE).is_file()


def test_truncated_metrics_is_broken(sweep):
    job = sweep / "0_replay.buffer_len=8"
    assert report.check_run_dir(job) is None
    lines = (job / "metrics.csv").read_text().splitlines()
    (job / "metrics.csv").write_text("\n".join(lines[:4]) + "\n")
    assert "truncated" in report.check_run_dir(job)
    status = {j.name: j.status for j in report.collect(sweep)}
    assert status["0_replay.buffer_len=8"] == "broken"
    (job / "summary.json").unlink()
    assert report.collect(sweep)[0].status == "incomplete"


def test_pareto_front():
    c = [report.Candidate("j", s, s, b, v, 1) for s, b, v in
         [("a", 10, 1.0), ("b", 20, 0.5), ("c", 30, 0.7), ("d", 40, 0.1), ("e", 20, 0.9)]]
    assert [x.scheme for x in report.pareto_front(c)] == ["a", "b", "d"]


@pytest.mark.parametrize(("args", "needle"), [
    pytest.param(["--metric", "foo"], "invalid choice: 'foo'", id="metric"),
    pytest.param(["--budget", "-1"], "--budget=-1.0 must be a positive number", id="budget"),
    pytest.param(["--horizon", "100"], "no reported length <= --horizon=100", id="horizon"),
    # listed all runners-up but the last (a slice from the end), exit 0
    pytest.param(["--top", "-1"], "--top=-1 is invalid; allowed: an integer >= 0", id="top"),
])
def test_bad_input_is_one_line(sweep, capsys, args, needle):
    with pytest.raises(SystemExit) as e:
        report.main([str(sweep), "--no-plots", *args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert err.startswith("precsim-report: error: ") and needle in err


def test_cli_module_missing_dir(tmp_path):
    r = subprocess.run([sys.executable, "-m", "precsim.report", str(tmp_path / "nope")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip() == f"precsim-report: error: {tmp_path / 'nope'} is not a directory"


def test_empty_dir_is_an_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        report.main([str(tmp_path)])
    assert e.value.code == 2 and "no run results" in capsys.readouterr().err


def test_report_default_metric_is_rel_err(sweep, capsys):
    code = report.main([str(sweep), "--budget", "1e-2", "--no-plots"])
    out = capsys.readouterr().out
    assert code == 0 and "metric rel_err <= 0.01" in out


def test_pareto_plot_with_many_configurations(tmp_path):
    """25+ configurations: the plot is written, and the FP32 baseline far below the others does
    not set the y range (it is named below the axis instead)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cands = [report.Candidate(f"j{i}", "s", f"split(fp{i} update + nvfp4 read)", 12000 + 300 * i,
                              0.12 / (1 + i / 10), 4096, f"fmt={i}") for i in range(26)]
    cands.append(report.Candidate("j0", "c", "conventional(fp32)", 65536, 2.5e-7, 4096))
    fig, ax = plt.subplots()
    ax.set_yscale("log")
    ax.scatter([c.bytes_per_step for c in cands], [c.value for c in cands])
    report.clip_low(ax, [c.value for c in cands], [(c.label, c.value, "k") for c in cands])
    lo, hi = ax.get_ylim()
    assert lo > 1e-5 and hi >= 0.12
    assert any("conventional(fp32): 2.5e-07" in t.get_text() for t in ax.texts)
    plt.close(fig)


def test_a_run_over_every_recorded_layer_is_one_complete_job(tmp_path, capsys):
    """A trace replay without workload.layer keeps its per-window files in layer_XX/ and, in its
    own folder, a summary of each scheme's worst layer (no metrics.csv): the report command the
    run prints reads it as one complete job whose figures are the worst layer's, as the
    layers' own summaries say; a truncated layer makes it broken, and the sweep callback then
    sets that layer's summary and the run's aside (the rerun redoes them)."""
    pytest.importorskip("transformers")
    import shlex

    from conftest import record_tiny_mamba2, run_main
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from precsim import callbacks

    rec, run = record_tiny_mamba2(tmp_path), tmp_path / "run"
    rc, out, err = run_main(["workload=trace", f"workload.path={rec}", "run.steps=64",
                             "metrics.window=32", "run.engine=torch", "run.progress=false",
                             f"hydra.run.dir={run}"], capsys)
    assert rc == 0, err
    assert not (run / "metrics.csv").exists() and (run / "layer_01" / "metrics.csv").is_file()
    cmd = next(ln for ln in out.splitlines() if ln.startswith("to compare with other runs: "))
    assert report.main(shlex.split(cmd.removeprefix("to compare with other runs: "))[3:]) == 0
    text = capsys.readouterr().out
    assert f"{run}: 1/1 jobs complete" in text and "broken" not in text, text
    assert (run / report.ERROR_PLOT).is_file() and (run / report.PARETO_PLOT).is_file()
    layers = [json.loads((run / f"layer_0{i}" / "summary.json").read_text()) for i in (0, 1)]
    with open(run / report.CSV_FILE) as f:
        rows = {r["scheme"]: r for r in csv.DictReader(f)}
    assert set(rows) == set(layers[0]["schemes"]) and len(rows) == 3
    for name, r in rows.items():
        assert r["status"] == "complete"
        worst = max(s["figures"][name]["final"]["rel_err"] for s in layers)
        assert float(r["rel_err@final"]) == pytest.approx(worst, rel=1e-6)
    # the recommendation: the cheapest scheme whose worst layer fits
    best = min(rows, key=lambda n: float(rows[n]["bytes_per_step"]))
    assert float(rows[best]["rel_err@final"]) <= 0.0625 and "--budget 0.0625" in cmd
    assert f"recommended: {rows[best]['label']}  (job ., scheme {best})" in text
    m = run / "layer_01" / "metrics.csv"
    m.write_text(m.read_text().splitlines()[0] + "\n")
    assert report.check_run_dir(run).startswith("layer_01: metrics.csv is truncated")
    assert [j.status for j in report.collect(run)] == ["broken"]
    cfg = OmegaConf.create({"hydra": {"mode": RunMode.MULTIRUN, "launcher": {"_target_": "x"},
                                      "job": {"num": 0}, "runtime": {"output_dir": str(run)}},
                            "run": {"device": "cpu"}})
    callbacks.SweepCallback().on_job_start(cfg)
    assert (run / "layer_01" / "summary.json.broken").is_file()
    assert (run / "summary.json.broken").is_file() and not (run / "summary.json").exists()
    assert (run / "layer_00" / "summary.json").is_file()  # intact: kept


# -- what is comparable (issue 41) -----------------------------------------------------------
TINY = ["run.steps=64", "metrics.window=32", "metrics.vocab=32", "run.seqs=1",
        "run.engine=torch", "run.progress=false", "metrics.plot=false"]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """A folder as a user's outputs/ grows: a sweep of layer runs of one shape (two buffer
    lengths), a single run of another shape, and a whole-model run of a tiny GDN checkpoint."""
    tf = pytest.importorskip("transformers")
    import torch
    from conftest import GDN

    from precsim.cli import main as cli_main

    root = tmp_path_factory.mktemp("mixed")
    out = root / "outputs"
    assert cli_main(["-m", "experiment=split_nvfp4", "replay.buffer_len=8,16", "model.heads=1",
                     "model.head_dim=8", *TINY, f"hydra.sweep.dir={out / 'sweep'}"]) == 0
    assert cli_main(["experiment=split_nvfp4", "model.heads=2", "model.head_dim=16", *TINY,
                     f"hydra.run.dir={out / 'other_shape'}"]) == 0
    torch.manual_seed(0)
    tf.Qwen3_5ForCausalLM(tf.Qwen3_5TextConfig(vocab_size=96, hidden_size=32,
                                               num_hidden_layers=2, **GDN,
                                               num_attention_heads=2, num_key_value_heads=1,
                                               intermediate_size=32)
                          ).save_pretrained(root / "gdn_ckpt")
    assert cli_main(["experiment=model_kl", f"model.path={root / 'gdn_ckpt'}", "run.steps=6",
                     "metrics.window=3", "run.progress=false", "metrics.plot=false",
                     f"hydra.run.dir={out / 'whole_model'}"]) == 0
    return out


def test_report_groups_what_is_comparable(mixed, capsys):
    """Layer runs of two shapes and a whole-model run: three groups, one recommendation each,
    said in the output; labels name only what differs within a group (buffer_len), never a key
    a run lacks (`experiment=None`, `path=None`)."""
    code = report.main([str(mixed), "--budget", "0.0625", "--no-plots"])
    out = capsys.readouterr().out
    assert code == 0
    assert "the runs form 3 groups that are not ranked against each other" in out
    blocks = {b.splitlines()[0]: b for b in out.split("== group ")[1:]}
    assert len(blocks) == 3, out
    by = {what: next(b for h, b in blocks.items() if what in h) for what in (
        "synthetic layer runs, Mamba-2 layer (1 head x 8 x 128) (2 jobs)",
        "synthetic layer runs, Mamba-2 layer (2 heads x 16 x 128) (1 job)",
        "whole-model runs of gdn_ckpt (the metric measures the model's logits")}
    assert all(b.count("recommended:") + b.count("NO configuration") == 1
               for b in blocks.values()), out
    # each group's recommendation names a job of its own group
    small, other, model = by.values()
    assert "(job sweep/" in small.split("recommended:")[1].splitlines()[0]
    assert "(job other_shape," in other and "(job whole_model," in model
    import re

    assert report.main([str(mixed), "--budget", "1", "--no-plots"]) == 0  # every one listed
    tags = re.findall(r"\[([^\]/]*) / ", capsys.readouterr().out)
    assert tags and set(tags) <= {"buffer_len=8", "buffer_len=16", "other_shape",
                                  "whole_model"}, tags
    groups = report.comparable_groups(report.collect(mixed))
    tags = report.short_tags(next(g for g in groups if "1 head x" in g.title).jobs)
    assert sorted(tags.values()) == ["buffer_len=16", "buffer_len=8"]


def test_horizon_beyond_the_longest_run_needs_extrapolate(sweep, capsys):
    """--horizon past every run: one line naming the flag, the value and what is allowed, exit
    2, nothing written; with --extrapolate the report judges at the last length and says so."""
    with pytest.raises(SystemExit) as e:
        report.main([str(sweep), "--metric", "kl", "--budget", "1e-3", "--horizon", "131072"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert err.startswith("precsim-report: error: --horizon=131072 is beyond the longest run "
                          "(4,096 steps); allowed: 1..4096, or add --extrapolate")
    assert not (sweep / report.CSV_FILE).exists() and not (sweep / report.PARETO_PLOT).exists()
    code, out = _run(capsys, sweep, "--budget", "1e-3", "--horizon", "131072", "--extrapolate",
                     "--no-plots")
    assert code == 0 and "no run reached the horizon; figures at length 4,096 used" in out
    code, out = _run(capsys, sweep, "--budget", "1e-3", "--horizon", "4096", "--no-plots")
    assert code == 0 and "note: no run reached" not in out


def test_sweep_plots_carry_the_decision(sweep, monkeypatch):
    """With a budget both sweep plots draw its line, the Pareto plot stars the recommended
    configuration and labels it "recommended" (the length plot puts it first in its legend);
    no text sits among the points but the front's numbers (inside their markers) and that
    label; a curve lying on top of another says so in the legend."""
    import matplotlib.pyplot as plt

    from precsim import plots

    # a second split whose curve is the first's: drawn with its own marker, said in the legend
    SPECS["split_fp16_nvfp4"] = ("split(fp16 update + nvfp4 read)", "split", "fp16", "rne",
                                 "nvfp4")
    try:
        write_job(sweep / "4_twin", 16, {"split_fp16_nvfp4": (16042, 6e-4)})
        figs = {}

        def keep(fig, path, **kw):
            figs[Path(path).name] = fig
            return Path(path)

        monkeypatch.setattr(plots, "save_png", keep)
        report.aggregate(sweep, budget=("kl", 1e-3))
    finally:
        del SPECS["split_fp16_nvfp4"]
    pareto, length = figs[report.PARETO_PLOT], figs[report.ERROR_PLOT]
    for fig in (pareto, length):
        kl_ax = next(ax for ax in fig.axes if "KL" in ax.get_title() or "kl" in ax.get_title())
        assert any(ln.get_ydata()[0] == 1e-3 and len(set(ln.get_ydata())) == 1
                   for ln in kl_ax.get_lines()), "no budget line on the kl panel"
    kl_ax = pareto.axes[1]
    rec = [t for t in kl_ax.texts if t.get_text() == "recommended"]
    assert len(rec) == 1 and rec[0].xy == (16042, 6e-4)  # split, L=16: the cheapest fitting
    free = [t.get_text() for t in kl_ax.texts if t.get_text() not in ("recommended",)
            and not t.get_text().isdigit() and not t.get_text().startswith(("Pareto front",
                                                                             "▼"))]
    assert not free, free
    listed = next(t.get_text() for t in kl_ax.texts if t.get_text().startswith("Pareto front"))
    assert "<- recommended" in next(ln for ln in listed.splitlines() if "16,042" in ln)
    assert "same point: split(fp16 update + nvfp4 read)" in listed  # the twin, not hidden
    names = [t.get_text() for t in length.legends[0].get_texts()]
    assert names[0].startswith("#1 ★ recommended: ") and "split(fp32" in names[0]
    twin = next(n for n in names if "split(fp16 update" in n)
    assert twin.endswith("(lies on #1)"), names
    plt.close("all")


def test_plots_of_exact_schemes_with_a_budget(tmp_path):
    """Every value 0 (a tiny whole-model sweep whose schemes are all exact) with the sweep's
    budget: both plots are written (the budget line alone once left a log axis of 0..1)."""
    write_job(tmp_path / "a", 16, {"conventional_fp32": (65536, 0.0),
                                   "split_fp32_nvfp4": (16042, 0.0)})
    agg = report.aggregate(tmp_path, budget=("rel_err", 0.0625))
    assert [p.name for p in agg.plots] == [report.ERROR_PLOT, report.PARETO_PLOT]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in agg.plots)


def test_report_relates_layer_replays_to_the_whole_model_run(tmp_path, capsys):
    """A recording's layer replay and a whole-model run of the checkpoint it was recorded from:
    the report keeps them in two groups and says how their verdicts relate and which to trust
    for what; a replay of another checkpoint's recording gets no such note."""
    pytest.importorskip("transformers")
    from conftest import build

    from precsim.cli import main as cli_main
    from precsim.record import main as record_main

    build("Mamba2ForCausalLM", 0.2, slow_decay=True).save_pretrained(tmp_path / "ckpt")
    np.save(tmp_path / "ids.npy", np.random.default_rng(0).integers(0, 96, (1, 16)))
    assert record_main(["--model", str(tmp_path / "ckpt"), "--ids-file",
                        str(tmp_path / "ids.npy"), "--layers", "0",
                        "--out", str(tmp_path / "rec")]) == 0
    out = tmp_path / "outputs"
    assert cli_main(["workload=trace", f"workload.path={tmp_path / 'rec'}", "workload.layer=0",
                     "run.steps=16", "metrics.window=8", "metrics.vocab=32",
                     "run.progress=false", "metrics.plot=false", "run.engine=torch",
                     f"hydra.run.dir={out / 'replay'}"]) == 0
    assert cli_main(["experiment=model_kl", f"model.path={tmp_path / 'ckpt'}",
                     f"model.ids={tmp_path / 'ids.npy'}", "run.steps=16", "metrics.window=8",
                     "run.progress=false", "metrics.plot=false",
                     f"hydra.run.dir={out / 'whole'}"]) == 0
    capsys.readouterr()
    assert report.main([str(out), "--budget", "0.0625", "--no-plots"]) == 0
    text = capsys.readouterr().out
    note = [ln for ln in text.splitlines() if ln.startswith("note: group")]
    assert len(note) == 1, text
    assert "replays layers of a recording of group" in note[0]
    assert "trust the whole-model verdict" in note[0]
    # the recording made from another checkpoint: no relation
    meta = json.loads((tmp_path / "rec" / "record.json").read_text())
    meta["model_path"] = str(tmp_path / "elsewhere")
    (tmp_path / "rec" / "record.json").write_text(json.dumps(meta))
    assert report.main([str(out), "--budget", "0.0625", "--no-plots"]) == 0
    assert "note: group" not in capsys.readouterr().out
