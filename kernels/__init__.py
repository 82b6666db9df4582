"""precsim.kernels — fused Triton kernels (plain tensors and ints in; no precsim config).

``mamba2`` / ``gdn``: the fused decode kernels and their keyword launchers; ``codes``: the slot
code layout and dispatch order; ``quant`` / ``rng``: fake quantisation and counter-based random
bits, bit-identical to ``precsim.formats``; ``metrics``: fused window metrics; ``inputs``: the
counter-based normals. The host driver is ``precsim.engines.triton``.

``available(device)`` / ``why_unavailable(device)`` say whether the kernels can run here (a CUDA
device with Triton, or any device with ``TRITON_INTERPRET=1``, Triton's CPU interpreter, for
tests).
"""

from __future__ import annotations

import os


def why_unavailable(device: str = "cuda") -> str:
    """Empty string when the Triton kernels can run on ``device``, else the reason."""
    try:
        import triton
    except ImportError:
        return "triton is not installed"
    if not hasattr(triton, "constexpr_function"):  # kernels.quant unrolls the format table
        return (f"triton {getattr(triton, '__version__', '?')} lacks triton.constexpr_function, "
                "which the kernels use (a newer triton has it: torch 2.11's 3.6 does)")
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


__all__ = ["available", "why_unavailable"]
