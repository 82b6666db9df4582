"""The command line's way to a config: Hydra's registrations (the schema, the resolvers
``${precsim_uid:}``, ``${precsim_gpus:}``, ``${precsim_short:}``), the config groups' presets, the
checks of the overrides before Hydra makes a directory (:func:`precheck`), the composition of a
validated :class:`~precsim.config.Config` (:func:`compose_config`), and what a sweep's jobs need
of the command line (:func:`sweep_kernels`), and the lines an interrupted command prints
(:func:`interrupt_lines`: where each job stopped, the command that resumes it). Imports inside
functions keep ``--help`` fast.
"""

from __future__ import annotations

import os
import secrets
import sys

MULTIRUN_FLAGS = ("-m", "--multirun")


def new_uid() -> str:
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
        OmegaConf.register_new_resolver("precsim_uid", new_uid, use_cache=True)
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


def group_options() -> dict[str, list[str]]:
    """The presets of each config group (``conf/<group>/*.yaml``)."""
    from importlib.resources import files

    conf = files("precsim.conf")
    return {g: sorted(p.name[:-5] for p in conf.joinpath(g).iterdir() if p.name.endswith(".yaml"))
            for g in ("experiment", "model", "schemes", "workload")}


def groups_line() -> str:
    """The presets of each group, as ``--help`` lists them."""
    return "  ".join(f"{g}={'|'.join(names)}" for g, names in group_options().items())


def check_group(group: str, value) -> None:
    from precsim.errors import PrecsimError

    names = group_options()[group]
    if isinstance(value, str) and value in names:
        return
    if group == "schemes" and isinstance(value, dict):
        return  # schemes={...}: a whole dict of schemes
    raise PrecsimError(f"{group}={value!r} is unknown; allowed: {', '.join(names)}")


def precheck(args: list[str], fresh_dir: list[bool]):
    """Everything that can be checked before Hydra creates a run directory: the override keys
    (against the schema), and for a single run the whole config, the device, the engine, a trace
    file and a complete result already in an explicit output directory. Returns ``(config,
    directory, its summary)`` when that result is reused (nothing left to do), else None."""
    from pathlib import Path

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, Glob, RangeSweep

    from precsim.config import check_key
    from precsim.errors import PrecsimError
    from precsim.rundir import reusable

    flags = [a for a in args if a.startswith("-")]
    if any(f not in MULTIRUN_FLAGS for f in flags):
        return None  # Hydra's own options (--cfg, -cn, ...): Hydra handles them
    overrides = [a for a in args if not a.startswith("-")]
    check_words_and_launcher(overrides)
    parsed = OverridesParser.create().parse_overrides(overrides)
    run_dir = None
    for o in parsed:
        key = o.key_or_group
        if key == "hydra.run.dir":
            run_dir = o.value()
        if key.startswith("hydra") or "/" in key or o.package:
            continue
        check_key(key)
        if key in group_options() and not o.is_delete():
            if not o.is_sweep_override():
                check_group(key, o.value())
            elif flags and isinstance(o.value(), (ChoiceSweep, RangeSweep)):  # model=mamba2,gdn
                for v in o.sweep_string_iterator():
                    check_group(key, v)
            elif flags and isinstance(o.value(), Glob) and not o.value().filter(
                    group_options()[key]):  # no job at all: a sweep of nothing
                raise PrecsimError(f"{o.input_line} matches no {key} option; allowed: "
                                   f"{', '.join(group_options()[key])}")
    check_output_dirs(parsed, multirun=bool(flags))  # before Hydra makes any of them
    if flags:  # a sweep: each job is checked as it runs; a failed job leaves error.txt
        return None
    explicit = run_dir is not None or any(o.key_or_group == "run.out_dir" for o in parsed)
    if not explicit:
        # Hydra's default directory is a new, unique one: the app validates the config (a
        # failed run's stub directory is removed), no second composition here (~0.3 s)
        return None
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
        return None
    user = [a for a, o in zip(overrides, parsed, strict=True)
            if not (o.key_or_group.startswith("hydra") or o.package)]
    c = compose_config(user)
    from precsim.api import preflight  # (here: the engines' imports only when needed)

    preflight(c)
    out = c.run.out_dir or (run_dir if isinstance(run_dir, str) and "${" not in run_dir
                            else None)
    if out is None:
        return None
    out = Path(out)
    fresh_dir[0] = run_dir is not None and not Path(run_dir).exists()
    stored = reusable(c, out)
    return None if stored is None else (c, out, stored)


# the launcher presets and the plugin (and the extra that installs it) each one needs
LAUNCHER_PLUGINS = {"joblib": "hydra_joblib_launcher", "joblib_gpus": "hydra_joblib_launcher",
                     "submitit_local": "hydra_submitit_launcher",
                     "submitit_slurm": "hydra_submitit_launcher",
                     "slurm_gpu": "hydra_submitit_launcher"}


