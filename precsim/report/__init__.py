"""Sweep reports: ``python -m precsim.report DIR [--metric rel_err --budget 0.0625 --horizon N]``.

What it reads and writes is :data:`REPORT_HELP` (docs/sweeps.md); jobs that failed or never
finished get one row each in ``sweep_summary.csv``. Also :func:`run_verdict`, the budget verdict
the CLI prints at the end of a single run. By concern:

* :mod:`.runs`: reading run directories (:func:`collect`, :func:`check_run_dir`);
* :mod:`.groups`: which runs are comparable (:func:`comparable_groups`, :func:`short_tags`);
* :mod:`.ranking`: candidates, the recommendation and its text (:func:`decide`);
* :mod:`.verdict`: one run's verdict (:func:`run_verdict`);
* :mod:`.table`: the rows of ``sweep_summary.csv``;
* :mod:`.sweep_plots`: the length and Pareto plots;
* :mod:`.command`: the whole report (:func:`aggregate`) and ``precsim-report`` (:func:`main`).
"""

from __future__ import annotations

# the run directory's file names the report reads and writes (their home: precsim.rundir)
from ..rundir import ERROR_FILE
from ..rundir import SWEEP_CSV_FILE as CSV_FILE
from ..rundir import SWEEP_ERROR_PLOT as ERROR_PLOT
from ..rundir import SWEEP_PARETO_PLOT as PARETO_PLOT
from .command import REPORT_HELP, Aggregate, aggregate, main
from .groups import Group, comparable_groups, longest_run, short_tags, workload_kind
from .ranking import (
    Candidate,
    Recommendation,
    candidates,
    decide,
    format_decision,
    format_recommendation,
    pareto_front,
    recommend,
    relation_lines,
)
from .runs import METRICS, Job, ReportError, check_run_dir, collect, layer_dirs
from .sweep_plots import clip_low, plot_error_vs_length, plot_pareto
from .table import summary_rows
from .verdict import (
    BUDGET_MEANING,
    MODEL_MEANING,
    as_override,
    knob,
    margin_text,
    per_layer_lines,
    run_verdict,
)

__all__ = [
    "BUDGET_MEANING", "CSV_FILE", "ERROR_FILE", "ERROR_PLOT", "METRICS", "MODEL_MEANING",
    "PARETO_PLOT", "REPORT_HELP", "Aggregate", "Candidate", "Group", "Job", "Recommendation",
    "ReportError", "aggregate", "as_override", "candidates", "check_run_dir", "clip_low",
    "collect", "comparable_groups", "decide", "format_decision", "format_recommendation", "knob",
    "layer_dirs", "longest_run", "main", "margin_text", "pareto_front", "per_layer_lines",
    "plot_error_vs_length", "plot_pareto", "recommend", "relation_lines", "run_verdict",
    "short_tags", "summary_rows", "workload_kind",
]
