"""Results recorded before a change, compared bit for bit after it (issue 43, acceptance 1).

``golden.json.gz`` holds what the configs in ``CASES`` gave on every CPU-runnable engine (numpy,
torch, numba; triton in Triton's interpreter) when it was recorded: each scheme's window rows
(every numeric column: rel_err, kl, top1, state/read drift, their percentiles, first_flip, ...)
and its per-step rel_err (whole-model runs: per-token KL and top-1 too). Its ``meta`` entry
names the commit, the date and the library versions it was recorded with. The test re-runs the
same configs and asks ``np.array_equal`` (NaN equal to NaN) of every array: a refactoring that
is meant to leave the numbers alone must leave every one of them alone.

Record again (only when a result is *meant* to change, saying so in the commit)::

    python tests/golden/test_golden.py --record

Platform: every engine's bits are deterministic on one machine and library set (the engines'
reductions run in fixed orders; the inputs are counter-based). What another machine may change
is the float64 truth's last bits (NumPy/torch einsums go through the CPU's BLAS kernels, whose
summation order depends on the ISA, and ``log``/``cos`` of the input generator through libm),
and with it the last bits of every rel_err. A mismatch on a machine or library set other than
the one in ``meta`` says so in its message; record on the base commit there first, then compare.
The tiny checkpoints are random transformers models (seed 0): their weights' fingerprint is
recorded too, so a transformers release that initialises them differently is named as such,
not blamed on precsim.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: conftest's helpers (also as a script)

from conftest import EF_SCHEMES, SEED_TABLE, make_trace, tiny_cfg  # noqa: E402

GOLDEN = HERE / "golden.json.gz"
CPU = ("numpy", "torch", "numba")

# Every scheme below is one the engine tests already run, so the numba engine compiles no task
# of its own here (SEED_TABLE: test_engine_numba's ENGINE, GDN's test_gdn_matches_torch_engine_
# and_oracle; EF_SCHEMES: test_error_feedback's test_cpu_engines_hold_the_same_bits): the three
# scheme kinds, RNE and SR, error feedback in four formats, and nvfp4 / fp8_e4m3 / fp16 / bf16 /
# int8_b16 (row-scaled) as master, read copy or residual.
LAYER = {**SEED_TABLE, **EF_SCHEMES}
# Triton's interpreter spends ~0.1 s a step and scheme here: five schemes that cover the kinds,
# SR, error feedback and the formats above
TRITON = {k: LAYER[k] for k in ("shared_nvfp4_sr", "split_fp16sr_nvfp4", "c_int8_ef",
                                "c_fp8sr_ef", "sp_ef")}
MODEL = {"fp32": {"kind": "conventional", "fmt": "fp32"},
         "shared": {"kind": "shared", "fmt": "nvfp4", "rounding": "sr"},
         "split": {"kind": "split", "fmt": "fp32", "read_fmt": "nvfp4"}}


def _layer(family, schemes, steps=64, heads=2, **over):
    base = dict(replay__buffer_len=8, run__threads=1, run__device="cpu", metrics__window=16)
    return tiny_cfg(family, steps=steps, heads=heads, schemes=schemes, **{**base, **over})


def _trace_m2(tmp: Path) -> dict:
    """A Mamba-2 trace with a D skip and B/C shared by 2 heads (1 group)."""
    tr = make_trace("mamba2", T=64, H=2, P=16, N=32, seed=3, with_D=True)
    tr["B"], tr["C"] = tr["B"][:, :1], tr["C"][:, :1]
    np.savez(tmp / "m2_trace.npz", **tr)
    return {"workload": {"kind": "trace", "path": str(tmp / "m2_trace.npz")}}


# case -> (engines, config builder(tmp dir) -> config dict)
CASES = {
    # synthetic Mamba-2, 4 heads in 2 groups, 2 sequences (the percentiles), 4 windows
    "mamba2": (CPU, lambda tmp: _layer("mamba2", LAYER, heads=4, run__seqs=2,
                                       model__groups=2)),
    "gdn": (CPU, lambda tmp: _layer("gdn", LAYER, run__seqs=2)),
    # a trace: D, grouped B/C, the float32 exp of a fast kernel's decay
    "mamba2_trace_fast": (CPU, lambda tmp: {**_layer("mamba2", SEED_TABLE,
                                                      model__decay_exp="fast"),
                                            **_trace_m2(tmp)}),
    # GDN's u from the master copy, fast decays
    "gdn_u_master_fast": (("torch", "numba"), lambda tmp: _layer(
        "gdn", SEED_TABLE, replay__gdn_u_source="master", model__decay_exp="fast")),
    # (the interpreter runs 12 of the trace's 64 steps)
    "mamba2_triton": (("triton",), lambda tmp: {**_layer(
        "mamba2", TRITON, steps=12, replay__buffer_len=4, metrics__window=4), **_trace_m2(tmp)}),
    "gdn_triton": (("triton",), lambda tmp: _layer(
        "gdn", TRITON, steps=12, heads=1, replay__buffer_len=4, metrics__window=4)),
}
# whole-model mode (the torch scan, parallel mode): a tiny random checkpoint of each family
ARCHS = {
    "model_mamba2": ("Mamba2ForCausalLM", "Mamba2Config", dict(
        num_hidden_layers=2, num_heads=4, head_dim=16, expand=2, state_size=16, n_groups=2,
        conv_kernel=4, chunk_size=8)),
    "model_gdn": ("Qwen3_5ForCausalLM", "Qwen3_5TextConfig", dict(
        num_hidden_layers=2, linear_num_value_heads=4, linear_num_key_heads=2,
        linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=4, head_dim=16,
        layer_types=["linear_attention", "full_attention"], num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=32)),
}


def _checkpoint(case: str, tmp: Path) -> tuple[Path, str]:
    """The case's tiny random checkpoint (seed 0, weights N(0, 0.2^2)) saved under ``tmp``, and
    its weights' fingerprint."""
    import torch
    import transformers as tf

    arch, cname, kw = ARCHS[case]
    cfg = getattr(tf, cname)(vocab_size=96, hidden_size=32, **kw)
    cfg.initializer_range = 0.2
    torch.manual_seed(0)
    m = getattr(tf, arch)(cfg).eval()
    h = hashlib.sha256()
    for k, v in sorted(m.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().float().contiguous().numpy().tobytes())
    m.save_pretrained(tmp / arch)
    return tmp / arch, h.hexdigest()[:16]


