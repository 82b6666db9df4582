"""precsim.kernels — fused Triton kernels (GPU engine). See kernels/README in the docs."""

from __future__ import annotations


def why_unavailable(device: str = "cuda") -> str:
    return "the Triton engine is not built yet"


def available(device: str = "cuda") -> bool:
    return False


def run_triton(cfg, device, progress=True):  # pragma: no cover - replaced by the kernel module
    raise NotImplementedError(why_unavailable(device))
