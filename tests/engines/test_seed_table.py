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


def _check_shape(by, end):
    conv, shared = by["conventional_nvfp4_sr"], by["shared_nvfp4_sr"]
    s32, s16 = by["split_fp32_nvfp4"], by["split_fp16sr_nvfp4"]
    assert shared[256] < 0.5 * conv[256]  # fewer roundings at first...
    assert max(by["conventional_fp32"].values()) < 1e-5
    for split in (s32, s16):
        vals = [v for k, v in split.items() if k >= 512]
        assert all(0.03 < v < 0.2 for v in vals)
        mid = sorted(vals)[len(vals) // 2]
        assert all(abs(v / mid - 1) < 0.25 for v in vals)  # flat: the read error only
    assert abs(s16[end] / s32[end] - 1) < 0.10  # FP16-SR update ~ FP32 update
    return conv, shared


def test_seed_table_shape_short():
    """1,024 steps: the early part of the published shape."""
    by = _seed_table(1024, 2)
    conv, shared = _check_shape(by, 1024)
    assert conv[1024] > 0.8
    assert shared[1024] > 2 * shared[256]  # ...but shared error grows with length


@pytest.mark.slow
def test_seed_table_shape_32k():
    """The full acceptance check: 32,768 steps, 4 heads (several minutes on 2 cores)."""
    by = _seed_table(32768, 4)
    conv, shared = _check_shape(by, 32768)
    assert conv[32768] >= 0.8 and shared[32768] >= 0.8
