"""The command line: ``python -m precsim experiment=NAME [overrides]`` (a Hydra application).

It composes (:mod:`precsim.compose`), validates and calls the Python API (:func:`precsim.api.
run_into`); user errors (bad names, ranges, trace files) end with one line on stderr and exit
status 2 (:mod:`precsim.errors`). Its process's tuning is :mod:`precsim.process`, its patches of
Hydra :mod:`precsim.hydra_patches`.
"""

from __future__ import annotations

import gc
import os
import sys

from precsim import process
from precsim.compose import (  # noqa: F401 - compose_config, register_configs: the CLI's names
    MULTIRUN_FLAGS,
    compose_config,
    register_configs,
)

HELP = """\
precsim: how far does an SSM layer's output drift after N tokens when its recurrent state is
stored in FP16 / FP8 / NVFP4 (conventionally, as a shared ReplaySSM checkpoint, or split into a
master and a read copy), and which scheme is the cheapest within your error budget?

usage: python -m precsim [-m] [GROUP=OPTION | KEY=VALUE ...]      (also: precsim ...)

the three main commands:
  python -m precsim experiment=split_nvfp4
      one run: split FP32+NVFP4 beside conventional FP32 and shared NVFP4-SR; prints a table,
      each scheme's status against the budget and the recommendation
  python -m precsim -m experiment=precision_sweep hydra/launcher=joblib
      a sweep (-m: one job per combination); prints progress and one recommendation at the end
  python -m precsim.report DIR --metric rel_err --budget 0.0625      (also: precsim-report)
      compares every run under DIR and recommends the cheapest configuration within the budget

real models (the models extra: pip install 'precsim[models]'; docs/real-models.md):
  python -m precsim.record --model PATH --text-file doc.txt --tokens 8192 --out rec/
      records a checkpoint's SSM-layer inputs; replay them: workload=trace workload.path=rec/
  python -m precsim experiment=model_kl model.path=PATH model.text=doc.txt
      a whole-model run: every SSM layer's state under each scheme, KL / top-1 of the logits

groups: {groups}
keys (see docs/): run.steps run.seqs run.seed run.out_dir model.heads replay.buffer_len
  schemes.NAME.fmt|rounding|read_fmt|error_feedback metrics.window metrics.budget_metric
  metrics.budget ...
budget (default): metrics.budget_metric=rel_err metrics.budget=0.0625, i.e. the layer output's
  RMS error at the last step <= 1/16 of its RMS (output SNR >= 24 dB)

output files (in outputs/NAME/DATE_ID/, or hydra.run.dir=DIR, or run.out_dir=DIR):
  metrics.csv          per scheme and window: rel_err, kl, top1 (mean, p10/p50/p90), drift
  summary.json         headline figures, bytes per step, config; written last (= complete)
  error_vs_length.png  error, KL and drift vs length, with the budget line
  per_step.npz         per-step rel_err of every scheme
  precsim.log          the log, with the table and verdict
  checkpoint.pt        while a run is unfinished: its state (run.checkpoint_s, default 120 s)
  a sweep directory (multirun/NAME/DATE_ID/) adds sweep_summary.csv, sweep_error_vs_length.png,
  sweep_pareto.png

A finished result is never overwritten: rerunning the same config into its directory reuses it,
another config there is an error. An interrupted run (Ctrl-C, kill, preemption) resumes from its
checkpoint when rerun the same way (run.resume=false: start over; docs/resume.md).
Hydra's own options: --hydra-help; the composed config: --cfg job
"""

_IN_PROCESS_SWEEP = False  # a sweep's jobs ran in this process (Hydra's basic launcher)


def _fail(msg: str) -> None:
    from precsim.errors import print_error

    sys.exit(print_error("precsim", msg))


