"""The command line: ``python -m precsim experiment=NAME [overrides]`` (a Hydra application).

This module holds the Hydra app, the registration of the config schema and of the resolvers the
configs use (``${precsim_uid:}``, ``${precsim_gpus:}``), and the rule that user errors (bad names,
ranges, trace files) end with one line on stderr and exit status 2.
"""

from __future__ import annotations

import contextlib
import gc
import os
import secrets
import sys


def process_age() -> float | None:
    """Seconds since this process started (Linux: ``/proc``, 10 ms resolution; None elsewhere):
    the start-up phase includes the interpreter and every import before our first line."""
    try:
        with open("/proc/self/stat") as f:
            start = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: start, clock ticks
        with open("/proc/uptime") as f:
            up = float(f.read().split()[0])
        return max(0.0, up - start / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def keep_freed_memory() -> None:
    """glibc's malloc (Linux): serve blocks below 32 MB from the heap and keep freed memory for
    reuse (``M_MMAP_THRESHOLD`` 32 MB, ``M_TRIM_THRESHOLD`` 1 GB) instead of mapping each large
    block afresh and returning it when freed. A run frees and reallocates its per-window arrays
    (inputs, outputs, the KL's logits: 1-10 MB each) every window; with the defaults each one
    came back as fresh pages, and the first touch of a page costs a fault: a 32K-step run on 8
    heads took 457,000 page faults and 0.9 s of system time, 150,000 and 0.4-0.5 s with these
    (engine 4.3 -> 3.9 s on a 2-core VM). The command line owns its process, so it sets them
    here; the memory a run peaks at is unchanged, it is only not given back before the exit."""
    if not sys.platform.startswith("linux"):
        return
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (ValueError, OSError, AttributeError):  # not glibc
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 32 << 20)  # glibc's largest allowed value
    mallopt(m_trim_threshold, 1 << 30)


def _fail(msg: str) -> None:
    from precsim.errors import print_error

    sys.exit(print_error("precsim", msg))


# -- registration ------------------------------------------------------------------------------
def _uid() -> str:
    """A short suffix unique among runs started in the same second (pid + random)."""
    return f"{os.getpid():x}{secrets.token_hex(2)}"


def gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no torch/CUDA means no GPU to spread over
        return 0


def register_resolvers() -> None:
    """``${precsim_uid:}`` (cached per config, so every job of a sweep agrees on it),
    ``${precsim_gpus:}`` (visible CUDA devices, at least 1) and ``${precsim_short:NAME}`` (a
    directory name cut to fit, :func:`short_name`). Call before Hydra resolves dirs."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("precsim_uid"):
        OmegaConf.register_new_resolver("precsim_uid", _uid, use_cache=True)
    if not OmegaConf.has_resolver("precsim_gpus"):
        OmegaConf.register_new_resolver("precsim_gpus", lambda: max(1, gpu_count()),
                                        use_cache=True)
    if not OmegaConf.has_resolver("precsim_short"):
        OmegaConf.register_new_resolver("precsim_short", short_name)


def short_name(name: str, limit: int = 200) -> str:
    """A sweep job's directory name within the file system's 255 bytes: ``name`` itself, or its
    first characters and a hash of the whole (the same overrides, the same name: resume works)."""
    import zlib

    name = str(name)
    if len(name.encode()) <= limit:
        return name
    return name.encode()[:limit - 9].decode(errors="ignore") + f"~{zlib.crc32(name.encode()):08x}"


def register_configs() -> None:
    """Register the schema with Hydra's ConfigStore (called by the CLI and by tests)."""
    from hydra.core.config_store import ConfigStore

    from precsim.config import Config

    register_resolvers()  # ${precsim_uid:} in hydra.run.dir / hydra.sweep.dir
    ConfigStore.instance().store(name="precsim_schema", node=Config)


# -- the app -----------------------------------------------------------------------------------
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

_MULTIRUN_FLAGS = ("-m", "--multirun")
_HELP_FLAGS = ("-h", "--help")


def _group_options() -> dict[str, list[str]]:
    """The presets of each config group (``conf/<group>/*.yaml``)."""
    from importlib.resources import files

    conf = files("precsim.conf")
    return {g: sorted(p.name[:-5] for p in conf.joinpath(g).iterdir() if p.name.endswith(".yaml"))
            for g in ("experiment", "model", "schemes", "workload")}


def _groups() -> str:
    return "  ".join(f"{g}={'|'.join(names)}" for g, names in _group_options().items())


def _check_group(group: str, value) -> None:
    from precsim.errors import PrecsimError

    names = _group_options()[group]
    if isinstance(value, str) and value in names:
        return
    if group == "schemes" and isinstance(value, dict):
        return  # schemes={...}: a whole dict of schemes
    raise PrecsimError(f"{group}={value!r} is unknown; allowed: {', '.join(names)}")


