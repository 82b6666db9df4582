"""Study 9's CSV and tables from its committed results (no model run: 64 tokens take ~30 s)."""

from __future__ import annotations

from pathlib import Path

from conftest import load_script

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "experiments" / "studies" / "study_real_traces"


def _mod():
    return load_script(HERE / "run.py", "study_real_traces_run")


def test_committed_csv_columns_and_tables():
    m = _mod()
    rows = m.read_csv(HERE / "results.csv")
    assert tuple(rows[0]) == m.COLS
    assert {(r["family"], r["layer"]) for r in rows} == {("mamba2", 0), ("mamba2", 1),
                                                         ("gdn", 0), ("gdn", 2)}
    assert {r["study"] for r in rows} == set(m.STUDIES)
    assert m.full_windows(2056, 128) == 2048 and m.full_windows(72, 128) == 72
    assert "ratio shared/split" in m.table_kl(rows)
    assert "Cheapest scheme" in m.table_precision(rows)
