"""The article's table: the shape of error vs length on its workload."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module

from precsim.cli import register_configs
from precsim.config import to_config
from precsim.engines.torch import run as run_torch


def _seed_table(steps: int, heads: int):
    register_configs()
    with initialize_config_module(config_module="precsim.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "experiment=seed_table", f"run.steps={steps}", f"model.heads={heads}",
            "run.progress=false", "metrics.vocab=256"])
    res = run_torch(to_config(cfg), "cpu", progress=False)
    by = {}
    for r in res.rows:
        by.setdefault(r["scheme"], {})[r["step"]] = r["rel_err"]
    return by


# the published split error is 0.09 (the article's table, 32,768 steps); measured on every
# window from step 512 on: 0.0882-0.0897 here (4,096 steps, 4 heads), 0.0876-0.0914 at 32,768
# steps (both splits); limit 0.09 +- 5%, about twice the worst measured distance (2.7%)
SPLIT_PUBLISHED, SPLIT_TOL = 0.09, 0.05


def _check_shape(by, end):
    conv, shared = by["conventional_nvfp4_sr"], by["shared_nvfp4_sr"]
    s32, s16 = by["split_fp32_nvfp4"], by["split_fp16sr_nvfp4"]
    assert shared[256] < 0.5 * conv[256]  # fewer roundings at first...
    assert shared[end] > 3 * shared[256]  # ...but shared error grows with length
    assert conv[end] >= 0.8 and shared[end] >= 0.8  # both lose the signal (0.94-1.1 measured)
    assert max(by["conventional_fp32"].values()) < 1e-5
    for split in (s32, s16):
        vals = [v for k, v in split.items() if k >= 512]
        assert all(abs(v / SPLIT_PUBLISHED - 1) < SPLIT_TOL for v in vals), vals
    # FP16-SR update ~ FP32 update: 0.49% (4,096 steps) and 0.36% (32,768) apart measured
    assert abs(s16[end] / s32[end] - 1) < 0.02


def test_seed_table_shape():
    """4,096 steps, 4 heads (8 s on 2 cores): the published shape, long enough for shared
    to lose the signal (0.94 at the end) while split stays flat at 0.09."""
    _check_shape(_seed_table(4096, 4), 4096)


@pytest.mark.slow
def test_seed_table_shape_32k():
    """The published length: 32,768 steps, 4 heads (74 s on 2 cores, 10 min when they were
    busy). CI runs the same checks at 4,096 steps (test_seed_table_shape)."""
    _check_shape(_seed_table(32768, 4), 32768)
