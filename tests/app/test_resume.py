"""Interrupted work is never lost: checkpoints, resume, SIGINT/SIGTERM, preemption, file modes.

A signal at a known step comes from ``PRECSIM_SIGNAL_AT=SIGINT@STEP`` (precsim.checkpoint: the
process signals itself at the first window boundary at or after STEP); the reference is the
same config run uninterrupted, so "bit-identical" is checked byte for byte.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import EF_SCHEMES, SEED_TABLE, interrupted, run_main, tiny_cfg

from precsim import report
from precsim.checkpoint import (
    CHECKPOINT_FILE,
    Checkpoint,
    Interrupted,
    install_handlers,
    restore_handlers,
)
from precsim.config import to_config
from precsim.engines import engine_module

SMALL = ["experiment=split_nvfp4", "run.steps=1024", "model.heads=2", "run.seqs=2",
         "metrics.vocab=64", "metrics.window=128", "run.progress=false"]


def _cli(args, cwd, env=None, timeout=300):
    env = {**{k: v for k, v in os.environ.items() if k != "PRECSIM_SIGNAL_AT"},
           "MPLBACKEND": "Agg", **(env or {})}
    return subprocess.run([sys.executable, "-m", "precsim", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _bytes(d: Path) -> dict[str, bytes]:
    return {n: (d / n).read_bytes() for n in ("metrics.csv", "per_step.npz")}


def _same_rows(a, b) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(x[k] == y[k] or (x[k] != x[k] and y[k] != y[k]) for k in x)
        for x, y in zip(a, b, strict=True))


# -- every CPU engine, in process: an interrupted run resumes bit-identically ------------------
ENGINE_CASES = [("torch", "mamba2"), ("torch", "gdn"), ("numba", "mamba2"), ("numba", "gdn"),
                ("numpy", "mamba2"),  # the Triton engine saves where a batch of windows ends
                pytest.param("triton", "mamba2", marks=pytest.mark.gpu),
                pytest.param("triton", "gdn", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("engine,family", ENGINE_CASES)
def test_engine_resumes_bit_identically(engine, family, tmp_path, monkeypatch):
    import torch

    mod = engine_module(engine)
    if engine == "numba" and not mod.available():
        pytest.skip("numba is not installed")
    dev = "cuda" if engine == "triton" and torch.cuda.is_available() else "cpu"
    # SR streams (shared and conventional), a split read copy and error-feedback residuals are
    # saved and restored; schemes other tests run too (tests/engines/test_error_feedback.py's
    # EF schemes, the seed table's), so the numba engine compiles none of them only for this
    schemes = {"c32": SEED_TABLE["conventional_fp32"], "sh": SEED_TABLE["shared_nvfp4_sr"],
               "sp": EF_SCHEMES["sp_ef"], "ef": EF_SCHEMES["c_fp8sr_ef"]}
    cfg = to_config(tiny_cfg(family, steps=256, schemes=schemes, run__seqs=2, metrics__window=8,
                             run__engine=engine, replay__buffer_len=8, model__head_dim=16))
    ref = mod.run(cfg, dev, progress=False)
    assert ref.engine == engine  # no fallback
    e = interrupted(monkeypatch, "SIGINT@100", cfg, tmp_path,
                    lambda ck: mod.run(cfg, dev, progress=False, ckpt=ck))
    assert e.signum == signal.SIGINT and 100 <= e.pos < 256
    assert (tmp_path / CHECKPOINT_FILE).is_file()
    part = e.partial  # the whole windows before the stop, as the full run has them
    assert part.rows and max(r["step"] for r in part.rows) <= e.pos
    assert _same_rows(part.rows, ref.rows[:len(part.rows)])
    ck = Checkpoint(cfg, tmp_path)
    res = mod.run(cfg, dev, progress=False, ckpt=ck)
    assert res.info["resumed_s"] > 0
    assert _same_rows(res.rows, ref.rows)
    for name, v in ref.per_step_rel_err.items():
        np.testing.assert_array_equal(res.per_step_rel_err[name], v)


def test_checkpoint_interval(tmp_path, monkeypatch):
    """checkpoint_s > 0 saves while the run goes on (time-based); 0 never does."""
    cfg = to_config(tiny_cfg("mamba2", steps=256, run__checkpoint_s=1e-9,
                             replay__buffer_len=16))
    ck = Checkpoint(cfg, tmp_path)
    res = engine_module("torch").run(cfg, "cpu", progress=False, ckpt=ck)
    assert res.info["checkpoints"] == 256 // 16 - 1  # every flush but the last
    assert (tmp_path / CHECKPOINT_FILE).is_file()
    ck.done()
    assert not (tmp_path / CHECKPOINT_FILE).exists()
    cfg0 = to_config(tiny_cfg("mamba2", steps=256, run__checkpoint_s=0))
    res = engine_module("torch").run(cfg0, "cpu", progress=False, ckpt=Checkpoint(cfg0, tmp_path))
    assert "checkpoints" not in res.info and not (tmp_path / CHECKPOINT_FILE).exists()


# -- the command line ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted run of SMALL (torch engine), through the Python API (the same files:
    test_submitit_local_job_preempted_resumes compares a command's result with one too)."""
    from precsim import simulate
    from precsim.cli import compose_config, register_configs

    out = tmp_path_factory.mktemp("ref") / "run"
    register_configs()
    simulate(compose_config([*SMALL, "run.engine=torch"]), out, progress=False)
    return out


