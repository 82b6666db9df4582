"""experiment=task_eval (precsim.models.task, precsim.tasks, precsim.taskstats) and the lm-eval
model (precsim.lm_eval_adapter) on a tiny Mamba-2 checkpoint built offline.

The checkpoint is random (weights N(0, 1), slowly decaying heads, so that its SSM state matters),
so its task accuracy is chance; the items are made *self-consistent*: each item's gold is the
FP32-state baseline's own choice (its own greedy answer, for generative items), found by a first
pass. The baseline is then right on every item by construction, and every item a scheme gets
wrong is a flip the state format caused."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

tf = pytest.importorskip("transformers")

from precsim import taskstats  # noqa: E402
from precsim.config import to_config  # noqa: E402
from precsim.errors import PrecsimError  # noqa: E402
from precsim.models.task import evaluate, write  # noqa: E402
from precsim.tasks import Item, builtin_items, read_items  # noqa: E402

C = {"kind": "conventional"}
SCHEMES = {"fp32": {**C, "fmt": "fp32"}, "same": {**C, "fmt": "fp32"},
           "fp16": {**C, "fmt": "fp16"}, "fp8": {**C, "fmt": "fp8_e4m3"},
           "fp4": {**C, "fmt": "fp4_e2m1"}, "fp8sr": {**C, "fmt": "fp8_e4m3", "rounding": "sr"}}


def _cfg(path, task: dict, schemes=None, **run):
    return to_config({"model": {"path": str(path)}, "schemes": schemes or SCHEMES,
                      "task": task, "run": {"steps": 8, "progress": False, **run},
                      "metrics": {"window": 8}, "replay": {"buffer_len": 4}})


def _task(**kw):
    """A task section alone (a config with a task needs model.path: config.validate)."""
    from precsim.config import TaskConfig

    return TaskConfig(**kw)


def _char_tokenizer():
    """A character-level tokenizer of the 95 printable ASCII characters and <eos> (96 ids)."""
    from tokenizers import Tokenizer, decoders, models

    vocab = {chr(i): i - 32 for i in range(32, 127)}
    vocab["<eos>"] = 95
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.decoder = decoders.Fuse()
    return tf.PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """The tiny Mamba-2 checkpoint, without a tokenizer (``bare``) and with one (``text``)."""
    from conftest import build

    root = tmp_path_factory.mktemp("task_ckpt")
    m = build("Mamba2ForCausalLM", 1.0, slow_decay=True)
    m.save_pretrained(root / "bare")
    m.save_pretrained(root / "text")
    _char_tokenizer().save_pretrained(root / "text")
    return root


def _jsonl(path, items):
    path.write_text("".join(json.dumps(d) + "\n" for d in items))
    return path


@pytest.fixture(scope="module")
def mc(ckpt, tmp_path_factory):
    """24 token-id items (a 16-token context, 8 single-token choices), gold = the baseline's
    choice; evaluated under every scheme of SCHEMES (fp8sr over 2 SR seeds)."""
    d = tmp_path_factory.mktemp("mc")
    rng = np.random.default_rng(1)
    items = [{"context": rng.integers(0, 96, 16).tolist(),
              "choices": [[int(c)] for c in rng.choice(96, 8, replace=False)], "gold": 0}
             for _ in range(24)]
    f = _jsonl(d / "mc.jsonl", items)
    first = evaluate(_cfg(ckpt / "bare", {"path": str(f)}, {"fp32": SCHEMES["fp32"]}),
                     progress=False)
    for it, p in zip(items, first["_per"]["fp32"]["acc:pred"], strict=True):
        it["gold"] = int(p)
    _jsonl(f, items)
    s = evaluate(_cfg(ckpt / "bare", {"path": str(f)}, sr_seeds=2), progress=False)
    return s, write(s, d / "out"), d / "out"


def test_identity_scheme_no_flips_destructive_drops_and_flips_fall_with_bits(mc):
    s, public, out = mc
    r = s["schemes"]
    assert r["fp32"]["role"] == "baseline" and r["fp32"]["acc"] == 1.0
    same = r["same"]  # the FP32 state again under another name: identical to the baseline
    assert (same["lost"], same["gained"], same["p_mcnemar"]) == (0, 0, 1.0)
    assert same["delta"] == same["delta_lo"] == same["delta_hi"] == 0.0
    assert r["reference"]["lost"] == r["noise_floor"]["lost"] == 0  # the floor flips nothing
    fp4 = r["fp4"]  # 4-bit state without a scale: a significant drop
    assert fp4["delta"] < 0 and fp4["delta_hi"] < 0 and fp4["p_mcnemar"] < 0.05
    assert fp4["down"] == fp4["lost"] >= 6 and fp4["gained"] == 0
    assert abs(fp4["delta"]) >= fp4["mdd"]  # detected, so at least the detectable change
    assert r["fp16"]["lost"] <= r["fp8"]["lost"] <= fp4["lost"]
    assert r["fp8sr"]["seeds"] == 2
    # the files: one CSV line per item, the summary (no private keys), the plot
    lines = (out / "items.csv").read_text().splitlines()
    assert len(lines) == 25 and "fp4:correct" in lines[0]
    stored = json.loads((out / "summary.json").read_text())
    assert stored["schemes"]["fp4"]["lost"] == fp4["lost"] and "_items" not in stored
    assert (out / "task_accuracy.png").stat().st_size > 1000


def test_statistics_against_scipy():
    from scipy import stats

    for down, up in [(0, 0), (6, 0), (7, 2), (3, 11), (40, 25)]:
        want = stats.binomtest(down, down + up, 0.5).pvalue if down + up else 1.0
        assert taskstats.mcnemar_exact(down, up) == pytest.approx(want, rel=1e-12)
    rng = np.random.default_rng(0)
    b = (rng.random(200) < 0.7).astype(float)
    s = np.where(rng.random(200) < 0.15, 1 - b, b)  # 15% of the items flipped
    d, lo, hi = taskstats.paired_delta(s, b, B=4000)
    ref = stats.bootstrap((s, b), lambda x, y: np.mean(x - y), paired=True, n_resamples=4000,
                          method="percentile", vectorized=False,
                          random_state=np.random.default_rng(1)).confidence_interval
    assert d == pytest.approx(np.mean(s - b))
    assert lo == pytest.approx(ref.low, abs=0.01) and hi == pytest.approx(ref.high, abs=0.01)
    for k, n in [(0, 10), (7, 20), (20, 20), (55, 200)]:
        ci = stats.binomtest(k, n).proportion_ci(0.95, method="wilson")
        assert taskstats.wilson(k / n, n) == pytest.approx((ci.low, ci.high), abs=1e-9)
    # the minimum detectable change solves Connor's sample-size formula at its own value
    za, zb = stats.norm.ppf(0.975), stats.norm.ppf(0.8)
    for n, psi in [(500, 0.2), (2000, 0.05)]:
        m = taskstats.mdd(n, psi)
        need = (za * math.sqrt(psi) + zb * math.sqrt(psi - m * m)) ** 2 / m ** 2
        assert need == pytest.approx(n, rel=1e-6)
    assert taskstats.mdd(100, 0.3) > taskstats.mdd(400, 0.3) > taskstats.mdd(400, 0.05)
    assert taskstats.mdd(10, 0.0) >= 0.6  # the exact test needs 6 discordant items of 10
    assert taskstats.mdd(5, 0.0) == math.inf


def test_generative_exact_match_is_the_greedy_decode(ckpt, tmp_path):
    """Answers decoded greedily under the FP32 state (repeated teacher-forced passes) are, by
    the teacher-forced check of task_eval, exact matches of the FP32 state: the two agree."""
    from precsim.models.run import build_groups, prepare
    from precsim.models.task import greedy, task_cfg

    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, 96, int(n)).tolist() for n in (5, 9, 12, 7)]
    cfg = _cfg(ckpt / "bare", {"path": str(tmp_path / "gen.jsonl")},
               {"fp32": SCHEMES["fp32"], "fp4": SCHEMES["fp4"]})
    pcfg, tmp = task_cfg(cfg)
    try:  # task_cfg's folder is the caller's to remove (as models.task.load does)
        ld = prepare(pcfg)
        gs = lambda: build_groups(cfg, next(ld.model.parameters()).dtype)  # noqa: E731
        answers = greedy(ld, cfg, prompts, [3, 3, 2, 4], gs, "fp32", 4096)
        assert [len(a) for a in answers] == [3, 3, 2, 4]
        _jsonl(tmp_path / "gen.jsonl", [{"prompt": p, "answer": a}
                                        for p, a in zip(prompts, answers, strict=True)])
        s = evaluate(cfg, progress=False, ld=ld)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert s["schemes"]["fp32"]["acc"] == 1.0
    assert s["task"]["metric"] == "exact_match (greedy)"


def test_passkey_items_and_accuracy_by_length(ckpt, tmp_path):
    t = _task(name="passkey", lengths=[12, 24], items=3, key_len=2, depth=0.5, seed=0)
    items = builtin_items(t, 96)
    assert len(items) == 6 and [len(i.context) for i in items] == [12] * 3 + [24] * 3
    it = items[4]
    k = it.context.index(12)  # the key marker (vocab 96: the reserved ranges start at 12)
    assert it.context[k + 1:k + 3] == it.choices[0] and abs(k - 0.5 * 20) <= 1
    assert it.context[-1] == 13  # the query marker ends the prompt
    assert [i.context for i in builtin_items(t, 96)] == [i.context for i in items]
    t.seed = 1
    assert [i.context for i in builtin_items(t, 96)] != [i.context for i in items]
    mq = _task(name="mqar", lengths=[16], items=2, key_len=3)
    q = builtin_items(mq, 96)[0]
    pairs = q.context[q.context.index(12) + 1:][:6]
    assert dict(zip(pairs[::2], pairs[1::2], strict=True))[q.context[-1]] == q.choices[0][0]
    cfg = _cfg(ckpt / "bare", {"name": "passkey", "lengths": [12, 24], "items": 3,
                               "key_len": 1}, {"fp32": SCHEMES["fp32"], "fp4": SCHEMES["fp4"]})
    s = evaluate(cfg, progress=False)
    assert set(s["schemes"]["fp4"]["by_length"]) == {"12", "24"}
    public = write(s, tmp_path)
    assert public["plot"] == "accuracy_vs_length.png" and (tmp_path / public["plot"]).is_file()


BAD = [  # (line text, what the one-line error must say)
    ('{"context": [1, 2], "choices": [[3], [4]], "gold": 0}\n{"context": [1, 2',
     ":2: not valid JSON"),
    ('{"context": [1, 2], "choices": [[3]], "gold": 0}', ":1: field 'choices'"),
    ('{"context": [1, 2], "choices": [[3], [4]], "gold": 2}', ":1: field 'gold'"),
    ('{"context": [1, 2], "choices": [[3], [400]], "gold": 0}', ":1: field 'choices[1]'"),
    ('{"context": "Hello", "choices": ["a", "b"], "gold": 0}', ":1: field 'context': is text"),
    ('{"prompt": [1], "answer": "x"}', ":1: field 'answer'"),
    ('{"question": 1}', ":1: has neither"),
    ('[1, 2]', ":1: a JSON list"),
]


@pytest.mark.parametrize("text,says", BAD)
def test_bad_items_name_the_file_line_and_field(tmp_path, text, says):
    f = tmp_path / "bad.jsonl"
    f.write_text(text + "\n")
    with pytest.raises(PrecsimError) as e:
        read_items(f, None, 96, "CKPT")
    msg = str(e.value)
    assert "\n" not in msg and str(f) + says in msg and "allowed:" in msg


def test_cli_runs_and_bad_input_is_one_line_exit_2(ckpt, tmp_path, capsys):
    from precsim.cli import main

    f = _jsonl(tmp_path / "t.jsonl", [{"context": [1, 2, 3], "choices": [[4], [5]], "gold": 0},
                                      {"prompt": [6, 7], "answer": [8]}])
    base = ["experiment=task_eval", f"model.path={ckpt / 'bare'}", "run.progress=false",
            "schemes={fp32:{kind:conventional,fmt:fp32}}"]
    assert main([*base, f"task.path={f}", f"hydra.run.dir={tmp_path / 'ok'}"]) == 0
    assert "(baseline)" in capsys.readouterr().out
    assert {p.name for p in (tmp_path / "ok").iterdir()} >= {"summary.json", "items.csv"}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(f.read_text() + '{"context": [1], "choices": [[2]], "gold": 0}\n')
    for over, says in (([f"task.path={bad}"], f"{bad}:3: field 'choices'"),
                       (["task.name=needle"], "task.name='needle' is unknown"),
                       ([f"task.path={f}", "task.batch_tokens=0"],
                        "task.batch_tokens=0; allowed: auto or an integer >= 1"),
                       ([f"task.path={f}", "task.batch_tokens=many"],
                        "task.batch_tokens='many'; allowed: auto")):
        run = tmp_path / over[-1].split("=")[0]
        with pytest.raises(SystemExit) as e:
            main([*base, *over, f"hydra.run.dir={run}"])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and says in err and len(err.splitlines()) == 1
        assert not run.exists()  # nothing half-written


def test_text_items_follow_lm_evals_split(ckpt):
    tok = tf.AutoTokenizer.from_pretrained(str(ckpt / "text"))
    from precsim.tasks import encode_pair

    assert encode_pair(tok, "Q: a ", "b") == encode_pair(tok, "Q: a", " b")
    assert encode_pair(tok, "", "ab") == ([95], [65, 66])


def _tiny_lm_eval_task(tmp_path) -> list[dict]:
    """A local lm-eval multiple-choice task ``precsim_tiny_mc`` in ``tmp_path/tasks`` over 8
    items written to ``tmp_path/docs.jsonl``; its items."""
    rng = np.random.default_rng(3)
    words = ["red", "blue", "green", "gray", "pink", "teal"]
    docs = [{"context": " ".join(rng.choice(words, 4)) + " is",
             "choices": list(rng.choice(words, 3, replace=False)), "gold": int(rng.integers(3))}
            for _ in range(8)]
    _jsonl(tmp_path / "docs.jsonl", docs)
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "tiny.yaml").write_text(
        "task: precsim_tiny_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {tmp_path / 'docs.jsonl'}\ntest_split: test\noutput_type: multiple_choice\n"
        "doc_to_text: '{{context}}'\ndoc_to_choice: '{{choices}}'\ndoc_to_target: '{{gold}}'\n"
        "metric_list:\n  - metric: acc\n")
    return docs


def test_documented_lm_eval_command_runs(ckpt, tmp_path):
    """docs/tasks.md's ``precsim-lm-eval --model precsim --model_args path=DIR,scheme=... --tasks
    NAME --include_path TASKDIR``, through the command line (``python -m
    precsim.lm_eval_adapter``, the entry point's module), offline on a local task."""
    import os
    import subprocess
    import sys

    pytest.importorskip("lm_eval")
    _tiny_lm_eval_task(tmp_path)
    r = subprocess.run([sys.executable, "-m", "precsim.lm_eval_adapter", "--model", "precsim",
                        "--model_args", f"path={ckpt / 'text'},scheme=conventional:fp8_e4m3:rne",
                        "--tasks", "precsim_tiny_mc", "--include_path", str(tmp_path / "tasks")],
                       capture_output=True, text=True, cwd=tmp_path, timeout=600,
                       env={**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "precsim_tiny_mc" in r.stdout and "acc" in r.stdout
    assert "Traceback" not in r.stderr
    # a bad scheme or batch size: precsim's one line at the end, exit 2, no traceback
    for arg, says in (("scheme=bogus", "'bogus'"), ("batch_tokens=many", "batch_tokens='many'")):
        bad = subprocess.run([sys.executable, "-m", "precsim.lm_eval_adapter", "--model",
                              "precsim", "--model_args", f"path={ckpt / 'text'},{arg}",
                              "--tasks", "precsim_tiny_mc", "--include_path",
                              str(tmp_path / "tasks")],
                             capture_output=True, text=True, cwd=tmp_path, timeout=600,
                             env={**os.environ, "HF_DATASETS_OFFLINE": "1",
                                  "HF_HUB_OFFLINE": "1"})
        assert bad.returncode == 2 and "Traceback" not in bad.stderr
        last = bad.stderr.strip().splitlines()[-1]
        assert last.startswith("precsim: error: ") and says in last and "allowed:" in last


@pytest.mark.filterwarnings("ignore")
def test_lm_eval_adapter_equals_task_eval(ckpt, tmp_path):
    lm_eval = pytest.importorskip("lm_eval")
    import precsim.lm_eval_adapter  # noqa: F401 - registers the model "precsim"

    docs = _tiny_lm_eval_task(tmp_path)
    # lm-eval puts " " (target_delimiter) between the context and each choice
    f = _jsonl(tmp_path / "same.jsonl", [{**d, "choices": [" " + c for c in d["choices"]]}
                                         for d in docs])
    s = evaluate(_cfg(ckpt / "text", {"path": str(f)},
                      {"fp32": SCHEMES["fp32"], "fp4": SCHEMES["fp4"]}), progress=False)
    from lm_eval.tasks import TaskManager

    for scheme, name in (("fp32", "fp32"), ("conventional:fp4_e2m1:rne", "fp4")):
        res = lm_eval.simple_evaluate(
            model="precsim", model_args=f"path={ckpt / 'text'},scheme={scheme},buffer_len=4",
            tasks=["precsim_tiny_mc"], task_manager=TaskManager(include_path=str(tmp_path /
                                                                                 "tasks")))
        acc = res["results"]["precsim_tiny_mc"]["acc,none"]
        assert acc == pytest.approx(s["schemes"][name]["acc"]), scheme


def test_lm_eval_missing_is_one_line(monkeypatch, capsys):
    from precsim import lm_eval_adapter as ad

    monkeypatch.setattr(ad, "LM", None)
    with pytest.raises(PrecsimError, match=r"pip install 'precsim\[eval\]'"):
        ad.require()
    assert ad.main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["precsim: error: lm_eval is not installed; allowed: pip install "
                   "'precsim[eval]'"]


def test_item_rows_choose_by_summed_and_normalised_likelihood():
    """Scoring on fixed row scores (no model): acc sums, acc_token divides by tokens,
    acc_byte by bytes; a NaN score never wins; a generative item needs every argmax."""
    from precsim.models.task import Rows, correctness

    items = [Item("mc", [1], [[2], [3, 4, 5]], 1, nbytes=[1, 9]),
             Item("mc", [1], [[2], [3]], 0), Item("gen", [1], [[2, 3]], 0)]
    rows, first = Rows.of(items)
    sc = {"lp": np.array([-2.0, -3.0, np.nan, -1.0, -4.0]),
          "greedy": np.array([0, 0, 0, 0, 1.0])}
    c = correctness(items, first, sc, rows)
    assert c["acc"].tolist() == [0, 0, 1] and c["acc:pred"].tolist() == [0, 1, 0]
    assert c["acc_token"].tolist() == [1, 0, 1]  # -3/3 > -2/1
    assert c["acc_byte"][0] == 1 and math.isnan(c["acc_byte"][1])


def test_head_only_at_scored_positions_equals_the_full_head(ckpt):
    """Task scoring runs the output head only where a token is scored (run_parallel's ``at``):
    there every group's metrics equal the full head's bit for bit, elsewhere they are NaN."""
    from precsim.models.parallel import run_parallel
    from precsim.models.run import build_groups
    from precsim.models.task import load

    cfg = _cfg(ckpt / "bare", {"name": "mqar"}, sr_seeds=2)
    ld, _ = load(cfg, "cpu")
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 96, (3, 40))
    at = np.zeros(ids.shape, dtype=bool)
    at[0, [5, 39]] = at[1, 20] = at[2, [0, 1, 2, 30]] = True
    dt = next(ld.model.parameters()).dtype
    full = run_parallel(ld.model, ids, build_groups(cfg, dt), cfg, ld.compute, ld.backend)
    part = run_parallel(ld.model, ids, build_groups(cfg, dt), cfg, ld.compute, ld.backend,
                        at=at)
    assert set(part) == set(full) and len(full) >= 5
    for g in full:
        for k in ("lp", "arg", "kl", "top1", "margin"):
            if k not in full[g]:
                continue
            a, b = full[g][k], part[g][k]
            np.testing.assert_array_equal(b[at], a[at], err_msg=f"{g} {k}")
            assert np.isnan(b[~at]).all(), (g, k)


def test_auto_batch_rows_follow_the_memory_estimate(ckpt, monkeypatch):
    """``task.batch_tokens=auto`` (the default): off a GPU 65,536 rows x positions x groups a
    pass; on a CUDA device the most rows whose whole-model estimate (placement.estimate of one
    row, at the groups' mean state bytes) fits half the free memory; an integer as given."""
    import dataclasses

    import torch

    from precsim.models import placement
    from precsim.models.run import build_groups
    from precsim.models.task import CPU_BATCH_TOKENS, load, pass_rows, rows_together

    cfg = _cfg(ckpt / "bare", {"name": "mqar"})
    assert cfg.task.batch_tokens == "auto"
    ld, _ = load(cfg, "cpu")
    gs = build_groups(cfg, torch.float32)
    assert pass_rows(ld, "auto", gs, 100, cfg) == CPU_BATCH_TOKENS // (len(gs) * 100)
    assert pass_rows(ld, 10**6, gs, 100, cfg) == 10**6 // (len(gs) * 100)
    assert pass_rows(ld, 1, gs, 100, cfg) == 1
    # passes of model.chunk=64 positions (a whole number of 4-token segments)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, chunk=64))
    one = placement.estimate(placement.shape_of(ld.model, torch.float32), 1, len(gs), 5000,
                             64, state_bytes=placement.state_bytes(gs, ld.compute)).run()
    free = {"b": 0}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (free["b"], 2 * free["b"]))
    monkeypatch.setattr(ld, "device", "cuda")
    for rows in (1, 7, 300):
        free["b"] = 2 * rows * one + one // 2  # half of it: rows and a part of one more
        assert pass_rows(ld, "auto", gs, 5000, cfg) == rows
    free["b"] = 0
    assert pass_rows(ld, "auto", gs, 5000, cfg) == 1  # at least one row
    # a shared context's rows continued together: as many as their repeated states and caches
    # (the estimate's part with the layers, every group) fit in half the free memory
    row = placement.estimate(placement.shape_of(ld.model, torch.float32), 1, len(gs), 1, 1,
                             state_bytes=placement.state_bytes(gs, ld.compute)).group_layers \
        * len(gs)
    for most, fit in ((4, 3), (4, 9), (2, 1), (3, 0)):
        free["b"] = 2 * 5 * fit * row + row  # 5 contexts, each with fit rows, and a bit
        assert rows_together(ld, gs, 5, most) == max(1, min(most, fit)), (most, fit)


def test_auto_chunk_of_a_task_holds_the_rows_left_a_pass_where_memory_allows(ckpt, monkeypatch):
    """``model.chunk=auto`` (the default) in task scoring: with ``task.batch_tokens=auto`` on a
    (faked) CUDA device the largest of 32,768 .. 2,048 positions at which every row still to
    score fits one pass, else 2,048; on the CPU, with an integer batch_tokens or a plan, 32,768;
    an integer model.chunk as set. The passes use the chosen chunk (summary.json's model.chunk)
    and every item's scores equal a run at that chunk fixed."""
    import dataclasses

    import numpy as np
    import torch

    from precsim.models import placement as pl
    from precsim.models import task as T
    from precsim.models.parallel import AUTO_CHUNKS
    from precsim.models.run import build_groups

    def at(c, chunk):
        return dataclasses.replace(c, model=dataclasses.replace(c.model, chunk=chunk))

    cfg = _cfg(ckpt / "bare", {"name": "passkey"})
    assert cfg.model.chunk == "auto"
    ld, _ = T.load(cfg, "cpu")
    gs = build_groups(cfg, torch.float32)
    N, rows = 32768, 6
    assert T.task_chunk(ld, cfg, "auto", gs, N, rows).model.chunk == 32768  # the CPU
    monkeypatch.setattr(ld, "device", "cuda")
    one = {c: pl.estimate(pl.shape_of(ld.model, torch.float32), 1, len(gs), N, c,
                          state_bytes=pl.state_bytes(gs, ld.compute)).run() for c in AUTO_CHUNKS}
    assert one[32768] > one[2048]  # (fewer positions a pass: less memory a row)
    free = {"b": 0}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (free["b"], 2 * free["b"]))
    for c in AUTO_CHUNKS:  # just room for all the rows at c (and at every smaller chunk)
        free["b"] = 2 * rows * one[c]
        assert T.task_chunk(ld, cfg, "auto", gs, N, rows).model.chunk == c
    free["b"] = 2 * rows * one[2048] - 1
    assert T.task_chunk(ld, cfg, "auto", gs, N, rows).model.chunk == 2048  # none: the smallest
    assert T.task_chunk(ld, cfg, 10**6, gs, N, rows).model.chunk == 32768  # integer rows
    assert T.task_chunk(ld, at(cfg, 4096), "auto", gs, N, rows).model.chunk == 4096
    monkeypatch.setattr(ld, "plan", object())
    assert T.task_chunk(ld, cfg, "auto", gs, N, rows).model.chunk == 32768
    monkeypatch.undo()

    # the passes run at the chosen chunk: on the CPU, with 8 positions chosen for them
    t = {"name": "passkey", "lengths": [12, 24], "items": 3, "key_len": 1}
    sch = {"fp32": SCHEMES["fp32"], "fp4": SCHEMES["fp4"], "fp8sr": SCHEMES["fp8sr"]}
    monkeypatch.setattr(T, "task_chunk", lambda ld_, c, *a: at(c, 8))
    auto = T.evaluate(_cfg(ckpt / "bare", t, sch), progress=False)
    monkeypatch.undo()
    at8 = T.evaluate(at(_cfg(ckpt / "bare", t, sch), 8), progress=False)
    whole = T.evaluate(_cfg(ckpt / "bare", t, sch), progress=False)
    assert auto["model"]["chunk"] == at8["model"]["chunk"] == [8]
    assert whole["model"]["chunk"] == [25]  # all rows in one pass, whole (24 + the key)
    assert auto["config"]["model"]["chunk"] == "auto"
    assert auto["_per"].keys() == at8["_per"].keys()
    for g, per in auto["_per"].items():
        for k, v in per.items():
            np.testing.assert_array_equal(v, at8["_per"][g][k], err_msg=f"{g} {k}")


