"""The run directory: the one home of its file names, and of what decides whether a directory
holds a finished result (completeness, reuse, the input fingerprint), how its files are written
(atomically) and how a broken job is set aside.

A run directory holds ``metrics.csv``, ``per_step.npz``, the PNG, ``precsim.log`` and
``summary.json`` last (its ``complete`` flag marks a finished run); while a run is unfinished
its ``checkpoint.pt``; a failed sweep job's ``error.txt``. A sweep directory adds the sweep's
summary and plots; a replay of every recorded layer its ``layers.csv``, ``layers.png`` and one
``layer_XX/`` run directory per layer; a recording (``precsim.record``) its ``record.json``.
"""

from __future__ import annotations

# -- file names ---------------------------------------------------------------------------------
# a run
METRICS_FILE = "metrics.csv"
SUMMARY_FILE = "summary.json"  # written last: its ``complete`` flag marks a finished run
PER_STEP_FILE = "per_step.npz"
PLOT_FILE = "error_vs_length.png"
GENERATIONS_FILE = "generations.txt"  # model.mode=generate: the continuations, readable
LOG_FILE = "precsim.log"  # Hydra's job log (the job's name is precsim)
CHECKPOINT_FILE = "checkpoint.pt"  # while a run is unfinished
ERROR_FILE = "error.txt"  # a failed sweep job's error
BROKEN_SUFFIX = ".broken"  # a broken job's summary, set aside: summary.json.broken
HYDRA_DIR = ".hydra"  # Hydra's copy of the composed config
# a sweep
SWEEP_CSV_FILE = "sweep_summary.csv"
SWEEP_ERROR_PLOT = "sweep_error_vs_length.png"
SWEEP_PARETO_PLOT = "sweep_pareto.png"
MULTIRUN_FILE = "multirun.yaml"  # Hydra's, in a sweep directory
# every recorded layer of a recording, replayed (precsim.layers)
LAYERS_CSV = "layers.csv"
LAYERS_PLOT = "layers.png"
# a recording (precsim.record)
RECORD_FILE = "record.json"
# a task run (experiment=task_eval) and a per-layer sensitivity run
ITEMS_CSV = "items.csv"
TASK_LENGTH_PLOT, TASK_DELTA_PLOT = "accuracy_vs_length.png", "task_accuracy.png"
SENS_CSV, SENS_PNG = "sensitivity.csv", "sensitivity.png"


def layer_dir_name(layer: int) -> str:
    """The run directory of one layer of a replay over every recorded layer: ``layer_07``."""
    return f"layer_{layer:02d}"
