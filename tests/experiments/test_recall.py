"""experiments/recall/train_recall.py (issue 42): two CPU runs of the recipe at its tiny size
write bit-identical checkpoints; its training sequences are reproducible from the seed and
decidable only from the planted pairs / key; its evaluation items are precsim's built-in ones."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import load_script

pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "experiments" / "recall" / "train_recall.py"


def recipe():
    return load_script(SCRIPT, "recall_recipe")


R = recipe()


def test_two_cpu_runs_write_bit_identical_checkpoints(tmp_path):
    """Two runs with the same seed and steps, and a third paused after step 2 of each model
    (exit 75, ``NAME/resume.pt``) and continued by the same command twice: the same bytes."""
    outs = []
    cmd = [sys.executable, str(SCRIPT), "--cpu", "--tiny", "--steps", "4", "--seed", "3"]
    for run in ("a", "b"):
        out = tmp_path / run
        subprocess.run([*cmd, "--out", str(out)], check=True, cwd=REPO, capture_output=True)
        outs.append(out)
    c = tmp_path / "c"
    rcs = [subprocess.run([*cmd, "--out", str(c), "--pause-after", "2"], cwd=REPO,
                          capture_output=True, text=True) for _ in range(3)]
    assert [r.returncode for r in rcs] == [75, 75, 0], [r.stdout[-300:] for r in rcs]
    assert "paused at step 2/4" in rcs[0].stdout and "resuming" in rcs[1].stdout
    assert not list(c.glob("*/resume.pt"))
    outs.append(c)
    for name in ("mamba2", "gdn"):
        a, b, p = ((o / name / "model.safetensors").read_bytes() for o in outs)
        assert a == b == p, name
        assert (outs[0] / name / "config.json").read_bytes() == \
            (outs[1] / name / "config.json").read_bytes()
        log = json.loads((outs[0] / name / "train_log.json").read_text())
        assert log["train"]["steps"] == 4 and log["checkpoint_bytes"] <= R.MAX_BYTES
    acc = json.loads((outs[0] / "accuracy.json").read_text())["accuracy"]
    assert set(acc) == {"mamba2", "gdn"} and set(acc["mamba2"]) == {"mqar", "passkey"}


def test_batches_are_reproducible_from_the_seed():
    tr = R.TRAIN["tiny"]
    a = R.batch_at(3, 0, 5, 8, tr, ["mqar", "passkey"])
    b = R.batch_at(3, 0, 5, 8, tr, ["mqar", "passkey"])
    c = R.batch_at(4, 0, 5, 8, tr, ["mqar", "passkey"])
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[0], c[0])
    # the curriculum: step 0 only the first length; tokens per step fixed
    ids, _ = R.batch_at(3, 0, 0, 8, tr, ["mqar"])
    assert ids.shape == (tr["tokens"] // tr["lengths"][0], tr["lengths"][0])


def test_first_stage_holds_the_first_length_then_unlocks_the_rest():
    """``--first-stage F``: steps < F draw only the first length; the others unlock evenly over
    the remaining steps, the last stage reached before the end."""
    tr = dict(R.TRAIN["small"], first_stage=40)
    Ls, steps = tr["lengths"], 120
    seen = [R.batch_at(0, 1, s, steps, tr, ["mqar"])[0].shape[1] for s in range(steps)]
    assert set(seen[:40]) == {Ls[0]}
    assert set(seen[40:]) == set(Ls)
    # the last length unlocks at F + (n-2)/(n-1) of the rest: never before it
    last_at = 40 + (len(Ls) - 2) * (steps - 40) // (len(Ls) - 1)
    assert Ls[-1] not in seen[:last_at]
    # unset, the equal stages as before (step 0 .. steps/n: the first length only)
    plain = [R.batch_at(0, 1, s, steps, R.TRAIN["small"], ["mqar"])[0].shape[1]
             for s in range(steps // len(Ls))]
    assert set(plain) == {Ls[0]}


def test_lr_and_first_stage_are_recorded_and_bind_a_paused_run(tmp_path):
    """``--lr`` / ``--first-stage`` go to train_log.json; a paused run continued with another
    ``--lr`` is refused in one line naming the allowed continuation."""
    out = tmp_path / "o"
    cmd = [sys.executable, str(SCRIPT), "--cpu", "--tiny", "--steps", "4", "--seed", "3",
           "--models", "gdn", "--first-stage", "2", "--out", str(out)]
    r = subprocess.run([*cmd, "--lr", "1e-3", "--pause-after", "2"], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode == 75, r.stderr[-500:]
    r = subprocess.run([*cmd, "--lr", "2e-3"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode != 0 and "written by another command" in r.stderr + r.stdout
    assert "Traceback" not in r.stderr
    r = subprocess.run([*cmd, "--lr", "1e-3"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-500:]
    log = json.loads((out / "gdn" / "train_log.json").read_text())
    assert log["train"]["lr"] == 1e-3 and log["train"]["first_stage"] == 2
    assert log["gdn_train_kernel"].startswith("transformers")  # no flash-linear-attention here


@pytest.mark.parametrize("iid", [False, True])
def test_answers_are_decidable_only_from_the_planted_key(iid):
    alph = R.alphabets(128)
    mk, mq = int(alph["mark_key"][0]), int(alph["mark_query"][0])
    keys, vals = set(alph["keys"].tolist()), set(alph["values"].tolist())
    for s in range(20):
        rng = np.random.default_rng(s)
        ids, mask = R.sequence(rng, "mqar", 96, 4, alph, iid)
        assert len(ids) == 96 and mask.sum() == 4 and list(ids).count(mk) == 1
        k = list(ids).index(mk)
        pairs = ids[k + 1:k + 9]
        table = dict(zip(pairs[::2].tolist(), pairs[1::2].tolist(), strict=True))
        assert len(table) == 4 and set(table) <= keys and set(table.values()) <= vals
        for t in np.flatnonzero(mask):  # each answer: the value planted right after its key
            assert ids[t - 2] == mq and table[int(ids[t - 1])] == ids[t]
            # the key occurs in the context before the query only where it was planted
            before = list(ids[:t - 2])
            assert [i for i, v in enumerate(before) if v == ids[t - 1]][0] in range(k + 1, k + 9)
            assert ids[t] in pairs[1::2]
        filler = ids[~np.isin(np.arange(96), np.r_[k:k + 9, 96 - 12:96])]
        assert set(filler.tolist()) <= set(alph["filler"].tolist())  # no key or value leaks
        ids, mask = R.sequence(rng, "passkey", 64, 3, alph, iid)
        k = list(ids).index(mk)
        assert mask.sum() == 3 and ids[-4] == mq
        assert list(ids[-3:]) == list(ids[k + 1:k + 4]) == list(ids[mask])
        assert set(np.delete(ids, np.r_[k:k + 4, 60:64]).tolist()) <= set(alph["filler"].tolist())


def test_eval_items_are_task_evals_own():
    from precsim.config import TaskConfig
    from precsim.tasks import builtin_items

    t = TaskConfig(name="mqar", lengths=[64], items=3, key_len=4, depth=0.5, seed=9)
    ours = R.eval_items("mqar", [64], 3, 128, 9)
    assert [i.context for i in ours] == [i.context for i in builtin_items(t, 128)]
    it = ours[0]  # the answer is the value planted right after the queried key
    mk = int(R.alphabets(128)["mark_key"][0])
    k = it.context.index(mk)
    pairs = it.context[k + 1:k + 9]
    assert dict(zip(pairs[::2], pairs[1::2], strict=True))[it.context[-1]] == it.choices[0][0]


def test_study_commands_compose_to_the_schemes_it_names(tmp_path):
    """study.py's overrides give task_eval exactly its schemes (FP32 + the engines' formats)."""
    st = load_script(SCRIPT.parent / "study.py", "recall_study")
    from precsim.cli import compose_config, register_configs

    register_configs()

    ck = tmp_path / "m"
    ck.mkdir()
    (ck / "config.json").write_text(json.dumps({"state_size": 32}))
    sch = st.schemes(st.row_block(ck))
    args = st.argparse.Namespace(lengths=[64, 128], items=3, key_len=4, depth=0.5, seed=0,
                                 batch_tokens=4096, device="cpu", sr_seeds=1, buffer_len=16)
    cmd = st.command(ck, "mqar", args, tmp_path / "run", sch)
    cfg = compose_config(cmd[cmd.index("-m") + 2:])
    assert list(cfg.schemes) == ["fp32", *sch] and len(sch) == 16
    assert cfg.schemes["conv_int8row_sr"].fmt == "int8_b32"
    assert cfg.schemes["conv_int8row_sr"].rounding == "sr"
    assert cfg.schemes["split_fp32_nvfp4"].read_fmt == "nvfp4"
    assert cfg.task.name == "mqar" and cfg.task.lengths == [64, 128]


# -- gpu_full.py: the GPU runs' driver and post-processing -------------------------------------
def gpu_full():
    return load_script(REPO / "experiments" / "recall" / "gpu_full.py", "recall_gpu_full")


def _fake_run(runs: Path, G, fam: str, seed: int, accs: dict, items: int = 20) -> None:
    """A task_eval run folder as the study writes it: per scheme and length an accuracy, its
    change against fp32 and a McNemar p (0.001 where the drop is >= 0.1)."""
    name = f"{G.ckpt_name(fam, seed)}_float32_mqar_L4096"
    d = runs / name
    d.mkdir(parents=True)
    sch = {}
    for n, by in accs.items():
        role = "baseline" if n == "fp32" else "scheme"
        sch[n] = {"role": role, "by_length": {
            str(L): {"items": items, "acc": a, "acc_lo": max(0.0, a - 0.1),
                     "acc_hi": min(1.0, a + 0.1), "delta": a - accs["fp32"][L],
                     "delta_lo": a - accs["fp32"][L] - 0.05, "delta_hi": a - accs["fp32"][L],
                     "lost": round(max(0.0, accs["fp32"][L] - a) * items), "gained": 0,
                     "p_mcnemar": 0.001 if accs["fp32"][L] - a >= 0.1 else 1.0}
            for L, a in by.items()}}
    (d / "summary.json").write_text(json.dumps({"schemes": sch, "sr_seeds": 3}))
    (d / "study_meta.json").write_text(json.dumps({
        "model": G.ckpt_name(fam, seed), "family": fam, "train_seed": seed,
        "weights": "float32", "task": "mqar", "lengths": [1024, 4096]}))
    cols = [f"{n}:correct" for n in accs]
    lines = ["item,length," + ",".join(cols)]
    lines += [f"{i},{L},{','.join('1' for _ in cols)}" for L in (1024, 4096) for i in range(2)]
    (d / "items.csv").write_text("\n".join(lines) + "\n")


def test_gpu_full_report_notes_rederive_from_results_csv(tmp_path):
    """report(): results.csv, items.csv.gz, table.md, the plot and NOTES.md; NOTES.md's
    headline table is what results.csv gives (read back), and its break lengths are right:
    conv_nvfp4_sr drops 0.3 at 4,096 in every seed (breaks), conv_fp8 drops in one seed only
    (does not)."""
    G = gpu_full()
    runs = tmp_path / "study_x" / "runs"
    for s in (0, 1, 2):
        _fake_run(runs, G, "mamba2", s, {
            "fp32": {1024: 1.0, 4096: 0.95},
            "conv_nvfp4_sr": {1024: 0.95, 4096: 0.65},
            "conv_fp8": {1024: 1.0, 4096: 0.7 if s == 0 else 0.95}})
    G.report(tmp_path / "study_x")
    d = tmp_path / "study_x"
    for f in ("results.csv", "items.csv.gz", "table.md", "accuracy_vs_length.png", "NOTES.md"):
        assert (d / f).is_file(), f
    notes = (d / "NOTES.md").read_text()
    block = notes.split(G.HEAD_BEGIN)[1].split(G.HEAD_END)[0].strip().splitlines()
    assert block == G.headline(G.read_results(d / "results.csv"))
    row = {ln.split("|")[4].strip(): ln for ln in block[2:]}
    assert "| 4,096 |" in row["conv_nvfp4_sr"] and "0.65 [0.65, 0.65] (3 seeds)" in row[
        "conv_nvfp4_sr"]
    assert "| none |" in row["conv_fp8"] and "| none |" in row["fp32"]
    assert "float32" in notes and "SR seeds: [3]" in notes and "training seeds [0, 1, 2]" in notes


def test_one_training_seed_decides_alone(tmp_path):
    """With one training seed run, its own McNemar test decides the break (the rule's "2 seeds"
    cannot hold): conv_nvfp4_sr, 0.3 below FP32 at 4,096 (McNemar p 0.001), breaks there."""
    G = gpu_full()
    runs = tmp_path / "study_y" / "runs"
    _fake_run(runs, G, "mamba2", 0, {"fp32": {1024: 1.0, 4096: 0.95},
                                     "conv_nvfp4_sr": {1024: 0.95, 4096: 0.65}})
    G.report(tmp_path / "study_y")
    block = G.headline(G.read_results(tmp_path / "study_y" / "results.csv"))
    row = {ln.split("|")[4].strip(): ln for ln in block[2:]}
    assert "| 4,096 |" in row["conv_nvfp4_sr"] and "(1 seeds)" in row["conv_nvfp4_sr"]
    assert "| none |" in row["fp32"]


def test_committed_full_studies_notes_rederive():
    """Every committed GPU study (study_*/ with a headline block: study_full, study_long,
    study_lr1e3fs2k, ...): NOTES.md's headline table re-derives from its results.csv."""
    G = gpu_full()
    dirs = sorted(nf for nf in (REPO / "experiments" / "recall").glob("study_*/NOTES.md")
                  if G.HEAD_BEGIN in nf.read_text())
    assert {"study_full", "study_long", "study_lr1e3fs2k"} <= {nf.parent.name for nf in dirs}
    for nf in dirs:
        block = nf.read_text().split(G.HEAD_BEGIN)[1].split(G.HEAD_END)[0].strip()
        assert block.splitlines() == G.headline(G.read_results(nf.parent / "results.csv")), nf


