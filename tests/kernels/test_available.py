"""When the Triton kernels can run: a triton without ``constexpr_function`` (which the kernels'
format table needs) is refused with a reason before any kernel is compiled."""

from __future__ import annotations

import pytest
from precsim.kernels import why_unavailable

triton = pytest.importorskip("triton")


def test_a_triton_without_constexpr_function_is_refused_with_its_version(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert why_unavailable("cpu") == ""  # the interpreter runs them anywhere
    monkeypatch.delattr(triton, "constexpr_function")
    why = why_unavailable("cpu")
    assert "constexpr_function" in why and triton.__version__ in why
