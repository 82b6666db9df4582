"""The Python API: ``simulate(cfg)`` runs a study without Hydra and writes its files;
:func:`run_into` runs a validated config into a run directory as the command line does (a
layer, every layer of a recording, a whole model, a task), reusing a complete result and
resuming a checkpoint; :func:`preflight` checks what a config alone cannot."""

from __future__ import annotations

from pathlib import Path

from . import engines
from .checkpoint import Checkpoint
from .config import Config, to_config
from .result import Result, format_table, load_result, write_outputs
from .rundir import RECORD_FILE, job_log, reusable


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


def run(cfg: Config, progress: bool = True, ckpt=None, sweep_blocks=None) -> RunResult:
    """Run a validated config: a layer on its engine (:func:`precsim.engines.run`; a sweep's
    ``sweep_blocks``: :func:`precsim.compose.sweep_kernels`), or with ``model.path`` a whole
    checkpoint (:func:`precsim.models.run_model_kl`)."""
    if cfg.model.path:
        from .models import run_model_kl

        dev = engines.resolve_device(cfg.run.device)
        if cfg.per_layer.formats is not None:
            from .models.per_layer import run_per_layer

            result = run_per_layer(cfg, dev, progress=progress)
        else:
            result = run_model_kl(cfg, dev, progress=progress, ckpt=ckpt)
    else:
        result = engines.run(at_layer(cfg), progress=progress, ckpt=ckpt,
                             sweep_blocks=sweep_blocks)
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
    if w.layer is None or not Path(w.path or "", RECORD_FILE).is_file():
        raise PrecsimError(f"schemes.{per[0]}.layers with a single trace; allowed: a "
                           "precsim.record directory as workload.path (every layer, or "
                           "workload.layer=N), or model.path (whole-model mode)")
    check_layers_exist(cfg, recorded_layers(Path(w.path)), None, None,
                       f"the recording {w.path}")
    return dataclasses.replace(cfg, schemes={n: scheme_at(s, w.layer)
                                             for n, s in cfg.schemes.items()})


def run_layers(cfg: Config, out: Path, say=print, progress: bool = True,
               sweep_blocks=None) -> dict:
    """Every recorded layer of ``cfg.workload.path`` (:func:`precsim.layers.run_all`), each an
    ordinary run into ``out/layer_XX/`` (reused when complete); the combined summary."""
    from .layers import run_all

    def one(c: Config, sub: Path) -> dict:
        stored = reusable(c, sub)
        return stored if stored is not None else write_outputs(
            c, run(c, progress=progress, sweep_blocks=sweep_blocks), sub)

    return run_all(cfg, out, one, say)


def run_into(cfg: Config, out: Path, say=print, progress: bool = True, task: bool = False,
             note=None, startup_s: float | None = None,
             sweep_blocks=None) -> tuple[str, dict | None]:
    """Run a validated config into the run directory ``out`` as the command line does; returns
    ``(how, summary)``, ``how`` one of ``"task"`` (``task.*`` or ``task``: a task evaluation,
    which prints its own table; no summary), ``"layers"`` (every layer of a recording),
    ``"reused"`` (``out`` held this config's complete result) and ``"run"``. ``say`` prints the
    table and the run's facts, ``note`` (if given) a long run's estimate; ``startup_s`` is
    recorded among the phases; ``sweep_blocks``: a sweep's kernels (:func:`run`). An interrupt
    writes the windows done so far (``complete: false``) and its
    :class:`~precsim.checkpoint.Interrupted` goes on, ``out`` set on it."""
    from .checkpoint import Interrupted, job_signals

    if cfg.task.path or cfg.task.name or task:
        from .models.task import run_task_cli  # experiment=task_eval (docs/tasks.md)

        if cfg.per_layer.formats is not None:  # experiment=per_layer over a task's accuracy
            from .models.per_layer_task import run_cli as run_task_cli
        run_task_cli(cfg, out, say, progress=progress)
        return "task", None
    stored = reusable(cfg, out)
    if stored is not None:
        say(f"precsim: {out} already holds a complete result of this config; reused")
        return "reused", stored
    ck = Checkpoint(cfg, out)
    if not cfg.model.path:  # a run that cannot fit: one line before any allocation
        from .preflight import check_fits, long_run_note  # (whole-model mode sizes its own)

        text = long_run_note(check_fits(cfg))
        if text and note is not None:
            note(text)
    from .layers import is_record_dir

    if is_record_dir(cfg):  # every recorded layer, then the worst layer's verdict
        return "layers", run_layers(cfg, out, say, progress=progress, sweep_blocks=sweep_blocks)
    ck.load()  # another config's checkpoint: a one-line error before the engine starts
    try:
        with ck, job_signals():
            result = run(cfg, progress=progress, ckpt=ck, sweep_blocks=sweep_blocks)
    except Interrupted as e:  # the windows done so far, marked incomplete
        e.out = out
        if e.partial is not None:
            write_outputs(cfg, e.partial, out, complete=False)
        job_log(f"interrupted ({e}) at step {e.pos}; checkpoint {e.path}")
        raise
    if startup_s is not None:
        result.info["phases_s"] = {"startup": round(startup_s, 4),
                                   **result.info.get("phases_s", {})}
    summary = write_outputs(cfg, result, out)
    ck.done()
    say(format_table(summary))
    say(f"\nengine={result.engine} device={result.device} steps={result.steps} "
        f"wall={result.wall_s:.2f}s -> {out}")
    if summary.get("lengths_skipped"):
        say(f"note: metrics.lengths {summary['lengths_skipped']} not reported: no window of "
            f"metrics.window={cfg.metrics.window} ends there")
    return "run", summary


def preflight(c) -> None:
    """Checks that need more than the config, before a run: the device, the engine, the
    memory it needs (a layer-level run), a trace file (every layer of a recording)."""
    import copy

    device = engines.resolve_device(c.run.device)
    engines.resolve_engine(c.run.engine, device)
    if not c.model.path:
        from .preflight import check_fits

        check_fits(c)
    if c.workload.kind == "trace":
        from .layers import is_record_dir
        from .workload import make_workload, recorded_layers

        c = copy.deepcopy(c)
        if is_record_dir(c):  # every layer is replayed: each checked, then the first read
            from .layers import check_record

            check_record(c)
            c.workload.layer = min(recorded_layers(Path(c.workload.path)), default=None)
        make_workload(c)  # reads and checks the file (and run.steps against it)