# the hand-written finding of study_full/NOTES.md: each figure it quotes, as the text says it,
# and where results.csv holds it (task, weights, model, length, scheme, column)
FINDING = [
    ("0.38 / 0.47 / 0.59", [("mqar", "float32", f"full_{m}", 4096, "conv_nvfp4_sr", "acc")
                            for m in ("mamba2_seed0", "mamba2_seed2", "gdn_seed1")]),
    ("0.92 / 0.98 / 0.98", [("mqar", "float32", f"full_{m}", 4096, "fp32", "acc")
                            for m in ("mamba2_seed0", "mamba2_seed2", "gdn_seed1")]),
    ("(0.44 vs 1.00", [("passkey", "float32", "full_gdn_seed1", 1024, s, "acc")
                       for s in ("conv_nvfp4_sr", "fp32")]),
    ("(0.86 vs 1.00", [("passkey", "float32", "full_gdn_seed1", 1024, s, "acc")
                       for s in ("conv_fp8_sr", "fp32")]),
    ("(0.66 vs 0.93", [("mqar", "float32", "full_gdn_seed1", 32768, s, "acc")
                       for s in ("conv_fp8_sr", "fp32")]),
    ("(0.55 /\n  0.64 / 0.70 vs 0.91 / 0.84 / 0.99", [
        ("passkey", "float32", f"full_{m}", 8192, s, "acc")
        for s in ("shared_nvfp4_sr", "fp32") for m in ("mamba2_seed0", "mamba2_seed2",
                                                         "gdn_seed1")]),
    ("0.75 vs\n  0.90", [("mqar", "float32", "full_mamba2_seed0", 8192, s, "acc")
                         for s in ("shared_nvfp4_sr", "fp32")]),
    ("(GDN: 0.76 vs 0.93", [("mqar", "float32", "full_gdn_seed1", 32768, s, "acc")
                            for s in ("shared_nvfp4_sr", "fp32")]),
    ("(BF16 0.95 / 0.96", [("mqar", "float32", f"full_{m}", 32768, "conv_bf16", "acc")
                           for m in ("mamba2_seed0", "mamba2_seed2")]),
    ("MQAR 0.04 /\n  0.50 at 32,768", [("mqar", "float32", f"full_{m}", 32768, "fp32", "acc")
                                       for m in ("mamba2_seed0", "mamba2_seed2")]),
]


