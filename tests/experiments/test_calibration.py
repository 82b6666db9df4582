"""The budget calibration study (experiments/studies/calibration/, issue 40 item 5):
every headline number
NOTES.md quotes re-derives from the committed raw results (results.csv, items.csv), computed here
independently of the driver; docs/metrics.md quotes the same numbers; the driver's ``--table``
rebuilds results.csv from the committed run directories byte for byte; and the two measurements
saw the same sequences (no item changes its answer without the answer position's top-1
flipping in the whole-model run)."""

from __future__ import annotations

import csv
import math
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CAL = ROOT / "experiments" / "studies" / "calibration"
METRICS = ("kl_window", "kl_all", "kl_answer", "flip_all", "flip_answer")


def _rows(name: str) -> list[dict]:
    with (CAL / name).open() as f:
        return list(csv.DictReader(f))


def _num(v: str) -> float:
    return float(v)


def headline() -> dict[str, str]:
    """NOTES.md's headline table: ``| `key` | value |`` rows between the headline markers."""
    text = (CAL / "NOTES.md").read_text()
    m = re.search(r"<!-- headline -->(.*?)<!-- /headline -->", text, re.S)
    assert m, "NOTES.md has no <!-- headline --> ... <!-- /headline --> table"
    out = {}
    for k, v in re.findall(r"^\|\s*`([a-z0-9_.]+)`\s*\|\s*([^|]+?)\s*\|", m.group(1), re.M):
        out[k] = v
    assert out, "the headline table is empty"
    return out


def derive() -> dict[str, float | None]:
    """Every headline figure from results.csv and items.csv (not through calibrate.py)."""
    from scipy.stats import spearmanr

    rows = [r for r in _rows("results.csv") if r["role"] != "baseline"]
    d = {}
    sig = [r for r in rows if _num(r["p_mcnemar"]) < 0.05]
    ns = [r for r in rows if _num(r["p_mcnemar"]) >= 0.05]
    d["rows"] = len(rows)
    d["significant"] = len(sig)
    d["significant_drops"] = sum(1 for r in sig if _num(r["delta"]) < 0)
    d["min_mdd"] = min(_num(r["mdd"]) for r in rows)
    d["max_mdd"] = max(_num(r["mdd"]) for r in rows)
    absd = [abs(_num(r["delta"])) for r in rows]
    for m in METRICS:
        d[f"min_{m}_significant"] = min((_num(r[m]) for r in sig), default=None)
        d[f"max_{m}_not_significant"] = max((_num(r[m]) for r in ns), default=None)
        d[f"spearman_{m}_abs_delta"] = spearmanr([_num(r[m]) for r in rows], absd).statistic
    d["spearman_gen_identical_abs_delta"] = spearmanr(
        [_num(r["gen_identical"]) for r in rows], absd).statistic
    for b in ("0.001", "0.01", "0.1"):
        within = [r for r in rows if _num(r["kl_window"]) <= float(b)]
        d[f"within_{b}.rows"] = len(within)
        d[f"within_{b}.max_abs_delta"] = max((abs(_num(r["delta"])) for r in within),
                                             default=None)
        d[f"within_{b}.significant"] = sum(1 for r in within if _num(r["p_mcnemar"]) < 0.05)
    its = [i for i in _rows("items.csv") if i["scheme"] != "fp32"]
    for b in ("0.001", "0.01", "0.1"):
        keys = {(r["model"], r["scheme"], r["length"]) for r in rows
                if _num(r["kl_window"]) <= float(b)}
        mine = [i for i in its if (i["model"], i["scheme"], i["length"]) in keys]
        d[f"within_{b}.items"] = len(mine)
        d[f"within_{b}.items_changed"] = sum(1 for i in mine
                                             if _num(i["correct"]) != _num(i["base_correct"]))
    d["items"] = len(its)
    changed = [i for i in its if _num(i["correct"]) != _num(i["base_correct"])]
    d["item_changed"] = len(changed)
    d["item_flip_answer"] = sum(1 for i in its if _num(i["flip_answer"]) > 0)
    d["item_changed_without_flip"] = sum(1 for i in changed if _num(i["flip_answer"]) == 0)
    return d


