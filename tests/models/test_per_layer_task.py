"""experiment=per_layer metrics.budget_metric=accuracy over a task (precsim.models.per_layer_task)
on the tiny planted Mamba-2 of test_per_layer (its layer PLANT's output is all state), with
self-consistent items as in test_tasks (gold = the FP32-state baseline's own choice, so every
item a format gets wrong is a flip it caused)."""

from __future__ import annotations

import json

import numpy as np
import pytest

tf = pytest.importorskip("transformers")

from conftest import run_main  # noqa: E402
from test_per_layer import PLANT, _mamba2  # noqa: E402

from precsim.config import to_config  # noqa: E402
from precsim.errors import PrecsimError  # noqa: E402
from precsim.models import per_layer_task  # noqa: E402
from precsim.models.task import evaluate  # noqa: E402

FP32 = {"kind": "conventional", "fmt": "fp32"}
FMTS = ["fp16", "fp4_e2m1"]  # fp4_e2m1: a 4-bit state without a scale, destructive at PLANT


def _cfg(ck, f, schemes=None, **over):
    d = {"model": {"path": str(ck)}, "schemes": schemes or {"s": FP32},
         "task": {"path": str(f)}, "run": {"steps": 8, "progress": False},
         "metrics": {"window": 8}, "replay": {"buffer_len": 4}}
    for key, val in over.items():
        sec, _, k = key.partition("__")
        d.setdefault(sec, {})[k] = val
    return to_config(d)


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """The planted checkpoint and 24 self-consistent multiple-choice items (a 16-token context,
    8 single-token choices)."""
    root = tmp_path_factory.mktemp("pltask")
    ck = _mamba2(root / "planted", plant=PLANT)
    rng = np.random.default_rng(1)
    items = [{"context": rng.integers(0, 96, 16).tolist(),
              "choices": [[int(c)] for c in rng.choice(96, 8, replace=False)], "gold": 0}
             for _ in range(24)]
    f = root / "mc.jsonl"
    f.write_text("".join(json.dumps(d) + "\n" for d in items))
    first = evaluate(_cfg(ck, f), progress=False)
    for it, p in zip(items, first["_per"]["s"]["acc:pred"], strict=True):
        it["gold"] = int(p)
    f.write_text("".join(json.dumps(d) + "\n" for d in items))
    return ck, f, root


def test_destructive_layer_is_most_sensitive_and_the_assignment_avoids_it(task):
    """The planted layer in FP4 drops the most accuracy (by far); the assignment keeps it (and
    any layer whose FP4 drops an item: budget below one item) at FP16, the rest at FP4; the
    verification measures the assignment's drop with its paired statistics and fits, at fewer
    bytes than uniform FP16 (uniform FP4 misses)."""
    ck, f, _ = task
    budget = 0.02  # below one item of 24
    s = per_layer_task.run(_cfg(ck, f, per_layer__formats=FMTS, per_layer__groups_per_pass=3,
                                metrics__budget_metric="accuracy", metrics__budget=budget),
                           progress=False)
    pl = s["per_layer"]
    assert s["experiment"] == "per_layer" and pl["metric"] == "accuracy_drop"
    assert pl["sensitivity_runs"] == 1 + 3 * 2 and pl["base_value"] == 0.0
    fp4 = pl["added"]["fp4_e2m1"]
    assert max(fp4, key=fp4.get) == PLANT and fp4[PLANT] >= 0.25
    assert fp4[PLANT] > 5 * max(v for la, v in fp4.items() if la != PLANT)
    assert all(v == 0 for v in pl["added"]["fp16"].values())
    assert pl["lost"]["fp4_e2m1"][PLANT] == round(24 * fp4[PLANT])
    rd = pl["rounds"][-1]
    assign = {la: rd["layers"].get(la, rd["layers"]["default"]) for la in pl["layers"]}
    assert assign[PLANT] == "fp16"
    for la in pl["layers"]:  # each layer at FP4 exactly where its FP4 drops nothing
        assert assign[la] == ("fp4_e2m1" if fp4[la] == 0 else "fp16"), la
    assert pl["verified"] and rd["fits"] and rd["measured"] <= budget
    assert rd["predicted"] == pytest.approx(0.0, abs=1e-5)
    row = s["schemes"]["per_layer"]  # the verification's paired statistics
    assert rd["measured"] == pytest.approx(-row["delta"]) and rd["lost"] == row["lost"]
    assert {"p_mcnemar", "drop_lo", "drop_hi", "gained", "mdd"} <= rd.keys()
    assert rd["drop_lo"] <= rd["measured"] <= rd["drop_hi"]
    u = pl["uniform"]
    assert u["fp4_e2m1"]["value"] > budget and pl["best_uniform"] == "fp16"
    assert s["schemes"]["uniform_fp4_e2m1"]["p_mcnemar"] < 0.05
    assert rd["bytes_per_token"] < u["fp16"]["bytes_per_token"]


def test_command_line_writes_the_run_and_bad_metric_task_pairs_are_one_line(task, capsys):
    ck, f, root = task
    base = ["experiment=per_layer", f"model.path={ck}", "run.progress=false",
            f"per_layer.formats=[{','.join(FMTS)}]", "metrics.plot=false"]
    out = root / "run"
    rc, text, err = run_main([*base, f"task.path={f}", "metrics.budget_metric=accuracy",
                              "metrics.budget=0.05", f"hydra.run.dir={out}"], capsys)
    assert rc in (0, None), err
    assert "per-layer assignment (split's read_fmt per layer" in text
    assert "as a scheme: schemes.split.layers=" in text and "(baseline)" in text
    assert {p.name for p in out.iterdir()} >= {"summary.json", "items.csv", "sensitivity.csv"}
    stored = json.loads((out / "summary.json").read_text())
    assert stored["per_layer"]["verified"] and "per_layer" in stored["schemes"]
    assert (out / "sensitivity.csv").read_text().splitlines()[0].startswith(
        "layer,format,accuracy_drop,added_accuracy_drop")
    for over, says in ((["metrics.budget_metric=accuracy"],
                        "metrics.budget_metric=accuracy needs a task; allowed: task.path="),
                       ([f"task.path={f}", "metrics.budget_metric=kl"],
                        "metrics.budget_metric=kl with a task")):
        run = root / f"bad{len(over)}"
        rc, _, err = run_main([*base, *over, f"hydra.run.dir={run}"], capsys)
        assert rc == 2 and len(err) == 1 and says in err[0], err
        assert not run.exists()
    with pytest.raises(PrecsimError, match="metrics.budget_metric=accuracy needs a task"):
        to_config({"schemes": {"s": FP32}, "metrics": {"budget_metric": "accuracy"}})