def _m(*names):
    return [f"long_{n}" for n in names]


# study_long/NOTES.md's finding (the retrained models), as FINDING
FINDING_LONG = [
    ("0 / 1 / 2 at 0.77 / 0.85 / 0.83 against 1.00 / 1.00 / 1.00", [
        ("mqar", "float32", m, 4096, s, "acc") for s in ("conv_nvfp4_sr", "fp32")
        for m in _m("mamba2_seed0", "mamba2_seed1", "mamba2_seed2")]),
    ("GDN seed 1 at 0.34 against 1.00", [("mqar", "float32", "long_gdn_seed1", 4096, s, "acc")
                                         for s in ("conv_nvfp4_sr", "fp32")]),
    ("(0.66 / 0.45 / 0.79 against\n  0.91 / 0.76 / 0.82", [
        ("mqar", "float32", m, 16384, s, "acc") for s in ("shared_nvfp4_sr", "fp32")
        for m in _m("mamba2_seed0", "mamba2_seed1", "mamba2_seed2")]),
    ("(0.66 vs\n  0.84", [("mqar", "float32", "long_gdn_seed1", 32768, s, "acc")
                          for s in ("shared_nvfp4_sr", "fp32")]),
    ("(0.73 vs 0.84", [("mqar", "float32", "long_gdn_seed1", 32768, s, "acc")
                        for s in ("conv_fp8_sr", "fp32")]),
    ("(conventional NVFP4-SR 0.18 and shared NVFP4-SR 0.76 at 4,096 against 1.00", [
        ("passkey", "float32", "long_mamba2_seed0", 4096, s, "acc")
        for s in ("conv_nvfp4_sr", "shared_nvfp4_sr", "fp32")]),
    ("FP8-SR 0.71 vs 0.96 at 8,192; split 0.99", [
        ("passkey", "float32", "long_mamba2_seed0", L, s, "acc")
        for L, s in ((8192, "conv_fp8_sr"), (8192, "fp32"), (4096, "split_fp32_nvfp4"))]),
    ("0.75 and split FP16-SR / NVFP4 0.78 against 0.93 at 1,024", [
        ("passkey", "float32", "long_gdn_seed0", 1024, s, "acc")
        for s in ("split_fp32_nvfp4", "split_fp16sr_nvfp4", "fp32")]),
    ("FP8-SR 0.43, shared NVFP4-SR 0.28, conventional NVFP4-SR 0.01", [
        ("passkey", "float32", "long_gdn_seed0", 1024, s, "acc")
        for s in ("conv_fp8_sr", "shared_nvfp4_sr", "conv_nvfp4_sr")]),
]



