"""precsim.kernels — fused Triton kernels: the GPU engine (``run.engine=triton``).

``available(device)`` / ``why_unavailable(device)`` say whether the engine can run here (a CUDA
device with Triton, or any device with ``TRITON_INTERPRET=1``, Triton's CPU interpreter, for
tests); ``run_triton(cfg, device, progress)`` runs a config and returns a
``precsim.engine.Result`` (see :mod:`precsim.kernels.engine`). Settings the kernels do not cover
fall back to the torch engine with a logged note.
"""

from __future__ import annotations

import os


def why_unavailable(device: str = "cuda") -> str:
    """Empty string when the Triton engine can run on ``device``, else the reason."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return ""
    if device != "cuda":
        return f"device={device!r}: Triton kernels need CUDA (or TRITON_INTERPRET=1)"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device is visible"
    return ""


def available(device: str = "cuda") -> bool:
    return why_unavailable(device) == ""


def run_triton(cfg, device, progress=True, **kw):
    """Run ``cfg`` with the fused kernels (``precsim.kernels.engine.run_triton``)."""
    from .engine import run_triton as _run

    return _run(cfg, device, progress, **kw)


__all__ = ["available", "why_unavailable", "run_triton"]
