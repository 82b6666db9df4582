"""The studies driver (experiments/run_studies.py): one small study re-run on the CPU, its tidy
CSV's columns and shape, the PNG, the NOTES results block, and the archive round trip."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from conftest import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rs():
    # (registered in sys.modules: dataclasses look their module up there)
    return load_script(ROOT / "experiments" / "run_studies.py", "run_studies")


@pytest.fixture(scope="module")
def buffer_study(rs, tmp_path_factory):
    """study_buffer_len (5 jobs, L = 4 ... 64) at a tiny size: 1 head of 16 x 32, 512 steps."""
    tmp = tmp_path_factory.mktemp("studies")
    st = rs.BY_NAME["study_buffer_len"]
    info = rs.run_study(st, tmp / "work", tmp / "dest", "cpu", smoke=True,
                        extra=("run.steps=512", "model.heads=1", "model.head_dim=16",
                               "model.state_dim=32"))
    return rs, st, info, tmp / "dest" / st.name


def test_every_study_has_its_preset(rs):
    for st in rs.STUDIES:
        assert (ROOT / "conf" / "experiment" / f"{st.name}.yaml").is_file(), st.name
    assert [st.number for st in rs.STUDIES] == list(range(1, 9))


@pytest.mark.parametrize(("args", "want"), [
    # a KeyError traceback, a FileNotFoundError / ReadError traceback, a ValueError traceback
    (["--only", "study_buffer_len,nosuch"], "--only='study_buffer_len,nosuch': no study "
                                            "'nosuch'; allowed: study_seed_table_131k, "),
    (["--unpack", "missing.tar.gz"], "--unpack='missing.tar.gz' is not a studies.tar.gz "
                                     "archive; allowed: the archive that --out wrote"),
    (["--jobs", "-1"], "--jobs=-1 is invalid; allowed: an integer >= 1"),
    (["--bogus"], "unrecognized arguments: --bogus"),  # (after argparse's usage block)
])
def test_bad_arguments_are_one_line(rs, args, want, capsys):
    with pytest.raises(SystemExit) as e:
        rs.main(args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"experiments/run_studies.py: error: {want}"), err


def test_small_study_csv_columns_and_shape(buffer_study):
    rs, st, info, out = buffer_study
    assert info["returncode"] == 0, (out / "run.log").read_text()[-2000:]
    with open(out / rs.CSV_NAME, newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == rs.TIDY_COLS
        rows = list(reader)
    # 5 jobs x 4 schemes x 2 window ends (256, 512)
    assert len(rows) == 5 * 4 * 2
    assert sorted({int(r["buffer_len"]) for r in rows}) == [4, 8, 16, 32, 64]
    assert {r["scheme"] for r in rows} == {"conventional_fp32", "shared_nvfp4_sr",
                                           "split_fp32_nvfp4", "split_fp16sr_nvfp4"}
    assert {int(r["step"]) for r in rows} == {256, 512}
    assert {(r["model"], r["heads"], r["head_dim"], r["state_dim"]) for r in rows} == {
        ("nemotron3_super", "1", "16", "32")}
    for r in rows:
        assert r["study"] == "study_buffer_len"
        assert float(r["rel_err"]) >= 0 and float(r["bytes_per_step"]) > 0
    # the cost model: a shared checkpoint's bytes per step grow with L (buffer reads)
    shared = sorted((int(r["buffer_len"]), float(r["bytes_per_step"])) for r in rows
                    if r["scheme"] == "shared_nvfp4_sr" and r["step"] == "512")
    assert [b for _, b in shared] == sorted(b for _, b in shared)
    # conventional FP32 does not depend on L: one value in every job
    fp32 = {r["rel_err"] for r in rows if r["scheme"] == "conventional_fp32" and
            r["step"] == "512"}
    assert len(fp32) == 1


def test_small_study_png_info_notes(buffer_study):
    rs, st, info, out = buffer_study
    png = out / "buffer_len.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    stored = json.loads((out / rs.INFO_NAME).read_text())
    assert stored["smoke"] is True and stored["wall_s"] > 0
    assert "experiment=study_buffer_len" in stored["command"]
    assert len(stored["jobs"]) == 5
    notes = (out / "NOTES.md").read_text()
    assert rs.BEGIN in notes and rs.END in notes and rs.FINDING_MARK in notes
    assert "SMOKE RUN" in notes and "| shared(nvfp4/sr) | 64 |" in notes
    # a refresh replaces the results block and keeps what a person wrote outside it
    (out / "NOTES.md").write_text(notes.replace("_Not written yet: two", "Written: two", 1))
    rs.write_notes(st, out)
    again = (out / "NOTES.md").read_text()
    assert "Written: two" in again and again.count(rs.BEGIN) == 1


def test_archive_round_trip(buffer_study, tmp_path):
    rs, st, info, out = buffer_study
    archive = rs.pack(out.parent, tmp_path / "arch")
    got = rs.unpack(archive, tmp_path / "exp")
    assert got == [st.name]
    assert (tmp_path / "exp" / st.name / rs.CSV_NAME).read_bytes() == \
        (out / rs.CSV_NAME).read_bytes()
    # a second unpack keeps a NOTES.md a person has written in and refreshes its results block
    notes = tmp_path / "exp" / st.name / "NOTES.md"
    notes.write_text(notes.read_text().replace("_Not written yet: two", "Written: two", 1))
    rs.unpack(archive, tmp_path / "exp")
    assert "Written: two" in notes.read_text() and rs.BEGIN in notes.read_text()


def test_thinning_keeps_ends_and_lengths(rs):
    steps = list(range(256, 131072 + 1, 256))
    keep = rs.thin_steps(steps)
    assert {256, 1024, 4096, 32768, 131072} <= keep
    assert 30 <= len(keep) <= 60
    assert rs.thin_steps(steps[:2]) == {256, 512}