def check_words_and_launcher(overrides: list[str]) -> None:
    """Before Hydra parses the overrides: a bare word (``split_nvfp4``: Hydra's "missing
    EQUAL") names the override it most likely meant; ``hydra/launcher=joblib`` (or a SLURM or
    submitit launcher) without its Hydra plugin names the extra that installs it."""
    import importlib.util

    from precsim.errors import PrecsimError

    for a in overrides:
        if "=" in a or a.startswith("~"):
            continue
        groups = [g for g, names in group_options().items() if a in names]
        hint = (f"did you mean {groups[0]}={a}?" if groups else
                "allowed: KEY=VALUE or GROUP=OPTION (python -m precsim --help lists them)")
        raise PrecsimError(f"{a!r} is not an override (KEY=VALUE); {hint}")
    for a in overrides:
        key, _, value = a.lstrip("+").partition("=")
        plugin = LAUNCHER_PLUGINS.get(value) if key == "hydra/launcher" else None
        if plugin and importlib.util.find_spec(f"hydra_plugins.{plugin}") is None:
            raise PrecsimError(
                f"hydra/launcher={value} needs Hydra's {plugin.replace('_', '-')} plugin, which "
                "is not installed; allowed: pip install 'precsim[sweep]' (the joblib and "
                "submitit launchers), or no hydra/launcher (jobs run one after another)")


def check_output_dirs(parsed, multirun: bool) -> None:
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


def with_run_dir(args: list[str]) -> list[str]:
    """``run.out_dir=DIR`` of a single run without ``hydra.run.dir``: Hydra's run directory
    (its ``.hydra/`` and ``precsim.log``) is DIR too, so nothing is left under ``outputs/``."""
    if any(a in MULTIRUN_FLAGS or a.startswith("-") for a in args):
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

    try:
        with initialize_config_module(config_module="precsim.conf", version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides)
    except ConfigCompositionException as e:
        explain_missing_scheme(e, overrides)
        raise
    return checked_config(cfg)


def checked_config(cfg):
    """``to_config`` of a composed config, OmegaConf's errors one-line PrecsimErrors."""
    from omegaconf.errors import OmegaConfBaseException

    from precsim.config import to_config
    from precsim.errors import PrecsimError

    try:
        return to_config(cfg)
    except OmegaConfBaseException as e:
        raise PrecsimError(str(e).splitlines()[0]) from None


def overrides_of(args: list[str]) -> list[str]:
    """The overrides among the command line's ``args``, without Hydra's options and their
    values (``--cfg job``)."""
    try:
        from hydra._internal.utils import get_args_parser

        return list(get_args_parser().parse_known_args(args)[0].overrides)
    except (ImportError, SystemExit):  # another Hydra: what is not an option
        return [a for a in args if not a.startswith("-")]


def explain_unknown_key(e: Exception) -> None:
    """Hydra's "Could not override 'run.stepz'" for a key the schema lacks, where
    :func:`precheck` did not see it (``--cfg job``): :func:`~precsim.config.check_key`'s line
    with the nearest key, instead of Hydra's "+run.stepz" hint (which fails too)."""
    import re

    from precsim.config import check_key

    m = re.search(r"Could not override '([^']+)'", str(e))
    if m and " not in " in f"{e}\n{e.__cause__}":
        check_key(m.group(1))


def explain_missing_scheme(e: Exception, overrides: list[str]) -> None:
    """``schemes.candidate.fmt=...`` where the chosen schemes preset has no ``candidate``: say
    which schemes there are and which preset defines it (instead of Hydra's ``+`` hint). With
    ``+`` (``+schemes.mine.fmt=fp16``) Hydra's own line was "Invalid type assigned: dict is not
    a subclass of SchemeConfig"."""
    import re
    from importlib.resources import files

    from hydra import compose, initialize_config_module

    from precsim.errors import PrecsimError

    m = re.search(r"Could not override '(schemes\.([^.']+)[^']*)'", str(e))
    if not m and "subclass of SchemeConfig" in str(e.__cause__):
        m = re.search(r"Error merging override \+{1,2}(schemes\.([^.=]+)[^=]*)=", str(e))
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


def sweep_blocks(hc, c) -> set[int]:
    """Block sizes (kernels' tile blocks) of the formats this sweep's jobs use: the job's own
    schemes' and every format named among the swept values (:func:`swept`)."""
    from precsim import formats as pf
    from precsim.engines.triton import scheme_block
    from precsim.errors import PrecsimError

    blocks = set()
    for w in {w.strip() for _, v in swept(hc) for w in v.split(",")}:
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