def main(argv: list[str] | None = None) -> int:
    """The command line; ``argv`` defaults to ``sys.argv[1:]``. Returns the exit status (user
    errors raise ``SystemExit(2)`` after one line on stderr)."""
    args = list(sys.argv[1:] if argv is None else argv)
    from precsim.checkpoint import Interrupted, install_handlers, restore_handlers

    collecting = gc.isenabled()
    # SIGINT/SIGTERM: one line and 130/143, no traceback; the try starts at once (a signal
    # during keep_freed_memory's ctypes import was a traceback: tests/app/test_resume.py)
    old_handlers = install_handlers()
    try:
        keep_freed_memory()
        # no cyclic garbage collection while the imports run (the collections they set off took
        # 0.37 s of a 1.7 s start-up on the 2-core machine): on again, the imports' objects
        # frozen out of it, before the engine (_run_app) and on the way out. The few cycles the
        # imports leave unreachable (~10,000 objects, a few MB) are frozen too and kept till the
        # exit: a full collection first would cost 0.18 s of the 0.37
        gc.disable()
        if "--version" in args:  # precsim's own (Hydra's option printed Hydra's)
            from precsim import __version__

            print(f"precsim {__version__}")
            return 0
        if any(a in _HELP_FLAGS for a in args):
            sys.stdout.write(HELP.format(groups=_groups()))
            sys.stdout.flush()
            return 0
        if not any(a.startswith("-") and a not in _MULTIRUN_FLAGS for a in args):
            _warm_up(args)  # a run (not --cfg, --info, ...): overlap its one-off costs
        return _main(args)
    except BrokenPipeError:  # e.g. `precsim --help | head -1`: the reader left; not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except (Interrupted, KeyboardInterrupt) as e:
        if isinstance(e, KeyboardInterrupt):
            import signal

            e = Interrupted(signal.SIGINT)
        for line in _interrupt_lines(e, args):
            print(line, file=sys.stderr, flush=True)
        from precsim.checkpoint import mark_said

        mark_said()  # a watchdog still running exits without a second line
        return e.exit_code
    finally:  # an in-process caller (tests, a notebook) gets its collector back as it was
        # and no warm-up thread outlives the command: one still initialising CUDA when the
        # interpreter exits (a one-line error within a second of the start) aborted the
        # process (`terminate called without an active exception`, exit 134, on the H200)
        _join_warm_up()
        restore_handlers(old_handlers)
        gc.unfreeze()
        if collecting:
            gc.enable()


def entry() -> None:
    """The process entry point (``python -m precsim``, the ``precsim`` script): :func:`main`,
    then, once every file is written and the streams and logs are flushed, ``os._exit``: the
    interpreter's teardown (CUDA's context, torch's and Triton's modules) took 0.5-0.7 s of each
    GPU process and has nothing left to write. Errors still exit through ``SystemExit``; so does
    a sweep (``-m``) whose jobs ran elsewhere, whose launcher's exit handlers stop its worker
    processes (joblib's loky, submitit); a sweep whose jobs all ran in this process (Hydra's
    basic launcher: :data:`_IN_PROCESS_SWEEP`) exits as a single run does."""
    from precsim.checkpoint import mark_process

    mark_process()  # a lost interrupt may end this process hard (checkpoint.watchdog)
    code = main()
    if any(a in _MULTIRUN_FLAGS for a in sys.argv[1:]) and not _IN_PROCESS_SWEEP:
        return sys.exit(code)  # a sweep: its launchers' exit handlers stop their workers
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more to say
            pass
    os._exit(code)


def _main(args: list[str]) -> int:
    try:
        import hydra
        from omegaconf import DictConfig
    except ImportError as e:  # pragma: no cover
        _fail(f"hydra-core is required for the CLI ({e}); pip install hydra-core")
    register_configs()
    # let exceptions reach us unprinted, so user errors become one line (bugs still show a trace)
    os.environ["HYDRA_FULL_ERROR"] = "1"
    fresh_dir: list[bool] = [True]  # whether the run directory is one this process creates
    args = _with_run_dir(args)
    try:
        if _precheck(args, fresh_dir):
            return 0
    except Exception as e:  # noqa: BLE001 - user errors become one line, bugs a traceback
        if is_user_error(e):
            _fail(one_line(e))
        raise

    from precsim.checkpoint import Interrupted

    @hydra.main(version_base="1.3", config_path="pkg://precsim.conf", config_name="config")
    def _app(cfg: DictConfig) -> None:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        try:
            _run_app(cfg)
        except Interrupted as e:
            if e.pos is None and fresh_dir[0] and HydraConfig.get().mode == RunMode.RUN:
                remove_stub(HydraConfig.get())  # nothing of this run in it: no stray folder
            raise
        except Exception as e:
            # a single run ends here with one line; in a sweep the callback records the job's
            # error and the other jobs go on
            if is_user_error(e) and HydraConfig.get().mode == RunMode.RUN:
                if fresh_dir[0]:
                    remove_stub(HydraConfig.get())
                _fail(one_line(e))
            raise

    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    if any(a in _MULTIRUN_FLAGS for a in args):
        _validate_sweeps_lightly()
    saved = sys.argv
    sys.argv = [saved[0] if saved else "precsim", *args]
    try:
        with _one_composition(args):
            _app()
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
    except Exception as e:  # noqa: BLE001 - the last line of defence for one-line errors
        if is_user_error(e):
            GlobalHydra.instance().clear()
            try:  # a scheme the preset lacks: say which preset has it (not Hydra's `+` hint)
                _explain_missing_scheme(e, args)
            except Exception as better:  # noqa: BLE001
                e = better
            _fail(one_line(e))
        raise
    finally:
        sys.argv = saved
        GlobalHydra.instance().clear()
    return 0


@contextlib.contextmanager
def _one_composition(args: list[str]):
    """Hydra's main composes the whole config twice: once only to read ``hydra.mode``
    (``Hydra.get_mode``, which returns None on any error), then again to run (0.25-0.45 s each
    on the 2-core machine). No packaged config sets ``hydra.mode`` (tests/app/test_cli.py
    checks), so where no override sets it and no option points Hydra at other configs, the
    probe's answer is None and this skips it: -m or not then picks the mode, as after the
    probe. Hydra's own options (``--cfg``, ``-cd``, ...) go the usual way."""
    try:
        from hydra._internal.hydra import Hydra
    except ImportError:  # pragma: no cover - another Hydra: the usual way
        Hydra = None
    keys = {a.split("=", 1)[0].lstrip("+~") for a in args if not a.startswith("-")}
    if (Hydra is None or not callable(getattr(Hydra, "get_mode", None)) or "hydra.mode" in keys
            or any(a.startswith("-") and a not in _MULTIRUN_FLAGS for a in args)):
        yield
        return
    probe = Hydra.get_mode
    Hydra.get_mode = lambda self, config_name, overrides: None
    try:
        yield
    finally:
        Hydra.get_mode = probe


