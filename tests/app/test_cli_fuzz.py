"""Fuzz test of the command line: seeded override sets built from the config schema, valid and
invalid. Each must either complete (a complete result in its directory) or exit 2 with exactly
one line on stderr; never a traceback, never a directory left by a run that failed."""

from __future__ import annotations

import random

import pytest

from precsim.cli import main
from precsim.config import schema_keys

N_CASES = 200
BASE = ["model.heads=1", "model.head_dim=4", "model.state_dim=16", "run.steps=32", "run.seqs=1",
        "metrics.window=16", "metrics.vocab=16", "metrics.lengths=[16,32]", "run.progress=false",
        "metrics.plot=false", "run.device=cpu", "run.engine=torch"]
# run.engine=torch: the command line is under test, not an engine; with auto, the valid cases'
# numba compiles took 75 of the 106 s these 200 cases took on the 2-core machine (run.engine
# is still fuzzed below; auto's choice is tests/engines/test_engine_numba.py's)
SCHEMES = ("conventional_fp32", "shared_nvfp4_sr", "split_fp32_nvfp4")  # schemes=split_nvfp4
# plausible values per key (valid and invalid); keys not listed get GENERIC values
VALUES = {
    "model.family": ["mamba2", "gdn", "rwkv", "1"],
    "model.heads": ["1", "2", "0", "-1", "x", "1.5"],
    "model.head_dim": ["4", "8", "0", "abc"],
    "model.state_dim": ["16", "32", "8", "12", "0"],
    "model.groups": ["1", "2", "0"],
    "replay.buffer_len": ["4", "16", "64", "0", "-2"],
    "replay.buffer_dtype": ["fp32", "bf16", "fp16", "int8"],
    "replay.drafts": ["0", "2", "4", "99", "-1"],
    "replay.acceptance": ["0.7", "1.0", "0", "1.5", "[0.9,0.8,0.7]", "[0.9,2]", "[]", "x"],
    "replay.accept_seq": ["[1,2]", "[0]", "[]", "null"],
    "replay.gdn_u_source": ["read", "master", "both"],
    "formats.scale_floor": ["subnormal", "normal", "zero"],
    "formats.tensor_scope": ["matrix", "tensor", "none", "row"],
    "workload.kind": ["synthetic", "seed_article", "trace", "random"],
    "workload.path": ["null", "/nonexistent.npz"],
    "workload.long_memory_frac": ["0.5", "0", "2"],
    "workload.dt_noise": ["0.5", "0.1"],
    "run.steps": ["16", "32", "48", "8", "0", "-5", "many"],
    "run.seqs": ["1", "2", "0"],
    "run.seed": ["0", "7", "-1"],
    "run.device": ["cpu", "tpu", "cuda"],
    "run.engine": ["torch", "auto", "numpy", "cuda"],
    "run.compute_dtype": ["fp32", "fp64", "fp8"],
    "run.threads": ["1", "0", "-1"],
    "metrics.window": ["8", "16", "32", "64", "0"],
    "metrics.vocab": ["16", "1", "2"],
    "metrics.logit_scale": ["3", "0", "-1"],
    "metrics.kl": ["true", "false", "maybe"],
    "metrics.lengths": ["[16]", "[8,32]", "[0]", "[]", "[1024]"],
    "metrics.budget_metric": ["rel_err", "kl", "state_drift", "ppl"],
    "metrics.budget": ["0.0625", "1e-3", "0", "-1", "inf", "nan"],
    "name": ["run", "my_run"],
    "run.out_dir": ["elsewhere", "null"],
}
FIELD_VALUES = {
    "kind": ["conventional", "shared", "split", "mixed"],
    "fmt": ["fp32", "fp16", "bf16", "fp8_e4m3", "nvfp4", "mxfp4", "e8m0", "fp5"],
    "rounding": ["rne", "sr", "up"],
    "read_fmt": ["nvfp4", "fp8_e4m3", "null", "fp3"],
    "sr_bits": ["8", "0", "33", "null"],
    "overflow": ["satfinite", "ieee", "wrap"],
    "label": ["x", "null"],
}
GENERIC = ["1", "0", "abc", "null"]


def _typo(key: str, rng: random.Random) -> str:
    i = rng.randrange(len(key))
    return key[:i] + rng.choice("xqz") + key[i + 1:]


def _case(rng: random.Random) -> list[str]:
    keys = [k for k in schema_keys() if not k.startswith("schemes.")]
    fields = [k.rsplit(".", 1)[1] for k in schema_keys() if k.startswith("schemes.")]
    over = []
    for _ in range(rng.randint(1, 3)):
        r = rng.random()
        if r < 0.55:
            k = rng.choice(keys)
            over.append(f"{k}={rng.choice(VALUES.get(k, GENERIC))}")
        elif r < 0.8:
            f = rng.choice(fields)
            name = rng.choice([*SCHEMES, "candidate"])
            over.append(f"schemes.{name}.{f}={rng.choice(FIELD_VALUES.get(f, GENERIC))}")
        elif r < 0.9:
            k = rng.choice(keys)
            over.append(f"{rng.choice(['', '+'])}{_typo(k, rng)}=1")
        else:
            over.append(rng.choice(["model=gdn", "model=foo", "schemes=single",
                                    "schemes=seed_table", "workload=seed_article",
                                    "experiment=nothing", "run.steps=1=2", "run..steps=3"]))
    return over


@pytest.mark.parametrize("chunk", range(4))
def test_command_line_fuzz(chunk, tmp_path, capsys, monkeypatch):
    """4 chunks x 50 cases = 200 override sets, each completing or failing in one line."""
    monkeypatch.chdir(tmp_path)
    rng = random.Random(1100 + chunk)
    outcomes = {"ok": 0, "error": 0}
    for i in range(N_CASES // 4):
        over = _case(rng)
        out = tmp_path / f"case{i}"
        args = [*BASE, *over, f"hydra.run.dir={out}"]
        try:
            rc = main(args)
        except SystemExit as e:
            rc = e.code
        cap = capsys.readouterr()
        err = [ln for ln in cap.err.splitlines() if ln.strip()]
        where = f"case {chunk}/{i}: {over}: {cap.err[-2000:]}"
        assert "Traceback" not in cap.err + cap.out, where
        if rc == 0:
            res = next((o.split("=", 1)[1] for o in over if o.startswith("run.out_dir=")
                        and not o.endswith("=null")), out)
            assert (tmp_path / res / "summary.json").is_file(), where
            outcomes["ok"] += 1
        else:
            assert rc == 2 and len(err) == 1 and err[0].startswith("precsim: error: "), where
            assert not out.exists(), f"stub directory left: {where}"
            outcomes["error"] += 1
    assert outcomes["ok"] >= 5 and outcomes["error"] >= 5, outcomes  # both kinds exercised
