"""``model.doc_batch``: whole-model runs in batches of documents (precsim.models.run.measure).

Batched and unbatched runs of deterministic schemes agree bit for bit on the CPU (float32
weights: the tiny models' matmuls give each row the same bits whatever the batch's size), in
parallel and generate mode and through the command line; random draws (SR bits, the noise run's
dither) come from each batch's own seed (:func:`precsim.models.run.batch_seed`): the first
batch's are the unbatched run's, a later batch's are its own.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import build, interrupted, kl_cfg, one_line_errors, run_main

from precsim.models import run as run_mod
from precsim.models.run import batch_seed, run_model_kl

RNE = {"fp32": {"kind": "conventional", "fmt": "fp32"},
       "shared": {"kind": "shared", "fmt": "nvfp4"},
       "split": {"kind": "split", "fmt": "fp32", "read_fmt": "nvfp4"}}
SR = {**RNE, "sr": {"kind": "conventional", "fmt": "fp16", "rounding": "sr"}}


@pytest.fixture(scope="module")
def m2(tmp_path_factory):
    """A tiny Mamba-2 whose SSM layers matter, four 24-token documents of ids, and the same
    document four times."""
    root = tmp_path_factory.mktemp("docbatch")
    build("Mamba2ForCausalLM", 0.2, slow_decay=True).save_pretrained(root / "m2")
    ids = np.random.default_rng(2).integers(0, 96, (4, 24))
    np.save(root / "ids.npy", ids)
    np.save(root / "same.npy", np.repeat(ids[:1], 4, axis=0))
    return root


def _cfg(root, schemes=RNE, ids="ids.npy", **over):
    return kl_cfg(root / "m2", schemes, 24, model__ids=str(root / ids), run__seqs=4,
                  metrics__baseline="fp32", **over)


def _same_figures(a, b) -> None:
    """Everything of two whole-model results but the noise run's draws and the timings."""
    assert a.rows == b.rows
    assert a.per_step_rel_err.keys() == b.per_step_rel_err.keys()
    for name, v in a.per_step_rel_err.items():
        np.testing.assert_array_equal(b.per_step_rel_err[name], v, err_msg=name)
    assert a.info["first_flip"] == b.info["first_flip"]
    fa, fb = a.info["floor"], b.info["floor"]
    assert fa["fp32_vs_fp64"] == fb["fp32_vs_fp64"]
    for n, s in fa["schemes"].items():
        assert s["per_doc_kl"] == fb["schemes"][n]["per_doc_kl"], n


def _close_figures(a, b, rtol: float = 1e-6) -> None:
    """:func:`_same_figures` up to float32 rounding in the real-valued figures (the counts,
    steps and flips exact)."""
    assert [(r["scheme"], r["step"]) for r in a.rows] == [(r["scheme"], r["step"]) for r in b.rows]
    for ra, rb in zip(a.rows, b.rows, strict=True):
        assert ra.keys() == rb.keys()
        for k, v in ra.items():
            if isinstance(v, float) and not float(v).is_integer():
                np.testing.assert_allclose(rb[k], v, rtol=rtol, err_msg=f"{ra['scheme']} {k}")
            else:
                assert rb[k] == v or (v != v and rb[k] != rb[k]), (ra["scheme"], ra["step"], k)
    for name, v in a.per_step_rel_err.items():
        np.testing.assert_allclose(b.per_step_rel_err[name], v, rtol=rtol, err_msg=name)
    assert a.info["first_flip"] == b.info["first_flip"]
    fa, fb = a.info["floor"], b.info["floor"]
    for n, s in fa["schemes"].items():
        np.testing.assert_allclose(fb["schemes"][n]["per_doc_kl"], s["per_doc_kl"], rtol=rtol)


@pytest.mark.parametrize("mode", ["parallel", "generate"])
def test_batched_runs_of_deterministic_schemes_equal_one_batch(m2, mode):
    """model.doc_batch=1, 2 and 3 (a smaller last batch) give the rows, every token's metrics,
    the drift and the generated tokens of model.doc_batch=0 (one batch) bit for bit; the info
    records the batch size."""
    over = {"model__mode": mode, "model__new_tokens": 6, "model__chunk": 8}
    ref = run_model_kl(_cfg(m2, model__doc_batch=0, **over), "cpu", progress=False)
    assert ref.info["doc_batch"] == 4
    assert any(r["state_drift"] > 0 for r in ref.rows)  # (the drift is compared too)
    for B in (1, 2, 3):
        res = run_model_kl(_cfg(m2, model__doc_batch=B, **over), "cpu", progress=False)
        assert res.info["doc_batch"] == B
        _same_figures(ref, res)
        if mode == "generate":
            assert res.info["generation"]["schemes"] == ref.info["generation"]["schemes"]
            assert res.info["generations_text"] == ref.info["generations_text"]