def main(argv: list[str] | None = None) -> int:
    """The command line; ``argv`` defaults to ``sys.argv[1:]``. Returns the exit status (user
    errors raise ``SystemExit(2)`` after one line on stderr)."""
    args = list(sys.argv[1:] if argv is None else argv)
    from precsim.checkpoint import Interrupted, install_handlers, mark_said, restore_handlers

    collecting = gc.isenabled()
    # SIGINT/SIGTERM: one line and 130/143, no traceback; the try starts at once (a signal
    # during keep_freed_memory's ctypes import was a traceback: tests/app/test_resume.py)
    old_handlers = install_handlers()
    try:
        process.start()  # malloc kept, the collector off while the imports run
        if "--version" in args:  # precsim's own (Hydra's option printed Hydra's)
            from precsim import __version__

            print(f"precsim {__version__}")
            return 0
        if any(a in ("-h", "--help") for a in args):
            from precsim.compose import groups_line

            sys.stdout.write(HELP.format(groups=groups_line()))
            sys.stdout.flush()
            return 0
        if not any(a.startswith("-") and a not in MULTIRUN_FLAGS for a in args):
            process.warm_up(args)  # a run (not --cfg, --info, ...): overlap its one-off costs
        return _main(args)
    except BrokenPipeError:  # e.g. `precsim --help | head -1`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (Interrupted, KeyboardInterrupt) as e:
        if isinstance(e, KeyboardInterrupt):
            import signal

            e = Interrupted(signal.SIGINT)
        from precsim.compose import interrupt_lines
        from precsim.hydra_patches import jobs_left

        for line in interrupt_lines(e, args, jobs_left(e)):
            print(line, file=sys.stderr, flush=True)
        mark_said()  # a watchdog still running exits without a second line
        return e.exit_code
    finally:
        process.join_warm_up()  # no warm-up thread outlives the command
        restore_handlers(old_handlers)
        process.finish(collecting)  # an in-process caller gets its collector back as it was


def entry() -> None:
    """The process entry point (``python -m precsim``, the ``precsim`` script): :func:`main`,
    then, once every file is written, :func:`precsim.process.exit_now` (``os._exit``). Errors
    still exit through ``SystemExit``; so does a sweep (``-m``) whose jobs ran elsewhere, whose
    launcher's exit handlers stop its worker processes (joblib's loky, submitit); a sweep whose
    jobs all ran in this process (Hydra's basic launcher) exits as a single run does."""
    from precsim.checkpoint import mark_process

    mark_process()  # a lost interrupt may end this process hard (checkpoint.watchdog)
    code = main()
    if any(a in MULTIRUN_FLAGS for a in sys.argv[1:]) and not _IN_PROCESS_SWEEP:
        return sys.exit(code)  # a sweep: its launchers' exit handlers stop their workers
    process.exit_now(code)


def _main(args: list[str]) -> int:
    try:
        import hydra
        from omegaconf import DictConfig
    except ImportError as e:  # pragma: no cover
        _fail(f"hydra-core is required for the CLI ({e}); pip install hydra-core")
    from precsim import compose, hydra_patches
    from precsim.checkpoint import Interrupted
    from precsim.errors import is_user_error, one_line
    from precsim.rundir import remove_stub

    if hydra_patches.unsupported_note():
        print(hydra_patches.unsupported_note(), file=sys.stderr, flush=True)
    register_configs()
    # let exceptions reach us unprinted, so user errors become one line (bugs still show a trace)
    os.environ["HYDRA_FULL_ERROR"] = "1"
    fresh_dir: list[bool] = [True]  # whether the run directory is one this process creates
    args = compose.with_run_dir(args)
    try:
        reused = compose.precheck(args, fresh_dir)
    except Exception as e:  # noqa: BLE001 - user errors become one line, bugs a traceback
        if is_user_error(e):
            _fail(one_line(e))
        raise
    if reused is not None:
        c, out, stored = reused
        print(f"precsim: {out} already holds a complete result of this config; reused (nothing "
              "was run or written; delete the directory to redo it)")
        _print_end(c, stored, out, reused=True)
        return 0

    @hydra.main(version_base="1.3", config_path="pkg://precsim.conf", config_name="config")
    def _app(cfg: DictConfig) -> None:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        try:
            _run_app(cfg)
        except Interrupted as e:
            if e.pos is None and fresh_dir[0] and hc.mode == RunMode.RUN:
                remove_stub(hc.runtime.output_dir, hc.job.name)  # no stray folder
            raise
        except Exception as e:
            # a single run ends here with one line; in a sweep the callback records the job's
            # error and the other jobs go on
            if is_user_error(e) and hc.mode == RunMode.RUN:
                if fresh_dir[0]:
                    remove_stub(hc.runtime.output_dir, hc.job.name)
                _fail(one_line(e))
            raise

    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    if any(a in MULTIRUN_FLAGS for a in args):
        hydra_patches.validate_sweeps_lightly()
    saved = sys.argv
    sys.argv = [saved[0] if saved else "precsim", *args]
    try:
        with hydra_patches.one_composition(args):
            _app()
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
    except Exception as e:  # noqa: BLE001 - the last line of defence for one-line errors
        if is_user_error(e):
            GlobalHydra.instance().clear()
            try:  # a key the schema lacks (--cfg job skips the precheck), then a scheme the
                # preset lacks: say which preset has it (not Hydra's `+` hint)
                compose.explain_unknown_key(e)
                compose.explain_missing_scheme(e, compose.overrides_of(args))
            except Exception as better:  # noqa: BLE001
                e = better
            _fail(one_line(e))
        raise
    finally:
        sys.argv = saved
        GlobalHydra.instance().clear()
    return 0


