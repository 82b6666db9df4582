"""tests/gpu/gpu_multi_model.py (issue 27's multi-GPU check) on the CPU: its checkpoint
writer (layer by layer, no whole model in memory) gives a checkpoint transformers loads with no
missing or unexpected key, sized as precsim's placement sizes it; ``--smoke`` runs through."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import load_script

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]


def _script():
    return load_script(ROOT / "tests" / "gpu" / "gpu_multi_model.py")


def test_the_checkpoint_writer_loads_and_is_sized_as_placement_sizes_it(tmp_path):
    import torch

    from precsim.models import placement as pl
    from precsim.models.load import load_model

    g = _script()
    size = g.write_checkpoint(g.qwen3_next_config(4, tiny=True), tmp_path / "c")
    g.check_loads(tmp_path / "c")  # nothing missing, nothing unexpected
    model, _ = load_model(tmp_path / "c")
    assert size == sum(p.numel() * p.element_size() for p in model.parameters())
    assert pl.shape_of(pl.meta_model(tmp_path / "c"), torch.float32).weights >= size
    shards = sorted((tmp_path / "c").glob("model-*.safetensors"))
    assert len(shards) >= 6  # a shard per decoder layer, embeddings, norm, head
    shards[1].unlink()  # an interrupted build: the missing shard is written again
    assert g.write_checkpoint(g.qwen3_next_config(4, tiny=True), tmp_path / "c") == size
    assert shards[1].is_file()
    g.check_loads(tmp_path / "c")


@pytest.mark.slow
def test_smoke_runs_and_the_placed_runs_equal_one_device(tmp_path):
    pytest.importorskip("accelerate")
    assert _script().main(["--smoke", "--work", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "gpu_multi_model.json").read_text())
    assert [r["rc"] for r in res["rows"]] == [0, 0, 0, 0]
    for per in res["fit_compare"].values():
        assert all(v["bit_equal"] for v in per.values())