def _warm_up(args: list[str]) -> None:
    """Start, in a daemon thread, the one-off costs the run will pay later, so they overlap the
    main thread's work (Hydra's import and setup, the run directory): ``import torch``, CUDA's
    context, cuBLAS's libraries, Triton's per-process cache key (a hash of its installation,
    ~0.4 s on the H200 machine), the Triton kernels (:func:`_warm_kernels`) and matplotlib.
    Nothing starts that the overrides rule out
    (``run.device=cpu``: no CUDA; ``metrics.plot=false``: no matplotlib)."""
    import threading

    def given(key: str) -> str | None:
        vals = [a.split("=", 1)[1] for a in args if a.lstrip("+").startswith(key + "=")]
        return vals[-1].strip().lower() if vals else None

    cuda_wanted = given("run.device") != "cpu"
    plot_wanted = given("metrics.plot") not in ("false", "0", "no", "off")

    def work():
        try:
            import torch

            if cuda_wanted and torch.cuda.is_available():
                torch.cuda.init()
                for dt in (torch.float32, torch.float64):  # load cuBLAS (the KL's matmuls)
                    x = torch.ones(8, 8, dtype=dt, device="cuda")
                    (x @ x).sum().item()
                from triton.runtime.cache import triton_key

                triton_key()
                if given("run.engine") in (None, "auto", "triton"):
                    _warm_kernels()
            if plot_wanted:
                import matplotlib

                matplotlib.use("Agg")
                import matplotlib.pyplot  # noqa: F401
        except Exception:  # noqa: BLE001 - a warm-up only; the run itself reports errors
            pass

    t = threading.Thread(target=work, name="precsim-warm-up", daemon=True)
    t.start()
    _WARM_UP.append(t)


def _warm_kernels() -> None:
    """The Triton engine's one-off host work that needs no launch (~0.1 s of a process's first
    run otherwise, measured on the H200 machine): importing the kernels (Triton reads and
    parses each function's source), Triton's CUDA driver (its launcher stubs, a subprocess for
    the CUDA library path) and its lazily imported compiler modules, and each kernel's source
    hash (an AST walk over the function and its callees)."""
    import importlib

    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    driver.active.get_current_device()
    for name in ("triton.compiler.compiler", "triton.experimental.gluon"):
        importlib.import_module(name)
    for name in ("mamba2", "gdn", "metrics", "inputs"):
        mod = importlib.import_module(f"precsim.kernels.{name}")
        for fn in vars(mod).values():
            if isinstance(fn, JITFunction):
                fn.cache_key  # noqa: B018 - computed once and kept by the function


_WARM_UP: list = []  # the warm-up thread of this process, joined before the engine starts
_IN_PROCESS_SWEEP = False  # a sweep's jobs ran in this process (Hydra's basic launcher)


def _join_warm_up(timeout: float = 30.0) -> None:
    """Let the warm-up finish before the engine runs: its one-off work then overlaps Hydra's
    setup only, instead of racing the engine's first kernels (two threads hashing Triton's
    installation at once)."""
    while _WARM_UP:
        _WARM_UP.pop().join(timeout)


def _precheck(args: list[str], fresh_dir: list[bool]) -> bool:
    """Everything that can be checked before Hydra creates a run directory: the override keys
    (against the schema), and for a single run the whole config, the device, the engine, a trace
    file and a complete result already in an explicit output directory. Returns True when that
    result is reused (nothing left to do)."""
    from pathlib import Path

    from hydra.core.override_parser.overrides_parser import OverridesParser

    from precsim.config import check_key
    from precsim.errors import PrecsimError

    flags = [a for a in args if a.startswith("-")]
    if any(f not in _MULTIRUN_FLAGS for f in flags):
        return False  # Hydra's own options (--cfg, -cn, ...): Hydra handles them
    overrides = [a for a in args if not a.startswith("-")]
    _check_words_and_launcher(overrides)
    parsed = OverridesParser.create().parse_overrides(overrides)
    run_dir = None
    for o in parsed:
        key = o.key_or_group
        if key == "hydra.run.dir":
            run_dir = o.value()
        if key.startswith("hydra") or "/" in key or o.package:
            continue
        check_key(key)
        if key in _group_options() and not o.is_delete():
            _check_group(key, o.value())
    _check_output_dirs(parsed, multirun=bool(flags))  # before Hydra makes any of them
    if flags:  # a sweep: each job is checked as it runs; a failed job leaves error.txt
        return False
    explicit = run_dir is not None or any(o.key_or_group == "run.out_dir" for o in parsed)
    if not explicit:
        # Hydra's default directory is a new, unique one: the app validates the config (a
        # failed run's stub directory is removed), no second composition here (~0.3 s)
        return False
    given = [(o.key_or_group, o.value()) for o in parsed
             if o.key_or_group in ("hydra.run.dir", "run.out_dir")]
    for key, v in given:  # a file there: the run would end in a traceback after all its work
        if isinstance(v, str) and "${" not in v and Path(v).exists() and not Path(v).is_dir():
            raise PrecsimError(f"{key}={v!r} is an existing file, not a directory; allowed: a "
                               "directory (new, or one holding this config's result)")
    given = [v for _, v in given]
    if all(isinstance(v, str) and "${" not in v and not Path(v).exists() for v in given):
        # new directories hold no result to reuse: the app validates (removing the stub of a
        # run that fails), no second composition here (~0.3 s of every such command)
        fresh_dir[0] = run_dir is not None
        return False
    user = [a for a, o in zip(overrides, parsed, strict=True)
            if not (o.key_or_group.startswith("hydra") or o.package)]
    c = compose_config(user)
    _preflight(c)
    out = c.run.out_dir or (run_dir if isinstance(run_dir, str) and "${" not in run_dir
                            else None)
    if out is None:
        return False
    out = Path(out)
    fresh_dir[0] = run_dir is not None and not Path(run_dir).exists()
    from precsim.result import reusable

    stored = reusable(c, out)
    if stored is None:
        return False
    print(f"precsim: {out} already holds a complete result of this config; reused (nothing "
          "was run or written; delete the directory to redo it)")
    _print_end(c, stored, out, reused=True)
    return True