def _interrupted(tmp_path, sig="SIGINT", extra=()):
    out = tmp_path / "run"
    args = [*SMALL, "run.engine=torch", *extra, f"hydra.run.dir={out}"]
    r = _cli(args, tmp_path, env={"PRECSIM_SIGNAL_AT": f"{sig}@500"})
    return r, out, args


@pytest.mark.parametrize("sig,code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_interrupt_one_line_partial_then_resume(sig, code, tmp_path, reference, capsys):
    r, out, args = _interrupted(tmp_path, sig)
    assert r.returncode == code, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr + r.stdout, r.stderr
    assert lines[0].startswith(f"precsim: interrupted ({sig}) at step ")
    assert str(out / CHECKPOINT_FILE) in lines[0]
    resume_cmd = lines[0].split("resume: ", 1)[1]
    assert resume_cmd.startswith("python -m precsim ") and f"hydra.run.dir={out}" in resume_cmd
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is False and 500 <= summary["info"]["interrupted_at"] < 1024
    steps = {int(x.split(",")[1]) for x in (out / "metrics.csv").read_text().splitlines()[1:]}
    assert steps == {128, 256, 384, 512} & set(range(summary["info"]["interrupted_at"] + 1))
    assert not (out / "error_vs_length.png").exists()
    # reports and reuse skip it: incomplete, not broken, not reused
    job = report.collect(out)[0]
    assert job.status == "incomplete" and "interrupted at step" in job.error
    assert not (out / "summary.json.broken").exists()
    rc, _, err = run_main(args, capsys)  # the rerun in process (the signal was the process's)
    assert rc == 0, err
    said = [x for x in err if "resuming" in x]
    assert len(said) == 1 and "from its checkpoint at step" in said[0] and "saved" in said[0]
    assert _bytes(out) == _bytes(reference)
    assert not (out / CHECKPOINT_FILE).exists()
    assert json.loads((out / "summary.json").read_text())["complete"] is True
    assert report.check_run_dir(out) is None


def test_resume_false_starts_over_and_other_config_is_an_error(tmp_path, reference, capsys,
                                                               monkeypatch):
    """In process (``main(argv)``; the interrupted process is the test above's)."""
    out = tmp_path / "run"
    args = [*SMALL, "run.engine=torch", f"hydra.run.dir={out}"]
    monkeypatch.setenv("PRECSIM_SIGNAL_AT", "SIGINT@500")
    assert run_main(args, capsys)[0] == 130
    monkeypatch.delenv("PRECSIM_SIGNAL_AT")
    rc, _, err = run_main([*args, "run.seed=1"], capsys)
    assert rc == 2 and len(err) == 1, err
    assert "checkpoint of another config (run.seed=0 there, 1 now)" in err[0]
    assert "run.resume=false" in err[0] and (out / CHECKPOINT_FILE).is_file()
    rc, _, err = run_main([*args, "run.resume=false"], capsys)
    assert rc == 0, err
    assert not any("resuming" in x for x in err)
    assert "resumed_s" not in json.loads((out / "summary.json").read_text())["info"]
    assert _bytes(out) == _bytes(reference)


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600)])
def test_result_modes_follow_the_umask(umask, mode, tmp_path, capsys):
    out = tmp_path / "run"
    old = os.umask(umask)  # the command in process, under this umask
    try:
        rc, _, err = run_main([*SMALL, "run.steps=256", f"hydra.run.dir={out}"], capsys)
    finally:
        os.umask(old)
    assert rc == 0, err
    for name in ("metrics.csv", "summary.json", "per_step.npz", "error_vs_length.png"):
        assert stat.S_IMODE((out / name).stat().st_mode) == mode, name
    log = (out / "precsim.log").read_text()  # the table and the verdict, as on the terminal
    assert "err(final)" in log and "recommended:" in log


