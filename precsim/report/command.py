"""The whole report (:func:`aggregate`: ``sweep_summary.csv`` and the plots) and its command
line, ``precsim-report`` (:func:`main`)."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

from .. import result as res
from ..errors import PrecsimError, argument_parser
from ..rundir import SWEEP_CSV_FILE, SWEEP_ERROR_PLOT, SWEEP_PARETO_PLOT, atomic_write_text
from .groups import longest_run
from .ranking import decide, format_decision
from .runs import METRICS, Job, ReportError, collect
from .sweep_plots import plot_error_vs_length, plot_pareto
from .table import summary_rows


@dataclass
class Aggregate:
    jobs: list[Job]
    rows: list[dict]
    csv_path: Path
    plots: list[Path]

    @property
    def n_complete(self) -> int:
        return sum(j.status == "complete" for j in self.jobs)


def aggregate(root: Path, plots: bool = True, budget: tuple[str, float] | None = None,
              horizon: int | None = None, jobs: list[Job] | None = None) -> Aggregate:
    """Collect ``root`` (or take its ``jobs``), write ``sweep_summary.csv`` (and the plots, with
    the budget line ``(metric, value)`` and each group's recommended configuration when given)
    into it."""
    root = Path(root)
    jobs = collect(root) if jobs is None else jobs
    if not jobs:
        raise ReportError(f"no run results (summary.json) under {root}")
    rows = summary_rows(jobs)
    csv_path = root / SWEEP_CSV_FILE
    atomic_write_text(csv_path, res.rows_to_csv(rows))
    written = []
    if plots and any(j.summary is not None for j in jobs):
        written = [plot_error_vs_length(jobs, root / SWEEP_ERROR_PLOT, budget, horizon),
                   plot_pareto(jobs, root / SWEEP_PARETO_PLOT, budget, horizon)]
    return Aggregate(jobs, rows, csv_path, written)


REPORT_HELP = """\
Compares every run under DIR (a sweep directory, one run directory, or a folder of sweeps) and
writes into DIR: sweep_summary.csv (one row per job and scheme: the job's overrides, rel_err /
kl / state_drift at each reported length and at the end, bytes per step), sweep_error_vs_length.png
(the Pareto-front configurations highlighted) and sweep_pareto.png (metric vs bytes per step).
With --budget it recommends the cheapest configuration within the budget and lists runners-up.

example: python -m precsim.report multirun/precision_sweep/2026-01-01_12-00-00_ab12 \\
             --metric rel_err --budget 0.0625
"""


def main(argv: list[str] | None = None) -> int:
    p = argument_parser("precsim-report", prog="precsim-report", description=REPORT_HELP,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", type=Path, help="a sweep or run directory")
    p.add_argument("--metric", choices=METRICS, default="rel_err",
                   help="the figure compared against the budget (default: rel_err, the layer "
                        "output's relative RMS error; kl depends on the readout's scale)")
    p.add_argument("--budget", type=float,
                   help="largest acceptable metric at the horizon, e.g. 0.0625 (rel_err)")
    p.add_argument("--horizon", type=int, help="generated tokens (default: the longest run); "
                   "beyond the longest run only with --extrapolate")
    p.add_argument("--extrapolate", action="store_true",
                   help="allow a --horizon beyond the longest run: each configuration is then "
                        "judged at its last reported length (shared and conventional schemes' "
                        "errors still grow with length)")
    p.add_argument("--top", type=int, default=3, help="runners-up to list")
    p.add_argument("--no-plots", action="store_true", help="write only sweep_summary.csv")
    a = p.parse_args(argv)
    if a.budget is not None and not (a.budget > 0 and math.isfinite(a.budget)):
        p.error(f"--budget={a.budget} must be a positive number")
    if a.horizon is not None and a.horizon < 1:
        p.error(f"--horizon={a.horizon} must be a positive number of tokens")
    if a.top < 0:  # (a negative count sliced the list from its end)
        p.error(f"--top={a.top} is invalid; allowed: an integer >= 0 (runners-up to list)")
    try:
        from ..preflight import readable_dir, writable_dir

        # an unreadable DIR, or one it cannot write its summary into: one line, no work
        if a.dir.is_dir():  # (a missing one: collect's own line)
            readable_dir("DIR", a.dir)
            writable_dir("DIR", a.dir, "a directory of runs that precsim-report can write "
                         "sweep_summary.csv and its plots into")
        jobs = collect(a.dir)
        if not jobs:
            raise ReportError(f"no run results (summary.json) under {a.dir}")
        longest = longest_run(jobs)
        if a.horizon is not None and longest and a.horizon > longest and not a.extrapolate:
            raise ReportError(
                f"--horizon={a.horizon} is beyond the longest run ({longest:,} steps); "
                f"allowed: 1..{longest}, or add --extrapolate to judge each configuration at "
                "its last reported length")
        decision = decide(jobs, a.metric, a.budget, a.horizon)  # (checks --metric too)
        if not any(cs for _, cs, _ in decision) and longest:
            raise ReportError(f"no reported length <= --horizon={a.horizon} in any run")
        agg = aggregate(a.dir, plots=not a.no_plots, jobs=jobs, horizon=a.horizon,
                        budget=(a.metric, a.budget) if a.budget is not None else None)
    except PrecsimError as e:  # ReportError, a preflight's, a format's: one line (errors.py)
        p.error(str(e))
    print(f"{a.dir}: {agg.n_complete}/{len(agg.jobs)} jobs complete; wrote "
          f"{', '.join(x.name for x in [agg.csv_path, *agg.plots])}")
    for j in agg.jobs:
        if j.status != "complete":
            print(f"  job {j.name}: {j.status}" + (f" ({j.error})" if j.error else ""))
    if any(cs for _, cs, _ in decision):
        print(format_decision(decision, a.metric, a.horizon, a.top))
    return 0
