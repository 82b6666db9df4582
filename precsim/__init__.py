"""precsim — numerical precision simulator for the recurrent state of SSM layers.

``simulate(cfg)`` runs every precision scheme of a config in lockstep with the float64 truth;
``python -m precsim experiment=split_nvfp4`` is the command-line application.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .shadow import install as _install_shadow  # noqa: E402

_install_shadow()  # the checkout's kernels/ does not hide an installed `kernels` (transformers')

__all__ = ["simulate", "__version__"]


def simulate(cfg, out_dir=None, progress: bool = True):
    """See :func:`precsim.api.simulate`."""
    from .api import simulate as _simulate

    return _simulate(cfg, out_dir=out_dir, progress=progress)
