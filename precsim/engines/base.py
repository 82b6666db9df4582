"""What every engine shares: the flush schedule (from :mod:`precsim.schedule`, below the engines:
the cost model uses it too), the progress bar and the slow-start notice, the buffer rounder.

An engine is one module in this package with ``NAME``, ``supports(cfg, device) -> str | None``
(None, or why it cannot run ``cfg`` there) and ``run(cfg, device, progress) -> Result``; it
advances the float64 truth and every scheme in lockstep over ``make_workload(cfg, device)`` and
reduces the outputs with ``precsim.metrics.Accumulator``, then builds its
``precsim.result.Result`` with ``make_result``.
"""

from __future__ import annotations

import os

import numpy as np

from ..config import Config
from ..schedule import (  # noqa: F401 - the engines' flush schedule, re-exported
    acceptance_profile,
    accepted_counts,
    flush_events,
    flush_schedule,
    mean_accepted,
    segment_ends,
    segment_phase,
    skip_to,
)


def progress_bar(cfg: Config, enabled: bool):
    """A tqdm bar over the run's steps on a terminal; when stderr is not a TTY (piped, in a
    log file) a :class:`ProgressLines` instead, one plain line every few seconds. None when
    disabled (or tqdm is missing)."""
    if not (enabled and cfg.run.progress):
        return None
    import sys

    if not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty()):
        return ProgressLines(cfg.run.steps)
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        return None
    return tqdm(total=cfg.run.steps, unit="step", desc="precsim", mininterval=0.5,
                leave=False, dynamic_ncols=True)


class ProgressLines:
    """Progress for a stream that is not a terminal (a pipe, a CI log): no bar (its carriage
    returns make one line of everything), but ``precsim: step 12,288/32,768 (38%), 31 s,
    ~51 s left`` on stderr at most every ``every`` seconds, so a long run piped to a file or
    ``tee`` shows it is alive. Nothing for a run shorter than ``every``. The tqdm methods the
    engines and whole-model runs call: ``update``, ``reset``, ``set_description``, ``close``."""

    def __init__(self, total: int, every: float = 5.0, stream=None, clock=None):
        import sys
        import time

        self.total, self.every, self.n, self.desc = int(total), float(every), 0, "step"
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock or time.monotonic
        self.t0 = self.last = self.clock()

    def update(self, n: int = 1) -> None:
        self.n += int(n)
        now = self.clock()
        if now - self.last < self.every or self.n >= self.total:
            return
        self.last = now
        el = now - self.t0
        left = f", ~{el * (self.total - self.n) / self.n:,.0f} s left" if self.n else ""
        try:
            print(f"precsim: {self.desc} {self.n:,}/{self.total:,} "
                  f"({100 * self.n / self.total:.0f}%), {el:,.0f} s{left}", file=self.stream,
                  flush=True)
        except (OSError, ValueError):  # a closed pipe: nothing more to say
            pass

    def reset(self, total: int | None = None) -> None:
        self.n = 0
        if total is not None:
            self.total = int(total)

    def set_description(self, desc: str) -> None:  # (a whole-model run: "layers x chunks")
        self.desc = str(desc)

    def close(self) -> None:
        pass


def slow_notice(what: str, enabled: bool = True, after: float = 2.0):
    """A context manager that says ``precsim: {what} ...`` on stderr if its block is still
    running after ``after`` seconds (e.g. a first run's compilation: ~15-20 s during which the
    progress bar cannot move), and nothing otherwise."""
    import contextlib
    import sys
    import threading

    if not enabled:
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def notice():
        timer = threading.Timer(after, lambda: print(f"precsim: {what} ...", file=sys.stderr,
                                                     flush=True))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    return notice()


def buffer_rounder(dtype_name: str, compute_bits: int):
    """The rounding of ReplaySSM buffer entries (``replay.buffer_dtype``), NumPy or torch."""
    from precsim import formats as pf

    if dtype_name == "fp64" or (dtype_name == "fp32" and compute_bits == 32):
        return lambda x: x
    return lambda x: pf.quantize(x, dtype_name, "rne")


def launch_ends(seg_ends, window: int) -> list[int]:
    """Ends of the windows a fused engine runs at once (the Triton and numba engines): the first
    flush (of ``seg_ends``, :func:`segment_ends`) at or after each metrics window end, so the
    ReplaySSM buffers start empty in every window and state drift is sampled where the torch
    engine samples it."""
    seg_ends = np.asarray(seg_ends)
    steps = int(seg_ends[-1])
    ends = []
    k = 1
    while not ends or ends[-1] < steps:
        e = int(seg_ends[np.searchsorted(seg_ends, min(k * window, steps))])
        if not ends or e > ends[-1]:
            ends.append(e)
        k += 1
    return ends


def side_by_side_jobs() -> int:
    """How many jobs of a Hydra sweep run side by side on this machine: the joblib launcher's
    ``n_jobs`` in a multirun job (-1 = all cores, -2 all but one, ...), else 1 (a single run, the
    API, or Hydra's basic launcher, which runs the jobs in turn)."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode
        from omegaconf import OmegaConf
    except ImportError:  # pragma: no cover
        return 1
    if not HydraConfig.initialized():
        return 1
    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN:
        return 1
    if "joblib" not in str(OmegaConf.select(hc, "launcher._target_", default="") or "").lower():
        return 1
    n = OmegaConf.select(hc, "launcher.n_jobs", default=-1)
    cores = os.cpu_count() or 1
    n = int(n) if n is not None else -1
    return max(1, n if n > 0 else cores + 1 + n)


def cpu_threads(threads, cores: int | None = None) -> int:
    """The threads a CPU engine's own compiled code uses for ``run.threads``: ``auto`` = all
    cores for a single run, the cores shared out among the jobs of a joblib sweep that run
    side by side (1 each when ``n_jobs`` = cores); 0 = all cores; n = n (at most the cores).
    Results do not depend on it (tests/engines/test_engine_numba.py)."""
    cores = cores or os.cpu_count() or 1
    if threads == "auto":
        return max(1, cores // side_by_side_jobs())
    return cores if threads == 0 else max(1, min(int(threads), cores))


def torch_threads(threads) -> int | None:
    """torch's intra-op threads for ``run.threads`` (None: leave torch's default): ``auto`` = 1,
    because torch's OpenMP workers spin (with 2 threads on a shared 2-core machine the torch
    engine ran 3-20x slower than with one; docs/performance.md); 0 = torch's default; n = n."""
    if threads == "auto":
        return 1
    return None if threads == 0 else int(threads)
