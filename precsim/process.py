"""The command line's own process: its tuning (glibc's malloc, the cyclic garbage collector, a
warm-up thread that overlaps one-off costs with Hydra's start, ``os._exit`` at the end) in one
place. Only a command line that owns its process calls these (:mod:`precsim.cli`); the Python
API leaves its caller's process as it is.
"""

from __future__ import annotations

import gc
import os
import sys

WARM_UP: list = []  # the warm-up thread of this process, joined before the engine starts


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


def start() -> None:
    """The start of a command: :func:`keep_freed_memory`, and no cyclic garbage collection
    while the imports run (the collections they set off took 0.37 s of a 1.7 s start-up on the
    2-core machine): on again, the imports' objects frozen out of it, before the engine
    (:func:`ready`) and on the way out (:func:`finish`). The few cycles the imports leave
    unreachable (~10,000 objects, a few MB) are frozen too and kept till the exit: a full
    collection first would cost 0.18 s of the 0.37."""
    keep_freed_memory()
    gc.disable()


def ready() -> None:
    """Before the engine: the warm-up joined (:func:`join_warm_up`), the imports' objects
    frozen (later collections skip them: no multi-ms pauses) and the collector on again."""
    join_warm_up()
    gc.freeze()
    gc.enable()


def finish(collecting: bool) -> None:
    """The end of a command (after :func:`join_warm_up`): an in-process caller (tests, a
    notebook) gets its collector back as it was (``collecting``: ``gc.isenabled()`` before
    :func:`start`)."""
    gc.unfreeze()
    if collecting:
        gc.enable()


def exit_now(code: int) -> None:
    """``os._exit(code)`` once the logs are shut down and the streams flushed: the
    interpreter's teardown (CUDA's context, torch's and Triton's modules) took 0.5-0.7 s of
    each GPU process and has nothing left to write."""
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more to say
            pass
    os._exit(code)


def warm_up(args: list[str]) -> None:
    """Start, in a daemon thread, the one-off costs the run will pay later, so they overlap the
    main thread's work (Hydra's import and setup, the run directory): ``import torch``, CUDA's
    context, cuBLAS's libraries, Triton's per-process cache key (a hash of its installation,
    ~0.4 s on the H200 machine), the Triton kernels (:func:`warm_kernels`) and matplotlib.
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
                    warm_kernels()
            if plot_wanted:
                import matplotlib

                matplotlib.use("Agg")
                import matplotlib.pyplot  # noqa: F401
        except Exception:  # noqa: BLE001 - a warm-up only; the run itself reports errors
            pass

    t = threading.Thread(target=work, name="precsim-warm-up", daemon=True)
    t.start()
    WARM_UP.append(t)


def warm_kernels() -> None:
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
    from precsim.families import FAMILIES

    # each family's kernel set (its KERNEL names the module), then the shared ones
    for name in (*dict.fromkeys(f.KERNEL for f in FAMILIES.values()), "metrics", "inputs"):
        mod = importlib.import_module(f"precsim.kernels.{name}")
        for fn in vars(mod).values():
            if isinstance(fn, JITFunction):
                fn.cache_key  # noqa: B018 - computed once and kept by the function



def join_warm_up(timeout: float = 30.0) -> None:
    """Let the warm-up finish before the engine runs: its one-off work then overlaps Hydra's
    setup only, instead of racing the engine's first kernels (two threads hashing Triton's
    installation at once); and at the end of a command, so that none outlives it (one still
    initialising CUDA when the interpreter exits, a one-line error within a second of the
    start, aborted the process: ``terminate called without an active exception``, exit 134,
    on the H200)."""
    while WARM_UP:
        WARM_UP.pop().join(timeout)