def _g(seed):
    return f"lr1e3fs2k_gdn_seed{seed}"


# study_lr1e3fs2k/NOTES.md's finding (the six learned models), as FINDING
FINDING_LR = [
    ("MQAR 0.16 / 0.57 (GDN seeds\n  0 / 2) and 0.80 / 0.81 (Mamba-2 seeds 0 / 2) against 1.00", [
        ("mqar", "float32", m, 4096, "conv_nvfp4_sr", "acc")
        for m in (_g(0), _g(2), *_m("mamba2_seed0", "mamba2_seed2"))]
     + [("mqar", "float32", _g(0), 4096, "fp32", "acc")]),
    ("and 0.18 / 0.26 / 0.45 (Mamba-2)", [
        ("passkey", "float32", m, 4096, "conv_nvfp4_sr", "acc")
        for m in _m("mamba2_seed0", "mamba2_seed1", "mamba2_seed2")]),
    ("(0.76 / 0.72 / 0.80", [("passkey", "float32", _g(s), 1024, "conv_nvfp4_sr", "acc")
                              for s in (0, 1, 2)]),
    ("(0.81 / 0.76 against 1.00 in seeds", [
        ("passkey", "float32", _g(s), 1024, sch, "acc")
        for s, sch in ((0, "conv_fp8_sr"), (1, "conv_fp8_sr"), (0, "fp32"))]),
    ("(0.75 / 0.82 against 1.00; 0.37 / 0.35 at", [
        ("mqar", "float32", _g(s), L, sch, "acc")
        for s, L, sch in ((0, 16384, "conv_fp8_sr"), (2, 16384, "conv_fp8_sr"),
                          (0, 16384, "fp32"), (0, 32768, "conv_fp8_sr"),
                          (2, 32768, "conv_fp8_sr"))]),
    ("(0.74 / 0.56 / 0.88 against 0.96 / 0.72 / 0.96", [
        ("passkey", "float32", m, 8192, sch, "acc") for sch in ("conv_fp8_sr", "fp32")
        for m in _m("mamba2_seed0", "mamba2_seed1", "mamba2_seed2")]),
    ("(0.82 / 0.99 against 0.98 /\n  1.00", [
        ("mqar", "float32", _g(s), 32768, sch, "acc") for sch in ("shared_nvfp4_sr", "fp32")
        for s in (0, 2)]),
    ("(0.65 / 0.01 / 0.91 against 0.96 / 0.00\n  / 1.00; 0.24 vs 0.84", [
        ("passkey", "float32", _g(s), 16384, sch, "acc") for sch in ("shared_nvfp4_sr", "fp32")
        for s in (0, 1, 2)]
     + [("passkey", "float32", _g(2), 32768, sch, "acc") for sch in ("shared_nvfp4_sr", "fp32")]),
    ("Mamba-2 seed 0 passkey at\n  16,384, 0.28 vs 0.33", [
        ("passkey", "float32", "long_mamba2_seed0", 16384, sch, "acc")
        for sch in ("split_fp16sr_nvfp4", "fp32")]),
    ("at 32,768 0.54 / 0.85\n  vs 0.55 / 0.84 in seeds 0 / 2", [
        ("passkey", "float32", _g(s), 32768, sch, "acc") for sch in ("split_fp32_nvfp4", "fp32")
        for s in (0, 2)]),
]


