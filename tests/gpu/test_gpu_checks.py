"""GPU correctness checks (issue 43: moved from experiments/bench/), run as tests on a CUDA machine:

    pytest -m gpu tests/gpu                 # one GPU: the first three; two or more: all

Each test runs one script of this folder at its GPU size (its command line stays, for a run that
keeps its report: ``python tests/gpu/gpu_check.py --out DIR`` and the others' docstrings).
Without CUDA (or with one GPU, for the multi-GPU tests) every test skips; the scripts' CPU paths
(``--smoke``, the Triton interpreter) are tested in tests/gpu/test_gpu_check_drafts.py,
test_gpu_multi_model.py and test_study_error_feedback.py. Records of earlier runs:
``tests/gpu/records/``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import load_script

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = pytest.mark.gpu
one_gpu = pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")
two_gpus = pytest.mark.skipif(GPUS < 2, reason="needs two or more CUDA GPUs")


@one_gpu
def test_triton_kernels_and_engine_against_formats_torch_and_oracle(tmp_path):
    """gpu_check.py: in-kernel quantisation bit-equal to precsim.formats, every scheme's windows
    against the torch engine, the float64 truth against the NumPy oracle (4,096 steps)."""
    g = load_script(HERE / "gpu_check.py", "gpu_check")
    rc = g.main(["--steps", "4096", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "gpu_check.json").read_text())
    bad = [r for r in rows if not r["ok"]]
    assert rc == 0 and rows and not bad, bad[:10]


@one_gpu
def test_speculative_decoding_triton_against_torch(tmp_path):
    """gpu_check_drafts.py's check section: drafts on the Triton engine against the torch engine
    (no fallback, the same flushes and dead steps, windows within the gates). Its ``study``
    section (study 6 as whole processes, timed) is the study's GPU run, not part of the test."""
    g = load_script(HERE / "gpu_check_drafts.py", "gpu_check_drafts")
    rc = g.main([str(tmp_path), "--only", "check"])
    data = json.loads((tmp_path / "gpu_check_drafts.json").read_text())
    assert rc == 0 and data["ok"], data["failures"]


@one_gpu
def test_error_feedback_kernels_against_torch(tmp_path):
    """gpu_check_ef.py --check-only: the error-feedback kernels' states and residuals against the
    torch engine on CUDA (the study at 131,072 steps is its other sections)."""
    g = load_script(HERE / "gpu_check_ef.py", "gpu_check_ef")
    assert g.main([str(tmp_path), "--check-only"]) == 0
    assert (tmp_path / "check_ef.csv").is_file()


@two_gpus
def test_a_joblib_sweep_runs_one_job_per_gpu(tmp_path):
    """The sweep half of the former gpu_multi_check.sh (the formats half is
    tests/formats/test_formats_cuda.py): ``hydra/launcher=joblib_gpus`` places the jobs of one
    sweep on different GPUs."""
    cmd = [sys.executable, "-m", "precsim", "-m", "experiment=split_nvfp4",
           "model=nemotron3_super", "run.steps=2048", "run.seqs=1", "run.engine=torch",
           "run.device=cuda", "run.progress=false", "replay.buffer_len=4,8,16,32",
           "hydra/launcher=joblib_gpus", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    logs = p.stdout + p.stderr + "".join(
        f.read_text() for f in (tmp_path / "sweep").glob("*/*.log"))
    devices = {line.split("runs on ", 1)[1].split()[0] for line in logs.splitlines()
               if "runs on cuda" in line}
    assert len(devices) >= 2, devices


@two_gpus
@pytest.mark.slow
def test_device_map_across_gpus_equals_one_gpu(tmp_path):
    """gpu_multi_model.py at a test size (a 4-layer Qwen3-Next-shape checkpoint, 2,048 tokens):
    the whole-model KL with ``model.device_map=balanced`` and ``auto`` equals the one-GPU run's
    (per-token KL within 1% relative, top-1 the same on 99% of tokens). The full-size run (the
    80B shape over every GPU) is the script's ``--stage large``."""
    g = load_script(HERE / "gpu_multi_model.py", "gpu_multi_model")
    args = ["--work", str(tmp_path), "--fit-layers", "4", "--large-layers", "1",
            "--tokens", "2048"]
    assert g.main(["--stage", "build", *args]) == 0
    assert g.main(["--stage", "fit", *args]) == 0
    res = json.loads((tmp_path / "gpu_multi_model.json").read_text())
    assert set(res["fit_compare"]) == {"balanced", "auto"}
    for per in res["fit_compare"].values():
        for scheme, v in per.items():
            assert v["bit_equal"] or (v["rel"] < 1e-2 and v["top1_same"] >= 0.99), (scheme, v)
