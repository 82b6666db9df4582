"""Benchmarks (experiments/bench) and diagnosis scripts (experiments/diagnose) run through on the
CPU, as the docs show them; every benchmark writes its record through
experiments/bench/record.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_script

ROOT = Path(__file__).resolve().parents[2]
record = load_script(ROOT / "experiments" / "bench" / "record.py", "bench_record")


def test_phase_timeline_times_a_run_and_a_sweep(tmp_path):
    """``experiments/diagnose/phase_timeline.py`` (docs/performance.md's time line of a
    process): a single run and a two-job sweep through the command line, exit 0, the stages
    in the JSON, each job's ``_run_app`` once, and the run's own files written."""
    script = ROOT / "experiments" / "diagnose" / "phase_timeline.py"
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    tiny = ["experiment=split_nvfp4", "run.steps=64", "model.heads=1", "model.groups=1",
            "metrics.window=32", "run.progress=false"]
    for name, args in (("run", [*tiny, f"run.out_dir={tmp_path / 'run'}"]),
                       ("sweep", ["-m", *tiny, "replay.buffer_len=8,16", "metrics.plot=false",
                                  f"hydra.sweep.dir={tmp_path / 'sweep'}"])):
        out = tmp_path / f"{name}.json"
        r = subprocess.run([sys.executable, str(script), "--json", str(out), "--", *args],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        data = json.loads(out.read_text())
        stages = [row["stage"] for row in data["rows"]]
        assert data["exit"] == 0 and data["total_s"] > 0
        assert stages.count("cli._run_app") == (1 if name == "run" else 2), stages
        assert "api.run" in stages and "[timeline] total" in r.stderr
    assert (tmp_path / "run" / "summary.json").is_file()
    assert "report.aggregate" in stages and (tmp_path / "sweep" / "sweep_summary.csv").is_file()


@pytest.mark.slow
def test_gpu_sweep_single_rows_smoke(tmp_path):
    """``experiments/bench/gpu_sweep.py --smoke --only single`` on the CPU: every process row
    runs through (its smoke sizes had a metrics window longer than the run: each process
    stopped at validation and the script still exited 0), the bad path exits 2."""
    r = subprocess.run([sys.executable, str(ROOT / "experiments" / "bench" / "gpu_sweep.py"),
                        "--smoke", "--only", "single", "--out", str(tmp_path)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    (rec,) = record.read(tmp_path / "gpu_sweep.jsonl")  # one run, one record
    data = rec["figures"]
    rows = {row["tag"]: row for row in data["rows"]}
    assert rows["bad_trace_path"]["rc"] == 2
    for tag in ("split_nvfp4_fresh", "split_nvfp4_fresh_one_launch", "engines_fresh"):
        assert rows[tag]["rc"] == 0 and rows[tag]["engine_wall_s"] > 0, rows[tag]


@pytest.mark.slow
def test_bench_tasks_tiny_cpu(tmp_path):
    """``experiments/bench/bench_tasks.py --cpu --tiny``: model_kl over the rows (two
    processes: --kl-seqs 8 of 16 rows), task_eval over the same rows in two processes and
    passkey run through, the JSON has the ratio; run again with ``--prior`` (the first run's
    record), every process counts as done and the figures are the first run's."""
    def bench(out, *extra):
        r = subprocess.run([sys.executable, str(ROOT / "experiments" / "bench" /
                                                "bench_tasks.py"),
                            "--cpu", "--tiny", "--task-procs", "2", "--out", str(tmp_path / out),
                            "--work", str(tmp_path / "work"), *extra], cwd=tmp_path,
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        (rec,) = record.read(tmp_path / out / "bench_tasks.jsonl")
        return rec, r.stdout

    rec, _ = bench("out")
    assert "bench_tasks.py" in rec["command"] and rec["machine"]["cpus"] > 0
    data = rec["figures"]
    assert [row["what"] for row in data["rows"]] == [
        "model_kl rows 0..7", "model_kl rows 8..15", "task_eval part 1/2", "task_eval part 2/2",
        "passkey"]
    assert [row["rc"] for row in data["rows"]] == [0] * 5
    info = data["info"]
    assert info["rows"] == 16 and info["kl_processes"] == 2 and info["task_over_kl"] > 0
    assert info["task_processes"] == 2 and info["passkey_model_s"] > 0
    again, printed = bench("again", "--prior", str(tmp_path / "out" / "bench_tasks.jsonl"))
    assert printed.count("(from ") == 5
    for k in ("task_over_kl", "kl_rows_per_s", "task_rows_per_s", "passkey_model_s"):
        assert again["figures"]["info"][k] == info[k], k


def test_every_bench_script_writes_through_record(tmp_path):
    """One record format (issue 43): no benchmark of experiments/bench writes a file of its own;
    the helper appends one JSON line of date, machine, command and figures per run."""
    bench = ROOT / "experiments" / "bench"
    for f in [*bench.glob("*.py"), *bench.glob("*.sh")]:
        if f.name == "record.py":
            continue
        text = f.read_text()
        # a file of its own in the output folder: out / "x.json").write_text(...), json.dump(...)
        assert not re.search(r'out\s*/\s*"[^"]+"\)\.write_text|json\.dump\(|open\([^)]*"[wa]"',
                             text), f.name
        assert "record" in text, f"{f.name} writes no record"
    path = record.write(tmp_path, "demo", {"x": 1.5}, cmd="python demo.py")
    record.write(tmp_path, "demo", {"x": 2.5}, cmd="python demo.py")
    recs = record.read(path)
    assert [r["figures"]["x"] for r in recs] == [1.5, 2.5]
    assert set(recs[0]) == set(record.KEYS) and recs[0]["machine"]["cpus"] > 0
    with record.transcript(tmp_path, "printed", {"n": 1}):
        print("a line")
    (rec,) = record.read(tmp_path / "printed.jsonl")
    assert rec["figures"] == {"args": {"n": 1}, "printed": ["a line"], "completed": True}


@pytest.mark.slow
def test_whole_model_profile_smoke_cpu(tmp_path):
    """``experiments/diagnose/gpu_whole_model_profile.py`` as its docstring's CPU smoke shows it:
    three in-process model_kl runs (the third under torch.profiler) of a built checkpoint; the
    JSON has the timed run's phases and the profiled wall, the ops table the forward's ops."""
    stem = "tiny_mamba2_2x256"
    r = subprocess.run([sys.executable, str(ROOT / "experiments" / "diagnose" /
                                            "gpu_whole_model_profile.py"),
                        "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"),
                        "--kind", "tiny_mamba2", "--device", "cpu", "--tokens", "256", "--seqs",
                        "2"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    info = json.loads((tmp_path / "out" / f"{stem}.json").read_text())
    assert len(info["walls_s"]) == 2 and info["profiled_wall_s"] > 0
    assert info["phases_s"]["forward_s"] > 0 and info["gpu"] == "cpu"
    assert "run.seqs=2" in info["argv"]
    assert "aten::" in (tmp_path / "out" / f"{stem}_ops.txt").read_text()
    load = (tmp_path / "out" / "tiny_mamba2_load.txt").read_text()
    assert load.startswith("load in a fresh process") and "load_model" in load


def test_import_cost_names_the_packages_that_register_torch_operators(tmp_path):
    """``experiments/diagnose/import_cost.py``: a fresh ``-X importtime`` process importing what
    a model run imports; its record sums per-package import times and counts torch custom
    operators by registering package. torch.library.custom_op called from a module of this
    test's own is counted under that module's file (the attribution is real, not a constant)."""
    from conftest import build

    build("Mamba2ForCausalLM", 0.2).save_pretrained(tmp_path / "m")
    script = ROOT / "experiments" / "diagnose" / "import_cost.py"
    # an extra registration, from a module outside site-packages (--also)
    (tmp_path / "extra_op.py").write_text(
        "import torch\n@torch.library.custom_op('precsim_test::twice', mutates_args=())\n"
        "def twice(x: torch.Tensor) -> torch.Tensor:\n    return 2 * x\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "m"), "--repeat", "1",
                        "--also", "extra_op", "--load", "cpu", "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "process 1:" in r.stdout and "torch custom operators registered" in r.stdout
    rec = record.read(tmp_path / "o" / "import_cost.jsonl")[-1]
    row = rec["figures"]["rows"][0]
    assert row["custom_ops"].get(f"{tmp_path.name}/extra_op.py") == 1, row["custom_ops"]
    assert row["packages_s"]["torch"] > 0 and row["total_s"] >= row["torch_s"]
    # --load: the model's load after the imports, its registrations apart (none here: the
    # extra operator registered at import)
    assert row["load_s"] > 0 and row["custom_ops_load"] == {}, row
    assert "then the load on cpu:" in r.stdout
    bad = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 1 and "holds no config.json; allowed" in bad.stderr


def test_gpu_layer_scan_runs_its_variants_on_the_cpu(tmp_path):
    """``experiments/diagnose/gpu_layer_scan.py`` at tiny sizes on the CPU (the torch scan; its
    launch knobs then change nothing): every requested row timed and written, exit 0."""
    script = ROOT / "experiments" / "diagnose" / "gpu_layer_scan.py"
    r = subprocess.run([sys.executable, str(script), "--docs", "1", "--tokens", "16",
                        "--chunks", "1", "--heads", "2", "--variants", "base,truth,segments",
                        "--docs-list", "2", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads((tmp_path / "gpu_layer_scan.json").read_text())["rows"]
    names = [row["variant"] for row in rows]
    assert names[0] == "all 5 groups (the scan as run)" and "reference alone" in names
    assert "2 docs: all 5 groups" in names and len(names) == 7 + 3 + 3 + 4
    assert all(row["us_per_token"] > 0 for row in rows)


def test_step_torch_calls_counts_precsims_calls_per_generated_token(tmp_path):
    """``experiments/diagnose/step_torch_calls.py``: two generation runs in one process; the
    calls per extra token and layer, precsim's apart from the model's own (both present: each
    step runs transformers' layers and precsim's scans)."""
    r = subprocess.run([sys.executable, str(ROOT / "experiments" / "diagnose" /
                                            "step_torch_calls.py"), "--tokens", "4"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(r"precsim ([\d.]+), other \(transformers, torch\) ([\d.]+)", r.stdout)
    assert m and float(m.group(1)) > 50 and float(m.group(2)) > 10, r.stdout