@pytest.mark.parametrize("name, finding", [("study_full", FINDING),
                                           ("study_long", FINDING_LONG),
                                           ("study_lr1e3fs2k", FINDING_LR)])
def test_committed_full_study_finding_rederives(name, finding):
    """The figures a study's hand-written finding (NOTES.md) quotes are results.csv's, rounded
    as written; and split's MQAR changes are within 2 items (|change| <= 0.02, p >= 0.5)."""
    import csv

    d = REPO / "experiments" / "recall" / name
    if not (d / "results.csv").is_file():
        pytest.skip(f"no GPU {name} committed yet")
    notes = (d / "NOTES.md").read_text()
    with (d / "results.csv").open() as f:
        rows = {(r["task"], r["weights"], r["model"], int(r["length"]), r["scheme"]): r
                for r in csv.DictReader(f)}
    for text, keys in finding:
        text = text.replace("\\n", "\n")
        got = [f"{float(rows[k[:5]][k[5]]):.2f}" for k in keys]
        assert text in notes, text
        nums = re.findall(r"(?<![\d,.])\d+\.\d+", text)  # 0.75, not 1,024 or 2,000-step
        assert nums == got, (text, got)
    split = [r for k, r in rows.items() if k[0] == "mqar" and k[4].startswith("split_")]
    assert split and max(abs(float(r["delta"])) for r in split) <= 0.02
    assert min(float(r["p_mcnemar"]) for r in split) >= 0.5


