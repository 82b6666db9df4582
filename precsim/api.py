"""The Python API: ``simulate(cfg)`` runs a study without Hydra and writes its files."""

from __future__ import annotations

from pathlib import Path

from . import engines
from .checkpoint import Checkpoint
from .config import Config, to_config
from .result import Result, load_result, reusable, write_outputs


class RunResult(Result):
    """The :class:`~precsim.result.Result` of :func:`simulate` and :func:`run`, with the
    verdict the command line prints at the end of a run."""

    def verdict(self, metric: str | None = None, budget: float | None = None) -> str:
        """Each scheme against the budget, the recommended one and its margin
        (:func:`precsim.report.run_verdict`); the config's ``metrics.budget_metric`` /
        ``metrics.budget`` unless given."""
        from .report import run_verdict

        summary = self.summary()
        m = self.config.metrics
        return run_verdict(summary, metric or m.budget_metric,
                           m.budget if budget is None else float(budget),
                           self.run_dir if self.run_dir is not None else "RUN_DIR")


def _judged(result: Result, cfg: Config, run_dir: Path | None = None) -> RunResult:
    """``result`` as a :class:`RunResult` of ``cfg`` (same fields, the same objects)."""
    import dataclasses

    out = RunResult(**{f.name: getattr(result, f.name) for f in dataclasses.fields(Result)})
    out.config = cfg
    if run_dir is not None:
        out.run_dir = run_dir
    return out


def simulate(cfg, out_dir: str | Path | None = None, progress: bool = True) -> RunResult:
    """Run every scheme of ``cfg`` against the float64 truth; write files when ``out_dir``.

    ``cfg`` is a :class:`precsim.config.Config`, a dict or an OmegaConf node (validated here).

    The Result's ``verdict()`` is the budget verdict the command line prints.

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
            return _judged(load_result(Path(out_dir), stored), cfg, Path(out_dir))
        ck = Checkpoint(cfg, Path(out_dir))
        ck.load()
    result = run(cfg, progress=progress, ckpt=ck)
    if out_dir is not None:
        write_outputs(cfg, result, Path(out_dir))
        ck.done()
        result.run_dir = Path(out_dir)
    return result


def run(cfg: Config, progress: bool = True, ckpt=None) -> RunResult:
    """Run a validated config: a layer on its engine (:func:`precsim.engines.run`), or with
    ``model.path`` a whole checkpoint (:func:`precsim.models.run_model_kl`)."""
    if cfg.model.path:
        from .models import run_model_kl

        dev = engines.resolve_device(cfg.run.device)
        if cfg.per_layer.formats is not None:
            from .models.per_layer import run_per_layer

            result = run_per_layer(cfg, dev, progress=progress)
        else:
            result = run_model_kl(cfg, dev, progress=progress, ckpt=ckpt)
    else:
        result = engines.run(at_layer(cfg), progress=progress, ckpt=ckpt)
    return _judged(result, cfg)  # (its summary() and verdict())


def at_layer(cfg: Config) -> Config:
    """A layer-level run of a config with per-layer schemes: each scheme at the replayed layer
    (``workload.layer`` of a record directory)."""
    import dataclasses

    from .config import check_layers_exist, scheme_at
    from .errors import PrecsimError
    from .workload import recorded_layers

    per = [n for n, s in cfg.schemes.items() if s.layers is not None]
    if not per:
        return cfg
    w = cfg.workload
    if w.layer is None or not Path(w.path or "", "record.json").is_file():
        raise PrecsimError(f"schemes.{per[0]}.layers with a single trace; allowed: a "
                           "precsim.record directory as workload.path (every layer, or "
                           "workload.layer=N), or model.path (whole-model mode)")
    check_layers_exist(cfg, recorded_layers(Path(w.path)), None, None,
                       f"the recording {w.path}")
    return dataclasses.replace(cfg, schemes={n: scheme_at(s, w.layer)
                                             for n, s in cfg.schemes.items()})