# the launcher presets and the plugin (and the extra that installs it) each one needs
_LAUNCHER_PLUGINS = {"joblib": "hydra_joblib_launcher", "joblib_gpus": "hydra_joblib_launcher",
                     "submitit_local": "hydra_submitit_launcher",
                     "submitit_slurm": "hydra_submitit_launcher",
                     "slurm_gpu": "hydra_submitit_launcher"}


def _check_words_and_launcher(overrides: list[str]) -> None:
    """Before Hydra parses the overrides: a bare word (``split_nvfp4``: Hydra's "missing
    EQUAL") names the override it most likely meant; ``hydra/launcher=joblib`` (or a SLURM or
    submitit launcher) without its Hydra plugin names the extra that installs it."""
    import importlib.util

    from precsim.errors import PrecsimError

    for a in overrides:
        if "=" in a or a.startswith("~"):
            continue
        groups = [g for g, names in _group_options().items() if a in names]
        hint = (f"did you mean {groups[0]}={a}?" if groups else
                "allowed: KEY=VALUE or GROUP=OPTION (python -m precsim --help lists them)")
        raise PrecsimError(f"{a!r} is not an override (KEY=VALUE); {hint}")
    for a in overrides:
        key, _, value = a.lstrip("+").partition("=")
        plugin = _LAUNCHER_PLUGINS.get(value) if key == "hydra/launcher" else None
        if plugin and importlib.util.find_spec(f"hydra_plugins.{plugin}") is None:
            raise PrecsimError(
                f"hydra/launcher={value} needs Hydra's {plugin.replace('_', '-')} plugin, which "
                "is not installed; allowed: pip install 'precsim[sweep]' (the joblib and "
                "submitit launchers), or no hydra/launcher (jobs run one after another)")


def _check_output_dirs(parsed, multirun: bool) -> None:
    """Every directory the command writes can be written: ``hydra.run.dir`` (a sweep:
    ``hydra.sweep.dir``; Hydra's defaults under the working directory when not given) and
    ``run.out_dir``; not a file, not under one, not read-only (preflight.writable_dir). Of a
    value with an interpolation (``outputs/${name}/...``), the part before it."""
    from precsim.preflight import writable_dir

    keys = ("hydra.sweep.dir",) if multirun else ("hydra.run.dir",)
    given = {o.key_or_group: o.value() for o in parsed
             if o.key_or_group in (*keys, "run.out_dir")}
    for key in keys:  # Hydra's default (conf/config.yaml): under the working directory
        given.setdefault(key, "multirun" if multirun else "outputs")
    for key, v in given.items():
        if not isinstance(v, str) or not v:
            continue
        static = v if "${" not in v else (v.split("${", 1)[0].rpartition("/")[0] or ".")
        writable_dir(key, static, shown=v)


def _with_run_dir(args: list[str]) -> list[str]:
    """``run.out_dir=DIR`` of a single run without ``hydra.run.dir``: Hydra's run directory
    (its ``.hydra/`` and ``precsim.log``) is DIR too, so nothing is left under ``outputs/``."""
    if any(a in _MULTIRUN_FLAGS or a.startswith("-") for a in args):
        return args
    keys = [a.split("=", 1)[0].lstrip("+") for a in args]
    if "hydra.run.dir" in keys or "run.out_dir" not in keys:
        return args
    value = [a.split("=", 1)[1] for a, k in zip(args, keys, strict=True) if k == "run.out_dir"][-1]
    if value.strip() in ("", "null", "None", "~"):
        return args
    return [*args, f"hydra.run.dir={value}"]


def compose_config(overrides: list[str]):
    """The validated Config the app would get for ``overrides`` (Hydra's compose API)."""
    from hydra import compose, initialize_config_module
    from hydra.errors import ConfigCompositionException

    from precsim.config import to_config

    try:
        with initialize_config_module(config_module="precsim.conf", version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides)
    except ConfigCompositionException as e:
        _explain_missing_scheme(e, overrides)
        raise
    return _to_config(cfg, to_config)


def _to_config(cfg, to_config):
    from omegaconf.errors import OmegaConfBaseException

    from precsim.errors import PrecsimError

    try:
        return to_config(cfg)
    except OmegaConfBaseException as e:
        raise PrecsimError(str(e).splitlines()[0]) from None


def _explain_missing_scheme(e: Exception, overrides: list[str]) -> None:
    """``schemes.candidate.fmt=...`` where the chosen schemes preset has no ``candidate``: say
    which schemes there are and which preset defines it (instead of Hydra's ``+`` hint)."""
    import re
    from importlib.resources import files

    from hydra import compose, initialize_config_module

    from precsim.errors import PrecsimError

    m = re.search(r"Could not override '(schemes\.([^.']+)[^']*)'", str(e))
    if not m:
        return
    name = m.group(2)
    rest = [o for o in overrides
            if not o.lstrip("+~").startswith((f"schemes.{name}.", f"schemes.{name}="))]
    try:
        with initialize_config_module(config_module="precsim.conf", version_base="1.3"):
            have = list(compose(config_name="config", overrides=rest).schemes)
    except Exception:  # noqa: BLE001 - the plain message below still names the key
        have = []
    import yaml

    presets = sorted(p.name[:-5] for p in files("precsim.conf").joinpath("schemes").iterdir()
                     if p.name.endswith(".yaml")
                     and name in (yaml.safe_load(p.read_text()) or {}))
    where = (f"; schemes={presets[0]} defines it (add schemes={presets[0]} before "
             f"{m.group(1)})" if presets else
             "; a scheme of your own: schemes=single and schemes.candidate.KEY=VALUE (the "
             "preset's one scheme beside FP32), or replace them all: '~schemes' "
             f"'+schemes={{{name}: {{kind: split, fmt: fp32, read_fmt: nvfp4}}}}'")
    raise PrecsimError(f"unknown scheme schemes.{name} in {m.group(1)}; this config's schemes "
                       f"are: {', '.join(have) or '?'}{where}") from None


