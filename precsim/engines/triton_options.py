"""What a caller of the Triton engine (:mod:`precsim.engines.triton`) passes beyond the
config: :class:`Options`, what a user sets, and :class:`Diagnosis`, the knobs of benchmarks and
diagnosis scripts (``run(cfg, device, options=..., diagnosis=...)``)."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class Options:
    """What a user of the Triton engine sets beyond the config.

    ``record_outputs``: True or a list of names ("truth", scheme names) whose per-step outputs go
    to ``info["outputs"]``. ``runtime_codes``: the schemes' kinds, formats and roundings as
    runtime arguments of one kernel compiled per shape (True: what a sweep over schemes wants,
    one compile for all its jobs), or constexprs, a kernel compiled per configuration (False:
    2.3x faster kernels, measured on the H200; docs/performance.md); None:
    :func:`runtime_codes_default`.
    ``sweep_blocks``: a job of a sweep over schemes (None: not one): the block sizes the sweep's
    jobs will need (the command line's ``compose.sweep_kernels``); runtime codes are then the
    default, and the first job compiles the kernels of these blocks beside its own (one kernel per
    block size serves the sweep).
    """

    record_outputs: bool | list = False
    runtime_codes: bool | None = None
    sweep_blocks: frozenset | None = None


@dataclass
class Diagnosis:
    """Knobs of the Triton engine for benchmarks and diagnosis (``run(..., diagnosis=...)``;
    None: these defaults).

    ``overlap`` (default: on CUDA) reduces window k's metrics on a side stream while window k+1's
    kernel runs. ``skip_metrics`` leaves the metrics stage out (no rows). ``poison`` fills the
    output buffers with NaN before each launch (checks that the kernels write every output).
    ``kl_tf32``: the KL's difference matmul in TF32 on CUDA (~1e-3 relative on the KL; False:
    IEEE float32). ``fused_metrics``: each window's outputs reduced in one Triton pass (False:
    the torch ops of ``DeviceAccumulator.push``, also used when outputs are recorded). ``lpt``:
    the costliest slots' programs first (``kernels.codes.dispatch_order``). ``maxnreg`` caps the
    kernels' registers per thread. ``kl_fused``: the KL after its two matmuls in one Triton pass.
    ``prefetch`` (CUDA): the next batch's inputs are drawn on a side stream while the current
    kernel runs. ``metrics_batch``: launch windows whose inputs and fused window metrics are
    drawn and reduced together. ``priority`` (CUDA): the kernels run on a high-priority stream.
    ``inflight``: launches the host may queue ahead of the GPU (it then waits for the oldest).
    ``metrics_lag`` (with ``overlap``, without ``metrics_thread``): a batch's metrics are reduced
    once this many later batches are queued behind it. Neither changed a first run's time on the
    H200 machine (5-64 launches, lags 1-4; docs/performance.md, GPU section). ``metrics_thread``
    (with ``overlap``): a thread of its own queues each batch's metrics, after calling every
    metrics kernel once on zeros while the first batch launches (a first run: 0.46-0.48 s
    against 0.47-0.48 s without, and no stall between launches). ``lanes``: the truth and each
    scheme in a launch of its own (None: :data:`LANES` without runtime codes; False: one launch
    per block size, as before).
    """

    num_warps: int | None = None
    overlap: bool | None = None
    skip_metrics: bool = False
    poison: bool = False
    kl_tf32: bool = True
    fused_metrics: bool = True
    lpt: bool = True
    maxnreg: int | None = None
    kl_fused: bool = True
    prefetch: bool = True
    metrics_batch: int = 8
    priority: bool = True
    inflight: int = 32
    metrics_lag: int = 2
    metrics_thread: bool = True
    lanes: bool | None = None


def settings(**kw) -> dict:
    """:func:`run`'s ``options`` and ``diagnosis`` from fields of either (benchmark scripts that
    take both from their command line): ``run(cfg, dev, **settings(num_warps=8, ...))``."""
    mine = {f.name for f in fields(Options)}
    return {"options": Options(**{k: v for k, v in kw.items() if k in mine}),
            "diagnosis": Diagnosis(**{k: v for k, v in kw.items() if k not in mine})}
