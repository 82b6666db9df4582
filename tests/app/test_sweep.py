"""Sweeps end to end: aggregation, resume without redoing finished jobs, failed jobs, launchers.

The CLI runs in a subprocess with a tiny config (2 heads, 256 steps, vocab 64).
"""

from __future__ import annotations

import csv
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from precsim import callbacks, report

# run.engine=torch: each job is a fresh process, and auto's numba engine loads its compiled code
# in each (a 2-job joblib sweep: 31 s against 16 s); engine choice is test_engine_numba.py's
FAST = ["run.steps=256", "run.seqs=1", "model.heads=2", "metrics.vocab=64", "run.progress=false",
        "run.engine=torch"]
SWEEP = ["-m", "experiment=split_nvfp4", "replay.buffer_len=8,16", *FAST]
RESULT_FILES = ("metrics.csv", "summary.json", "per_step.npz", "error_vs_length.png")


def _TRACE_JOBS(tmp_path: Path) -> list[str]:  # noqa: N802 - a constant's shape
    """Two jobs over a 256-step trace whose second asks for more steps than it has: a failure
    only a job finds (a bad value of the config itself is refused before any job runs)."""
    import numpy as np
    from conftest import make_trace

    np.savez(tmp_path / "t.npz", **make_trace("mamba2", T=256, H=2, P=8, N=32))
    return ["workload=trace", "workload.path=t.npz", "run.steps=256,100000"]  # (cwd: tmp_path)