def test_a_later_batch_draws_its_own_sr_bits(m2):
    """The same document four times, in batches of 2: the first batch's documents are the
    unbatched run's first two bit for bit (batch 0 draws from run.seed); the second batch's SR
    scheme and noise run differ from the first's (their own seed), while the round-to-nearest
    schemes give every copy of the document the same figures."""
    one = run_model_kl(_cfg(m2, SR, "same.npy", model__doc_batch=0), "cpu", progress=False)
    two = run_model_kl(_cfg(m2, SR, "same.npy", model__doc_batch=2), "cpu", progress=False)
    for name, v in one.per_step_rel_err.items():
        np.testing.assert_array_equal(two.per_step_rel_err[name][:, :2], v[:, :2], err_msg=name)
        t = two.per_step_rel_err[name]
        if name.split(":")[0] in ("shared", "split"):
            np.testing.assert_array_equal(t[:, 2:], t[:, :2], err_msg=name)
    kl = two.per_step_rel_err["sr:kl"]
    assert not np.array_equal(kl[:, 2:], kl[:, :2])  # batch 1's SR bits are not batch 0's
    noise = two.info["floor"]["noise"]["per_doc_kl"]
    assert noise[2:] != noise[:2]
    assert batch_seed(0, 0) == 0 and batch_seed(7, 0) == 7
    seeds = {batch_seed(s, b) for s in range(3) for b in range(1, 4)}
    assert len(seeds) == 9 and not seeds & {0, 1, 2} and all(0 <= x < 2**63 for x in seeds)


def test_the_command_line_writes_the_same_files_and_refuses_bad_values(m2, tmp_path, capsys,
                                                                      monkeypatch):
    """Through the command line: model.doc_batch=2 writes the metrics.csv of one batch, and
    summary.json's doc_batch; -1 and x are one line each, exit 2, and so are model.chunk's."""
    monkeypatch.chdir(tmp_path)
    args = ["experiment=model_kl", f"model.path={m2 / 'm2'}", f"model.ids={m2 / 'ids.npy'}",
            "run.steps=24", "run.seqs=4", "metrics.window=8", "replay.buffer_len=4",
            "schemes.shared_nvfp4_sr.rounding=rne", "metrics.plot=false", "run.progress=false"]
    for B in (0, 2):
        rc, _, err = run_main([*args, f"model.doc_batch={B}", f"hydra.run.dir={tmp_path / str(B)}"],
                              capsys)
        assert rc == 0, err
    assert (tmp_path / "0" / "metrics.csv").read_bytes() == \
        (tmp_path / "2" / "metrics.csv").read_bytes()
    s = [json.loads((tmp_path / d / "summary.json").read_text()) for d in ("0", "2")]
    assert s[0]["info"]["doc_batch"] == 4 and s[1]["info"]["doc_batch"] == 2
    assert s[0]["figures"] == s[1]["figures"] and s[0]["schemes"] == s[1]["schemes"]
    log = (tmp_path / "2" / "precsim.log").read_text()
    assert "documents: 4 in 2 batches of 2 (model.doc_batch=2" in log
    path = f"model.path={m2 / 'm2'}"
    want = "allowed: auto, or an integer >= 0"
    one_line_errors([(["experiment=model_kl", path, "model.doc_batch=-1"],
                      f"model.doc_batch=-1 is invalid; {want}"),
                     (["experiment=model_kl", path, "model.doc_batch=x"],
                      f"model.doc_batch='x' is invalid; {want}"),
                     (["experiment=model_kl", path, "model.chunk=-1"],
                      f"model.chunk=-1 is invalid; {want} (positions per forward pass"),
                     (["experiment=model_kl", path, "model.chunk=big"],
                      f"model.chunk='big' is invalid; {want} (positions per forward pass")],
                    capsys)