def _wait_for(p: subprocess.Popen, moment: str, timeout: float = 120.0) -> None:
    """Until process ``p`` reaches ``moment`` of its start-up, read from ``/proc``: "handlers",
    it catches SIGTERM (its ``SigCgt`` mask: precsim's ``install_handlers``, the first thing
    ``cli.main`` does; Python itself catches only SIGINT); "warm-up", its second thread runs
    (``process.warm_up``'s, started just before Hydra is imported and composes)."""
    status = Path(f"/proc/{p.pid}/status")
    if not status.exists():
        pytest.skip("no /proc: the process's state cannot be read here")
    bit = 1 << (signal.SIGTERM - 1)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert p.poll() is None, p.communicate()
        fields = dict(ln.split(":", 1) for ln in status.read_text().splitlines() if ":" in ln)
        if (int(fields["SigCgt"], 16) & bit if moment == "handlers" else
                int(fields["Threads"]) >= 2):
            return
        time.sleep(0.002)
    raise AssertionError(f"precsim never reached {moment!r}")


@pytest.mark.parametrize("moment", ["handlers", "warm-up"])
def test_interrupt_outside_the_engine_has_no_traceback(tmp_path, moment):
    """SIGINT / SIGTERM while the command starts up (before any engine): one line. Sent at a
    moment read from the process's state, not after a fixed sleep (1.5 s was before the
    handlers on a busy machine: 2 runs in 3 failed)."""
    for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        env = {k: v for k, v in os.environ.items() if k != "PRECSIM_SIGNAL_AT"}
        p = subprocess.Popen([sys.executable, "-m", "precsim", *SMALL,
                              f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait_for(p, moment)
        p.send_signal(sig)
        out, err = p.communicate(timeout=120)
        assert p.returncode == code, err[-3000:]
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert err.startswith(f"precsim: interrupted ({sig.name})")
        assert not (tmp_path / "run").exists()  # nothing of the run is left


def test_sweep_interrupted_one_line_per_unfinished_job(tmp_path, reference):
    sweep = tmp_path / "sweep"
    args = ["-m", *SMALL, "run.engine=torch", "replay.buffer_len=16,32", f"hydra.sweep.dir={sweep}"]
    r = _cli(args, tmp_path, env={"PRECSIM_SIGNAL_AT": "SIGINT@500"})
    assert r.returncode == 130, r.stderr[-3000:]
    assert "Traceback" not in r.stderr + r.stdout
    lines = [x for x in r.stderr.splitlines() if x.startswith("precsim:")]
    assert lines[0].startswith("precsim: interrupted (SIGINT): job 0 at step ")
    assert lines[1].startswith("precsim: job 1 not started (") and "buffer_len=32" in lines[1]
    assert lines[2] == "precsim: resume the sweep: python -m precsim " + " ".join(args)
    assert len(lines) == 3
    r2 = _cli(args, tmp_path)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert r2.stderr.count("resuming") == 1
    job0 = next(sweep.glob("0_*"))
    assert _bytes(job0) == _bytes(reference)  # replay.buffer_len=16 is SMALL's default
    assert all(j.status == "complete" for j in report.collect(sweep))


def test_submitit_local_job_preempted_resumes(tmp_path):
    """A submitit_local job signalled as a cluster preempts (SIGUSR2) stops at a window
    boundary with a checkpoint, is requeued by submitit and resumes from it."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from precsim import simulate
    from precsim.cli import compose_config, register_configs

    register_configs()
    over = [*SMALL, "run.engine=torch", "run.steps=4096"]
    simulate(compose_config(over), tmp_path / "ref", progress=False)
    sweep = tmp_path / "sweep"
    args = ["-m", *over, "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10",
            "run.checkpoint_s=0.2", f"hydra.sweep.dir={sweep}"]
    env = {k: v for k, v in os.environ.items() if k != "PRECSIM_SIGNAL_AT"}
    p = subprocess.Popen([sys.executable, "-m", "precsim", *args], cwd=tmp_path, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not list(sweep.glob(f"0_*/{CHECKPOINT_FILE}")):
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()[1][-3000:]
            time.sleep(0.05)
        task = _submitit_task(p.pid)
        os.kill(task, signal.SIGUSR2)  # what SLURM sends before a preemption or time-out
        out, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 0, err[-3000:]
    job0 = next(sweep.glob("0_*"))
    logs = "".join(f.read_text() for f in sweep.rglob("*.err")) + (job0 / "precsim.log").read_text()
    assert "Requeued job" in logs and "resuming" in logs and "from its checkpoint" in logs
    assert _bytes(job0) == _bytes(tmp_path / "ref")
    assert not (job0 / CHECKPOINT_FILE).exists()


def _submitit_task(session: int) -> int:
    """The pid of the submitit_local task (the job's Python process) in ``session``."""
    for pid in (int(d) for d in os.listdir("/proc") if d.isdigit()):
        try:
            if os.getsid(pid) != session:
                continue
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"SUBMITIT_LOCAL_GLOBALID=0" in environ:
            return pid
    raise AssertionError("no submitit task found")


def test_watchdog_ends_a_process_whose_interrupt_was_lost(capsys):
    """An interrupt swallowed inside an import lock's callback left the process waiting for
    ever (seen under load); the watchdog armed with the signal ends it: 128 + signum and one
    line, or no second line when the command already said why it stops."""
    from precsim import checkpoint as ck

    got = []
    ck.watchdog(signal.SIGINT, after=0.05, end=got.append).join(5)
    assert got == [130]
    assert capsys.readouterr().err.startswith("precsim: SIGINT: stopped (the process had not ")
    ck.mark_said()
    try:
        ck.watchdog(signal.SIGTERM, after=0.05, end=got.append).join(5)
    finally:
        ck.mark_said(False)
    assert got == [130, 143] and capsys.readouterr().err == ""


def test_an_interrupt_lost_in_a_finaliser_is_delivered_again(capfd):
    """An interrupt raised where Python cannot propagate it (here a finaliser; under load, an
    import lock's callback) was printed as "Exception ignored" and lost; the handlers now send
    the signal again from outside that callback, and it stops the command as any other."""

    class Finaliser:
        def __del__(self):
            raise Interrupted(signal.SIGINT)

    old = install_handlers()
    try:
        with pytest.raises(Interrupted) as e:
            Finaliser()  # collected at once: its interrupt is unraisable
            time.sleep(5)
        assert e.value.signum == signal.SIGINT
    finally:
        restore_handlers(old)
    assert "Exception ignored" not in capfd.readouterr().err
    assert sys.unraisablehook is sys.__unraisablehook__ or "_unraisable" not in repr(
        sys.unraisablehook)


def test_interrupt_while_hydra_is_half_imported_is_one_line(monkeypatch):
    """An interrupt that lands while ``import hydra`` runs reaches the command line's handler
    with hydra unusable: its lines (the version check behind :func:`jobs_left` included) import
    nothing of hydra. ``sys.modules["hydra"] = None`` makes any import of it fail, as the
    half-imported module did (a flaky "partially initialized module 'hydra'" traceback, run 20
    of a test loop)."""
    from importlib import metadata

    from precsim import hydra_patches
    from precsim.compose import interrupt_lines

    monkeypatch.setitem(sys.modules, "hydra", None)
    with pytest.raises(ImportError):
        import hydra  # noqa: F401 - the state the handler meets
    assert hydra_patches.hydra_version() == metadata.version("hydra-core")
    e = Interrupted(signal.SIGINT)
    lines = interrupt_lines(e, list(SMALL), hydra_patches.jobs_left(e))
    assert lines == ["precsim: interrupted (SIGINT) before a run started; nothing to resume"]
