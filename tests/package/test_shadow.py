"""transformers >= 5.25 requires Hugging Face's ``kernels`` and imports it; run from a checkout,
the repository's own top-level ``kernels/`` (precsim.kernels) came first on ``sys.path`` and
every model load failed (``cannot import name 'CUDAProperties' from 'kernels'``); and with it
installed, transformers wraps its scan functions in modules taking ``(*args, **kwargs)``, which
hid their parameter names from precsim's hook (``KeyError: 'hidden_states'``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_a_checkouts_kernels_does_not_hide_an_installed_kernels(tmp_path):
    """From the checkout (first on sys.path), ``import kernels`` finds the installed package
    (here a stand-in right after the checkout on sys.path) once precsim is imported; before,
    the checkout's."""
    site = tmp_path / "site"
    (site / "kernels").mkdir(parents=True)
    (site / "kernels" / "__init__.py").write_text("WHO = 'installed'\n")
    code = ("import sys; sys.path[:0] = [{repo!r}, {site!r}]; {pre}"
            "import kernels; print(getattr(kernels, 'WHO', kernels.__file__))")
    run = [sys.executable, "-c"]
    before = subprocess.run(run + [code.format(repo=str(REPO), site=str(site), pre="")],
                            cwd=REPO, capture_output=True, text=True, check=True).stdout
    after = subprocess.run(run + [code.format(repo=str(REPO), site=str(site),
                                              pre="import precsim; ")],
                           cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert before.strip() == str(REPO / "kernels" / "__init__.py")
    assert after.strip() == "installed"


def test_nothing_else_installed_leaves_the_import_as_before(tmp_path):
    """Without an installed ``kernels`` the bare import goes on as before (the finder steps
    aside); precsim's own kernels stay ``precsim.kernels``."""
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); import precsim, precsim.kernels, "
            "importlib.util as u; s = u.find_spec('kernels'); "
            "print(s.origin if s else None, precsim.kernels.__name__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, check=True).stdout.split()
    import importlib.machinery

    rest = [p for p in sys.path if isinstance(p, str) and Path(p or ".").resolve() != REPO]
    other = importlib.machinery.PathFinder.find_spec("kernels", rest)
    if other is not None and other.origin not in (None, "namespace"):  # (tests/kernels/: ns)
        pytest.skip("a kernels distribution is installed here")
    assert out[0] in ("None", str(REPO / "kernels" / "__init__.py"))
    assert out[1] == "precsim.kernels"


def test_hook_reads_the_parameters_through_a_kernels_wrapper():
    """signature_of: a module whose forward takes (*args, **kwargs) and calls the function it
    closes over (kernels' _create_func_module) yields that function's parameters; a bare
    (*args, **kwargs) callable is a one-line error."""
    import torch

    from precsim.errors import PrecsimError
    from precsim.models.hook import signature_of

    def scan(hidden_states, dt, A, B, C, chunk_size, D=None):
        return hidden_states

    def wrap(func):
        class Func(torch.nn.Module):
            def forward(self, *args, **kwargs):
                return func(*args, **kwargs)
        return Func()

    assert list(signature_of(scan).parameters)[:3] == ["hidden_states", "dt", "A"]
    assert list(signature_of(wrap(scan)).parameters) == list(
        __import__("inspect").signature(scan).parameters)
    with pytest.raises(PrecsimError, match="cannot read the parameters"):
        signature_of(lambda *a, **k: None)
