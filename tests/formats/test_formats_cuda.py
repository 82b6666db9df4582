"""CUDA tensors through precsim.formats give the same bits as the NumPy path (GPU only)."""

from __future__ import annotations

import numpy as np
import precsim.formats as pf
import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

STATE_FORMATS = [n for n in pf.names() if n not in ("fp64",)]


@pytest.mark.parametrize("name", STATE_FORMATS)
@pytest.mark.parametrize("rounding", ["rne", "sr"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cuda_matches_numpy_bit_for_bit(name, rounding, dtype):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((4, 64, 128)) * np.exp2(rng.integers(-12, 12, (4, 64, 1))))
    x = x.astype(dtype)
    if name == "e8m0":
        x = np.abs(x) + dtype(1e-3)
    a = pf.quantize(x, name, rounding, seed=11, stream=5)
    b = pf.quantize(torch.from_numpy(x).cuda(), name, rounding, seed=11, stream=5).cpu().numpy()
    np.testing.assert_array_equal(a, b)
