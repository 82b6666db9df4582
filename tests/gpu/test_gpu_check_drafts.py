"""tests/gpu/gpu_check_drafts.py on the CPU (``--smoke``: the Triton interpreter and the
numba engine at tiny sizes): the script the GPU run depends on runs through, gates what it should
and writes its three files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import load_script

pytest.importorskip("triton")
pytest.importorskip("numba")

ROOT = Path(__file__).resolve().parents[2]


def _script():
    return load_script(ROOT / "tests" / "gpu" / "gpu_check_drafts.py")


@pytest.mark.slow
def test_smoke_check_section(tmp_path):
    """The check section (Triton vs torch with and without drafts, a scheme dying mid-run)."""
    rc = _script().main([str(tmp_path), "--smoke", "--only", "check"])
    data = json.loads((tmp_path / "gpu_check_drafts.json").read_text())
    assert rc == 0 and data["ok"], data["failures"]
    assert [(r["family"], r["drafts"]) for r in data["check"]] == [
        ("mamba2", 4), ("mamba2", 0), ("gdn", 4), ("gdn", 0)]
    assert all(r["dead_at"] is not None for r in data["check"])
    assert "ALL CHECKS PASSED" in (tmp_path / "gpu_check_drafts.txt").read_text()


def test_a_failure_is_reported_not_raised(tmp_path, monkeypatch):
    """A check that fails (here: the Triton engine 'falls back') is a FAIL line and exit 1, and
    the files are still written."""
    mod = _script()

    def broken(rep, device, smoke):
        rep.fail("check mamba2 T=4: ran torch (speculative decoding)")

    monkeypatch.setattr(mod, "check", broken)
    rc = mod.main([str(tmp_path), "--smoke", "--only", "check"])
    data = json.loads((tmp_path / "gpu_check_drafts.json").read_text())
    assert rc == 1 and not data["ok"] and "ran torch" in data["failures"][0]
    assert "FAILED" in (tmp_path / "gpu_check_drafts.txt").read_text()