def half_unit(s: str) -> float:
    """Half a unit of the last digit ``s`` is printed with (0 for an integer)."""
    m = re.fullmatch(r"[+-]?(\d+)(?:\.(\d+))?(?:e([+-]?\d+))?", s)
    assert m, f"{s!r} is not a plain number"
    dec = len(m.group(2) or "")
    exp = int(m.group(3) or 0)
    if not dec and not m.group(3):
        return 0.0
    return 0.5 * 10.0 ** (exp - dec)


needs_results = pytest.mark.skipif(not (CAL / "results.csv").is_file(),
                                   reason="studies/calibration/results.csv not committed")


@needs_results
def test_notes_headline_rederives_from_results():
    got, want = headline(), derive()
    unknown = set(got) - set(want)
    assert not unknown, f"NOTES.md quotes figures this test cannot derive: {sorted(unknown)}"
    for k, s in got.items():
        v = want[k]
        if s in ("none", "n/a"):
            assert v is None or (isinstance(v, float) and math.isnan(v)), (k, s, v)
            continue
        assert v is not None, (k, s)
        assert abs(float(s) - v) <= half_unit(s) + 1e-12, f"NOTES.md {k} = {s}, results: {v}"


@needs_results
def test_docs_quote_the_notes():
    """docs/metrics.md's calibration section quotes NOTES.md's headline values."""
    docs = (ROOT / "docs" / "metrics.md").read_text()
    m = re.search(r"## What a budget means in accuracy\n(.*?)(?=\n## |\Z)", docs, re.S)
    assert m, "docs/metrics.md has no section 'What a budget means in accuracy'"
    sec, head = m.group(1), headline()
    quoted = re.findall(r"<!-- q:([a-z0-9_.]+) -->([^<\s]+)", sec)
    assert len(quoted) >= 3, "the section marks its quoted numbers (<!-- q:KEY -->VALUE)"
    for k, v in quoted:
        assert k in head, f"docs quote {k}, which NOTES.md's headline lacks"
        assert v.rstrip(".,;:)") == head[k], f"docs/metrics.md {k} = {v}, NOTES.md {head[k]}"
    assert "experiments/studies/calibration/calibrate.py --table" in sec


@needs_results
def test_same_sequences():
    """(a) and (b) saw the same items: on round-to-nearest schemes (no random bits, so the two
    processes compute the same state) an item whose correctness changed has a flipped answer
    position in the whole-model run; the FP32 baseline's own rows flip nothing; the answer
    position is the one generation writes first."""
    its = _rows("items.csv")
    base = [i for i in its if i["scheme"] == "fp32"]
    assert base and all(_num(i["flip_answer"]) == 0 and _num(i["kl_window"]) == 0 for i in base)
    res = {(r["model"], r["scheme"], r["length"]): r for r in _rows("results.csv")}
    rtn = {r["scheme"] for r in res.values() if r["scheme"].startswith("conv_")
           and not r["scheme"].endswith("_sr")}
    assert rtn
    bad = [i for i in its if i["scheme"] in rtn and _num(i["correct"]) != _num(i["base_correct"])
           and _num(i["flip_answer"]) == 0]
    assert not bad, bad[:3]
    # the answer position is the last prompt token: its top-1 flips exactly when generation's
    # first written token differs from the baseline's (one run, the same rounding draws)
    assert all(_num(i["diverge_first"]) == _num(i["flip_answer"]) for i in its)
    for (m, s, L), r in res.items():  # the per-item rows add up to the per-scheme rows
        mine = [i for i in its if (i["model"], i["scheme"], i["length"]) == (m, s, L)]
        assert len(mine) == int(r["items"])
        lost = sum(1 for i in mine if _num(i["base_correct"]) > _num(i["correct"]))
        assert lost == pytest.approx(_num(r["lost"])), (m, s, L)


@needs_results
def test_table_command_rebuilds_results(tmp_path):
    """`calibrate.py --table` on a copy of the committed run directories writes the same
    results.csv and items.csv."""
    out = tmp_path / "cal"
    shutil.copytree(CAL / "runs", out / "runs")
    sys.path.insert(0, str(CAL))
    try:
        import calibrate
    finally:
        sys.path.remove(str(CAL))
    assert calibrate.main(["--table", str(out)]) == 0
    for f in ("results.csv", "items.csv"):
        assert (out / f).read_text() == (CAL / f).read_text(), f
    assert (out / "calibration.png").stat().st_size > 10_000