def test_decode_mode_runs_several_documents_one_a_batch(m2):
    """model.mode=decode takes one document a batch (auto), so run.seqs > 1 runs (float64
    weights: equal to parallel mode to float32 noise, as tests/models/test_decode.py); a batch
    of several is one line naming model.doc_batch."""
    from precsim.errors import PrecsimError

    cfg = _cfg(m2, RNE, model__mode="decode", model__dtype="float64")
    dec = run_model_kl(cfg, "cpu", progress=False)
    assert dec.info["doc_batch"] == 1
    par = run_model_kl(_cfg(m2, RNE, model__dtype="float64"), "cpu", progress=False)
    p, d = par.per_step_rel_err, dec.per_step_rel_err
    for n in ("shared", "split"):  # every document as parallel mode (test_decode's tolerance)
        assert d[f"{n}:kl"].shape == (24, 4) and p[f"{n}:kl"].max() > 1e-6
        assert np.abs(p[f"{n}:kl"] - d[f"{n}:kl"]).max() <= 1e-5 * p[f"{n}:kl"].max(), n
    with pytest.raises(PrecsimError, match="model.doc_batch=2 with model.mode=decode "
                                           r"\(2 documents a batch\); allowed: 1 or auto"):
        run_model_kl(_cfg(m2, RNE, model__mode="decode", model__doc_batch=2), "cpu",
                     progress=False)


def test_auto_fits_half_the_free_gpu_memory(m2, monkeypatch):
    """model.doc_batch=auto: on a (faked) CUDA device the largest batch whose estimate
    (placement.estimate for one document, times the batch) fits half the free memory; the CPU,
    decode mode, a device_map plan and a checkpoint to resume: all documents (decode: one)."""
    from precsim.models import placement as pl

    ld = run_mod.prepare(_cfg(m2), "cpu")
    per = pl.estimate(pl.shape_of(ld.model, torch.float32), 1, 5, 24, 24).run()
    cfg = _cfg(m2)
    assert run_mod.doc_batch(cfg, ld, 5, 24) == 4  # the CPU
    ld.device = "cuda"
    for free, want in ((int(2 * per * 2.5), 2), (2 * per - 1, 1), (1, 1), (100 * per, 4)):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d, f=free: (f, 10 * f))
        assert run_mod.doc_batch(cfg, ld, 5, 24) == want, free
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: (2 * per, 0))
    assert run_mod.doc_batch(cfg, ld, 5, 24) == 1
    assert run_mod.doc_batch(_cfg(m2, model__doc_batch=3), ld, 5, 24) == 3
    assert run_mod.doc_batch(_cfg(m2, model__doc_batch=9), ld, 5, 24) == 4
    assert run_mod.doc_batch(_cfg(m2, model__mode="decode"), ld, 5, 1) == 1

    class Saved:
        def saved(self):
            return True
    assert run_mod.doc_batch(cfg, ld, 5, 24, Saved()) == 4
    ld.plan = object()
    assert run_mod.doc_batch(cfg, ld, 5, 24) == 4


def test_several_batches_do_not_checkpoint_and_an_interrupt_keeps_nothing(m2, tmp_path,
                                                                           monkeypatch):
    """With several batches no checkpoint is saved between chunks (the info says so); an
    interrupt stops the run with no partial result (one batch's documents are not the run's)
    and no checkpoint; the rerun completes with the uninterrupted figures."""
    from precsim.checkpoint import Checkpoint

    cfg = _cfg(m2, model__doc_batch=2, model__chunk=8)
    ref = run_model_kl(cfg, "cpu", progress=False, ckpt=Checkpoint(cfg, tmp_path, every_s=1e-9))
    assert "checkpoints_off" in ref.info and "checkpoints" not in ref.info
    assert not (tmp_path / "checkpoint.pt").exists()
    e = interrupted(monkeypatch, "SIGINT@8", cfg, tmp_path,
                    lambda ck: run_model_kl(cfg, "cpu", progress=False, ckpt=ck))
    assert e.partial is None and e.pos is None and e.path is None
    assert not (tmp_path / "checkpoint.pt").exists()
    _same_figures(ref, run_model_kl(cfg, "cpu", progress=False, ckpt=Checkpoint(cfg, tmp_path)))


