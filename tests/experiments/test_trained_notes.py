"""The trained-model studies' notes re-derive from their committed raw results (issue 42,
acceptance 3). Each ``NOTES.md`` of
``experiments/studies/study_trained_{kl,engines,verdict}`` ends with a
``claims`` block, one line a number the notes state:

    ratio RUN A/B = 4.54      mean KL of scheme A over mean KL of scheme B in run RUN
    mean RUN A = 0.00227      mean KL of scheme A (documents x SR seeds)
    wins RUN A<B = 31/48      documents whose seed-averaged KL of A is below B's (of 48)
    bpb KEY = 1.472           bits/byte of gpu_run/bpb.json's KEY
    ratio RUN A/B upto=L = 4.03   the same ratio over the windows ending at or before token L
    spearman MODEL = 0.71     Spearman's rho over MODEL's SSM layers (``both``: both models'
                              layers) of the per-layer ratio shared_Li/split_Li in
                              layers2k_MODEL_float32 against the layer's median head half-life
                              (gpu_run/half_lives.json, ``MODEL|x1``)
    halflife KEY = 21.5       the median over every head of half_lives.json's KEY

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
CLAIM = re.compile(r"^(ratio|mean|wins|bpb|spearman|halflife) (\S+)(?: (\S+))?"
                   r"(?: upto=(\d+))? = (\S+)$")


def claims(notes: str) -> list[tuple[str, str, str | None, str]]:
    m = re.search(r"<!-- claims\n(.*?)-->", notes, re.S)
    assert m, "NOTES.md has no claims block"
    out = []
    for line in m.group(1).strip().splitlines():
        c = CLAIM.match(line.strip())
        assert c, f"unreadable claim line: {line!r}"
        out.append(c.groups())
    return out


def doc_means(path: Path, upto: int | None = None) -> dict[tuple[str, str], dict[int, list[float]]]:
    """(run, scheme) -> {document: [each SR seed's mean KL over the document's windows]} (only
    the windows ending at or before token ``upto``, when given)."""
    acc = defaultdict(lambda: [0.0, 0])
    with gzip.open(path, "rt") as f:
        for r in csv.DictReader(f):
            if upto is not None and int(r["window_end"]) > upto:
                continue
            a = acc[(r["run"], r["scheme"], int(r["seed"]), int(r["doc"]))]
            a[0] += float(r["kl"])
            a[1] += 1
    out: dict = defaultdict(lambda: defaultdict(list))
    for (run, scheme, _seed, doc), (tot, n) in sorted(acc.items()):
        out[(run, scheme)][doc].append(tot / n)
    return out


def median(v: list[float]) -> float:
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def ranks(v: list[float]) -> list[float]:
    """Ranks 0..n-1 (ties: their mean rank)."""
    order = sorted(range(len(v)), key=v.__getitem__)
    r = [0.0] * len(v)
    i = 0
    while i < len(v):
        j = i
        while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2
        i = j + 1
    return r


def spearman(x: list[float], y: list[float]) -> float:
    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    den = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return num / den


def layer_points(dm, hl: dict, model: str) -> tuple[list[float], list[float]]:
    """Each SSM layer's median head half-life and its shared_Li/split_Li ratio."""
    run = f"layers2k_{model}_float32"
    layers = sorted(int(s.split("_L")[1]) for (r, s) in dm if r == run
                    and s.startswith("shared_L"))
    assert layers, f"no per-layer rows for {model}"
    x = [median(hl[f"{model}|x1"]["per_layer"][str(i)]) for i in layers]
    y = [mean(dm[(run, f"shared_L{i}")]) / mean(dm[(run, f"split_L{i}")]) for i in layers]
    return x, y


def mean(d: dict[int, list[float]]) -> float:
    vals = [v for vs in d.values() for v in vs]
    return sum(vals) / len(vals)


def digits(text: str) -> int:
    """Significant digits printed in ``text``."""
    s = text.replace(",", "").lstrip("+-").split("e")[0].replace(".", "").lstrip("0")
    return max(1, len(s))


