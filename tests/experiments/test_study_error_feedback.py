"""Study 10 (error feedback): its driver's rows, table, CSV and plot on a tiny run, and the GPU
script's non-CUDA parts (tests/gpu/gpu_check_ef.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import load_script, run_main

ROOT = Path(__file__).resolve().parents[2]


def _load(path: Path, name: str):
    return load_script(path, name)


def test_study_rows_table_csv_and_plot(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # Hydra's own run directory (outputs/) here, not in the checkout
    st = _load(ROOT / "experiments/studies/study_error_feedback/run.py", "study_ef_run")
    cmd = st.command("nemotron3_super", {"heads": 1, "steps": 64, "seqs": 1}, tmp_path / "r",
                     "cpu")
    assert cmd[1:4] == ["-m", "precsim", "experiment=study_error_feedback"]
    rc, out, err = run_main([*cmd[3:], "model.head_dim=8", "metrics.window=32",
                             "metrics.vocab=32", "run.engine=torch"], capsys)
    assert rc == 0, err
    rows = st.rows_of("nemotron3_super", tmp_path / "r")
    assert len(rows) == 16 and {r["model"] for r in rows} == {"nemotron3_super"}
    by = {r["scheme"]: r for r in rows}
    # the bytes: INT8 block 128 on an 8 x 128 head = 8 * 128 * 8.25 / 8 = 1,056 B; its FP16
    # residual 2,048 B, read and written every step
    assert by["int8_rtn"]["bytes_per_step"] == 2 * 1056
    assert by["int8_ef_fp16"]["bytes_per_step"] == 2 * 1056 + 2 * 2048
    assert by["int8_ef_fp16"]["resid_bytes_per_step"] == 2 * 2048
    assert by["int8_ef_int8"]["error_feedback"] == "int8_b128"
    assert by["conventional_fp32"]["rel_err"] < 1e-5 < by["int8_rtn"]["rel_err"]
    st.write_csv(rows, tmp_path / "results.csv")
    back = st.read_csv(tmp_path / "results.csv")
    assert [r["scheme"] for r in back] == list(by)
    assert back[3]["rel_err"] == pytest.approx(rows[3]["rel_err"], rel=1e-5)
    assert "INT8 + EF FP16" in st.table(rows)
    st.plot(back, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 10_000


def test_gpu_script_without_cuda_says_use_smoke(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine runs the real check")
    g = _load(ROOT / "tests/gpu/gpu_check_ef.py", "gpu_check_ef")
    assert g.main([str(tmp_path)]) == 2
    assert "--smoke" in capsys.readouterr().err


@pytest.mark.slow
def test_gpu_script_smoke(tmp_path, monkeypatch):
    """The whole script on the CPU: Triton's interpreter, tiny processes (~3 min)."""
    monkeypatch.chdir(tmp_path)  # its processes' Hydra run directories land here
    pytest.importorskip("triton")
    g = _load(ROOT / "tests/gpu/gpu_check_ef.py", "gpu_check_ef_smoke")
    assert g.main([str(tmp_path), "--smoke"]) == 0
    for f in ("check_ef.csv", "study_ef.csv", "engines_ef.csv"):
        assert (tmp_path / f).stat().st_size > 100, f