def test_a_split_plan_runs_each_batch_on_its_copies(m2, monkeypatch):
    """A split plan (forced on two CPU 'devices') with model.doc_batch=2: each batch's schemes
    split across the copies, equal bit for bit to the batched one-device run (SR included: the
    batches' seeds are the same)."""
    from precsim.models import placement as pl

    seen = []

    def place(cfg, dev, ok):
        seen.append(cfg.model.doc_batch)
        need = pl.Need(1, 1, 1, 1, 5, 2, 24, 8)
        return pl.Plan("split", "auto", ["cpu", "cpu"], need, {"cpu": 0},
                       shards=[["fp32", "shared", "split"], ["sr"]], why="test")

    ref = run_model_kl(_cfg(m2, SR, model__doc_batch=2, model__chunk=8), "cpu", progress=False)
    monkeypatch.setattr(run_mod, "place", place)
    res = run_model_kl(_cfg(m2, SR, model__doc_batch=2, model__chunk=8,
                            model__device_map="auto"), "cpu", progress=False)
    assert seen == [2] and res.info["placement"]["shards"][1] == ["sr"]
    _same_figures(ref, res)
    assert res.info["floor"]["noise"] == ref.info["floor"]["noise"]


def test_the_plan_is_sized_for_one_batch(m2, monkeypatch):
    """model.device_map's plan: sized for model.doc_batch documents when that is an integer,
    else (auto, 0) for every document; in generate mode for the prompt and the written
    tokens."""
    from precsim.models import placement as pl

    docs, tokens = [], []
    monkeypatch.setattr(pl, "plan_run", lambda *a, **k: docs.append(k["docs"]) or tokens.append(
        k["tokens"]) or pl.Plan("single", "auto", ["cpu"], pl.Need(1, 1, 1, 1, 5, 1, 24, 24),
                                {"cpu": 1}, why="test"))
    for B in (2, 9, 0, "auto"):
        run_mod.place(_cfg(m2, model__doc_batch=B, model__device_map="auto"), "cpu", True)
    assert docs == [2, 4, 4, 4] and tokens == [24] * 4
    # generation: sized for the prompt and the written tokens
    run_mod.place(_cfg(m2, model__device_map="auto", model__mode="generate",
                       model__new_tokens=6), "cpu", True)
    assert tokens[-1] == 30


def test_task_scoring_batches_draw_their_own_seeds(m2, monkeypatch):
    """task_eval's batches of rows (precsim.models.task.score_rows): the first draws from
    run.seed (its rows' scores are the one-batch run's), each later one from its own batch seed:
    the same row in another batch gets other SR bits. (Contexts of replay.buffer_len tokens:
    rows read whole, not from a shared context: tests/models/test_shared_context.py.)"""
    from precsim.models import parallel
    from precsim.models.run import build_groups, prepare
    from precsim.models.task import Rows, score_rows

    seeds = []
    real = parallel.run_parallel

    def spy(model, ids, groups, cfg, *a, **k):
        seeds.append(cfg.run.seed)
        return real(model, ids, groups, cfg, *a, **k)

    monkeypatch.setattr(parallel, "run_parallel", spy)
    cfg = _cfg(m2, SR, run__seed=5)
    ld = prepare(cfg, "cpu")
    row = np.random.default_rng(4).integers(0, 96, 24)
    rows = Rows([row] * 3, np.array([4] * 3), np.array([20] * 3))
    groups = lambda: build_groups(cfg, torch.float32)  # noqa: E731
    each = score_rows(ld, cfg, rows, groups, budget=1)  # a batch a row
    assert seeds == [5, batch_seed(5, 1), batch_seed(5, 2)]
    seeds.clear()
    whole = score_rows(ld, cfg, rows, groups, budget=10**9)  # one batch
    assert seeds == [5]
    for name in ("fp32", "shared", "split"):
        assert each[name]["lp"].tolist() == [each[name]["lp"][0]] * 3, name
    assert each["sr"]["lp"][0] == whole["sr"]["lp"][0]
    assert len(set(each["sr"]["lp"].tolist())) == 3


def test_out_of_memory_names_the_batch(m2, monkeypatch):
    """Out of memory: the one line names model.doc_batch with its value and batch size."""
    from precsim.errors import PrecsimError

    def oom(*a, **k):
        raise torch.OutOfMemoryError("faked")

    monkeypatch.setattr(run_mod, "run_batch", oom)
    with pytest.raises(PrecsimError, match=r"\(2 document\(s\) x 5 rows .*allowed: a smaller "
                                           r"model.chunk .*, a smaller model.doc_batch \(now "
                                           r"2: 2 of 4 documents a batch\), fewer run.seqs"):
        run_model_kl(_cfg(m2, model__doc_batch=2), "cpu", progress=False)


