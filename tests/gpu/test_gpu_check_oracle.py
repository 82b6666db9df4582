"""tests/gpu/gpu_check.py's float64 oracle on the CPU: heads split over forked workers, as the
GPU test runs it (the script imported through ``conftest.load_script``; its worker function
must pickle by reference, which once failed on the GPU machine: "Can't pickle <function
_oracle_slice>: it's not the same object as gpu_check._oracle_slice")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from conftest import load_script

from precsim.oracle import decode

HERE = Path(__file__).resolve().parent


def test_forked_oracle_equals_one_process():
    g = load_script(HERE / "gpu_check.py", "gpu_check")
    T, H, P, N = 16, 4, 3, 5
    rng = np.random.default_rng(0)
    tr = dict(A=-rng.random(H), dt=rng.random((T, H)) * 0.1, x=rng.normal(size=(T, H, P)),
              B=rng.normal(size=(T, H, N)), C=rng.normal(size=(T, H, N)))
    y = g.oracle_outputs(tr, H, workers=2)
    assert np.array_equal(y, decode(tr))