def test_interrupted_task_resumes_to_the_uninterrupted_scores(ckpt, tmp_path, capsys,
                                                              monkeypatch):
    """``experiment=task_eval`` interrupted between passes (PRECSIM_SIGNAL_AT: SIGINT once
    2 rows are scored) says one line with the row, the checkpoint and the command that resumes;
    writes no result; the rerun resumes from the checkpoint and writes the same per-item scores,
    byte for byte, as the run never interrupted (an SR scheme and a shared-context item among
    them); the checkpoint is gone after. A checkpoint of another config, or of other items
    (the task file edited since), is a one-line error."""
    from conftest import run_main

    from precsim.rundir import CHECKPOINT_FILE

    items = [{"context": [1, 2, 3, 4, 5, 6, 7, 8, 9], "choices": [[4], [5], [6]], "gold": 0},
             *({"context": [9, 8, 7 + i], "choices": [[4], [5]], "gold": 1} for i in range(3)),
             {"prompt": [6, 7], "answer": [8]}]
    f = _jsonl(tmp_path / "t.jsonl", items)
    # (the default schemes: FP32, FP16, FP8, NVFP4 SR shared)
    base = ["experiment=task_eval", f"model.path={ckpt / 'bare'}", "run.progress=false",
            f"task.path={f}", "task.batch_tokens=60", "replay.buffer_len=4",
            "metrics.plot=false"]
    monkeypatch.delenv("PRECSIM_SIGNAL_AT", raising=False)
    assert run_main([*base, f"hydra.run.dir={tmp_path / 'whole'}"], capsys)[0] == 0
    out = tmp_path / "cut"
    monkeypatch.setenv("PRECSIM_SIGNAL_AT", "SIGINT@2")
    rc, _, err = run_main([*base, f"hydra.run.dir={out}"], capsys)
    monkeypatch.delenv("PRECSIM_SIGNAL_AT")
    assert rc == 130 and len(err) == 1, err
    assert err[0].startswith("precsim: interrupted (SIGINT) at task row "), err[0]
    assert str(out / CHECKPOINT_FILE) in err[0] and "no partial results" in err[0]
    assert (out / CHECKPOINT_FILE).is_file() and not (out / "summary.json").exists()
    at = int(err[0].split("at task row ")[1].split(";")[0])
    assert 2 <= at < 10  # (10 rows in all: 3 + 3 x 2 choices, one generative row)
    # another config's checkpoint: one line, the checkpoint kept
    rc, _, e2 = run_main([*base, "run.seed=1", f"hydra.run.dir={out}"], capsys)
    assert rc == 2 and len(e2) == 1 and "checkpoint of another config (run.seed=0" in e2[0]
    resume = err[0].split("resume: ", 1)[1].split()[3:]  # (after python -m precsim)
    rc, _, e3 = run_main(resume, capsys)
    assert rc == 0, e3
    assert any(f"from its checkpoint at task row {at:,} of " in ln for ln in e3), e3
    assert not (out / CHECKPOINT_FILE).exists()
    assert (out / "items.csv").read_bytes() == (tmp_path / "whole" / "items.csv").read_bytes()
    a = json.loads((out / "summary.json").read_text())["schemes"]
    b = json.loads((tmp_path / "whole" / "summary.json").read_text())["schemes"]
    assert a == b
    # the items changed under a checkpoint: one line
    out2 = tmp_path / "cut2"
    monkeypatch.setenv("PRECSIM_SIGNAL_AT", "SIGINT@2")
    assert run_main([*base, f"hydra.run.dir={out2}"], capsys)[0] == 130
    monkeypatch.delenv("PRECSIM_SIGNAL_AT")
    _jsonl(f, [*items[:-1], {"prompt": [6, 7], "answer": [9]}])
    rc, _, e4 = run_main([*base, f"hydra.run.dir={out2}"], capsys)
    assert rc == 2 and len(e4) == 1 and "other task rows" in e4[0], e4
