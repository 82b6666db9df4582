"""Sweep job directories fit the file system's 255-byte names (``${precsim_short:...}``)."""

from __future__ import annotations

from precsim.compose import short_name


def test_short_names_fit_and_stay_distinct_and_stable():
    short = "experiment=split_nvfp4,run.seed=1"
    assert short_name(short) == short
    long_a = ",".join(f"formats.option_{i}=value_{i}" for i in range(20))
    long_b = long_a.replace("value_19", "value_X")
    a, b = short_name(long_a), short_name(long_b)
    assert len(a.encode()) <= 200 and len(b.encode()) <= 200
    assert a != b  # same prefix, different overrides: different directories
    assert a == short_name(long_a)  # the same overrides find the same directory (resume)
    assert len(short_name("é" * 300).encode()) <= 200  # cut on a character, not a byte
