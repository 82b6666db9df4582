"""Philox-4x32 SR random source (``sr_source="philox5" | "philox7" | "philox10"``).

References: the Random123 known-answer vectors (``tests/kat_vectors`` of DEShawResearch/random123,
7 and 10 rounds) and a scalar Philox written here from the published round function.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import precsim.formats as pf
import pytest
import torch

M32 = 0xFFFFFFFF
# counter[4], key[2] -> output[4]
KAT = {
    10: [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
         ((M32,) * 4, (M32, M32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
         ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
          (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))],
    7: [((0, 0, 0, 0), (0, 0), (0x5F6FB709, 0x0D893F64, 0x4F121F81, 0x4F730A48)),
        ((M32,) * 4, (M32, M32), (0x5207DDC2, 0x45165E59, 0x4D8EE751, 0x8C52F662)),
        ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
         (0x4DFCCABA, 0x190A87F0, 0xC47362BA, 0xB6B5242A))],
}


def philox_scalar(ctr, key, rounds):
    """Philox-4x32 on Python ints: key bumped by the Weyl constants before rounds 2..R."""
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & M32, (p0 >> 32) ^ c3 ^ k1, p0 & M32
    return c0, c1, c2, c3


@pytest.mark.parametrize("rounds", [7, 10])
def test_known_answer_vectors(rounds):
    for ctr, key, want in KAT[rounds]:
        assert philox_scalar(ctr, key, rounds) == want
        got = pf.philox4x32_numpy(*[[c] for c in ctr], *key, rounds)
        assert tuple(int(v[0]) for v in got) == want
        got = pf.philox4x32_torch(*[torch.tensor([c]) for c in ctr], *key, rounds)
        assert tuple(int(v[0]) for v in got) == want


@pytest.mark.parametrize("rounds", [5, 7, 10])
def test_vectorised_equals_scalar_on_random_counters(rounds):
    rng = np.random.default_rng(rounds)
    ctr = rng.integers(0, 2**32, (4, 64), dtype=np.uint64)
    key = [int(k) for k in rng.integers(0, 2**32, 2, dtype=np.uint64)]
    want = np.array([philox_scalar([int(c[i]) for c in ctr], key, rounds) for i in range(64)])
    got_np = np.stack(pf.philox4x32_numpy(*ctr, *key, rounds), axis=1)
    got_t = torch.stack(pf.philox4x32_torch(*[torch.from_numpy(c.astype(np.int64))
                                              for c in ctr], *key, rounds), dim=1)
    assert np.array_equal(got_np.astype(np.int64), want)
    assert np.array_equal(got_t.numpy(), want)


@pytest.mark.parametrize("source", ["philox5", "philox7", "philox10"])
def test_word_layout_and_offsets(source):
    """Word w is output w % 4 of counter (w // 4 lo, w // 4 hi, 0, 0) under the stream's keys."""
    rounds = int(source[6:])
    seed, stream = 123, 456
    key = pf.stream_keys(seed, stream)
    for offset in (0, 3, 2**34 + 5):
        words = pf.random_bits_numpy(9, seed, stream, offset, source=source)
        want = [philox_scalar(((w // 4) & M32, (w // 4) >> 32, 0, 0), key, rounds)[w % 4]
                for w in range(offset, offset + 9)]
        assert words.tolist() == want
        t = pf.random_bits_torch(9, seed, stream, offset, source=source)
        assert t.tolist() == want


@pytest.mark.parametrize("bits", [8, 16, 24])
@pytest.mark.parametrize("source", pf.SR_SOURCES)
def test_numpy_torch_and_chunking_agree(source, bits):
    a = pf.random_uint_numpy(1001, bits, 7, 9, 13, source=source)
    b = pf.random_uint_torch(1001, bits, 7, 9, 13, source=source)
    assert np.array_equal(a.astype(np.int64), b.numpy())
    c = np.concatenate([pf.random_uint_numpy(500, bits, 7, 9, 13, source=source),
                        pf.random_uint_numpy(501, bits, 7, 9, 513, source=source)])
    assert np.array_equal(a, c)


@pytest.mark.parametrize("name", ["nvfp4", "fp16", "int8_b16", "fp8_e4m3"])
def test_sr_numpy_equals_torch_and_sources_differ(name):
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    outs = {}
    for src in pf.SR_SOURCES:
        a = pf.quantize(x, name, "sr", seed=3, stream=2, sr_source=src)
        b = pf.quantize(torch.from_numpy(x), name, "sr", seed=3, stream=2, sr_source=src)
        assert np.array_equal(a.view(np.int32), b.numpy().view(np.int32))
        outs[src] = a
    assert np.array_equal(outs["hash"], pf.quantize(x, name, "sr", seed=3, stream=2))
    assert len({o.tobytes() for o in outs.values()}) == len(pf.SR_SOURCES)


@pytest.mark.parametrize("source", ["philox5", "philox7", "philox10"])
@pytest.mark.parametrize("name,x0,gap", [("int8", 3.3, 1.0), ("fp4_e2m1", 2.6, 1.0)])
def test_sr_unbiased(source, name, x0, gap):
    n = 100_000
    x = np.full(n, np.float32(x0), np.float32)
    out = pf.quantize(x, name, "sr", seed=17, sr_source=source)
    lo = math.floor(float(np.float32(x0)))
    frac = (float(np.float32(x0)) - lo) / gap
    if name == "fp4_e2m1":  # 8 random bits: P(up) = floor(frac * 256) / 256
        frac = math.floor(frac * 256) / 256
    se = gap * math.sqrt(frac * (1 - frac) / n)
    mean = float(out.astype(np.float64).mean())
    assert abs(mean - (lo + frac * gap)) < 4 * se


def test_bad_source_and_config():
    from precsim.config import to_config
    from precsim.errors import PrecsimError
    from precsim.schemes import format_options, quantize_state

    with pytest.raises(pf.FormatError, match=r"sr_source='philox4' is unknown; allowed: hash, "
                                             r"philox5, philox7, philox10"):
        pf.quantize(np.zeros(4, np.float32), "fp16", "sr", seed=1, sr_source="philox4")
    base = {"schemes": {"a": {"kind": "conventional", "fmt": "fp16", "rounding": "sr"}},
            "model": {"state_dim": 32, "head_dim": 8, "heads": 1}}
    with pytest.raises(PrecsimError, match=r"formats.sr_source='mt' is unknown"):
        to_config({**base, "formats": {"sr_source": "mt"}})
    cfg = to_config({**base, "formats": {"sr_source": "philox7"}})
    fo = format_options(cfg)
    assert fo["sr_source"] == "philox7"
    x = torch.randn(1, 2, 8, 32)
    got = quantize_state(x, "fp16", "sr", name="a", event=3, purpose=0, seed=5,
                         sc=cfg.schemes["a"], fmt_options=fo, layer_scope=False)
    stream = pf.stream_id(zlib.crc32(b"a"), 3, 0)
    want = pf.quantize(x, "fp16", "sr", seed=5, stream=stream, sr_source="philox7")
    assert torch.equal(got, want)
    if pytest.importorskip("triton"):
        from precsim.engines.triton import unsupported_reason

        assert "sr_source=philox7" in unsupported_reason(cfg)
