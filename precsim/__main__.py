"""``python -m precsim experiment=NAME [overrides]`` — the Hydra application.

User errors (bad names, ranges, trace files) end with one line on stderr and exit status 2.
"""

from __future__ import annotations

import os
import sys


def _fail(msg: str) -> None:
    print(f"precsim: error: {msg}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    try:
        import hydra
        from omegaconf import DictConfig
    except ImportError as e:  # pragma: no cover
        _fail(f"hydra-core is required for the CLI ({e}); pip install hydra-core")
    from precsim.config import register_configs

    register_configs()
    # Hydra prints full tracebacks for config errors unless told otherwise
    os.environ.setdefault("HYDRA_FULL_ERROR", "0")

    @hydra.main(version_base="1.3", config_path="pkg://precsim.conf", config_name="config")
    def _app(cfg: DictConfig) -> None:
        _run_app(cfg)

    try:
        _app()
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001 - the last line of defence for one-line errors
        from omegaconf.errors import OmegaConfBaseException

        from precsim.errors import PrecsimError

        if isinstance(e, (PrecsimError, OmegaConfBaseException)):
            _fail(str(e).splitlines()[0])
        raise


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


if __name__ == "__main__":
    main()
