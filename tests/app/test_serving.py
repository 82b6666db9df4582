"""precsim.serving: the engines' SSM-state settings and the verdict's next-step line."""

from __future__ import annotations

import pytest

from precsim.config import to_config
from precsim.serving import OPEN, SETTINGS, next_step_line, settings_for

ENGINES = {"vLLM", "SGLang", "TensorRT-LLM"}


def test_fp32_conventional_maps_to_every_engines_float32_setting():
    lines = settings_for({"kind": "conventional", "fmt": "fp32", "rounding": "rne"})
    assert {ln.split()[0] for ln in lines} == ENGINES
    assert all("float32" in ln for ln in lines)
    assert any("--mamba-ssm-cache-dtype float32" in ln for ln in lines)  # vLLM
    assert any("--mamba-ssm-dtype float32" in ln for ln in lines)  # SGLang
    assert any("mamba_ssm_cache_dtype: float32" in ln for ln in lines)  # TensorRT-LLM
    assert next_step_line({"kind": "conventional", "fmt": "fp32"}).startswith("to serve it: ")


def test_fp16_sr_maps_only_to_engines_documenting_fp16_sr():
    scheme = {"kind": "conventional", "fmt": "fp16", "rounding": "sr"}
    documented = {r.engine for r in SETTINGS
                  if (r.fmt, r.rounding) == ("fp16", "sr")
                  and ("stochastic" in r.setting or "stochastic" in r.source)}
    lines = settings_for(scheme)
    assert {ln.split()[0] for ln in lines} == documented
    assert all("stochastic_rounding" in ln or "stochastic-rounding" in ln for ln in lines)
    assert all("float16" in ln for ln in lines)
    # an alias of the format and a SchemeConfig give the same answer; plain FP16 lacks the SR flag
    assert settings_for({"kind": "conventional", "fmt": "float16", "rounding": "sr"}) == lines
    assert not any("stochastic" in ln for ln in settings_for({"kind": "conventional",
                                                               "fmt": "fp16"}))


def test_bf16_sr_is_not_shipped():
    line = next_step_line({"kind": "conventional", "fmt": "bf16", "rounding": "sr"})
    assert line.startswith("no serving engine ships this state format yet")
    assert "with SR: FP16 SR" in line


def test_split_fp32_nvfp4_is_shipped_by_no_engine():
    scheme = {"kind": "split", "fmt": "fp32", "rounding": "rne", "read_fmt": "nvfp4",
              "error_feedback": "none"}
    assert settings_for(scheme) == []
    line = next_step_line(scheme)
    assert line.startswith("no serving engine ships this state format yet (")
    for engine in ENGINES:
        assert engine in line.split("checked")[0]
    assert "closest shipped: FP32 (the master alone" in line


def test_int8_block128_names_the_open_work():
    line = next_step_line({"kind": "conventional", "fmt": "int8_b128", "rounding": "rne"})
    assert line.startswith("no serving engine ships")
    assert "PR #40012 (open)" in line
    ef = next_step_line({"kind": "conventional", "fmt": "int8_b128",
                         "error_feedback": "int8_b128"})
    assert "RFC #55196" in ef and "PR #40012" not in ef


@pytest.mark.parametrize("row", SETTINGS, ids=lambda r: f"{r.engine}:{r.setting[:40]}")
def test_every_row_scheme_is_a_precsim_scheme(row):
    cfg = to_config({"schemes": {"x": dict(row.scheme)}})
    s = cfg.schemes["x"]
    assert (s.kind, s.fmt, s.rounding) == (row.kind, row.fmt, row.rounding)
    assert row.engine in ENGINES and row.version and row.source and row.setting
    assert row.status in ("release", "main")


@pytest.mark.parametrize("work", OPEN, ids=lambda o: f"{o.ref}:{o.fmt}")
def test_open_work_formats_are_precsim_formats(work):
    sch = {"kind": work.kind, "fmt": work.fmt}
    if work.error_feedback != "none":
        sch["error_feedback"] = work.fmt
    to_config({"schemes": {"x": sch}})