def _run_app(cfg) -> None:
    """One job: its config checked, then :func:`precsim.api.run_into` its directory."""
    import time
    from pathlib import Path

    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from precsim import compose
    from precsim.api import run_into
    from precsim.checkpoint import Interrupted
    from precsim.config import check_preset
    from precsim.preflight import inverted_split_notes
    from precsim.rundir import job_log

    t0 = time.perf_counter()
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    if multirun and str(hc.launcher.get("_target_", "")).endswith(".BasicLauncher"):
        global _IN_PROCESS_SWEEP
        _IN_PROCESS_SWEEP = True  # no worker processes for the exit handlers to stop (entry)
    experiment = hc.runtime.choices.get("experiment")
    check_preset(experiment, cfg.model.path)
    c = compose.checked_config(cfg)
    if c.metrics.plot is None:  # a sweep job draws no PNG of its own unless asked
        c.metrics.plot = not multirun
    say = job_log if multirun else _say
    compose.check_model_vs_trace(hc, c)
    for line in inverted_split_notes(c):  # allowed (a study may want one), but said
        job_log(line, "WARNING")
        if not multirun:
            print(line, file=sys.stderr, flush=True)
    out = Path(c.run.out_dir) if c.run.out_dir else Path(hc.runtime.output_dir)
    process.ready()  # the warm-up joined, the collector on (off for the start-up: main)
    age = process.process_age()
    try:
        how, summary = run_into(c, out, say, progress=not multirun,
                                task=experiment == "task_eval",
                                note=None if multirun else _note,  # a sweep: one process
                                startup_s=None if multirun else age,
                                sweep_blocks=compose.sweep_kernels(hc, c, multirun))
    except Interrupted as e:
        e.job = hc.job.num if multirun else None
        raise
    if how == "task":
        return
    if not multirun:
        _print_end(c, summary, out, reused=how == "reused")
        return
    job_log(_end_text(c, summary, out))
    if how != "layers":
        print(f"precsim: job {hc.job.num} {'reused' if how == 'reused' else 'done'} "
              f"({time.perf_counter() - t0:.1f} s) -> {out}", file=sys.stderr, flush=True)


def _say(text: str) -> None:
    """Print, and keep it in the run's log (precsim.log holds the table and the verdict)."""
    from precsim.rundir import job_log

    print(text)
    job_log(text)


def _note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _end_text(c, summary: dict, out) -> str:
    from precsim import report

    return report.run_verdict(summary, c.metrics.budget_metric, c.metrics.budget, out)


def _print_end(c, summary: dict, out, reused: bool = False) -> None:
    if reused:
        from precsim.result import format_table

        print(format_table(summary))
    (print if reused else _say)("\n" + _end_text(c, summary, out))  # a reuse writes nothing
