"""The command line: ``python -m precsim experiment=NAME [overrides]`` (a Hydra application).

This module holds the Hydra app, the registration of the config schema and of the resolvers the
configs use (``${precsim_uid:}``, ``${precsim_gpus:}``), and the rule that user errors (bad names,
ranges, trace files) end with one line on stderr and exit status 2.
"""

from __future__ import annotations

import os
import secrets
import sys


def _fail(msg: str) -> None:
    print(f"precsim: error: {msg}", file=sys.stderr)
    sys.exit(2)


# -- registration ------------------------------------------------------------------------------
def _uid() -> str:
    """A short suffix unique among runs started in the same second (pid + random)."""
    return f"{os.getpid():x}{secrets.token_hex(2)}"


def _gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no torch/CUDA means no GPU to spread over
        return 0


def register_resolvers() -> None:
    """``${precsim_uid:}`` (cached per config, so every job of a sweep agrees on it) and
    ``${precsim_gpus:}`` (visible CUDA devices, at least 1). Call before Hydra resolves dirs."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("precsim_uid"):
        OmegaConf.register_new_resolver("precsim_uid", _uid, use_cache=True)
    if not OmegaConf.has_resolver("precsim_gpus"):
        OmegaConf.register_new_resolver("precsim_gpus", lambda: max(1, _gpu_count()),
                                        use_cache=True)


def register_configs() -> None:
    """Register the schema with Hydra's ConfigStore (called by the CLI and by tests)."""
    from hydra.core.config_store import ConfigStore

    from precsim.config import Config

    register_resolvers()  # ${precsim_uid:} in hydra.run.dir / hydra.sweep.dir
    ConfigStore.instance().store(name="precsim_schema", node=Config)


# -- the app -----------------------------------------------------------------------------------
def main() -> None:
    try:
        import hydra
        from omegaconf import DictConfig
    except ImportError as e:  # pragma: no cover
        _fail(f"hydra-core is required for the CLI ({e}); pip install hydra-core")
    register_configs()
    # let exceptions reach us unprinted, so user errors become one line (bugs still show a trace)
    os.environ["HYDRA_FULL_ERROR"] = "1"

    @hydra.main(version_base="1.3", config_path="pkg://precsim.conf", config_name="config")
    def _app(cfg: DictConfig) -> None:
        try:
            _run_app(cfg)
        except Exception as e:
            from hydra.core.hydra_config import HydraConfig
            from hydra.types import RunMode

            # a single run ends here with one line; in a sweep the callback records the job's
            # error and the other jobs go on
            if is_user_error(e) and HydraConfig.get().mode == RunMode.RUN:
                _fail(one_line(e))
            raise

    try:
        _app()
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001 - the last line of defence for one-line errors
        if is_user_error(e):
            _fail(one_line(e))
        raise
def is_user_error(e: BaseException) -> bool:
    """Config and input errors (ours, Hydra's, OmegaConf's), as opposed to bugs."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from precsim.errors import PrecsimError

    return isinstance(e, (PrecsimError, OmegaConfBaseException, HydraException))


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
    return "; ".join([head, *keep])


def _run_app(cfg) -> None:
    from pathlib import Path

    from hydra.core.hydra_config import HydraConfig
    from omegaconf.errors import OmegaConfBaseException

    from precsim.api import format_table, write_outputs
    from precsim.config import to_config
    from precsim.engine import run
    from precsim.errors import PrecsimError
    from precsim.results import is_complete

    try:
        c = to_config(cfg)
    except OmegaConfBaseException as e:
        raise PrecsimError(str(e).splitlines()[0]) from None
    out = Path(c.run.out_dir) if c.run.out_dir else Path(HydraConfig.get().runtime.output_dir)
    if is_complete(out):
        print(f"precsim: {out} already holds a complete result; skipped (delete it to redo)")
        return
    result = run(c, progress=True)
    summary = write_outputs(c, result, out)
    print(format_table(summary))
    print(f"\nengine={result.engine} device={result.device} steps={result.steps} "
          f"wall={result.wall_s:.2f}s -> {out}")
    _print_recommendation(c, out)


def _print_recommendation(c, out) -> None:
    """The cheapest scheme of this run within ``metrics.budget`` (same rule as precsim.report)."""
    from precsim import report

    mc = c.metrics
    try:
        rec = report.recommend(report.candidates(report.collect(out), mc.budget_metric), mc.budget)
    except report.ReportError:
        return
    text = report.format_recommendation(rec, mc.budget_metric, None, top=2)
    print("\n" + text.replace("  (job ., ", "  (").replace("[. / ", "["))
    print(f"(budget: metrics.budget_metric={mc.budget_metric} metrics.budget={mc.budget:g}; "
          f"a sweep: python -m precsim.report DIR --metric kl --budget 1e-3 --horizon 131072)")