def swept(hc) -> list[tuple[str, str]]:
    """This sweep's swept parameters as (key, values): the sweeper's ``params`` and the command
    line's comma lists and range/choice/glob/interval sweeps."""
    out = [(str(k), str(v)) for k, v in (hc.sweeper.get("params") or {}).items()]
    for a in sys.argv[1:]:
        key, eq, val = a.lstrip("+~").partition("=")
        if eq and ("," in val or val.startswith(("range(", "choice(", "glob(", "interval("))):
            out.append((key, val))
    return out


def sweeps_schemes(hc) -> bool:
    """Whether this sweep varies its schemes (a ``schemes`` key among :func:`swept`): then the
    Triton engine compiles one kernel taking the schemes as runtime arguments, not one per job
    (:func:`sweep_kernels`)."""
    return any(k == "schemes" or k.startswith("schemes.") for k, _ in swept(hc))


def check_model_vs_trace(hc, c) -> None:
    """``model=gdn`` on the command line with a Mamba-2 trace (or the reverse): a trace fixes
    the layer's family and shape, so the choice would be dropped without a word; one line."""
    from pathlib import Path

    from precsim.errors import PrecsimError
    from precsim.rundir import RECORD_FILE

    chosen = [o.split("=", 1)[1] for o in hc.overrides.task if o.lstrip("+").startswith("model=")]
    if not chosen or c.workload.kind != "trace" or not c.workload.path:
        return
    try:
        from precsim.families import FAMILIES, family_of
        from precsim.workload import load_trace_arrays, recorded_layers

        p = Path(c.workload.path)
        if (p / RECORD_FILE).is_file():
            have = recorded_layers(p)
            p = have.get(c.workload.layer) if c.workload.layer is not None else \
                next(iter(have.values()), None)
        fam = family_of(load_trace_arrays(p)) if p is not None else None
    except Exception:  # noqa: BLE001 - the workload reports an unreadable trace itself
        return
    if fam and fam != c.model.family:
        match = [n for n in group_options()["model"] if model_family(n) == fam]
        raise PrecsimError(
            f"model={chosen[-1]} (family {c.model.family}) with a {FAMILIES[fam].LABEL} trace "
            f"(workload.path={c.workload.path}): a trace fixes the layer's family and shape; "
            f"allowed: no model= (the trace's layer is used)"
            + (f" or model={'|'.join(match)}" if match else ""))


def model_family(preset: str) -> str | None:
    from importlib.resources import files

    import yaml

    try:
        return (yaml.safe_load(files("precsim.conf").joinpath("model", f"{preset}.yaml")
                               .read_text()) or {}).get("family")
    except Exception:  # noqa: BLE001
        return None


def sweep_kernels(hc, c, multirun: bool) -> frozenset | None:
    """A sweep on the GPU that varies its schemes (:func:`sweeps_schemes`): the block sizes its
    jobs need (:func:`sweep_blocks`), for which the Triton engine compiles one kernel taking the
    schemes as runtime arguments (``engines.run``'s ``sweep_blocks``); None for anything else
    (one kernel per job's schemes)."""
    if multirun and c.run.device != "cpu" and sweeps_schemes(hc):
        return frozenset(sweep_blocks(hc, c))
    return None


def interrupt_lines(e, args: list[str], left=()) -> list[str]:
    """What an interrupted run or sweep says: one line per unfinished job, each with where it
    stopped, its checkpoint and the command that resumes it; ``left``: a sweep's jobs not yet
    started, ``(number, overrides)`` (:func:`precsim.hydra_patches.jobs_left`)."""
    import shlex

    what = f"precsim: interrupted ({e})"
    out = getattr(e, "out", None)
    multirun = any(a in MULTIRUN_FLAGS for a in args)
    if out is None and multirun:
        return [f"{what}; rerun the same command with the same hydra.sweep.dir to resume "
                "(finished jobs are reused, interrupted ones resume from their checkpoints)"]
    if out is None:
        return [f"{what} before a run started; nothing to resume"]
    given = {a.split("=", 1)[0].lstrip("+") for a in args if "=" in a}
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    pin = [] if {key, "run.out_dir"} & given else [f"{key}={out.parent if multirun else out}"]
    cmd = "python -m precsim " + shlex.join([*args, *pin])
    unit = e.unit
    part = (f", partial results (complete: false) in {out}" if e.partial is not None else
            f" (no partial results: {out} gets its files when the run completes)")
    at = (f"at {unit} {e.pos:,}; checkpoint {e.path}{part}"
          if e.path is not None else f"with nothing saved in {out}" if e.pos is None else
          f"at {unit} {e.pos:,} (nothing saved)")
    if not multirun:
        return [f"{what} {at}; resume: {cmd}"]
    lines = [f"{what}: job {e.job} {at}"]
    lines += [f"precsim: job {n} not started ({' '.join(o)})" for n, o in left]
    return lines + [f"precsim: resume the sweep: {cmd}"]
