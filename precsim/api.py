"""The Python API: ``simulate(cfg)`` runs a study without Hydra and writes its files."""

from __future__ import annotations

from pathlib import Path

from .checkpoint import Checkpoint
from .config import to_config
from .engines import run
from .result import Result, load_result, reusable, write_outputs


def simulate(cfg, out_dir: str | Path | None = None, progress: bool = True) -> Result:
    """Run every scheme of ``cfg`` against the float64 truth; write files when ``out_dir``.

    ``cfg`` is a :class:`precsim.config.Config`, a dict or an OmegaConf node (validated here).

    Example:
        >>> from precsim import simulate
        >>> r = simulate({"schemes": {"c32": {"kind": "conventional"}},
        ...               "model": {"heads": 1, "head_dim": 4, "state_dim": 16},
        ...               "run": {"steps": 64, "progress": False}})
        >>> r.rows[-1]["step"]
        64
    """
    cfg = to_config(cfg)
    ck = None
    if out_dir is not None:  # a complete result is reused, a checkpoint resumed
        stored = reusable(cfg, Path(out_dir))
        if stored is not None:
            return load_result(Path(out_dir), stored)
        ck = Checkpoint(cfg, Path(out_dir))
        ck.load()
    result = run(cfg, progress=progress, ckpt=ck)
    if out_dir is not None:
        write_outputs(cfg, result, Path(out_dir))
        ck.done()
    return result
