"""Hydra glue for sweeps (``hydra.callbacks`` in ``conf/config.yaml``; the behaviour is
docs/sweeps.md's "Launchers" and "Resume, failures, directories"). :class:`SweepCallback`:

* **on_job_start** — moves aside the summary of a job whose files are broken (the app redoes
  it); under joblib with several visible GPUs, takes a free GPU (exclusive lock, ``job.num %
  n_gpus`` first, ``torch.cuda.set_device``: ``CUDA_VISIBLE_DEVICES`` would be ignored in a
  reused joblib worker that already initialised CUDA).
* **on_job_end** — a failed job leaves ``error.txt``; under ``-m`` the failure is held back from
  Hydra, so the other jobs run on and the sweep is still aggregated.
* **on_multirun_end** — :func:`precsim.report.aggregate` into the sweep directory; exit status 1
  when a job failed.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from .compose import gpu_count, register_resolvers
from .errors import is_user_error, one_line, user_error_types
from .rundir import BROKEN_SUFFIX, ERROR_FILE, job_log

log = logging.getLogger("precsim")



# Unpickling a callback in a launcher's worker process imports this module: the resolvers must
# exist there before the worker resolves hydra.sweep.dir.
register_resolvers()


def acquire_gpu(n_gpus: int, prefer: int, lock_dir: Path, poll_s: float = 0.5,
                timeout_s: float | None = None) -> tuple[int, Any]:
    """Take an exclusive lock on one of ``n_gpus`` GPUs, trying ``prefer`` first; wait while all
    are taken. Returns ``(gpu index, open lock file)``; closing the file releases the GPU."""
    import fcntl

    lock_dir.mkdir(parents=True, exist_ok=True)
    order = [(prefer + i) % n_gpus for i in range(n_gpus)]
    t0 = time.monotonic()
    while True:
        for i in order:
            f = open(lock_dir / f"gpu{i}.lock", "a")  # noqa: SIM115 - held for the job
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                f.close()
                continue
            return i, f
        if timeout_s is not None and time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"no free GPU among {n_gpus} after {timeout_s} s")
        time.sleep(poll_s)


def _gpu_lock_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"precsim-gpu-locks-{os.getuid()}"


class SweepCallback(Callback):
    """See the module docstring."""

    def __init__(self, aggregate: bool = True, plots: bool = True) -> None:
        self.aggregate = aggregate
        self.plots = plots
        self._gpu_lock: Any = None

    # -- jobs ------------------------------------------------------------------------------
    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        out = Path(config.hydra.runtime.output_dir)
        _set_aside_broken(out)
        if _wants_gpu_spread(config):
            n = gpu_count()
            if n > 1:
                import torch

                from .models.placement import HELD_GPU

                gpu, self._gpu_lock = acquire_gpu(n, int(config.hydra.job.num) % n,
                                                  _gpu_lock_dir())
                torch.cuda.set_device(gpu)
                os.environ[HELD_GPU] = str(gpu)  # model.device_map=auto sees this GPU alone
                log.info("job %s runs on cuda:%d of %d", config.hydra.job.num, gpu, n)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if self._gpu_lock is not None:
            self._gpu_lock.close()
            self._gpu_lock = None
            from .models.placement import HELD_GPU

            os.environ.pop(HELD_GPU, None)
        out = Path(config.hydra.runtime.output_dir)
        err_file = out / ERROR_FILE
        if job_return.status != JobStatus.FAILED:
            if err_file.exists():
                err_file.unlink()  # an earlier attempt failed; this one did not
            return
        from .rundir import atomic_write_text

        exc = job_return._return_value
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        if is_user_error(exc):  # a setting: one line on the terminal, the traceback on file
            first = one_line(exc)
            job_log(f"job failed ({out}): {first}\n{tb}", "ERROR")
            print(f"precsim: job {config.hydra.job.num} failed: {type(exc).__name__}: {first} "
                  f"-> {out}", file=sys.stderr, flush=True)
        else:  # a bug: its traceback on the terminal too
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            log.error("job failed (%s): %s\n%s", out, first, tb)
        atomic_write_text(err_file, f"{type(exc).__name__}: {first}\n\n{tb}")
        if config.hydra.mode == RunMode.MULTIRUN:
            # hold the failure back: Hydra would abort the sweep before aggregation; the exit
            # status comes from on_multirun_end, which finds error.txt
            job_return.status = JobStatus.COMPLETED
            job_return.return_value = None

    # -- sweeps ----------------------------------------------------------------------------
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from .report import aggregate

        sweep_dir = Path(str(config.hydra.sweep.dir))
        if not self.aggregate or not sweep_dir.is_dir():
            return
        metric = str(OmegaConf.select(config, "metrics.budget_metric", default="rel_err"))
        budget = float(OmegaConf.select(config, "metrics.budget", default=0.0625))
        try:  # the plots carry the sweep's budget line and its recommended configuration
            agg = aggregate(sweep_dir, plots=self.plots, budget=(metric, budget))
        except Exception as e:  # noqa: BLE001 - results stay on disk; say why, exit non-zero
            print(f"precsim: error: aggregating {sweep_dir} failed: {e}", file=sys.stderr)
            sys.exit(1)
        print(f"precsim: {agg.n_complete}/{len(agg.jobs)} jobs complete -> {agg.csv_path}")
        _print_sweep_recommendation(config, agg, sweep_dir)
        bad = [j for j in agg.jobs if j.status != "complete"]
        if bad:
            for j in bad:
                print(f"precsim: job {j.name} {j.status}: {j.error or j.status}", file=sys.stderr)
            names = _setting_error_names()
            if all(j.status == "failed" and (j.error or "").split(":")[0] in names for j in bad):
                hint = ("each stopped at a setting: the same command fails the same way; change "
                        "the setting it names")  # not "re-run": that leads nowhere
            else:
                hint = "re-run the same command to redo only those"
            print(f"precsim: error: {len(bad)} of {len(agg.jobs)} jobs did not finish (see "
                  f"{ERROR_FILE} and the log in each); {hint}", file=sys.stderr)
            sys.exit(1)


def _setting_error_names() -> set[str]:
    """The class names of config and input errors (``errors.user_error_types`` and their
    subclasses), as a failed job's ``error.txt`` names its error's class (jobs run by joblib
    or submitit failed in other processes)."""
    out, todo = set(), list(user_error_types())
    while todo:
        c = todo.pop()
        out.add(c.__name__)
        todo.extend(c.__subclasses__())
    return out


def _print_sweep_recommendation(config: DictConfig, agg: Any, sweep_dir: Path) -> None:
    """The sweep-level recommendation under the sweep's budget: the same text as
    ``python -m precsim.report SWEEP_DIR --metric M --budget B``."""
    import shlex

    from . import report

    metric = str(OmegaConf.select(config, "metrics.budget_metric", default="rel_err"))
    budget = float(OmegaConf.select(config, "metrics.budget", default=0.0625))
    try:
        decision = report.decide(agg.jobs, metric, budget)
    except report.ReportError:
        return
    if not any(cs for _, cs, _ in decision):
        return
    print(report.format_decision(decision, metric, None))
    print(f"(the same, with other budgets or a horizon: python -m precsim.report "
          f"{shlex.quote(str(sweep_dir))} --metric {metric} --budget {budget:g})")


def _wants_gpu_spread(config: DictConfig) -> bool:
    if config.hydra.mode != RunMode.MULTIRUN:
        return False
    target = str(OmegaConf.select(config, "hydra.launcher._target_", default="") or "")
    device = OmegaConf.select(config, "run.device", default="auto")
    return "joblib" in target.lower() and device in ("auto", "cuda")


def _set_aside_broken(out: Path) -> None:
    """If ``out`` claims completion but its files do not hold up, move the summary aside (and
    that of each broken layer of a run over every recorded layer, so the redo redoes those)."""
    from .report import check_run_dir, layer_dirs
    from .rundir import SUMMARY_FILE, interrupted_at

    for d in layer_dirs(out):
        _set_aside_broken(out / d)
    summary = out / SUMMARY_FILE
    if not summary.is_file() or interrupted_at(out) is not None:  # interrupted: resumes
        return
    why = check_run_dir(out)
    if why is not None:
        summary.replace(summary.with_name(SUMMARY_FILE + BROKEN_SUFFIX))
        log.warning("%s: %s; redoing the job", out, why)