def test_unpack_merge_keeps_the_items_of_runs_unpacked_before(tmp_path):
    """report() after a second unpack: items.csv.gz keeps the earlier runs' rows (their
    items.csv were deleted by the first report) beside the new run's."""
    import gzip

    G = gpu_full()
    d = tmp_path / "study_m"
    _fake_run(d / "runs", G, "mamba2", 0, {"fp32": {1024: 1.0, 4096: 0.95}})
    G.report(d)
    with gzip.open(d / "items.csv.gz", "rt") as f:
        first = f.read().splitlines()
    _fake_run(d / "runs", G, "mamba2", 2, {"fp32": {1024: 1.0, 4096: 0.95}})
    G.report(d)
    with gzip.open(d / "items.csv.gz", "rt") as f:
        both = f.read().splitlines()
    assert len(first) > 1 and len(both) == 2 * len(first) - 1
    assert set(first) <= set(both)


def test_gpu_full_study_jobs(tmp_path):
    """The study's jobs: MQAR with float32 weights first, every SR scheme under the SR seeds,
    bf16 weights as model.dtype, error feedback among the schemes, >= 4 rows a pass."""
    G = gpu_full()
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "config.json").write_text(json.dumps({"state_size": 64}))
    a = type("A", (), dict(tiny=False, items=100, sr_seeds=3, batch_tokens=1 << 21, chunk=4096,
                           device="cuda", work=tmp_path / "w", tag="full", schemes=None,
                           tasks=["mqar", "passkey"], weights=["float32", "bfloat16"],
                           one_job=False))()
    jobs = G.study_jobs(a, {("mamba2", 0): ck, ("gdn", 0): ck})
    assert jobs[0]["meta"]["task"] == "mqar" and jobs[0]["meta"]["weights"] == "float32"
    assert {j["meta"]["weights"] for j in jobs} == {"float32", "bfloat16"}
    assert {j["meta"]["task"] for j in jobs} == {"mqar", "passkey"}
    c = " ".join(jobs[-1]["cmd"])
    assert "model.dtype=bfloat16" in c and "run.sr_seeds=3" in c and "error_feedback" in c
    G_ = jobs[0]["meta"]["groups"]
    assert G_ == 3 + 9 * 3 + 9  # reference, fp32, noise; 9 SR schemes x 3 seeds; 9 others
    for j in jobs:
        bt = int(next(x for x in j["cmd"] if x.startswith("task.batch_tokens=")).split("=")[1])
        assert bt // (G_ * max(j["meta"]["lengths"])) >= 4