def _preflight(c) -> None:
    """Checks that need more than the config: the device, the engine, a trace file."""
    import copy

    from precsim.engines import resolve_device, resolve_engine

    device = resolve_device(c.run.device)
    resolve_engine(c.run.engine, device)
    if not c.model.path:
        from precsim.preflight import check_fits

        check_fits(c)
    if c.workload.kind == "trace":
        from pathlib import Path

        from precsim.layers import is_record_dir
        from precsim.workload import make_workload, recorded_layers

        c = copy.deepcopy(c)
        if is_record_dir(c):  # every layer is replayed: each checked, then the first read
            from precsim.layers import check_record

            check_record(c)
            c.workload.layer = min(recorded_layers(Path(c.workload.path)), default=None)
        make_workload(c)  # reads and checks the file (and run.steps against it)


def remove_stub(hc) -> None:
    """Remove the directory Hydra made for a run that then failed validation, but only when it
    holds nothing except Hydra's ``.hydra/`` and the job's log (never a result)."""
    import shutil
    from pathlib import Path

    out = Path(hc.runtime.output_dir)
    allowed = {".hydra", f"{hc.job.name}.log"}
    if out.is_dir() and all(p.name in allowed for p in out.iterdir()):
        shutil.rmtree(out, ignore_errors=True)
        cwd = Path.cwd().resolve()
        for parent in out.resolve().parents:  # e.g. outputs/NAME/ left empty: remove it too
            if parent == cwd or cwd not in parent.parents:
                break
            try:
                parent.rmdir()  # only when empty
            except OSError:
                break


def user_error_types() -> tuple:
    """The bases of config and input errors: ours, Hydra's, OmegaConf's."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from precsim.errors import PrecsimError

    return PrecsimError, OmegaConfBaseException, HydraException


def is_user_error(e: BaseException) -> bool:
    """Config and input errors (:func:`user_error_types`), as opposed to bugs."""
    return isinstance(e, user_error_types())


def one_line(e: BaseException) -> str:
    """Collapse a multi-line Hydra/OmegaConf message into one line that keeps the key."""
    text = str(e)
    if e.__cause__ is not None:  # e.g. "Error merging override" hides the reason in its cause
        text += "\n" + str(e.__cause__)
    text = text.split("Config search path")[0]
    parts = [p.strip() for p in text.splitlines() if p.strip()]
    if not parts:
        return type(e).__name__
    head, rest = parts[0], parts[1:]
    keep = [p for p in rest if p.startswith(("full_key", "Available options"))
            or not p.startswith(("object_type", "reference_type", "provider", "Set the env"))]
    if any(p.startswith("Available options") for p in keep):
        i = next(i for i, p in enumerate(keep) if p.startswith("Available options"))
        keep = keep[:i] + [keep[i].rstrip(":") + ": " + ", ".join(keep[i + 1:])]
    line = "; ".join([head, *keep])
    import re  # a value of the wrong type: the key, the value and what is allowed

    m = re.search(r"Value '(.*)' of type '\w+' could not be converted to (\w+).*full_key: (\S+)",
                  line)
    kinds = {"Integer": "an integer", "Float": "a number", "Boolean": "true or false"}
    if m and m.group(2) in kinds:
        return f"{m.group(3)}={m.group(1)!r} is invalid; allowed: {kinds[m.group(2)]}"
    m = re.search(r"Value '(.*)' is not a valid bool.*full_key: (\S+)", line)
    if m:
        return f"{m.group(2)}={m.group(1)!r} is invalid; allowed: true or false"
    return line


def covering_jobs(batch) -> list:
    """The jobs of a sweep batch whose composition checks what composing every job would: each
    distinct override (``key=value``) in at least one job, and each distinct combination of
    config-group choices (overrides of keys without a dot: ``model=...``, ``schemes=...``)."""
    seen: set = set()
    combos: set = set()
    picked = []
    for job in batch:
        groups = tuple(o for o in job if "." not in o.partition("=")[0])
        if groups not in combos or any(o not in seen for o in job):
            picked.append(job)
            combos.add(groups)
            seen.update(job)
    return picked


def _validate_sweeps_lightly() -> None:
    """Hydra's sweepers compose every job of a batch before launching it (a bad override fails
    before any job runs), then the launcher composes each job again: two compositions a job,
    0.3-0.7 s each, most of a small sweep job's cost. The check before launching now composes
    the covering jobs of :func:`covering_jobs` (4 of the 24 of ``experiment=precision_sweep``)
    and finds the same errors: an unknown key or group option, a value of the wrong type."""
    from hydra.plugins.sweeper import Sweeper

    if getattr(Sweeper.validate_batch_is_legal, "_precsim", False):
        return
    full = Sweeper.validate_batch_is_legal

    def validate(self, batch):
        jobs = covering_jobs(batch)
        if not _check_job_settings(self, jobs):  # (Hydra's check, and the config's, at once)
            full(self, jobs)

    validate._precsim = True
    Sweeper.validate_batch_is_legal = validate
    reuse_compositions()


def _check_job_settings(sweeper, jobs) -> bool:
    """Hydra's check before launching (each covering job composed, as its
    ``validate_batch_is_legal`` does) with the config's own checks on each composition
    (``check_preset``, ``to_config``): a bad value anywhere in the grid
    (``replay.buffer_len=0,16``) is one line, as in a single run, instead of a failed job after
    the others ran. False when this sweeper has no config loader to compose with (Hydra's own
    check then runs)."""
    from pathlib import Path

    from omegaconf import OmegaConf, open_dict

    from precsim.config import check_preset, to_config
    from precsim.errors import PrecsimError

    ctx = getattr(sweeper, "hydra_context", None)
    loader = ctx.config_loader if ctx is not None else getattr(sweeper, "config_loader", None)
    if loader is None or getattr(sweeper, "config", None) is None:
        return False
    for overrides in jobs:
        cfg = loader.load_sweep_config(master_config=sweeper.config,
                                       sweep_overrides=list(overrides))
        preset = OmegaConf.select(cfg, "hydra.runtime.choices.experiment", default=None)
        with open_dict(cfg):
            cfg.pop("hydra", None)
        try:
            check_preset(preset, OmegaConf.select(cfg, "model.path", default=None))
            _to_config(cfg, to_config)
        except PrecsimError as e:
            sweep_dir = Path(str(sweeper.config.hydra.sweep.dir))
            if sweep_dir.is_dir() and [p.name for p in sweep_dir.iterdir()] == ["multirun.yaml"]:
                (sweep_dir / "multirun.yaml").unlink()  # the sweeper's, made just before: no
                sweep_dir.rmdir()  # stray folder for a sweep that never started
            raise PrecsimError(f"{e} (the sweep's job {' '.join(overrides)}; no job ran)"
                               ) from None
    return True


def reuse_compositions() -> None:
    """Each job of a sweep is composed from scratch by Hydra (``load_sweep_config``: its
    defaults list, every config file merged, 0.2-0.3 s on the 2-core machine), once in the
    check before launching and again in the launcher. Jobs that differ from an earlier job of
    the same process only in scalar values of config keys (``replay.buffer_len=8`` against
    ``=4``: same group choices, same override keys in the same order) are made instead from a
    copy of that job's composed config, with Hydra's own code applying the differing values and
    filling in the fields it derives from the overrides (``hydra.overrides.task``,
    ``hydra.job.override_dirname``): the same config, as ``tests/app/test_sweep.py`` checks
    against full compositions. Anything else (a group choice, ``+``/``~``, a ``hydra.`` key, a
    list or dict value) is composed in full. In-process launchers only: the joblib and submitit
    launchers compose in their workers, as before."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    if getattr(ConfigLoaderImpl.load_sweep_config, "_precsim", False):
        return
    full = ConfigLoaderImpl.load_sweep_config
    made: dict = {}  # (id of the master config, the job's shape) -> (overrides, composed config)

    def load(self, master_config, sweep_overrides):
        job = list(sweep_overrides)
        shape = override_shape(job)
        key = (id(master_config), tuple(shape)) if shape is not None else None
        hit = made.get(key) if key is not None else None
        if hit is not None and hit[2] is master_config:
            return _derive(hit[1], hit[0], job, shape)
        cfg = full(self, master_config, job)
        if key is not None:
            import copy

            made[key] = (job, copy.deepcopy(cfg), master_config)
        return cfg

    load._precsim = True
    load.__wrapped__ = full  # Hydra's own (tests compare with it)
    ConfigLoaderImpl.load_sweep_config = load