def test_generation_writes_every_batch_in_one_step_loop(m2, monkeypatch):
    """model.mode=generate in batches: each batch reads its prompts alone, then the batches'
    documents write their tokens together (one step loop over all four on the CPU; on a faked
    GPU in groups of precsim.models.run.step_docs documents, the tails waiting in host memory),
    the same tokens as one batch, a prompt ending inside a ReplaySSM segment (its unfinished
    segment's inputs merged too) included, and the same figures: bit for bit where the prompts
    end on a segment boundary; where they end inside one, to 1e-4 relative (on an AVX-512
    Xeon, 2026-12-07, the split scheme's first generated token's KL differed in the 8th digit
    and its state error at the last full segment's end in the 5th, between one batch and four
    merged ones; not from the scheme's own einsums: the same with those in float64; cause not
    found; on the CI machine of 2026-12-07 they were equal)."""
    from precsim.models import generate as gen_mod

    writes = []
    real = gen_mod.write_tokens

    def spy(model, tail, groups, K, *a, **k):
        writes.append(K)
        return real(model, tail, groups, K, *a, **k)

    monkeypatch.setattr(gen_mod, "write_tokens", spy)
    for steps in (24, 22):  # (22: the prompts end 2 tokens into a segment of 4)
        over = {"model__mode": "generate", "model__new_tokens": 6, "model__chunk": 8,
                "run__steps": steps}
        ref = run_model_kl(_cfg(m2, model__doc_batch=0, **over), "cpu", progress=False)
        writes.clear()
        res = run_model_kl(_cfg(m2, model__doc_batch=1, **over), "cpu", progress=False)
        assert writes == [4] and res.info["write_docs"] == 4 and res.info["doc_batch"] == 1
        if steps % 4 == 0:
            _same_figures(ref, res)
        else:
            _close_figures(ref, res, rtol=1e-4)
        assert res.info["generation"] == ref.info["generation"]
        assert res.info["generations_text"] == ref.info["generations_text"]
    # a (faked) GPU whose free memory holds two documents' tails: two step loops of two
    cfg = _cfg(m2, model__doc_batch=1, model__mode="generate", model__new_tokens=6,
               model__chunk=8)
    ld = run_mod.prepare(cfg, "cpu")
    ld.device = "cuda"
    from precsim.models import placement as pl

    # (the estimate at the bytes these groups' states take, as the run sizes it)
    held = pl.state_bytes(run_mod.build_groups(cfg, torch.float32), ld.compute)
    assert held < 12  # (a float32 scheme holds no residual without error feedback)
    per = pl.estimate(pl.shape_of(ld.model, torch.float32), 1, 5, 24 + 6, 1,
                      state_bytes=held).run()
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: (int(2 * per * 2.5), 0))
    assert run_mod.step_docs(cfg, ld, 5, held) == 2
    assert run_mod.step_docs(cfg, ld, 5) == 1  # (at the most a group can hold: fewer)
    moved = []  # the calls that move a whole tail (map_tensors' recursion calls it too)
    real_t = gen_mod.map_tensors
    monkeypatch.setattr(gen_mod, "map_tensors", lambda objs, fn, memo=None: moved.append(
        isinstance(objs[0], dict) and "handler" in objs[0]) or real_t(objs, fn, memo))
    writes.clear()
    res = run_mod.measure(cfg, ld, cfg.schemes, progress=False)
    assert writes == [2, 2] and res.info["write_docs"] == 2
    assert sum(moved) == 6  # (per loop: each batch's tail to the host, the merged one back)
    ref = run_model_kl(_cfg(m2, model__doc_batch=0, model__mode="generate",
                            model__new_tokens=6, model__chunk=8), "cpu", progress=False)
    _same_figures(ref, res)
    assert res.info["generation"] == ref.info["generation"]


@pytest.mark.parametrize("arch", ["NemotronHForCausalLM", "Qwen3_5ForCausalLM"])
def test_merged_generation_of_hybrid_models_equals_one_batch(arch, tmp_path):
    """Hybrid models (an attention layer's key/value cache, GDN's conv states) write the same
    tokens when their batches' tails are merged as in one batch."""
    build(arch, 0.2).save_pretrained(tmp_path / arch)
    ids = np.random.default_rng(5).integers(0, 96, (3, 16))
    np.save(tmp_path / "ids.npy", ids)

    def run(B):
        return run_model_kl(kl_cfg(tmp_path / arch, RNE, 16, model__ids=str(tmp_path / "ids.npy"),
                                   run__seqs=3, metrics__baseline="fp32", model__doc_batch=B,
                                   model__mode="generate", model__new_tokens=5, model__chunk=8),
                            "cpu", progress=False)
    one, two = run(0), run(2)
    assert two.info["write_docs"] == 3
    _same_figures(one, two)
    assert two.info["generation"] == one.info["generation"]