def _arrays(prefix: str, result) -> dict[str, np.ndarray]:
    """Every numeric window column of each scheme and its per-step arrays."""
    out = {}
    for name in result.schemes:
        rows = [r for r in result.rows if r["scheme"] == name]
        cols = [k for k in rows[0] if k != "scheme"]
        for c in cols:
            out[f"{prefix}|{name}|{c}"] = np.array([r[c] for r in rows], dtype=np.float64)
    for name, v in result.per_step_rel_err.items():
        out[f"{prefix}|per_step|{name}"] = np.asarray(v, dtype=np.float64)
    return out


def run_case(case: str, tmp: Path) -> tuple[dict[str, np.ndarray], dict]:
    """The case's arrays on each of its engines and what ran them (engine names; weights)."""
    from precsim.config import to_config
    from precsim.engines import engine_module

    tmp.mkdir(parents=True, exist_ok=True)
    if case in ARCHS:
        from precsim.models.run import run_model_kl

        path, weights = _checkpoint(case, tmp)
        np.save(tmp / "ids.npy", np.random.default_rng(2).integers(0, 96, (2, 16)))
        cfg = to_config({"model": {"path": str(path), "ids": str(tmp / "ids.npy")},
                         "schemes": MODEL, "run": {"steps": 16, "progress": False,
                                                   "device": "cpu"},
                         "metrics": {"window": 8}, "replay": {"buffer_len": 4}})
        r = run_model_kl(cfg, "cpu", progress=False)
        return _arrays(case, r), {"engine": r.engine, "weights": weights}
    engines, build = CASES[case]
    out, ran = {}, {}
    for e in engines:
        r = engine_module(e).run(to_config(build(tmp)), "cpu", progress=False)
        out.update(_arrays(f"{case}|{e}", r))
        ran[e] = r.engine
    return out, {"engine": ran}


ALL = [*CASES, *ARCHS]


