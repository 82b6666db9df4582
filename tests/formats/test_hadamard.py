"""Randomized Hadamard rotation (``formats.rotate``) against an explicit matrix built with
scipy.linalg.hadamard, and ``quantize(..., rotate=True)`` as rotate -> quantize -> inverse."""

from __future__ import annotations

import numpy as np
import precsim.formats as pf
import pytest
import torch
from precsim.formats.hadamard import signs
from scipy.linalg import hadamard


@pytest.mark.parametrize("n", [1, 2, 16, 128, 1024])
def test_matches_explicit_matrix_and_inverts(n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal((3, 2, n)) * np.exp2(rng.integers(-20, 20, (3, 2, 1)))
    d = np.where(pf.random_bits_numpy(n, 0x0DDBA11, 0x524F54) >> np.uint32(31), -1.0, 1.0)
    R = hadamard(n) * d[None, :] / np.sqrt(n)  # y = H diag(d) x / sqrt(n)
    assert np.allclose(R @ R.T, np.eye(n), atol=1e-13, rtol=0)
    y = pf.rotate(x)
    scale = np.abs(x).max(axis=-1, keepdims=True)
    assert np.abs(y - x @ R.T).max(axis=-1, keepdims=True).max() <= 1e-12 * scale.max()
    assert np.all(np.abs(pf.rotate(y, inverse=True) - x) <= 1e-12 * scale)
    assert np.allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-12, atol=0)
    yt = pf.rotate(torch.from_numpy(x))
    assert np.array_equal(yt.numpy(), y)  # same operation order on both backends
    assert np.array_equal(pf.rotate(yt, inverse=True).numpy(), pf.rotate(y, inverse=True))

def test_signs_are_fixed_and_seeded():
    assert np.array_equal(signs(64), signs(64))
    assert not np.array_equal(signs(64), signs(64, seed=1))
    assert set(np.unique(signs(4096))) == {-1.0, 1.0}
    assert abs(signs(4096).mean()) < 4 / 64  # balanced (4 standard errors)
    x = np.random.default_rng(0).standard_normal((2, 64))
    assert not np.allclose(pf.rotate(x), pf.rotate(x, seed=1))

@pytest.mark.parametrize("name", ["int8_b64", "nvfp4", "fp8_e4m3", "int8"])
@pytest.mark.parametrize("rounding", ["rne", "sr"])
def test_quantize_rotate_is_rotate_quantize_inverse(name, rounding):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 4, 64)).astype(np.float32)
    x[0, 1, 5] = 300.0  # an outlier
    for xx in (x, torch.from_numpy(x)):
        got = pf.quantize(xx, name, rounding, seed=4, rotate=True)
        want = pf.rotate(pf.quantize(pf.rotate(xx), name, rounding, seed=4), inverse=True)
        assert got.dtype == xx.dtype and got.shape == xx.shape
        assert np.array_equal(np.asarray(got), np.asarray(want))

def test_rotation_spreads_an_outlier():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((64, 128)).astype(np.float32)
    x[:, 7] = 200.0  # one outlier per row: the row scale wipes out the rest without rotation
    plain = np.abs(pf.quantize(x, "int8_b128") - x)[:, np.arange(128) != 7].mean()
    rot = np.abs(pf.quantize(x, "int8_b128", rotate=True) - x)[:, np.arange(128) != 7].mean()
    assert rot < 0.5 * plain

def test_errors_and_config():
    from precsim.config import to_config
    from precsim.errors import PrecsimError
    from precsim.schemes import format_options

    with pytest.raises(pf.FormatError, match=r"rotate=true: rotate: last axis length 48 .* "
                                             r"allowed: a power of two"):
        pf.quantize(np.zeros((2, 48), np.float32), "int8", rotate=True)
    with pytest.raises(pf.FormatError, match="rotate='yes' is invalid; allowed: true, false"):
        pf.quantize(np.zeros((2, 16), np.float32), "int8", rotate="yes")
    base = {"schemes": {"a": {"kind": "conventional", "fmt": "int8"}},
            "model": {"state_dim": 32, "head_dim": 8, "heads": 1}}
    assert format_options(to_config({**base, "formats": {"rotate": True}}))["rotate"] is True
    with pytest.raises(PrecsimError, match=r"model.state_dim=48 is invalid; allowed: a power of "
                                           r"two \(formats.rotate=true"):
        to_config({**base, "model": {"state_dim": 48, "head_dim": 8, "heads": 1},
                   "formats": {"rotate": True}})
