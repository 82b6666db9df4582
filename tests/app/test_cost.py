"""Cost model against byte counts worked out by hand.

The reference layer: one Mamba-2 head, P = 64, N = 128 (8192 state elements), L = 16, FP32 buffer.

    FP32 state        8192 · 4 B                                  = 32768 B
    NVFP4 state       8192 · 4 bit = 4096 B of E2M1 elements
                    + 8192 / 16 = 512 E4M3 block scales (1 B)    =   512 B
                    + one FP32 scale per head matrix              =     4 B
                                                                   -> 4612 B  (= 8192·4.5/8 + 4)
    buffer entry      x (64) + B (128) in FP32 + dt in FP32       = 192·4 + 4 = 772 B
    buffer traffic    1 entry written per step, (L+1)/2 = 8.5 entries read on average
                                                                   -> 772 + 6562 = 7334 B/step

    conventional FP32  read + write every step: 2 · 32768        = 65536 B/step, 2 transfers
    shared NVFP4       read 4612 every step, write 4612/16 = 288.25
                       + buffer 7334                              = 12234.25 B/step,
                       over 16 steps: 16 reads + 1 write = 17 transfers -> 17/16 per step
    split FP32+NVFP4   reads: 15 read-copy reads (15 · 4612 = 69180) + the flush reads the
                       FP32 master (32768) -> 101948 / 16 = 6371.75
                       writes at the flush: master + read copy = (32768 + 4612) / 16 = 2336.25
                       + buffer 7334                              = 16042 B/step,
                       16 reads + 2 writes = 18 transfers -> 18/16 per step
"""

from __future__ import annotations

import pytest

from precsim.config import to_config
from precsim.cost import buffer_entry_bytes, scheme_cost, scheme_costs, state_bytes

P, N, L = 64, 128, 16
SHAPE = {"family": "mamba2", "head_dim": P, "state_dim": N, "buffer_len": L,
         "buffer_dtype": "fp32"}
BUFFER = 772 + 772 * (L + 1) / 2  # 7334


@pytest.mark.parametrize(("fmt", "nbytes"), [
    pytest.param("fp32", 32768, id="fp32"),
    pytest.param("fp16", 16384, id="fp16"),
    pytest.param("fp8_e4m3", 8192, id="fp8_e4m3"),
    pytest.param("nvfp4", 4096 + 512 + 4, id="nvfp4"),  # elements + E4M3 scales + FP32 scale
    pytest.param("mxfp4", 4096 + 256, id="mxfp4"),  # one E8M0 scale per 32, no tensor scale
])
def test_state_bytes(fmt, nbytes):
    assert state_bytes(fmt, P, N) == nbytes


@pytest.mark.parametrize(("family", "dtype", "nbytes"), [
    pytest.param("mamba2", "fp32", (64 + 128) * 4 + 4, id="mamba2-fp32"),
    pytest.param("mamba2", "bf16", (64 + 128) * 2 + 4, id="mamba2-bf16"),
    pytest.param("gdn", "fp32", (128 + 128) * 4 + 4, id="gdn-fp32"),  # u (V) + k (K) + decay
])
def test_buffer_entry_bytes(family, dtype, nbytes):
    v = 128 if family == "gdn" else P
    assert buffer_entry_bytes(family, v, 128, dtype) == nbytes


def test_conventional_fp32():
    c = scheme_cost("conventional", "fp32", None, **SHAPE)
    assert c["state_read"] == 32768 and c["state_write"] == 32768
    assert c["buffer_read"] == 0 and c["buffer_write"] == 0
    assert c["bytes_per_step"] == 65536
    assert c["state_transfers_per_step"] == 2  # 32 transfers over 16 steps
    assert c["fraction_of_fp32"] == 1.0 and c["roofline_speedup"] == 1.0


def test_shared_nvfp4():
    c = scheme_cost("shared", "nvfp4", None, **SHAPE)
    assert c["state_read"] == 4612
    assert c["state_write"] == 4612 / 16 == 288.25
    assert c["buffer_write"] == 772 and c["buffer_read"] == 6562
    assert c["bytes_per_step"] == 4612 + 288.25 + BUFFER == 12234.25
    assert c["state_transfers_per_step"] == 17 / 16  # 32 -> 17 transfers over 16 steps
    assert c["fraction_of_fp32"] == pytest.approx(12234.25 / 65536)
    assert c["roofline_speedup"] == pytest.approx(65536 / 12234.25)


def test_split_fp32_update_nvfp4_read():
    c = scheme_cost("split", "fp32", "nvfp4", **SHAPE)
    assert c["state_read"] == (15 * 4612 + 32768) / 16 == 6371.75
    assert c["state_write"] == (32768 + 4612) / 16 == 2336.25
    assert c["bytes_per_step"] == 6371.75 + 2336.25 + BUFFER == 16042
    assert c["state_transfers_per_step"] == 18 / 16


def test_replay_state_traffic_bound():
    """with an FP32 checkpoint, state traffic drops 32/17 = 1.88x at L = 16."""
    conv = scheme_cost("conventional", "fp32", None, **SHAPE)
    shared = scheme_cost("shared", "fp32", None, **SHAPE)
    state = shared["state_read"] + shared["state_write"]
    assert state == 32768 * 17 / 16
    assert conv["bytes_per_step"] / state == pytest.approx(32 / 17)


def test_unknown_kind_is_named():
    with pytest.raises(ValueError, match="kind='bogus'"):
        scheme_cost("bogus", "fp32", None, **SHAPE)


def test_scheme_costs_follow_the_config():
    cfg = to_config({
        "model": {"family": "mamba2", "heads": 1, "head_dim": P, "state_dim": N},
        "replay": {"buffer_len": L, "buffer_dtype": "fp32"},
        "schemes": {"c": {"kind": "conventional", "fmt": "fp32"},
                    "s": {"kind": "shared", "fmt": "nvfp4", "rounding": "sr"},
                    "x": {"kind": "split", "fmt": "fp32", "read_fmt": "nvfp4"}},
    })
    costs = scheme_costs(cfg)
    assert {k: v["bytes_per_step"] for k, v in costs.items()} == {
        "c": 65536, "s": 12234.25, "x": 16042}


def test_drafts_flush_every_mean_segment():
    """Speculative drafts: the flush interval is the schedule's mean segment. T = 4 drafts all
    accepted flush every 12 committed steps (12 + 2*4 > 16), so the costs are those of L = 12."""
    d = {"model": {"family": "mamba2", "heads": 1, "head_dim": P, "state_dim": N},
         "replay": {"buffer_len": 16, "drafts": 4, "accept_seq": [4]},
         "run": {"steps": 120}, "metrics": {"window": 24},
         "schemes": {"s": {"kind": "shared", "fmt": "nvfp4", "rounding": "sr"},
                     "x": {"kind": "split", "fmt": "fp32", "read_fmt": "nvfp4"}}}
    costs = scheme_costs(to_config(d))
    for name, s in to_config(d).schemes.items():
        want = scheme_cost(s.kind, s.fmt, s.read_fmt, family="mamba2", head_dim=P, state_dim=N,
                           buffer_len=12)
        assert costs[name] == pytest.approx(want)
        assert want["state_write"] > scheme_cost(s.kind, s.fmt, s.read_fmt, family="mamba2",
                                                 head_dim=P, state_dim=N,
                                                 buffer_len=16)["state_write"]
    assert scheme_costs(to_config(d), mean_segment=12.0) == costs
