"""Engines (registry): the float64 truth and every scheme in lockstep, on one device.

``ENGINES`` maps ``run.engine`` to a module (see :mod:`.base` for what a module provides):
``numpy`` (the plain step loop, the readable reference), ``torch`` (vectorised, CPU or CUDA),
``triton`` (fused GPU kernels), ``numba`` (a fused CPU engine, Mamba-2). ``run.engine=auto``
takes the first engine of ``AUTO[device]`` that is installed and supports the config (numba on
the CPU when it is installed and covers the config, else torch). A new engine is one module
plus one entry here.
"""

from __future__ import annotations

import importlib

from ..config import Config
from ..errors import PrecsimError
from ..result import Result
from .base import torch_threads

ENGINES = {"numpy": "precsim.engines.numpy", "torch": "precsim.engines.torch",
           "triton": "precsim.engines.triton", "numba": "precsim.engines.numba_host"}
AUTO = {"cuda": ("triton", "torch"), "cpu": ("numba", "torch")}


def engine_module(name: str):
    return importlib.import_module(ENGINES[name])


def resolve_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise PrecsimError("run.device='cuda' but no CUDA device is visible; allowed here: "
                           "auto, cpu")
    return name


def resolve_engine(name: str, device: str, cfg: Config | None = None) -> str:
    """The engine ``run.engine=name`` means on ``device`` (``auto``: the first that can run)."""
    if name == "auto":
        from precsim.kernels import available

        for cand in AUTO.get(device, ("torch",)):
            if cand == "triton" and not available(device):
                continue
            if cand == "numba":
                nb = engine_module("numba")
                if not nb.available() or (cfg is not None and nb.supports(cfg, device)):
                    continue
            return cand
        return "torch"
    if name == "triton":
        from precsim.kernels import why_unavailable

        why = why_unavailable(device)
        if why:
            here = ["auto", "torch", *(["numpy"] if device == "cpu" else []),
                    *(["numba"] if device == "cpu" and engine_module("numba").available()
                      else [])]
            raise PrecsimError(f"run.engine='triton' is unavailable ({why}); allowed here: "
                               f"{', '.join(here)}")
    if name == "numpy" and device != "cpu":
        raise PrecsimError(f"run.engine='numpy' with run.device={device!r}; allowed: "
                           "run.device=cpu (or another engine)")
    return name


def run(cfg: Config, progress: bool = True, ckpt=None, sweep_blocks=None) -> Result:
    """Run a validated config on the engine and device it asks for; ``ckpt``: its
    :class:`precsim.checkpoint.Checkpoint` (saves and restores the engine's state);
    ``sweep_blocks``: a job of a sweep over schemes (:func:`precsim.compose.sweep_kernels`): the
    Triton engine's kernels take the schemes as runtime arguments, compiled for these block
    sizes too (None: one kernel per configuration)."""
    import torch

    device = resolve_device(cfg.run.device)
    engine = resolve_engine(cfg.run.engine, device, cfg)
    nt = torch_threads(cfg.run.threads)
    if nt is not None and torch.get_num_threads() != nt:
        torch.set_num_threads(nt)
    if engine == "triton":
        tri = engine_module("triton")
        opt = tri.Options() if sweep_blocks is None else tri.Options(
            runtime_codes=None, sweep_blocks=frozenset(sweep_blocks))
        return tri.run(cfg, device, progress=progress, ckpt=ckpt, options=opt)
    return engine_module(engine).run(cfg, device, progress=progress, ckpt=ckpt)


__all__ = ["ENGINES", "AUTO", "engine_module", "resolve_device", "resolve_engine", "run"]
