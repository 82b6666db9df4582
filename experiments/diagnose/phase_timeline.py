"""Diagnosis (labelled: not a headline figure): where a ``python -m precsim ...`` process's
wall time goes, as a timeline. Runs the CLI in this process with a few of its stages wrapped
(Hydra's compositions and launcher, each job's ``_run_app``, the engine, the files, the sweep's
report and plots, the warm-up join, the Triton compile ahead) and prints, per call, when it
started (seconds after this interpreter started) and how long it took; ``--json`` writes them.

    python experiments/diagnose/phase_timeline.py [--json F] -- PRECSIM_ARGS ...

e.g. ``-- -m experiment=study_buffer_len run.device=cuda run.steps=32768``. The interpreter's
own start (before this script's first line) is not in it, and the wrapped modules are imported
before the CLI starts (torch among them): the first stage's start time is not a start-up figure.
"""

from __future__ import annotations

import functools
import importlib
import json
import sys
import threading
import time

T0 = time.perf_counter()
STAGES = [
    ("hydra._internal.config_loader_impl", "ConfigLoaderImpl.load_configuration"),
    ("hydra._internal.hydra", "Hydra.multirun"),
    ("hydra._internal.hydra", "Hydra.run"),
    ("hydra._internal.core_plugins.basic_launcher", "BasicLauncher.launch"),
    ("precsim.cli", "_run_app"),
    ("precsim.process", "join_warm_up"),
    ("precsim.result", "write_outputs"),  # before precsim.api, which imports it by name
    ("precsim.api", "run"),
    ("precsim.report", "aggregate"),
    ("precsim.report", "plot_pareto"),
    ("precsim.report", "plot_error_vs_length"),
    ("precsim.plots", "plot_error_vs_length"),
]
OPTIONAL = [("precsim.engines.triton", "_compile_together"), ("precsim.engines.triton", "run"),
            ("precsim.engines.numba_host", "run"), ("precsim.process", "warm_kernels"),
            ("triton.compiler", "compile"),  # each kernel's compile (JITFunction looks it up here)
            ("triton.runtime.build", "compile_module_from_src"),  # Triton's C stubs (a C compiler)
            ("triton.runtime.build", "compile_module_from_file"),
            ("triton.backends.nvidia.driver", "compile_module_from_src"),  # as bound there
            ("triton.backends.nvidia.driver", "compile_module_from_file"),
            ("triton.runtime.cache", "triton_key")]  # the hash of Triton's installation
ROWS: list[dict] = []


def wrap(modname: str, qual: str) -> None:
    mod = importlib.import_module(modname)
    *path, name = qual.split(".")
    owner = mod
    for p in path:
        owner = getattr(owner, p)
    f = getattr(owner, name)

    @functools.wraps(f)
    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            row = {"stage": f"{modname.rsplit('.', 1)[-1]}.{qual}", "start_s": round(t - T0, 3),
                   "took_s": round(time.perf_counter() - t, 3),
                   "thread": threading.current_thread().name}
            what = getattr(a[0], "name", None) if a and qual == "compile" else None
            if isinstance(what, str):  # the kernel a compile is for
                row["stage"] += f"({what})"
            ROWS.append(row)
            print(f"[timeline] {row['stage']:<44} at {row['start_s']:7.2f} s  took "
                  f"{row['took_s']:7.3f} s  [{row['thread']}]", file=sys.stderr, flush=True)

    setattr(owner, name, timed)


def main() -> int:
    argv = sys.argv[1:]
    out = None
    if argv[:1] == ["--json"]:
        out, argv = argv[1], argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    for m, q in STAGES:
        wrap(m, q)
    for m, q in OPTIONAL:
        try:
            wrap(m, q)
        except Exception:  # noqa: BLE001 - e.g. no Triton here
            pass
    from precsim import cli

    sys.argv = ["precsim", *argv]
    code = 0
    try:
        code = cli.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    total = time.perf_counter() - T0
    print(f"[timeline] total {total:.2f} s (after the interpreter's start), exit {code}",
          file=sys.stderr, flush=True)
    if out:
        with open(out, "w") as f:
            json.dump({"argv": argv, "total_s": round(total, 3), "exit": code, "rows": ROWS}, f,
                      indent=1)
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
