"""precsim's patches of Hydra's internals, in one place, for the hydra-core versions they were
written against (:data:`SUPPORTED`: pyproject pins ``hydra-core>=1.3,<1.4``). Each one saves
work Hydra repeats and changes no result or message:

* :func:`one_composition`: skips the probe composition Hydra's main makes only to read
  ``hydra.mode`` (``Hydra.get_mode``);
* :func:`validate_sweeps_lightly`: a sweep's check before launching composes its covering jobs
  (:func:`covering_jobs`) and runs the config's own checks on them
  (``Sweeper.validate_batch_is_legal``);
* :func:`reuse_compositions`: a sweep job that differs from an earlier one only in scalar
  values is derived from that job's composed config (``ConfigLoaderImpl.load_sweep_config``);
* :func:`jobs_left`: reads the jobs not yet started off Hydra's basic launcher's loop (for
  the lines an interrupted sweep prints).

On a hydra-core version outside :data:`SUPPORTED` none of them is applied: Hydra runs as it
ships (each command composes its config once more, each sweep job twice: slower start-up and
sweeps, the same results and messages), and an interrupted sweep does not list its jobs not yet
started; the command line says so in one line on stderr (:func:`unsupported_note`).
"""

from __future__ import annotations

import contextlib

SUPPORTED = ("1.3",)  # hydra-core major.minor versions the patches were written against


def hydra_version() -> str:
    """The installed hydra-core's version, from its metadata: nothing is imported, so this is
    safe while ``hydra`` is half imported (an interrupt that lands during ``import hydra``
    reaches :func:`jobs_left` through the command line's handler; importing hydra again there
    failed with "partially initialized module 'hydra'" and a traceback)."""
    from importlib import metadata

    try:
        return metadata.version("hydra-core")
    except metadata.PackageNotFoundError:
        return "?"


def supported() -> bool:
    """Whether the installed hydra-core is one the patches were written against."""
    return ".".join(hydra_version().split(".")[:2]) in SUPPORTED


def unsupported_note() -> str | None:
    """The line the command line prints on a hydra-core outside :data:`SUPPORTED`, else None."""
    if supported():
        return None
    return (f"precsim: note: hydra-core {hydra_version()} is not a version precsim's Hydra "
            f"patches were written for ({', '.join(v + '.x' for v in SUPPORTED)}); running "
            "without them: the same results, a slower start and slower sweeps")


@contextlib.contextmanager
def one_composition(args: list[str]):
    """Hydra's main composes the whole config twice: once only to read ``hydra.mode``
    (``Hydra.get_mode``, which returns None on any error), then again to run (0.25-0.45 s each
    on the 2-core machine). No packaged config sets ``hydra.mode`` (tests/app/test_cli.py
    checks), so where no override sets it and no option points Hydra at other configs, the
    probe's answer is None and this skips it: -m or not then picks the mode, as after the
    probe. Hydra's own options (``--cfg``, ``-cd``, ...) go the usual way."""
    Hydra = None
    if supported():
        try:
            from hydra._internal.hydra import Hydra
        except ImportError:  # pragma: no cover - another Hydra: the usual way
            Hydra = None
    keys = {a.split("=", 1)[0].lstrip("+~") for a in args if not a.startswith("-")}
    if (Hydra is None or not callable(getattr(Hydra, "get_mode", None)) or "hydra.mode" in keys
            or any(a.startswith("-") and a not in ("-m", "--multirun") for a in args)):
        yield
        return
    probe = Hydra.get_mode
    Hydra.get_mode = lambda self, config_name, overrides: None
    try:
        yield
    finally:
        Hydra.get_mode = probe


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


def validate_sweeps_lightly() -> None:
    """Hydra's sweepers compose every job of a batch before launching it (a bad override fails
    before any job runs), then the launcher composes each job again: two compositions a job,
    0.3-0.7 s each, most of a small sweep job's cost. The check before launching now composes
    the covering jobs of :func:`covering_jobs` (4 of the 24 of ``experiment=precision_sweep``)
    and finds the same errors: an unknown key or group option, a value of the wrong type."""
    if not supported():
        return
    from hydra.plugins.sweeper import Sweeper

    if getattr(Sweeper.validate_batch_is_legal, "_precsim", False):
        return
    full = Sweeper.validate_batch_is_legal

    def validate(self, batch):
        jobs = covering_jobs(batch)
        if not check_job_settings(self, jobs):  # (Hydra's check, and the config's, at once)
            full(self, jobs)

    validate._precsim = True
    Sweeper.validate_batch_is_legal = validate
    reuse_compositions()


def check_job_settings(sweeper, jobs) -> bool:
    """Hydra's check before launching (each covering job composed, as its
    ``validate_batch_is_legal`` does) with the config's own checks on each composition
    (``check_preset``, ``to_config``): a bad value anywhere in the grid
    (``replay.buffer_len=0,16``) is one line, as in a single run, instead of a failed job after
    the others ran. False when this sweeper has no config loader to compose with (Hydra's own
    check then runs)."""
    from pathlib import Path

    from omegaconf import OmegaConf, open_dict

    from .compose import checked_config
    from .config import check_preset
    from .errors import PrecsimError
    from .rundir import MULTIRUN_FILE, remove_empty_parents

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
            checked_config(cfg)
        except PrecsimError as e:
            sweep_dir = Path(str(sweeper.config.hydra.sweep.dir))
            if sweep_dir.is_dir() and [p.name for p in sweep_dir.iterdir()] == [MULTIRUN_FILE]:
                (sweep_dir / MULTIRUN_FILE).unlink()  # the sweeper's, made just before: no
                sweep_dir.rmdir()  # stray folder for a sweep that never started
                remove_empty_parents(sweep_dir)  # Hydra's multirun/NAME/ too
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
    if not supported():
        return
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


def jobs_left(e) -> list[tuple[int, list[str]]]:
    """The jobs of Hydra's basic launcher after the interrupted one (from the launcher's loop,
    which the interrupt left); none found for other launchers."""
    if not supported():
        return []
    tb = e.__traceback__
    while tb is not None:
        loc = tb.tb_frame.f_locals
        if tb.tb_frame.f_code.co_name == "launch" and "job_overrides" in loc and "idx" in loc:
            first = loc.get("initial_job_idx", 0)
            return [(first + i, list(o)) for i, o in enumerate(loc["job_overrides"])
                    if first + i > loc["idx"]]
        tb = tb.tb_next
    return []
