"""The trained-model studies' notes re-derive from their committed raw results (issue 42,
acceptance 3). Each ``NOTES.md`` of ``experiments/study_trained_{kl,engines,verdict}`` ends with a
``claims`` block, one line a number the notes state:

    ratio RUN A/B = 4.54      mean KL of scheme A over mean KL of scheme B in run RUN
    mean RUN A = 0.00227      mean KL of scheme A (documents x SR seeds)
    wins RUN A<B = 31/48      documents whose seed-averaged KL of A is below B's (of 48)
    bpb KEY = 1.472           bits/byte of gpu_run/bpb.json's KEY

This test recomputes each from ``results_raw.csv.gz`` (one row per run, group, SR seed,
document and 256-token window) by its own arithmetic (not analyse_rerun.py's), checks it to the
claim's printed digits, and checks that the number appears in the notes' text."""

from __future__ import annotations

import csv
import gzip
import json
import re
from collections import defaultdict
from pathlib import Path

import pytest

EXP = Path(__file__).resolve().parents[2] / "experiments"
STUDIES = ("study_trained_kl", "study_trained_engines", "study_trained_verdict")
CLAIM = re.compile(r"^(ratio|mean|wins|bpb) (\S+)(?: (\S+))? = (\S+)$")


def claims(notes: str) -> list[tuple[str, str, str | None, str]]:
    m = re.search(r"<!-- claims\n(.*?)-->", notes, re.S)
    assert m, "NOTES.md has no claims block"
    out = []
    for line in m.group(1).strip().splitlines():
        c = CLAIM.match(line.strip())
        assert c, f"unreadable claim line: {line!r}"
        out.append(c.groups())
    return out


def doc_means(path: Path) -> dict[tuple[str, str], dict[int, list[float]]]:
    """(run, scheme) -> {document: [each SR seed's mean KL over the document's windows]}."""
    acc = defaultdict(lambda: [0.0, 0])
    with gzip.open(path, "rt") as f:
        for r in csv.DictReader(f):
            a = acc[(r["run"], r["scheme"], int(r["seed"]), int(r["doc"]))]
            a[0] += float(r["kl"])
            a[1] += 1
    out: dict = defaultdict(lambda: defaultdict(list))
    for (run, scheme, _seed, doc), (tot, n) in sorted(acc.items()):
        out[(run, scheme)][doc].append(tot / n)
    return out


def mean(d: dict[int, list[float]]) -> float:
    vals = [v for vs in d.values() for v in vs]
    return sum(vals) / len(vals)


def digits(text: str) -> int:
    """Significant digits printed in ``text``."""
    s = text.replace(",", "").lstrip("-").split("e")[0].replace(".", "").lstrip("0")
    return max(1, len(s))


def close(got: float, claimed: str) -> bool:
    want = float(claimed.replace(",", ""))
    return float(f"{got:.{digits(claimed)}g}") == float(f"{want:.{digits(claimed)}g}")


@pytest.mark.parametrize("study", STUDIES)
def test_notes_numbers_rederive_from_the_raw_results(study):
    d = EXP / study
    raw = d / "results_raw.csv.gz"
    if not raw.exists():
        pytest.skip(f"{raw} not committed yet (experiments/trained/rerun.py on a GPU, then "
                    "analyse_rerun.py raw)")
    notes = (d / "NOTES.md").read_text()
    body = notes.split("<!-- claims")[0]
    dm = doc_means(raw)
    bpb_file = EXP / "study_trained_kl" / "gpu_run" / "bpb.json"
    bpb = json.loads(bpb_file.read_text()) if bpb_file.exists() else {}
    cl = claims(notes)
    assert len(cl) >= 3
    for kind, run, what, value in cl:
        if kind == "ratio":
            a, b = what.split("/")
            got = mean(dm[(run, a)]) / mean(dm[(run, b)])
        elif kind == "mean":
            got = mean(dm[(run, what)])
        elif kind == "wins":
            a, b = what.split("<")
            A, Bm = dm[(run, a)], dm[(run, b)]
            got = sum(sum(A[k]) / len(A[k]) < sum(Bm[k]) / len(Bm[k]) for k in A)
        else:
            got = bpb[run]["bits_per_byte"]
        num = value.split("/")[0] if kind == "wins" else value
        assert close(got, num), f"{study}: {kind} {run} {what}: notes {value}, raw {got:.6g}"
        assert value in body, f"{study}: the claimed {value} does not appear in the notes"