def test_gpu_full_subset_tag_and_steps(tmp_path):
    """A second recipe's checkpoint set (``--tag``), a study over a subset of schemes, tasks and
    weights, and ``--steps`` per model."""
    G = gpu_full()
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "config.json").write_text(json.dumps({"state_size": 64}))
    a = type("A", (), dict(tiny=False, items=100, sr_seeds=3, batch_tokens=1 << 21, chunk=4096,
                           device="cuda", work=tmp_path / "w", tag="long",
                           schemes={"conv_nvfp4_sr", "split_fp32_nvfp4"}, tasks=["mqar"],
                           weights=["float32"], one_job=False))()
    jobs = G.study_jobs(a, {("gdn", 1): ck})
    assert [j["name"] for j in jobs] == [f"long_gdn_seed1_float32_mqar_L{L}"
                                         for L in (8192, 16384, 32768)]
    assert jobs[0]["meta"]["groups"] == 3 + 3 + 1  # reference, fp32, noise; 1 SR x 3; split
    c = " ".join(jobs[0]["cmd"])
    assert "conv_nvfp4_sr" in c and "split_fp32_nvfp4" in c and "shared_nvfp4_sr" not in c
    assert G.parse_steps("mamba2=2400,gdn=2000", "full") == {"mamba2": 2400, "gdn": 2000}
    assert G.parse_steps("7", "full") == {"mamba2": 7, "gdn": 7}
    assert G.parse_steps(None, "full") == G.STEPS["full"]
    with pytest.raises(SystemExit, match="allowed: mamba2, gdn"):
        G.parse_steps("mamba3=5", "full")
    assert G.CKPT_RE.match("long_gdn_seed2")["model"] == "gdn"
    # each model's own recipe set: --tag mamba2=long,gdn=lr1e3
    tags = G.parse_tag("mamba2=long,gdn=lr1e3")
    assert tags == {"mamba2": "long", "gdn": "lr1e3"} and G.parse_tag("long") == "long"
    a.tag, a.schemes = tags, {"conv_nvfp4_sr"}
    names = {j["name"].split("_float32")[0] for j in
             G.study_jobs(a, {("gdn", 1): ck, ("mamba2", 0): ck})}
    assert names == {"lr1e3_gdn_seed1", "long_mamba2_seed0"}
    for bad in ("gdn=lr1e3", "mamba2=long,gdn=x_y", "mamba3=a,gdn=b"):
        with pytest.raises(SystemExit, match="allowed|letters and digits"):
            G.parse_tag(bad)
    ck2 = tmp_path / "ck2"
    (ck2 / "long_mamba2_seed2").mkdir(parents=True)
    for f in ("config.json", "model.safetensors"):
        (ck2 / "long_mamba2_seed2" / f).write_text("{}")
    assert set(G.find_ckpts(ck2, tags)) == {("mamba2", 2)}
    script = REPO / "experiments" / "recall" / "gpu_full.py"
    r = subprocess.run([sys.executable, str(script), "study", "--out", str(tmp_path / "o"),
                        "--ckpts", str(tmp_path / "none"), "--tag", "mamba2=long,gdn=lr1e3"],
                       cwd=REPO, capture_output=True, text=True)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "no long_mamba2_seed{0,1,2} or lr1e3_gdn_seed{0,1,2} checkpoint" in r.stderr


