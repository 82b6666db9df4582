"""A checkout's top-level ``kernels/`` folder must not hide an installed ``kernels``.

precsim's Triton kernels live in the repository's top-level ``kernels/`` and install as
``precsim.kernels``. Run from a checkout (``python -m precsim``, ``python -m pytest``), the
checkout is first on ``sys.path``, so a bare ``import kernels`` found that folder rather than
the distribution named ``kernels`` (Hugging Face's, which transformers >= 5.25 requires and
imports): every model load then failed with ``cannot import name 'CUDAProperties' from
'kernels'``. :func:`install` puts a finder first on ``sys.meta_path`` that resolves the bare
name ``kernels`` past any checkout of precsim; where nothing else provides it, the import goes
on as before. precsim itself never imports the bare name.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys


def _checkout(entry: str) -> bool:
    """Whether ``sys.path`` entry ``entry`` is a precsim checkout (its ``kernels/`` is ours)."""
    root = entry or os.getcwd()
    return (os.path.isfile(os.path.join(root, "kernels", "__init__.py"))
            and os.path.isfile(os.path.join(root, "precsim", "shadow.py")))


class SkipCheckoutKernels(importlib.abc.MetaPathFinder):
    """Finds the top-level ``kernels`` on ``sys.path`` without the precsim checkouts in it."""

    def find_spec(self, name, path=None, target=None):
        if name != "kernels" or path is not None:
            return None
        if not any(_checkout(p) for p in sys.path if isinstance(p, str)):
            return None
        rest = [p for p in sys.path if not (isinstance(p, str) and _checkout(p))]
        return importlib.machinery.PathFinder.find_spec(name, rest)


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, SkipCheckoutKernels) for f in sys.meta_path):
        sys.meta_path.insert(0, SkipCheckoutKernels())