def close(got: float, claimed: str) -> bool:
    want = float(claimed.replace(",", ""))
    return float(f"{got:.{digits(claimed)}g}") == float(f"{want:.{digits(claimed)}g}")


@pytest.mark.parametrize("study", STUDIES)
def test_notes_numbers_rederive_from_the_raw_results(study):
    d = EXP / "studies" / study
    raw = d / "results_raw.csv.gz"
    if not raw.exists():
        pytest.skip(f"{raw} not committed yet (experiments/trained/rerun.py on a GPU, then "
                    "analyse_rerun.py raw)")
    notes = (d / "NOTES.md").read_text()
    body = notes.split("<!-- claims")[0]
    dm = doc_means(raw)
    gpu = EXP / "studies" / "study_trained_kl" / "gpu_run"
    bpb = json.loads((gpu / "bpb.json").read_text()) if (gpu / "bpb.json").exists() else {}
    hl_file = gpu / "half_lives.json"
    hl = json.loads(hl_file.read_text()) if hl_file.exists() else {}
    cl = claims(notes)
    assert len(cl) >= 3
    upto_dm: dict = {}
    for kind, run, what, upto, value in cl:
        if kind == "ratio":
            a, b = what.split("/")
            d = dm
            if upto:
                if upto not in upto_dm:
                    upto_dm[upto] = doc_means(raw, int(upto))
                d = upto_dm[upto]
            got = mean(d[(run, a)]) / mean(d[(run, b)])
        elif kind == "mean":
            got = mean(dm[(run, what)])
        elif kind == "wins":
            a, b = what.split("<")
            A, Bm = dm[(run, a)], dm[(run, b)]
            got = sum(sum(A[k]) / len(A[k]) < sum(Bm[k]) / len(Bm[k]) for k in A)
        elif kind == "spearman":
            x, y = [], []
            for m in (("mamba2", "gdn") if run == "both" else (run,)):
                xm, ym = layer_points(dm, hl, m)
                x += xm
                y += ym
            got = spearman(x, y)
        elif kind == "halflife":
            got = median([v for vs in hl[run]["per_layer"].values() for v in vs])
        else:
            got = bpb[run]["bits_per_byte"]
        num = value.split("/")[0] if kind == "wins" else value
        assert close(got, num), (f"{study}: {kind} {run} {what or ''} {upto or ''}: notes "
                                 f"{value}, raw {got:.6g}")
        assert value in body, f"{study}: the claimed {value} does not appear in the notes"


def test_raw_reads_every_tarball_and_skips_a_damaged_one(tmp_path):
    """``analyse_rerun.read_tarball``: a whole tarball gives its runs; an empty one (a call that
    timed out before writing) and a truncated one give a reason, and keep only the runs read
    whole before the damage."""
    import io
    import sys
    import tarfile

    import numpy as np

    sys.path.insert(0, str(EXP / "trained"))
    from analyse_rerun import read_tarball

    def npz(n):  # random values: the file stays ~n x 8 bytes after compression
        b = io.BytesIO()
        kl = np.random.default_rng(n).random((2, n)).astype(np.float32)
        np.savez_compressed(b, **{"kl|x": kl, "top1|x": kl, "window|tokens": np.array(64)})
        return b.getvalue()

    good = tmp_path / "good.tar.gz"
    with tarfile.open(good, "w:gz") as tar:
        for name, n in (("a_m_float32", 1), ("b_m_float32", 50_000)):
            data = npz(n)
            info = tarfile.TarInfo(f"{name}/windows.npz")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    runs, err = read_tarball(good)
    assert err is None and sorted(runs) == ["a_m_float32", "b_m_float32"]
    empty = tmp_path / "empty.tar.gz"
    empty.write_bytes(b"")
    runs, err = read_tarball(empty)
    assert runs == {} and err
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    runs, err = read_tarball(cut)
    assert err and sorted(runs) == ["a_m_float32"]
