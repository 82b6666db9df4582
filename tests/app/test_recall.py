"""experiments/recall/train_recall.py (issue 42): two CPU runs of the recipe at its tiny size
write bit-identical checkpoints; its training sequences are reproducible from the seed and
decidable only from the planted pairs / key; its evaluation items are precsim's built-in ones."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "experiments" / "recall" / "train_recall.py"


def recipe():
    spec = importlib.util.spec_from_file_location("recall_recipe", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


R = recipe()


def test_two_cpu_runs_write_bit_identical_checkpoints(tmp_path):
    outs = []
    for run in ("a", "b"):
        out = tmp_path / run
        subprocess.run([sys.executable, str(SCRIPT), "--cpu", "--tiny", "--steps", "4", "--seed",
                        "3", "--out", str(out)], check=True, cwd=REPO, capture_output=True)
        outs.append(out)
    for name in ("mamba2", "gdn"):
        a, b = ((o / name / "model.safetensors").read_bytes() for o in outs)
        assert a == b, name
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
    from precsim.config import to_config
    from precsim.tasks import builtin_items

    fp32 = {"fp32": {"kind": "conventional", "fmt": "fp32"}}
    t = to_config({"schemes": fp32, "task": {"name": "mqar", "lengths": [64], "items": 3,
                                             "key_len": 4, "depth": 0.5, "seed": 9}}).task
    ours = R.eval_items("mqar", [64], 3, 128, 9)
    assert [i.context for i in ours] == [i.context for i in builtin_items(t, 128)]
    it = ours[0]  # the answer is the value planted right after the queried key
    mk = int(R.alphabets(128)["mark_key"][0])
    k = it.context.index(mk)
    pairs = it.context[k + 1:k + 9]
    assert dict(zip(pairs[::2], pairs[1::2], strict=True))[it.context[-1]] == it.choices[0][0]


def test_study_commands_compose_to_the_schemes_it_names(tmp_path):
    """study.py's overrides give task_eval exactly its schemes (FP32 + the engines' formats)."""
    spec = importlib.util.spec_from_file_location("recall_study", SCRIPT.parent / "study.py")
    st = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(st)
    from precsim.cli import _compose_config, register_configs

    register_configs()

    ck = tmp_path / "m"
    ck.mkdir()
    (ck / "config.json").write_text(json.dumps({"state_size": 32}))
    sch = st.schemes(st.row_block(ck))
    args = st.argparse.Namespace(lengths=[64, 128], items=3, key_len=4, depth=0.5, seed=0,
                                 batch_tokens=4096, device="cpu", sr_seeds=1, buffer_len=16)
    cmd = st.command(ck, "mqar", args, tmp_path / "run", sch)
    cfg = _compose_config(cmd[cmd.index("-m") + 2:])
    assert list(cfg.schemes) == ["fp32", *sch] and len(sch) == 16
    assert cfg.schemes["conv_int8row_sr"].fmt == "int8_b32"
    assert cfg.schemes["conv_int8row_sr"].rounding == "sr"
    assert cfg.schemes["split_fp32_nvfp4"].read_fmt == "nvfp4"
    assert cfg.task.name == "mqar" and cfg.task.lengths == [64, 128]