def override_shape(job: list[str]) -> list | None:
    """A job's overrides with each derivable one (:func:`reuse_compositions`: a plain
    ``a.b=scalar`` on a non-Hydra key) replaced by ``("=", key)``: jobs of one shape differ only
    in those values. None (composed in full, never derived from) when the overrides do not
    parse or a derivable key is also written by another override of the job (the same key, a
    parent or a child of it: Hydra applies them in order, which a copy would not replay)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(job)
    except Exception:  # noqa: BLE001 - Hydra's own composition reports it
        return None
    keys = [o.key_or_group for o in parsed]
    shape = []
    for i, o in enumerate(parsed):
        if not _derivable(o):
            shape.append(o.input_line)
            continue
        k = keys[i]
        if any(j != i and (q == k or q.startswith(k + ".") or k.startswith(q + "."))
               for j, q in enumerate(keys)):
            return None
        shape.append(("=", k))
    return shape


def _derivable(o) -> bool:
    key = o.key_or_group
    return (o.type.name == "CHANGE" and o.package is None and "." in key and "/" not in key
            and not key.startswith("hydra.") and o.value_type is not None
            and o.value_type.name == "ELEMENT" and not isinstance(o.value(), (dict, list)))


def _derive(base, base_job: list[str], job: list[str], shape: list):
    """``job``'s config from a copy of ``base``, the composed config of ``base_job`` (same
    shape): the values that differ applied as Hydra applies overrides, then the fields Hydra
    derives from the overrides."""
    import copy

    from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import open_dict

    parser = OverridesParser.create()
    cfg = copy.deepcopy(base)
    changed = [parser.parse_override(o) for o, b, s in zip(job, base_job, shape, strict=True)
               if isinstance(s, tuple) and o != b]
    ConfigLoaderImpl._apply_overrides_to_config(changed, cfg)
    app = [o for o in parser.parse_overrides(job) if not o.is_hydra_override()]
    with open_dict(cfg.hydra):
        cfg.hydra.overrides.task = [o.input_line for o in app]
        dn = cfg.hydra.job.config.override_dirname
        cfg.hydra.job.override_dirname = get_overrides_dirname(
            overrides=app, kv_sep=dn.kv_sep, item_sep=dn.item_sep, exclude_keys=dn.exclude_keys)
    return cfg


def sweep_blocks(hc, c) -> set[int]:
    """Block sizes (kernels' tile blocks) of the formats this sweep's jobs use: the job's own
    schemes' and every format named among the swept values (:func:`_swept`)."""
    from precsim import formats as pf
    from precsim.engines.triton import scheme_block
    from precsim.errors import PrecsimError

    blocks = set()
    for w in {w.strip() for _, v in _swept(hc) for w in v.split(",")}:
        try:  # a format name (row-scaled ones, <elem>_b<B>, are made on demand)
            f = pf.get(w)
        except Exception:  # noqa: BLE001 - not a format: another swept value
            continue
        if f.kind == "block":
            blocks.add(f.block)
    for s in c.schemes.values():
        try:
            blocks.add(scheme_block(s))
        except PrecsimError:
            pass
    return blocks - {0}


def _swept(hc) -> list[tuple[str, str]]:
    """This sweep's swept parameters as (key, values): the sweeper's ``params`` and the command
    line's comma lists and range/choice/glob/interval sweeps."""
    out = [(str(k), str(v)) for k, v in (hc.sweeper.get("params") or {}).items()]
    for a in sys.argv[1:]:
        key, eq, val = a.lstrip("+~").partition("=")
        if eq and ("," in val or val.startswith(("range(", "choice(", "glob(", "interval("))):
            out.append((key, val))
    return out


def sweeps_schemes(hc) -> bool:
    """Whether this sweep varies its schemes (a ``schemes`` key among :func:`_swept`): then the
    Triton engine compiles one kernel taking the schemes as runtime arguments, not one per job
    (``engines.triton.RUNTIME_CODES``)."""
    return any(k == "schemes" or k.startswith("schemes.") for k, _ in _swept(hc))


def _run_app(cfg) -> None:
    import time
    from pathlib import Path

    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from precsim.api import run
    from precsim.checkpoint import Checkpoint, Interrupted
    from precsim.config import check_preset, to_config
    from precsim.result import format_table, reusable, write_outputs

    t0 = time.perf_counter()
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    if multirun and str(hc.launcher.get("_target_", "")).endswith(".BasicLauncher"):
        global _IN_PROCESS_SWEEP
        _IN_PROCESS_SWEEP = True  # no worker processes for the exit handlers to stop (entry)
    check_preset(hc.runtime.choices.get("experiment"), cfg.model.path)
    c = _to_config(cfg, to_config)
    if c.metrics.plot is None:  # a sweep job draws no PNG of its own unless asked
        c.metrics.plot = not multirun
    runtime_codes = multirun and c.run.device != "cpu" and sweeps_schemes(hc)
    if runtime_codes or "precsim.engines.triton" in sys.modules:  # (an in-process caller's
        from precsim.engines import triton as triton_engine  # next command starts afresh)

        triton_engine.RUNTIME_CODES[0] = runtime_codes  # one kernel serves every job's schemes
        triton_engine.SWEEP_BLOCKS.clear()
        if runtime_codes:
            triton_engine.SWEEP_BLOCKS.update(sweep_blocks(hc, c))
    say = job_log if multirun else _say
    _check_model_vs_trace(hc, c)
    for line in inverted_split_notes(c):  # allowed (a study may want one), but said
        job_log(line, "WARNING")
        if not multirun:
            print(line, file=sys.stderr, flush=True)
    out = Path(c.run.out_dir) if c.run.out_dir else Path(hc.runtime.output_dir)
    if c.task.path or c.task.name or hc.runtime.choices.get("experiment") == "task_eval":
        from precsim.models.task import run_task_cli  # experiment=task_eval (docs/tasks.md)

        if c.per_layer.formats is not None:  # experiment=per_layer over a task's accuracy
            from precsim.models.per_layer_task import run_cli as run_task_cli
        _join_warm_up()
        gc.enable()  # off for the start-up (main)
        run_task_cli(c, out, say, progress=not multirun)
        return
    stored = reusable(c, out)
    ck = Checkpoint(c, out)
    if stored is not None:
        gc.enable()  # off for the start-up (main)
        say(f"precsim: {out} already holds a complete result of this config; reused")
        summary = stored
    else:
        if not c.model.path:  # a run that cannot fit: one line before any allocation
            from precsim.preflight import check_fits, long_run_note  # (whole-model mode
            # sizes its own)
            note = long_run_note(check_fits(c))
            if note and not multirun:
                print(note, file=sys.stderr, flush=True)
        _join_warm_up()
        gc.freeze()  # the imports' objects: later collections skip them (no multi-ms pauses)
        gc.enable()  # off for the start-up (main)
        age = process_age()
        from precsim.layers import is_record_dir, run_all

        if is_record_dir(c):  # every recorded layer, then the worst layer's verdict
            summary = run_all(c, out, say, progress=not multirun)
            if multirun:
                job_log(_end_text(c, summary, out))
            else:
                _print_end(c, summary, out)
            return
        ck.load()  # another config's checkpoint: a one-line error before the engine starts
        try:
            with ck, _job_signals():
                result = run(c, progress=not multirun, ckpt=ck)
        except Interrupted as e:  # the windows done so far, marked incomplete
            e.out, e.job = out, (hc.job.num if multirun else None)
            if e.partial is not None:
                write_outputs(c, e.partial, out, complete=False)
            job_log(f"interrupted ({e}) at step {e.pos}; checkpoint {e.path}")
            raise
        if age is not None and not multirun:  # a sweep's jobs share one process
            result.info["phases_s"] = {"startup": round(age, 4),
                                       **result.info.get("phases_s", {})}
        summary = write_outputs(c, result, out)
        ck.done()
        say(format_table(summary))
        say(f"\nengine={result.engine} device={result.device} steps={result.steps} "
            f"wall={result.wall_s:.2f}s -> {out}")
        if summary.get("lengths_skipped"):
            say(f"note: metrics.lengths {summary['lengths_skipped']} not reported: no window of "
                f"metrics.window={c.metrics.window} ends there")
    if multirun:
        job_log(_end_text(c, summary, out))
        print(f"precsim: job {hc.job.num} {'reused' if stored else 'done'} "
              f"({time.perf_counter() - t0:.1f} s) -> {out}", file=sys.stderr, flush=True)
    else:
        _print_end(c, summary, out, reused=stored is not None)


def inverted_split_notes(c) -> list[str]:
    """One note per split scheme whose master is narrower than its read copy (``fmt=nvfp4
    read_fmt=fp32``): the read copy is rounded from the master, so it holds nothing the master
    does not, at more bytes; the master's rounding sets the error."""
    from precsim import formats as pf

    out = []
    for name, s in c.schemes.items():
        if s.kind != "split" or not s.read_fmt:
            continue
        try:
            bm, br = pf.get(s.fmt).bits_per_element, pf.get(s.read_fmt).bits_per_element
        except Exception:  # noqa: BLE001 - the config's checks name a bad format
            continue
        if br > bm:
            out.append(f"precsim: note: schemes.{name} is an inverted split: its master "
                       f"(fmt={s.fmt}, {bm:g} bits/element) is narrower than its read copy "
                       f"(read_fmt={s.read_fmt}, {br:g}), which is rounded from the master and "
                       f"so holds no more than it; the usual split is a wide master and a "
                       f"narrow read copy (fmt={s.read_fmt} read_fmt={s.fmt})")
    return out


def _check_model_vs_trace(hc, c) -> None:
    """``model=gdn`` on the command line with a Mamba-2 trace (or the reverse): a trace fixes
    the layer's family and shape, so the choice would be dropped without a word; one line."""
    from pathlib import Path

    from precsim.errors import PrecsimError

    chosen = [o.split("=", 1)[1] for o in hc.overrides.task if o.lstrip("+").startswith("model=")]
    if not chosen or c.workload.kind != "trace" or not c.workload.path:
        return
    try:
        from precsim.families import family_of
        from precsim.workload import load_trace_arrays, recorded_layers

        p = Path(c.workload.path)
        if (p / "record.json").is_file():
            have = recorded_layers(p)
            p = have.get(c.workload.layer) if c.workload.layer is not None else \
                next(iter(have.values()), None)
        fam = family_of(load_trace_arrays(p)) if p is not None else None
    except Exception:  # noqa: BLE001 - the workload reports an unreadable trace itself
        return
    if fam and fam != c.model.family:
        names = {"mamba2": "Mamba-2", "gdn": "Gated DeltaNet"}
        match = [n for n in _group_options()["model"] if _model_family(n) == fam]
        raise PrecsimError(
            f"model={chosen[-1]} (family {c.model.family}) with a {names.get(fam, fam)} trace "
            f"(workload.path={c.workload.path}): a trace fixes the layer's family and shape; "
            f"allowed: no model= (the trace's layer is used)"
            + (f" or model={'|'.join(match)}" if match else ""))


def _model_family(preset: str) -> str | None:
    from importlib.resources import files

    import yaml

    try:
        return (yaml.safe_load(files("precsim.conf").joinpath("model", f"{preset}.yaml")
                               .read_text()) or {}).get("family")
    except Exception:  # noqa: BLE001
        return None


def _say(text: str) -> None:
    """Print, and keep it in the run's log (precsim.log holds the table and the verdict)."""
    print(text)
    job_log(text)


def _interrupt_lines(e, args: list[str]) -> list[str]:
    """What an interrupted run or sweep says: one line per unfinished job, each with where it
    stopped, its checkpoint and the command that resumes it."""
    import shlex

    what = f"precsim: interrupted ({e})"
    out = getattr(e, "out", None)
    if out is None and any(a in _MULTIRUN_FLAGS for a in args):
        return [f"{what}; rerun the same command with the same hydra.sweep.dir to resume "
                "(finished jobs are reused, interrupted ones resume from their checkpoints)"]
    if out is None:
        return [f"{what} before a run started; nothing to resume"]
    given = {a.split("=", 1)[0].lstrip("+") for a in args if "=" in a}
    multirun = any(a in _MULTIRUN_FLAGS for a in args)
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    where = out.parent if multirun else out
    pin = [] if {key, "run.out_dir"} & given else [f"{key}={where}"]
    cmd = "python -m precsim " + shlex.join([*args, *pin])
    at = (f"at step {e.pos:,}; checkpoint {e.path}, partial results (complete: false) in {out}"
          if e.path is not None else f"with nothing saved in {out}" if e.pos is None else
          f"at step {e.pos:,} (nothing saved)")
    if not multirun:
        return [f"{what} {at}; resume: {cmd}"]
    lines = [f"{what}: job {e.job} {at}"]
    lines += [f"precsim: job {n} not started ({' '.join(o)})" for n, o in _jobs_left(e)]
    return lines + [f"precsim: resume the sweep: {cmd}"]


def _jobs_left(e) -> list[tuple[int, list[str]]]:
    """The jobs of Hydra's basic launcher after the interrupted one (from the launcher's loop,
    which the interrupt left); none found for other launchers."""
    tb = e.__traceback__
    while tb is not None:
        loc = tb.tb_frame.f_locals
        if tb.tb_frame.f_code.co_name == "launch" and "job_overrides" in loc and "idx" in loc:
            first = loc.get("initial_job_idx", 0)
            return [(first + i, list(o)) for i, o in enumerate(loc["job_overrides"])
                    if first + i > loc["idx"]]
        tb = tb.tb_next
    return []


def _job_signals():
    """The signals that stop a job's engine at its next window boundary (a checkpoint saved) in a
    launcher's worker process, where :func:`main` did not install them: SIGINT and SIGTERM (a
    joblib worker), or submitit's preemption/time-out signal, SIGUSR2, which then goes on to
    submitit's handler: it requeues the job, and the requeued job resumes from the checkpoint."""
    import contextlib
    import signal

    from precsim.checkpoint import (
        Interrupted,
        handlers_installed,
        install_handlers,
        restore_handlers,
    )

    submitit = bool(os.environ.get("SUBMITIT_EXECUTOR"))
    if not submitit and handlers_installed():
        return contextlib.nullcontext()  # the command line's own process: installed already

    @contextlib.contextmanager
    def chain():
        old = install_handlers(("SIGUSR2",) if submitit else ("SIGINT", "SIGTERM"))
        try:
            yield
        except Interrupted as e:
            if e.signum == signal.SIGUSR2 and callable(old.get(signal.SIGUSR2)):
                old[signal.SIGUSR2](e.signum, None)  # submitit: requeue, exit
            raise
        finally:
            restore_handlers(old)

    return chain()


def _end_text(c, summary: dict, out) -> str:
    from precsim import report

    return report.run_verdict(summary, c.metrics.budget_metric, c.metrics.budget, out)


def _print_end(c, summary: dict, out, reused: bool = False) -> None:
    if reused:
        from precsim.result import format_table

        print(format_table(summary))
    (print if reused else _say)("\n" + _end_text(c, summary, out))  # a reuse writes nothing


def job_log(text: str, level: str = "INFO") -> None:
    """Write to the job's log file only (a sweep keeps the terminal for progress)."""
    import logging

    for h in logging.getLogger().handlers:
        if isinstance(h, logging.FileHandler):
            h.emit(logging.makeLogRecord({"msg": text, "levelno": getattr(logging, level),
                                          "levelname": level, "name": "precsim"}))