def _cli(args: list[str], cwd: Path, timeout: int = 400) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return subprocess.run([sys.executable, "-m", "precsim", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _jobs(sweep: Path) -> dict[str, Path]:
    return {p.name.split("_")[0]: p for p in sorted(sweep.iterdir())
            if p.is_dir() and not p.name.startswith(".")}


def _results(job: Path) -> dict[str, tuple[str, int]]:
    return {n: v for n, v in _snapshot(job).items() if n in RESULT_FILES}


def _snapshot(job: Path) -> dict[str, tuple[str, int | None]]:
    """sha256 of every file; the mtime of the result files (.hydra/ is rewritten per launch; the
    job's log gains a line per launch)."""
    out = {}
    for f in sorted(job.rglob("*")):
        if f.is_file() and f.suffix != ".log":
            rel = f.relative_to(job).as_posix()
            mt = f.stat().st_mtime_ns if rel in RESULT_FILES else None
            out[rel] = (hashlib.sha256(f.read_bytes()).hexdigest(), mt)
    return out


@pytest.fixture(scope="module")
def joblib_sweep(tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp("joblib")
    sweep = cwd / "sweep"
    r = _cli([*SWEEP, "hydra/launcher=joblib", f"hydra.sweep.dir={sweep}"], cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    return sweep


def test_joblib_sweep_aggregates_and_rerun_touches_nothing(joblib_sweep):
    sweep = joblib_sweep
    with open(sweep / report.CSV_FILE) as f:
        rows = list(csv.DictReader(f))
    assert {r["replay.buffer_len"] for r in rows} == {"8", "16"}
    assert len(rows) == 2 * 3 and all(r["status"] == "complete" for r in rows)
    assert all(float(r["bytes_per_step"]) > 0 and r["kl@256"] and r["rel_err@final"]
               for r in rows)
    for png in (report.ERROR_PLOT, report.PARETO_PLOT):
        assert (sweep / png).read_bytes()[:4] == b"\x89PNG"
    jobs = _jobs(sweep)
    assert set(jobs) == {"0", "1"} and "replay.buffer_len=8" in jobs["0"].name
    # metrics.plot=null: a sweep job draws no PNG of its own (the sweep's plots show them all)
    assert not any((p / "error_vs_length.png").exists() for p in jobs.values())
    before = {n: _snapshot(p) for n, p in jobs.items()}
    r = _cli([*SWEEP, "hydra/launcher=joblib", f"hydra.sweep.dir={sweep}"], sweep.parent)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr.count(" reused (") == 2  # the per-job line on the terminal
    assert {n: _snapshot(p) for n, p in _jobs(sweep).items()} == before


def test_rerun_redoes_only_the_crashed_job(joblib_sweep, tmp_path):
    sweep = tmp_path / "sweep"
    shutil.copytree(joblib_sweep, sweep)  # copy2 keeps the mtimes
    jobs = _jobs(sweep)
    (jobs["0"] / "summary.json").unlink()  # job 0 "crashed" before its summary was written
    keep = _results(jobs["1"])
    r = _cli([*SWEEP, "hydra/launcher=joblib", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr.count(" reused (") == 1 and r.stderr.count(" done (") == 1
    assert report.check_run_dir(jobs["0"]) is None
    assert _results(jobs["1"]) == keep


def test_broken_job_is_set_aside_for_redo(joblib_sweep, tmp_path):
    """A truncated metrics.csv under a complete summary: on_job_start moves the summary aside,
    so the app's completeness check fails and the job is redone."""
    from hydra.types import RunMode

    job = tmp_path / "job"
    shutil.copytree(_jobs(joblib_sweep)["0"], job)
    cfg = OmegaConf.create({"hydra": {"mode": RunMode.MULTIRUN, "launcher": {"_target_": "x"},
                                      "job": {"num": 0}, "runtime": {"output_dir": str(job)}},
                            "run": {"device": "cpu"}})
    callbacks.SweepCallback().on_job_start(cfg)  # intact: nothing moves
    assert report.check_run_dir(job) is None
    m = job / "metrics.csv"
    m.write_text(m.read_text().splitlines()[0] + "\n")
    callbacks.SweepCallback().on_job_start(cfg)
    assert not (job / "summary.json").exists() and (job / "summary.json.broken").is_file()


@pytest.mark.parametrize("launcher", ["joblib", "basic"])
def test_failed_job_keeps_the_others_and_exits_nonzero(tmp_path, launcher):
    """Both launchers (the basic one runs the jobs in the sweep's own process): a failed job
    ends the sweep through SystemExit(1) either way. (A basic-launcher sweep that succeeds ends
    through os._exit once everything is written, cli.entry: the sweeps run as processes in the
    other tests here check its exit status and files.)"""
    sweep = tmp_path / "sweep"
    r = _cli(["-m", "experiment=split_nvfp4", *_TRACE_JOBS(tmp_path), *FAST[1:],
              f"hydra/launcher={launcher}", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert r.returncode == 1
    assert "1 of 2 jobs did not finish" in r.stderr
    # a setting error: re-running the same command would fail again, so no "re-run" hint
    assert "the same command fails the same way; change the setting it names" in r.stderr
    assert "redo only those" not in r.stderr
    jobs = _jobs(sweep)
    assert report.check_run_dir(jobs["0"]) is None
    err = (jobs["1"] / "error.txt").read_text()
    assert err.startswith("PrecsimError: run.steps=100000 exceeds the trace length T=256")
    log = (jobs["1"] / "precsim.log").read_text()
    assert "Traceback" in err and "exceeds the trace" in log and "Traceback" in log
    # the terminal: one line when the job fails (the traceback only in its files), then the list
    assert "Traceback" not in r.stdout + r.stderr
    said = [ln for ln in r.stderr.splitlines() if ln.startswith("precsim: job 1 failed: ")]
    assert len(said) == 1 and said[0].endswith(f"-> {jobs['1']}"), r.stderr
    assert "PrecsimError: run.steps=100000 exceeds the trace length" in said[0]
    with open(sweep / report.CSV_FILE) as f:
        status = {r["job"].split("_")[0]: r["status"] for r in csv.DictReader(f)}
    assert status == {"0": "complete", "1": "failed"}


def test_a_bad_value_in_the_grid_is_one_line_before_any_job(tmp_path):
    """README: a bad value is one line before any directory is made, in a sweep too (it ran
    the other jobs, then failed the bad one's with a traceback, exit 1)."""
    sweep = tmp_path / "sweep"
    r = _cli(["-m", "experiment=split_nvfp4", "replay.buffer_len=16,0", *FAST,
              f"hydra.sweep.dir={sweep}"], tmp_path)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert lines[0].startswith("precsim: error: replay.buffer_len=0 is invalid; allowed: an "
                               "integer >= 1") and "no job ran" in lines[0]
    assert not sweep.exists() and "Traceback" not in r.stdout + r.stderr
    cwd = tmp_path / "cwd"  # Hydra's default sweep directory: its multirun/run/ was left empty
    cwd.mkdir()
    r = _cli(["-m", "experiment=split_nvfp4", "replay.buffer_len=16,0", *FAST], cwd)
    assert r.returncode == 2 and "no job ran" in r.stderr and not list(cwd.iterdir())


def test_a_failed_jobs_traceback_is_on_the_terminal_only_for_a_bug(tmp_path, capsys, caplog):
    """on_job_end: a setting error (errors.is_user_error) is one line on the terminal and its
    traceback goes to the job's log file and error.txt; a bug's traceback is on the terminal
    (the precsim logger) too."""
    import logging

    from hydra.core.utils import JobReturn, JobStatus
    from hydra.types import RunMode

    from precsim.errors import PrecsimError

    root = logging.getLogger()
    for num, exc in enumerate([PrecsimError("run.steps=0 is invalid; allowed: >= 1"),
                               ValueError("a bug\nwith two lines")]):
        out = tmp_path / str(num)
        out.mkdir()
        fh = logging.FileHandler(out / "precsim.log")
        root.addHandler(fh)
        try:
            raise exc
        except Exception as e:  # noqa: BLE001 - the job's exception, with its traceback
            ret = JobReturn(status=JobStatus.FAILED, _return_value=e)
        cfg = OmegaConf.create({"hydra": {"mode": RunMode.MULTIRUN, "job": {"num": num},
                                          "runtime": {"output_dir": str(out)}}})
        caplog.clear()
        try:
            callbacks.SweepCallback().on_job_end(cfg, ret)
        finally:
            root.removeHandler(fh)
            fh.close()
        assert ret.status == JobStatus.COMPLETED  # held back from Hydra: the sweep goes on
        err, log = (out / "error.txt").read_text(), (out / "precsim.log").read_text()
        assert err.startswith(f"{type(exc).__name__}: {str(exc).splitlines()[0]}\n")
        assert "Traceback" in err and "Traceback" in log and "raise exc" in log
        term = capsys.readouterr().err + caplog.text
        if num == 0:
            assert term == (f"precsim: job 0 failed: PrecsimError: run.steps=0 is invalid; "
                            f"allowed: >= 1 -> {out}\n")
        else:
            assert "Traceback" in term and "raise exc" in term and "ValueError: a bug" in term


def test_sweeps_started_together_get_their_own_dirs(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    # a job that fails at once keeps this cheap; the directory exists either way
    cmd = [sys.executable, "-m", "precsim", "-m", "experiment=split_nvfp4",
           *_TRACE_JOBS(tmp_path)[:2], "run.steps=100000", *FAST[1:]]
    procs = [subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for _ in range(2)]
    assert [p.wait(timeout=300) for p in procs] == [1, 1]
    dirs = sorted((tmp_path / "multirun" / "split_nvfp4").iterdir())
    assert len(dirs) == 2, dirs
    assert all((d / report.CSV_FILE).is_file() for d in dirs)


def test_submitit_local_one_job(tmp_path):
    sweep = tmp_path / "sweep"
    r = _cli(["-m", "experiment=split_nvfp4", "replay.buffer_len=8", *FAST,
              "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10",
              "metrics.plot=true", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert report.check_run_dir(_jobs(sweep)["0"]) is None
    assert (_jobs(sweep)["0"] / "error_vs_length.png").read_bytes()[:4] == b"\x89PNG"  # asked
    assert (sweep / report.CSV_FILE).is_file()


@pytest.mark.slow
def test_submitit_local_sweep_and_resume(tmp_path):
    sweep = tmp_path / "sweep"
    args = [*SWEEP, "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10",
            f"hydra.sweep.dir={sweep}"]
    r = _cli(args, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    jobs = _jobs(sweep)
    (jobs["1"] / "summary.json").unlink()
    keep = _results(jobs["0"])
    r = _cli(args, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    # hydra.yaml holds the submitit job id and the log gains submitit's lines: results only
    assert report.check_run_dir(jobs["1"]) is None and _results(jobs["0"]) == keep


def test_killed_sweep_resumes(tmp_path):
    """Kill a sequential sweep once its first job is done; the re-run does only the second.
    (~15 s on 2 cores; in CI: the SIGKILL is checked nowhere else.)"""
    sweep = tmp_path / "sweep"
    args = ["-m", "experiment=split_nvfp4", "replay.buffer_len=8,16", "run.steps=4096",
            "run.seqs=1", "model.heads=2", "metrics.vocab=64", "run.progress=false",
            f"hydra.sweep.dir={sweep}"]
    p = subprocess.Popen([sys.executable, "-m", "precsim", *args], cwd=tmp_path,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not list(sweep.glob("0_*/summary.json")):
            assert p.poll() is None and time.monotonic() < deadline, "job 0 never finished"
            time.sleep(0.2)
    finally:
        os.killpg(p.pid, signal.SIGKILL)  # the sweep and its children, started here
        p.wait()
    jobs = _jobs(sweep)
    assert "1" not in jobs or report.check_run_dir(jobs["1"]) is not None
    keep = _snapshot(jobs["0"])
    r = _cli(args, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr.count(" reused (") == 1
    jobs = _jobs(sweep)
    assert report.check_run_dir(jobs["1"]) is None and _snapshot(jobs["0"]) == keep


# -- configs and the callback, in process ---------------------------------------------------
def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_module
    from hydra.core.utils import setup_globals

    from precsim.cli import register_configs

    register_configs()
    setup_globals()
    with initialize_config_module(config_module="precsim.conf", version_base="1.3"):
        return compose(config_name="config", overrides=overrides, return_hydra_config=True)


def test_launcher_presets_compose():
    slurm = _compose(["hydra/launcher=slurm_gpu"]).hydra.launcher
    assert slurm._target_.endswith("SlurmLauncher") and slurm.gpus_per_node == 1
    assert slurm.tasks_per_node == 1 and slurm.nodes == 1
    jl = _compose(["hydra/launcher=joblib_gpus"]).hydra.launcher
    assert jl._target_.endswith("JoblibLauncher") and jl.n_jobs >= 1


def test_precision_sweep_preset():
    cfg = _compose(["experiment=precision_sweep"])
    assert cfg.name == "precision_sweep"
    assert set(cfg.schemes) == {"conventional_fp32", "candidate"}
    params = cfg.hydra.sweeper.params
    assert set(params) == {"schemes.candidate.fmt", "schemes.candidate.rounding",
                           "schemes.candidate.read_fmt"}
    assert str(params["schemes.candidate.read_fmt"]).split(",")[0] == "nvfp4"


def test_run_and_sweep_dirs_share_one_unique_suffix():
    cfg = _compose(["experiment=split_nvfp4"])
    run_dir, sweep_dir = cfg.hydra.run.dir, cfg.hydra.sweep.dir
    assert run_dir.startswith("outputs/split_nvfp4/") and sweep_dir.startswith("multirun/")
    assert run_dir.rsplit("_", 1)[1] == sweep_dir.rsplit("_", 1)[1] != ""
    assert f"{os.getpid():x}" in run_dir.rsplit("_", 1)[1]


def test_gpu_locks_one_job_per_gpu(tmp_path):
    g0, f0 = callbacks.acquire_gpu(2, prefer=0, lock_dir=tmp_path)
    g1, f1 = callbacks.acquire_gpu(2, prefer=0, lock_dir=tmp_path)  # 0 is taken
    assert (g0, g1) == (0, 1)
    with pytest.raises(TimeoutError):
        callbacks.acquire_gpu(2, prefer=1, lock_dir=tmp_path, poll_s=0.01, timeout_s=0.05)
    f1.close()
    g2, f2 = callbacks.acquire_gpu(2, prefer=0, lock_dir=tmp_path, timeout_s=1)
    assert g2 == 1
    f0.close()
    f2.close()


def test_callback_spreads_joblib_jobs_over_gpus(tmp_path, monkeypatch):
    import torch
    from hydra.core.utils import JobReturn, JobStatus
    from hydra.types import RunMode

    chosen = []
    monkeypatch.setattr(callbacks, "gpu_count", lambda: 3)
    monkeypatch.setattr(callbacks, "_gpu_lock_dir", lambda: tmp_path / "locks")
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    from precsim.models.placement import HELD_GPU

    monkeypatch.delenv(HELD_GPU, raising=False)  # (restored after the test)

    def cfg(num, launcher="hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
            device="auto"):
        return OmegaConf.create({
            "hydra": {"mode": RunMode.MULTIRUN, "launcher": {"_target_": launcher},
                      "job": {"num": num}, "runtime": {"output_dir": str(tmp_path / str(num))}},
            "run": {"device": device}})

    cbs = [callbacks.SweepCallback() for _ in range(3)]
    for i, cb in enumerate(cbs):
        cb.on_job_start(cfg(i + 4))  # jobs 4, 5, 6 -> GPUs 1, 2, 0
    assert chosen == [1, 2, 0]
    cbs[0]._gpu_lock.close()
    cbs[0] = callbacks.SweepCallback()
    cbs[0].on_job_start(cfg(7))  # 7 % 3 = 1 is free again
    assert chosen[-1] == 1
    import os

    assert os.environ[HELD_GPU] == "1"  # model.device_map=auto in this job sees cuda:1 alone
    callbacks.SweepCallback().on_job_start(cfg(8, device="cpu"))
    callbacks.SweepCallback().on_job_start(cfg(9, launcher="...BasicLauncher"))
    assert len(chosen) == 4
    for cb in cbs:  # on_job_end releases the GPU
        cb.on_job_end(cfg(0), JobReturn(status=JobStatus.COMPLETED))
        assert cb._gpu_lock is None
    assert HELD_GPU not in os.environ


def test_sweep_terminal_shows_progress_and_one_recommendation(tmp_path):
    """Per-job tables go to each job's log; the terminal gets a line per job and, at the end,
    the sweep-level recommendation with the report command for this sweep. A rerun into the
    same directory with another budget (or budget metric) reuses every job (their directory
    names leave the budget out) and recommends under the new budget."""
    sweep = tmp_path / "sweep"
    args = ["-m", "experiment=split_nvfp4", "replay.buffer_len=8,16", "run.steps=64",
            "model.heads=1", "metrics.window=32", "metrics.vocab=32", "metrics.plot=false",
            "run.progress=false", "run.engine=torch", f"hydra.sweep.dir={sweep}"]
    r = _cli(args, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "B/step/hd" not in r.stdout and "budget: rel_err" not in r.stdout  # no job tables
    assert r.stderr.count("precsim: job ") == 2
    assert r.stdout.count("metric rel_err <= 0.0625") == 1
    # 64 steps: only FP32 fits the budget; the next cheaper (split, rel_err ~0.08) misses it
    assert "recommended: conventional(fp32)" in r.stdout
    assert "the next cheaper (split(fp32 update + nvfp4 read)" in r.stdout
    assert f"python -m precsim.report {sweep} --metric rel_err --budget 0.0625" in r.stdout
    for job in _jobs(sweep).values():
        log = (job / "precsim.log").read_text()
        assert "B/step/hd" in log and "budget: rel_err <= 0.0625" in log
    jobs = _jobs(sweep)
    before = {n: _results(p) for n, p in jobs.items()}  # (.hydra/ holds the new budget)
    picked = []
    for budget, metric in (("0.1", "rel_err"), ("0.001", "kl")):
        r = _cli([*args, f"metrics.budget={budget}", f"metrics.budget_metric={metric}"],
                 tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stderr.count(" reused (") == 2 and " done (" not in r.stderr
        assert _jobs(sweep) == jobs and {n: _results(p) for n, p in jobs.items()} == before
        with open(sweep / report.CSV_FILE) as f:
            rows = [row for row in csv.DictReader(f) if float(row[f"{metric}@final"]) <= float(
                budget)]
        best = min(rows, key=lambda row: float(row["bytes_per_step"]))
        picked.append(best["label"])
        assert f"metric {metric} <= {float(budget):g} at the longest run" in r.stdout
        assert f"recommended: {best['label']}  (job {best['job']}" in r.stdout, r.stdout
        assert f"--metric {metric} --budget {float(budget):g}" in r.stdout
        for job in jobs.values():
            assert f"budget: {metric} <= {float(budget):g}" in (job / "precsim.log").read_text()
    # 64 steps: rel_err 0.1 admits the split scheme (~0.08), KL 1e-3 only FP32 (split ~0.02)
    assert picked == ["split(fp32 update + nvfp4 read)", "conventional(fp32)"]


def test_covering_jobs_keep_every_override_and_group_combination():
    """The sweep's check before launching composes fewer jobs
    (hydra_patches.validate_sweeps_lightly) but still every distinct override and every
    combination of config-group choices."""
    import itertools

    from precsim.hydra_patches import covering_jobs

    grid = [list(j) for j in itertools.product(
        ["schemes.c.fmt=fp32", "schemes.c.fmt=fp16", "schemes.c.fmt=bf16", "schemes.c.fmt=x"],
        ["schemes.c.rounding=rne", "schemes.c.rounding=sr"],
        ["model=mamba2", "model=gdn"], ["run.seed=0", "run.seed=1", "run.seed=2"])]
    picked = covering_jobs(grid)
    assert len(picked) < len(grid) / 4
    assert {o for j in picked for o in j} == {o for j in grid for o in j}
    assert {j[2] for j in picked} == {"model=mamba2", "model=gdn"}
    assert all(j in grid for j in picked)
    assert covering_jobs([]) == []


def test_sweep_jobs_made_from_an_earlier_composition_equal_hydras_own():
    """hydra_patches.reuse_compositions makes a job that differs from an earlier one only in scalar
    values from a copy of that job's config: every job of a grid (values of several types, a
    group switch, an added key) equals Hydra's full composition of it, Hydra's fields included
    (the task overrides, the run directory's name), and a bad value still fails."""
    import itertools

    import pytest
    from hydra import initialize_config_module
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import ConfigCompositionException
    from hydra.types import RunMode
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from precsim import hydra_patches
    from precsim.compose import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    current = ConfigLoaderImpl.load_sweep_config  # patched already by an in-process sweep?
    full = getattr(current, "__wrapped__", current)  # Hydra's own
    grid = [list(j) for j in itertools.product(
        ["experiment=precision_sweep"],
        ["schemes.candidate.fmt=fp32", "schemes.candidate.fmt=fp8_e4m3"],
        ["replay.buffer_len=4", "replay.buffer_len=32"],
        ["model=mamba2", "model=gdn"], ["run.seed=0"], ["metrics.budget=0.05"],
        ["run.out_dir=null"], ["metrics.plot=true"])]
    for i, other in ((4, "run.seed=7"), (5, "metrics.budget=1e-3"), (6, "run.out_dir=x y"),
                     (7, "metrics.plot=false")):  # one value of each type changed
        grid.append([*grid[1][:i], other, *grid[1][i + 1:]])
    grid += [[*grid[0], "+extra.key=1"], [*grid[1], "+extra.key=2"]]
    # another override writing the same key or a parent of it, after the swept one: Hydra's
    # order decides (composed in full); jobs whose keys differ are not one shape
    grid += [[*grid[0], "++run.seed=5"], [*grid[1], "++run.seed=5"],
             [*grid[0], "schemes.candidate={fmt:bf16}"], [*grid[1], "schemes.candidate={fmt:bf16}"],
             ["experiment=precision_sweep", "run.seed=3"],
             ["experiment=precision_sweep", "metrics.budget=0.5"]]
    with initialize_config_module(config_module="precsim.conf", version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        master = loader.load_configuration("config", ["experiment=precision_sweep"],
                                           RunMode.MULTIRUN)
        ConfigLoaderImpl.load_sweep_config = full  # a fresh patch: nothing made before
        try:
            hydra_patches.reuse_compositions()
            assert ConfigLoaderImpl.load_sweep_config is not full
            made = [loader.load_sweep_config(master, job) for job in grid]
            with pytest.raises((ConfigCompositionException, OmegaConfBaseException)):
                loader.load_sweep_config(master, [*grid[0][:-1], "metrics.plot=maybe"])
        finally:
            ConfigLoaderImpl.load_sweep_config = current
        for job, cfg in zip(grid, made, strict=True):
            ref = full(loader, master, job)
            assert OmegaConf.to_yaml(cfg) == OmegaConf.to_yaml(ref), job
            assert OmegaConf.is_struct(cfg) and not OmegaConf.is_readonly(cfg.hydra)
    GlobalHydra.instance().clear()
    assert hydra_patches.override_shape(["replay.buffer_len=4", "model=gdn", "+a.b=1", "hydra.x=1",
                                "m.l=[1,2]"]) == [("=", "replay.buffer_len"), "model=gdn",
                                                  "+a.b=1", "hydra.x=1", "m.l=[1,2]"]
    assert hydra_patches.override_shape(["run.seed=1", "++run.seed=5"]) is None
    assert hydra_patches.override_shape(["a.b.c=1", "a.b={c:2}"]) is None


def test_bad_group_option_in_a_later_job_fails_before_any_job_runs(tmp_path):
    """The covering check composes the job whose group choice does not exist: one line, exit 2,
    and no job ran (nothing in the sweep folder)."""
    sweep = tmp_path / "sweep"
    r = _cli(["-m", "model=mamba2,nosuchmodel", *FAST, f"hydra.sweep.dir={sweep}"], tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip() == ("precsim: error: model='nosuchmodel' is unknown; allowed: gdn, "
                                "mamba2, nemotron3_super, qwen35_gdn")  # (not ChoiceSweep(...))
    assert not list(sweep.glob("*/summary.json"))
    r = _cli(["-m", "model=glob(zzz*)", *FAST, f"hydra.sweep.dir={sweep}"], tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == (  # (it was "model=Glob(...) is unknown")
        "precsim: error: model=glob(zzz*) matches no model option; allowed: gdn, mamba2, "
        "nemotron3_super, qwen35_gdn"), r.stderr[-2000:]
    assert not sweep.exists()


def test_a_sweep_over_a_group_runs_each_option(tmp_path):
    """-m model=mamba2,gdn was refused: "model=ChoiceSweep(...) is unknown"."""
    sweep = tmp_path / "sweep"
    r = _cli(["-m", "model=mamba2,gdn", *FAST, "run.steps=64", "metrics.window=32",
              f"hydra.sweep.dir={sweep}"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    jobs = [f.parent.name for f in sweep.glob("*/summary.json")]
    assert sorted(j.split("model=")[1].split(",")[0] for j in jobs) == ["gdn", "mamba2"]


def test_scheme_sweeps_take_runtime_kernel_codes(monkeypatch):
    """A sweep over schemes runs the Triton kernels with the schemes as runtime arguments (one
    compile for every job); a sweep over anything else keeps per-configuration kernels."""
    from types import SimpleNamespace

    from precsim.compose import sweeps_schemes

    hc = SimpleNamespace(sweeper={"params": {"schemes.candidate.fmt": "fp32,fp16"}})
    assert sweeps_schemes(hc)
    hc = SimpleNamespace(sweeper={"params": {"replay.buffer_len": "4,8"}})
    monkeypatch.setattr("sys.argv", ["precsim", "-m", "run.seed=0,1", "schemes=single"])
    assert not sweeps_schemes(hc)
    monkeypatch.setattr("sys.argv", ["precsim", "-m", "schemes=single,replay_pair"])
    assert sweeps_schemes(hc)
    monkeypatch.setattr("sys.argv", ["precsim", "-m", "schemes.a.rounding=rne,sr"])
    assert sweeps_schemes(SimpleNamespace(sweeper={}))


def test_sweep_blocks_name_every_block_size_the_jobs_need(monkeypatch):
    """A sweep over schemes with runtime codes compiles, in its first job, the kernels of every
    block size its jobs will use: the formats among the swept values and the job's own."""
    from types import SimpleNamespace

    from precsim.compose import sweep_blocks
    from precsim.config import to_config

    c = to_config({"schemes": {"a": {"kind": "split", "fmt": "fp16", "read_fmt": "nvfp4"}}})
    hc = SimpleNamespace(sweeper={"params": {"schemes.a.read_fmt": "nvfp4,mxfp4,fp8_e4m3"}})
    monkeypatch.setattr("sys.argv", ["precsim", "-m", "schemes.a.fmt=fp16,int8_b128"])
    assert sweep_blocks(hc, c) == {16, 32, 128}
    monkeypatch.setattr("sys.argv", ["precsim", "-m"])
    c = to_config({"schemes": {"a": {"kind": "conventional", "fmt": "bf16"}}})
    assert sweep_blocks(SimpleNamespace(sweeper={}), c) == set()


def test_runtime_codes_for_a_sweep_over_schemes_only(tmp_path, capsys, monkeypatch):
    """A sweep over schemes hands each job's engine the sweep's block sizes (the Triton engine's
    runtime kernel codes, passed as an argument: no module state); the next command in the same
    process (a notebook, tests), a single run, hands none: per-configuration kernels."""
    from conftest import run_main

    from precsim import engines

    seen, real = [], engines.run

    def spy(cfg, progress=True, ckpt=None, sweep_blocks=None):
        seen.append(sweep_blocks)
        return real(cfg, progress=progress, ckpt=ckpt, sweep_blocks=sweep_blocks)

    monkeypatch.setattr(engines, "run", spy)
    rc, _, err = run_main(["-m", "experiment=split_nvfp4", "schemes.split_fp32_nvfp4.rounding="
                           "rne,sr", *FAST, f"hydra.sweep.dir={tmp_path / 's'}"], capsys)
    assert rc == 0, err
    assert seen == [frozenset({16})] * 2
    seen.clear()
    rc, _, err = run_main(["experiment=split_nvfp4", *FAST, f"run.out_dir={tmp_path / 'r'}"],
                          capsys)
    assert rc == 0, err
    assert seen == [None]