def _meta() -> dict:
    import torch

    vers = {"python": platform.python_version(), "numpy": np.__version__,
            "torch": torch.__version__}
    for mod in ("numba", "triton", "transformers"):
        try:
            vers[mod] = __import__(mod).__version__
        except ImportError:
            vers[mod] = None
    cpu = ""
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in
                   Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"versions": vers, "machine": platform.machine(), "cpu": cpu}


def record(path: Path = GOLDEN) -> None:
    """Run every case and write ``path``: gzipped JSON, ``meta`` and ``arrays``."""
    repo = HERE.parents[1]
    git = ["git", "-C", str(repo)]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "precsim", "formats",
                            "kernels", "conf"], capture_output=True, text=True,
                           check=True).stdout.strip()
    arrays, cases = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for case in ALL:
            a, info = run_case(case, Path(tmp) / case)
            arrays.update(a)
            cases[case] = info
            print(f"{case}: {len(a)} arrays, {info}", flush=True)
    import datetime as dt

    meta = {"commit": commit, "dirty": bool(dirty),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "command": "python tests/golden/test_golden.py --record", "cases": cases, **_meta()}
    text = json.dumps({"meta": meta, "arrays": {k: v.tolist() for k, v in arrays.items()}},
                      sort_keys=True, indent=0)  # (a float's repr reads back to its bits)
    path.write_bytes(gzip.compress(text.encode(), 9, mtime=0))
    print(f"wrote {path} ({path.stat().st_size} bytes, {len(arrays)} arrays) from {commit}"
          + (" (uncommitted changes in the package!)" if dirty else ""))


@pytest.fixture(scope="module")
def golden():
    data = json.loads(gzip.decompress(GOLDEN.read_bytes()))
    return data["meta"], {k: np.array(v, dtype=np.float64) for k, v in data["arrays"].items()}


@pytest.mark.parametrize("case", ALL)
def test_results_equal_the_recorded_ones(case, golden, tmp_path):
    """Every array of ``case`` bit for bit as recorded (``golden.json.gz``'s ``meta`` says when)."""
    meta, want = golden
    if case.endswith("_triton"):
        pytest.importorskip("triton")
        if os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("recorded in Triton's interpreter (TRITON_INTERPRET=1)")
    if case in ARCHS:
        pytest.importorskip("transformers")
    here = _meta()
    if (here["cpu"], here["machine"]) != (meta["cpu"], meta["machine"]):
        # bits are a property of one kind of CPU: numpy's and torch's vectorised exp/log and the
        # BLAS's summation order follow its instruction set (the build machines vary: AMD EPYC,
        # Intel Xeon), so a foreign CPU's last bits say nothing about a refactoring
        pytest.skip(f"recorded on {meta['cpu']!r} ({meta['machine']}), here {here['cpu']!r} "
                    f"({here['machine']}): bit-for-bit only on the recording CPU; re-record on "
                    "the base commit here to compare (python tests/golden/test_golden.py "
                    "--record)")
    got, info = run_case(case, tmp_path)
    where = (f"recorded at {meta['commit'][:10]} with {meta['versions']} on {meta['cpu']!r}; "
             f"here {_meta()['versions']} on {_meta()['cpu']!r}")
    rec = meta["cases"][case]
    if "weights" in rec:
        assert info["weights"] == rec["weights"], (
            f"{case}: the tiny checkpoint's weights differ from the recorded ones (a transformers "
            f"release that initialises them differently, not precsim): {where}")
    assert info["engine"] == rec["engine"], (case, info, rec)
    mine = {k for k in want if k.split("|", 1)[0] == case}
    assert set(got) == mine, (sorted(set(got) ^ mine)[:10], where)
    bad = []
    for k in sorted(mine):
        if not np.array_equal(got[k], want[k], equal_nan=True):
            d = np.abs(got[k] - want[k])
            bad.append(f"{k}: max |diff| {np.nanmax(d) if d.size else 0:.3g} "
                       f"(recorded {want[k][:4]}, now {got[k][:4]})")
    assert not bad, f"{len(bad)} of {len(mine)} arrays changed ({where}):\n" + "\n".join(bad[:20])


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit("usage: python tests/golden/test_golden.py --record")
    record()