def test_auto_chunk_holds_every_document_a_pass_where_memory_allows(m2, monkeypatch, tmp_path,
                                                                   capsys):
    """model.chunk=auto (the default): on a (faked) CUDA device the largest of 32,768 .. 2,048
    positions at which every document fits one pass by the doc_batch estimate
    (placement.estimate of one document x the documents, half the free memory), else 2,048;
    on the CPU, in decode mode, under a plan or with an integer doc_batch, 32,768. A run uses
    the chosen chunk (info.chunk) and keeps model.chunk=auto in its config."""
    from precsim.models import placement as pl
    from precsim.models.parallel import AUTO_CHUNKS

    cfg = _cfg(m2)
    assert cfg.model.chunk == "auto"
    ld = run_mod.prepare(cfg, "cpu")
    assert run_mod.auto_chunk(cfg, ld, 5) == 32768  # the CPU
    ld.device = "cuda"
    N = 32768
    ld.ids = np.zeros((4, N), dtype=np.int64)  # (the estimate reads the shape only)
    shape = pl.shape_of(ld.model, torch.float32)
    per = {c: pl.estimate(shape, 1, 5, N, c, state_bytes=12).run() for c in AUTO_CHUNKS}
    assert per[32768] > per[2048]  # (fewer positions a pass: less memory a document)
    for c in AUTO_CHUNKS:  # just room for all 4 documents at c (and at every smaller chunk)
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d, f=2 * 4 * per[c]: (f, f))
        assert run_mod.auto_chunk(cfg, ld, 5) == c
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: (2 * 4 * per[2048] - 1, 0))
    assert run_mod.auto_chunk(cfg, ld, 5) == 2048  # none holds them all: the smallest
    for other in (_cfg(m2, model__mode="decode"), _cfg(m2, model__doc_batch=2)):
        assert run_mod.auto_chunk(other, ld, 5) == 32768
    ld.plan = object()
    assert run_mod.auto_chunk(cfg, ld, 5) == 32768

    seen = []

    def chosen(c, ld_, groups, held):
        seen.append(groups)
        return 8
    monkeypatch.setattr(run_mod, "auto_chunk", chosen)
    res = run_model_kl(_cfg(m2), "cpu", progress=False)
    assert seen == [5] and res.info["chunk"] == 8
    fixed = run_model_kl(_cfg(m2, model__chunk=8), "cpu", progress=False)
    _same_figures(res, fixed)  # (the same passes: the same figures)
    rc, _, err = run_main(["experiment=model_kl", f"model.path={m2 / 'm2'}",
                           f"model.ids={m2 / 'ids.npy'}", "run.steps=24", "run.seqs=4",
                           "metrics.window=8", "replay.buffer_len=4", "metrics.plot=false",
                           "run.progress=false", f"hydra.run.dir={tmp_path / 'auto'}"], capsys)
    assert rc == 0, err
    s = json.loads((tmp_path / "auto" / "summary.json").read_text())
    assert s["config"]["model"]["chunk"] == "auto" and s["info"]["chunk"] == 8


def test_the_allocators_unused_blocks_count_as_free(m2, monkeypatch):
    """A second run in one process: PyTorch's caching allocator holds the first run's freed
    blocks (reserved, not allocated); they are free to the next run and count so."""
    from precsim.models import placement as pl

    ld = run_mod.prepare(_cfg(m2), "cpu")
    per = pl.estimate(pl.shape_of(ld.model, torch.float32), 1, 5, 24, 24).run()
    ld.device = "cuda"
    cfg = _cfg(m2)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: (2 * per - 1, 100 * per))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d: 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d: 0)
    assert run_mod.doc_batch(cfg, ld, 5, 24) == 1
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d: 7 * per)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d: 3 * per)  # 4 per unused
    assert pl.cuda_free(0) == 6 * per - 1
    assert run_mod.doc_batch(cfg, ld, 5, 24) == 2  # (6 per - 1) / 2 per: 2 documents
