"""Task scoring reads a context that several rows share once (precsim.models.task.score_rows:
shared_contexts, _score_shared): the contexts' pass keeps the model's cache and every group's
states, repeats them for each row, and the rows continue from there. Against every row read
whole (the same rows, the shared path switched off), on tiny Mamba-2, Nemotron-H (attention
beside Mamba-2: its KV cache is repeated too) and Gated DeltaNet models."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("transformers")

from precsim.config import to_config  # noqa: E402
from precsim.models import task as T  # noqa: E402

C = {"kind": "conventional"}
SCHEMES = {"fp32": {**C, "fmt": "fp32"}, "fp16": {**C, "fmt": "fp16"},
           "fp8": {**C, "fmt": "fp8_e4m3"},
           "split": {"kind": "split", "fmt": "fp32", "read_fmt": "nvfp4"},
           "shared16": {"kind": "shared", "fmt": "fp16"}}


def _rows(rng) -> T.Rows:
    """Contexts of 13 tokens (read to 12 with buffer_len 4, 1 left), of 16 (read to 12, 4
    left), of 3 (no whole segment before the last token: read whole with its rows) and a
    context with one row; 1-4 rows a context of 1-3 tokens each."""
    ids, start, n = [], [], []
    for P, rows in ((13, 3), (13, 4), (13, 2), (16, 2), (16, 3), (3, 3), (9, 1)):
        ctx = rng.integers(0, 96, P)
        for _ in range(rows):
            c = rng.integers(0, 96, int(rng.integers(1, 4)))
            ids.append(np.concatenate([ctx, c]).astype(np.int64))
            start.append(P)
            n.append(c.size)
    return T.Rows(ids, np.asarray(start), np.asarray(n))


@pytest.mark.parametrize("arch,together", [("Mamba2ForCausalLM", None),
                                           ("Mamba2ForCausalLM", 1),
                                           ("NemotronHForCausalLM", 2),
                                           ("Qwen3_5ForCausalLM", None)])
def test_shared_context_read_once_equals_every_row_read_whole(arch, together, tmp_path,
                                                              monkeypatch):
    """``together``: rows a context continued in one pass (None: all of them, as on the CPU;
    1 or 2: as on a GPU short of memory, the contexts' tail copied for each pass)."""
    from conftest import build

    from precsim.models import parallel
    from precsim.models.run import build_groups

    build(arch, 1.0, slow_decay=arch != "Qwen3_5ForCausalLM").save_pretrained(tmp_path / "m")
    cfg = to_config({"model": {"path": str(tmp_path / "m")}, "schemes": SCHEMES,
                     "task": {"name": "mqar"}, "run": {"steps": 8, "progress": False},
                     "metrics": {"window": 8}, "replay": {"buffer_len": 4}})
    ld, _ = T.load(cfg, "cpu")
    rows = _rows(np.random.default_rng(0))
    dt = next(ld.model.parameters()).dtype
    shared, rest = T.shared_contexts(rows, 4)
    assert [[len(c) for c in b] for b in shared] == [[3, 4, 2], [2, 3]]
    assert rest.tolist() == list(range(14, 18))  # the 3-token context's rows and the lone row
    passes = []
    real = parallel.run_parallel

    def counted(model, ids, *a, **k):
        passes.append(ids.shape)
        return real(model, ids, *a, **k)

    monkeypatch.setattr(parallel, "run_parallel", counted)
    if together is not None:
        monkeypatch.setattr(T, "rows_together", lambda ld, groups, K, most: together)
    got = T.score_rows(ld, cfg, rows, lambda: build_groups(cfg, dt), 1 << 20)
    once = sum(a * b for a, b in passes)
    passes.clear()
    monkeypatch.setattr(T, "shared_contexts", lambda r, L: ([], np.arange(len(r.ids))))
    want = T.score_rows(ld, cfg, rows, lambda: build_groups(cfg, dt), 1 << 20)
    whole = sum(a * b for a, b in passes)
    assert once < 0.6 * whole, (once, whole)  # 14 rows' contexts read as 5
    groups = build_groups(cfg, dt)
    assert {g.name for g in groups} == set(got) == set(want)
    for g in groups:
        if g.dither:  # the floor's dither is drawn per pass shape: another draw, not compared
            continue
        np.testing.assert_allclose(got[g.name]["lp"], want[g.name]["lp"], rtol=1e-4,
                                   atol=1e-5, err_msg=g.name)
        np.testing.assert_array_equal(got[g.name]["greedy"], want[g.name]["greedy"],
                                      err_msg=g.name)
    assert np.isfinite(got["fp32"]["lp"]).all()
    assert not np.allclose(got["fp8"]["lp"], got["fp32"]["lp"])  # the formats act


@pytest.mark.gpu
def test_shared_context_on_the_gpu(tmp_path, monkeypatch):
    """On a GPU: the contexts read by the Triton scan (their states handed to the torch schemes
    at a flush), the rows continued on the torch scan, against every row read whole by the
    Triton scan: the same greedy flags, log-likelihoods to float32 noise."""
    import torch
    from conftest import build

    from precsim.models.run import build_groups

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    build("Mamba2ForCausalLM", 0.2, slow_decay=True).save_pretrained(tmp_path / "m")
    cfg = to_config({"model": {"path": str(tmp_path / "m")}, "schemes": SCHEMES,
                     "task": {"name": "mqar"}, "run": {"steps": 8, "progress": False,
                                                        "device": "cuda"},
                     "metrics": {"window": 8}, "replay": {"buffer_len": 16}})
    ld, _ = T.load(cfg, "cuda")
    assert ld.backend == "triton"
    rng = np.random.default_rng(5)
    ids, start, n = [], [], []
    for P in (100, 100, 64, 40):
        ctx = rng.integers(0, 96, P)
        for _ in range(4):
            c = rng.integers(0, 96, 2)
            ids.append(np.concatenate([ctx, c]).astype(np.int64))
            start.append(P)
            n.append(2)
    rows = T.Rows(ids, np.asarray(start), np.asarray(n))
    dt = next(ld.model.parameters()).dtype
    got = T.score_rows(ld, cfg, rows, lambda: build_groups(cfg, dt), 1 << 20)
    monkeypatch.setattr(T, "shared_contexts", lambda r, L: ([], np.arange(len(r.ids))))
    want = T.score_rows(ld, cfg, rows, lambda: build_groups(cfg, dt), 1 << 20)
    for g in build_groups(cfg, dt):
        if g.dither:
            continue
        np.testing.assert_allclose(got[g.name]["lp"], want[g.name]["lp"], rtol=1e-3,
                                   atol=1e-4, err_msg=g.name)
        np.testing.assert_array_equal(got[g.name]["greedy"], want[g.name]["greedy"],
                                      err_msg=g.name)