def test_pool_reruns_an_out_of_memory_job_alone_after_the_others(tmp_path):
    """A job that fails with precsim's out-of-memory error beside others runs once more, alone,
    after them (an 80 GB card fits one 32K job, not four: 2026-12-07); any other failure is
    final, and a second out-of-memory failure too."""
    G = gpu_full()
    t = tmp_path

    def job(name, body):
        return {"name": name, "cmd": [sys.executable, "-c", body], "est": 0.0}

    oom = ("import pathlib, sys, time; m = pathlib.Path({m!r}); "
           "time.sleep(0.2)\n"
           "if m.exists():\n    pathlib.Path({s!r}).write_text(repr(time.time()))\n"
           "else:\n    m.write_text('x'); print('precsim: error: the task ran out of cuda "
           "memory; allowed: a smaller task.batch_tokens'); sys.exit(2)")
    slow = ("import pathlib, time; time.sleep(1.5); "
            f"pathlib.Path({str(t / 'slow_end')!r}).write_text(repr(time.time()))")
    jobs = [job("a", oom.format(m=str(t / "marker"), s=str(t / "a_start"))),
            job("b", slow),
            job("c", "import sys; print('precsim: error: model.path: no such file'); sys.exit(2)"),
            job("d", "import sys; print('precsim: error: the task ran out of cuda memory'); "
                     "sys.exit(2)")]
    done = {j["name"]: j["status"] for j in
            G.Pool(4, time.time() + 60, t / "logs").run(jobs)}
    assert done == {"a": "ok", "b": "ok", "c": "failed (exit 2)", "d": "failed (exit 2)"}
    # the rerun started after the job beside which it ran out of memory had finished
    assert float((t / "a_start").read_text()) > float((t / "slow_end").read_text())
    assert "ran out of cuda memory" in (t / "logs" / "a.log").read_text()  # both runs' output
