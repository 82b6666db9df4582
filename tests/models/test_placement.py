"""``model.device_map`` (precsim.models.placement): the placement decisions on faked GPUs (free
bytes passed in as numbers), the option's parsing and one-line errors, and whole-model runs
through the placed paths on the CPU against the default one-device run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from precsim.config import parse_device_map, to_config
from precsim.errors import PrecsimError
from precsim.models import placement as pl

GB = 10**9
TWO_GPUS = {"cuda:0": 80 * GB, "cuda:1": 80 * GB}
SCHEMES = [f"s{i}" for i in range(8)]


def need(weights_gb: float, per_group_gb: float, groups: int = 9, head_gb: float = 1.0,
         layers_share: float = 0.5) -> pl.Need:
    """A run's bytes: per group, ``layers_share`` with the layers and the rest one pass's."""
    per = per_group_gb * GB
    return pl.Need(int(weights_gb * GB), int(per * layers_share), int(per * (1 - layers_share)),
                   int(head_gb * GB), groups, 1, 8192, 8192)


def usable(free: dict) -> dict:
    return {d: int(f * pl.USABLE) for d, f in free.items()}


# --- the decision ------------------------------------------------------------------------------


def test_a_model_and_batch_fitting_one_gpu_run_on_the_gpu_with_most_room():
    free = {"cuda:0": 40 * GB, "cuda:1": 80 * GB}
    p = pl.decide("auto", need(10, 2), free, SCHEMES)
    assert (p.kind, p.devices) == ("single", ["cuda:1"])
    assert p.need.total() == 10 * GB + 9 * 2 * GB + GB  # weights + 9 groups + the head
    assert "one device, cuda:1" in p.line() and "\n" not in p.line()


def test_weights_fitting_one_gpu_but_not_the_batch_split_the_schemes_in_order():
    """60 GB of weights and 9 groups of 1.5 GB: 74.5 GB do not fit one 72 GB (usable) GPU; each
    GPU holds the weights, the head (1 GB), the reference and as many schemes as fit (6)."""
    n = need(60, 1.5)
    p = pl.decide("auto", n, TWO_GPUS, SCHEMES)
    assert p.kind == "split" and p.devices == ["cuda:0", "cuda:1"]
    assert [s for shard in p.shards for s in shard] == SCHEMES  # contiguous, in scheme order
    per = n.group_layers + n.group_pass
    for shard in p.shards:  # each GPU's bytes (its reference included) within its usable room
        assert n.weights + n.head + (1 + len(shard)) * per <= 72 * GB
    assert [len(s) for s in p.shards] == [4, 4]
    info = json.loads(json.dumps(p.info()))  # (summary.json holds it)
    assert info["kind"] == "split" and info["shards"] == [SCHEMES[:4], SCHEMES[4:]]


def test_uneven_gpus_split_as_their_room_allows_and_fewer_schemes_use_fewer_copies():
    free = {"cuda:0": 80 * GB, "cuda:1": 70 * GB, "cuda:2": 80 * GB}
    n = need(50, 3)  # room for (72-51)//3-1 = 6, (63-51)//3-1 = 3, 6 schemes
    p = pl.decide("auto", n, free, SCHEMES)
    assert p.kind == "split" and [s for sh in p.shards for s in sh] == SCHEMES
    sizes = dict(zip(p.devices, map(len, p.shards), strict=True))
    assert sizes["cuda:1"] <= 3 and max(sizes.values()) - min(sizes.values()) <= 1
    assert pl.split_schemes(n, usable(free), SCHEMES[:2]) == {"cuda:0": ["s0"],
                                                              "cuda:1": ["s1"]}


def test_weights_larger_than_one_gpu_spread_the_layers_with_room_left_for_the_run():
    n = need(110, 2)  # 110 GB of weights: no single 72 GB GPU; the run's 19 GB on top
    p = pl.decide("auto", n, TWO_GPUS, SCHEMES)
    assert p.kind == "device_map" and p.device_map == "auto"
    assert set(p.max_memory) == {0, 1}
    assert sum(p.max_memory.values()) >= n.weights  # the weights fit the caps
    for i, cap in p.max_memory.items():  # a GPU filled to its cap still holds its share of
        share = cap / n.weights  # the layers' states and caches, one pass and the head
        assert cap + share * n.groups * n.group_layers + n.groups * n.group_pass + n.head \
            <= usable(TWO_GPUS)[f"cuda:{i}"] * (1 + 1e-9)
    assert pl.decide("auto", n, TWO_GPUS, SCHEMES, split_ok=False).kind == "device_map"


def test_balanced_always_spreads_and_an_explicit_map_is_taken_as_given():
    p = pl.decide("balanced", need(1, 0.1), TWO_GPUS, SCHEMES)
    assert (p.kind, p.device_map, p.devices) == ("device_map", "balanced", ["cuda:0", "cuda:1"])
    dmap = {"model.embed_tokens": "cuda:0", "model.layers": "cuda:1", "lm_head": "cuda:1"}
    p = pl.decide(dmap, need(1, 0.1), TWO_GPUS, SCHEMES)
    assert (p.kind, p.device_map, p.devices) == ("device_map", dmap, ["cuda:0", "cuda:1"])


def test_a_split_needs_room_for_the_weights_on_each_gpu():
    """Weights that fit one GPU with room for the reference alone: no split (a GPU must run a
    scheme beside the reference), the layers are spread instead."""
    n = need(68, 3)  # 68 + 1 + 3 = 72 GB: the reference only
    assert pl.split_schemes(n, usable(TWO_GPUS), SCHEMES) is None
    assert pl.decide("auto", n, TWO_GPUS, SCHEMES).kind == "device_map"


def test_nothing_fits_is_one_line_with_the_bytes_needed_and_available():
    with pytest.raises(PrecsimError) as e:
        pl.decide("auto", need(200, 2), TWO_GPUS, SCHEMES)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("model.device_map=auto: the run needs ")
    assert "cuda:0, cuda:1 have 134.1 GiB usable (90% of 149.0 GiB free)" in msg
    assert "allowed: more GPUs" in msg
    with pytest.raises(PrecsimError, match=r"the run needs 2[0-9.]+ GiB .* and cpu has 14.0 GiB"
                                           r" usable \(90% of 15.6 GiB free\)"):
        pl.decide("auto", need(200, 2), {"cpu": 16 * 2**30 * 0.975}, SCHEMES)
    assert pl.decide("auto", need(1, 0.1), {"cpu": 16 * GB}, SCHEMES).devices == ["cpu"]
    p = pl.decide("balanced", need(1, 0.1), {"cpu": 16 * GB}, SCHEMES)  # accelerate: the CPU
    assert (p.kind, p.devices, p.device_map) == ("device_map", ["cpu"], "balanced")
    with pytest.raises(PrecsimError, match="model.device_map=balanced: the run needs"):
        pl.decide("balanced", need(20, 0.1), {"cpu": 16 * GB}, SCHEMES)


def test_free_memory_counts_every_visible_gpu_or_the_one_a_sweep_job_holds(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: ((10 + i) * GB, 80 * GB))
    monkeypatch.delenv(pl.HELD_GPU, raising=False)
    assert pl.free_memory("cuda") == {f"cuda:{i}": (10 + i) * GB for i in range(4)}
    monkeypatch.setenv(pl.HELD_GPU, "2")  # (the sweep callback's, tests/app/test_sweep.py)
    assert pl.free_memory("auto") == {"cuda:2": 12 * GB}
    assert list(pl.free_memory("cpu")) == ["cpu"] and pl.free_memory("cpu")["cpu"] > 0


# --- the option --------------------------------------------------------------------------------


def test_device_map_values_parse_or_fail_on_one_line(tmp_path):
    assert parse_device_map(None) is None and parse_device_map("none") is None
    assert parse_device_map("auto") == "auto" and parse_device_map("balanced") == "balanced"
    assert parse_device_map({"model.layers": 1, "lm_head": "cpu", "x": "cuda:2"}) == {
        "model.layers": "cuda:1", "lm_head": "cpu", "x": "cuda:2"}
    (tmp_path / "m.yaml").write_text("model.embed_tokens: 0\nmodel.layers: 1\n")
    (tmp_path / "m.json").write_text('{"": "cpu"}')
    assert parse_device_map(str(tmp_path / "m.yaml")) == {"model.embed_tokens": "cuda:0",
                                                          "model.layers": "cuda:1"}
    assert parse_device_map(str(tmp_path / "m.json")) == {"": "cpu"}
    assert parse_device_map('{"lm_head": 0}', "--device-map") == {"lm_head": "cuda:0"}
    cases = {"sequential": "model.device_map='sequential' is unknown; allowed: none (one device",
             str(tmp_path / "no.yaml"): "does not exist",
             "{}": "is invalid", "{lm_head: disk}": "model.device_map.lm_head='disk' is not a "
                                                   "device; allowed: an integer GPU index"}
    for value, start in cases.items():
        with pytest.raises(PrecsimError) as e:
            parse_device_map(value)
        assert start in str(e.value) and "\n" not in str(e.value), value
    (tmp_path / "bad.yaml").write_text("- a list\n")
    with pytest.raises(PrecsimError, match="holds list, not a map"):
        parse_device_map(str(tmp_path / "bad.yaml"))


def test_the_config_checks_the_device_map():
    sch = {"a": {"kind": "conventional"}}
    cfg = to_config({"model": {"path": "/some/ckpt", "device_map": {"lm_head": 1}},
                     "schemes": sch})
    assert cfg.model.device_map == {"lm_head": "cuda:1"}
    with pytest.raises(PrecsimError, match="model.device_map='auto' is invalid; allowed: none "
                                           "without model.path"):
        to_config({"model": {"device_map": "auto"}, "schemes": sch})
    with pytest.raises(PrecsimError, match="model.device_map='gpu' is unknown; allowed: none"):
        to_config({"model": {"path": "/some/ckpt", "device_map": "gpu"}, "schemes": sch})


def test_an_explicit_map_must_name_modules_cover_parameters_and_visible_gpus():
    mods, params = {"", "a", "a.b", "c"}, ["a.b.weight", "c.weight"]
    pl.check_map({"a": "cpu", "c": "cpu"}, mods, params, "M", 0)
    pl.check_map({"": "cpu"}, mods, params, "M", 0)
    with pytest.raises(PrecsimError, match="names 'd', not a module of M; allowed: module names "
                                           "such as a, a.b, c"):
        pl.check_map({"d": "cpu"}, mods, params, "M", 0)
    with pytest.raises(PrecsimError, match="places no module holding 'c.weight'"):
        pl.check_map({"a.b": "cpu"}, mods, params, "M", 0)
    with pytest.raises(PrecsimError, match=r"model.device_map.a='cuda:2' but 2 GPU\(s\) are "
                                           "visible; allowed: cuda:0..cuda:1 or cpu"):
        pl.check_map({"a": "cuda:2", "c": "cpu"}, mods, params, "M", 2)


# --- the estimate ------------------------------------------------------------------------------


def test_the_estimate_sizes_weights_exactly_and_the_run_by_its_terms(tmp_path):
    """The weights from the meta-device model equal the loaded model's parameter bytes (in the
    checkpoint's dtype and in an override); the run's bytes grow linearly in groups and
    documents, and the key/value cache appears only when the run goes in several passes."""
    pytest.importorskip("transformers")
    from conftest import build

    from precsim.models.load import load_model

    build("Qwen3_5ForCausalLM").to(torch.bfloat16).save_pretrained(tmp_path / "q")
    meta = pl.meta_model(tmp_path / "q")
    assert all(p.is_meta for p in meta.parameters())
    for dt in (torch.bfloat16, torch.float32):
        model, _ = load_model(tmp_path / "q", "cpu", str(dt).split(".")[1])
        real = sum(t.numel() * t.element_size() for t in [*model.parameters(),
                                                          *model.buffers()])
        assert pl.shape_of(meta, dt).weights == real, dt
    s = pl.shape_of(meta, torch.bfloat16)
    assert (s.heads, s.dv, s.dk, s.ssm_layers) == (4, 8, 16, 1) and s.kv == 2 * 1 * 16
    one, two = (pl.estimate(s, 1, g, 64, 64) for g in (3, 6))
    assert two.run() - one.run() == 3 * (one.group_layers + one.group_pass)
    assert pl.estimate(s, 2, 3, 64, 64).group_pass == 2 * one.group_pass
    chunked = pl.estimate(s, 1, 3, 64, 16)
    assert chunked.group_layers - one.group_layers == s.kv * 64 * 2  # the cache of 64 tokens


# --- whole-model runs through the placed paths -------------------------------------------------


@pytest.fixture(scope="module")
def kl_path(tmp_path_factory):
    pytest.importorskip("transformers")
    from conftest import build

    root = tmp_path_factory.mktemp("place")
    build("Mamba2ForCausalLM", 0.2, slow_decay=True).save_pretrained(root / "m")
    build("Qwen3_5ForCausalLM", 0.2, slow_decay=True).save_pretrained(root / "q")
    return root


def _equal(a, b):
    assert list(a.per_step_rel_err) == list(b.per_step_rel_err)
    for k, v in a.per_step_rel_err.items():
        np.testing.assert_array_equal(b.per_step_rel_err[k], v, err_msg=k)
    assert a.rows == b.rows


def test_accelerate_missing_is_one_line(kl_path, monkeypatch):
    import importlib.util

    from precsim.models.load import load_model

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "accelerate" else real(name, *a))
    with pytest.raises(PrecsimError, match=r"model.device_map needs the package accelerate .*"
                                           r"allowed: pip install 'precsim\[models\]'"):
        load_model(kl_path / "m", "cpu", None, "auto")


@pytest.mark.parametrize("arch", ["m", "q"])
def test_layers_placed_by_accelerate_with_its_hooks_give_the_one_device_result(kl_path, arch,
                                                                              monkeypatch):
    """An explicit map down to the SSM mixer, loaded by transformers/accelerate with accelerate's
    device hooks forced on (on one CPU it would not attach them): every activation goes through
    accelerate's hooks, precsim's hook wraps the mixer's hooked forward, and the per-token
    metrics equal the default one-device run bit for bit; the hooks are put back after."""
    accelerate = pytest.importorskip("accelerate")
    from conftest import MODEL_SCHEMES as KL_SCHEMES
    from conftest import kl_cfg

    from precsim.models import run as run_mod
    from precsim.models.run import run_model_kl

    path = kl_path / arch
    ref = run_model_kl(kl_cfg(path, KL_SCHEMES, 24, model__chunk=8), "cpu", progress=False)
    prefix = "backbone" if arch == "m" else "model"
    mixer = "mixer" if arch == "m" else "linear_attn"
    base = getattr(pl.meta_model(path), prefix)
    dmap = {**{f"{prefix}.{n}": "cpu" for n, _ in base.named_children() if n != "layers"},
            **{f"{prefix}.layers.0.{n}": "cpu" for n, _ in base.layers[0].named_children()},
            f"{prefix}.layers.1": "cpu", "lm_head": "cpu"}
    assert f"{prefix}.layers.0.{mixer}" in dmap
    loaded = []
    real = run_mod.load_model

    def forced(*a, **k):
        model, tok = real(*a, **k)
        assert a[3] == dmap
        accelerate.dispatch_model(model, dmap, main_device="cpu", force_hooks=True)
        loaded.append(model)
        return model, tok

    monkeypatch.setattr(run_mod, "load_model", forced)
    res = run_model_kl(kl_cfg(path, KL_SCHEMES, 24, model__chunk=8, model__device_map=dmap),
                       "cpu", progress=False)
    _equal(ref, res)
    assert res.info["placement"]["kind"] == "device_map"
    layer0 = getattr(loaded[0], prefix).layers[0]
    hooked = getattr(layer0, mixer).forward
    assert hasattr(getattr(layer0, mixer), "_hf_hook") and "new_forward" in repr(hooked.func)


def test_the_scheme_batch_split_over_two_copies_equals_one_batch(kl_path, monkeypatch):
    """A split plan (forced here on two CPU 'devices': the decision is tested above): two model
    copies, each the reference and a contiguous share of the schemes, in two threads; the
    per-token metrics, rows and drift in scheme order equal the one-batch run bit for bit."""
    from conftest import MODEL_SCHEMES as KL_SCHEMES
    from conftest import kl_cfg

    from precsim.models import run as run_mod
    from precsim.models.run import run_model_kl

    schemes = {**KL_SCHEMES, "sr": {"kind": "conventional", "fmt": "fp16", "rounding": "sr"}}
    for arch in ("m", "q"):
        ref = run_model_kl(kl_cfg(kl_path / arch, schemes, 24, model__chunk=8), "cpu",
                           progress=False)
        shards = [["fp32", "shared", "split"], ["sr"]]
        monkeypatch.setattr(run_mod, "place", lambda cfg, dev, ok, sh=shards: pl.Plan(
            "split", "auto", ["cpu", "cpu"], need(1, 1, 5), {"cpu": 0}, shards=sh, why="test"))
        res = run_model_kl(kl_cfg(kl_path / arch, schemes, 24, model__chunk=8,
                                   model__device_map="auto"), "cpu", progress=False)
        _equal(ref, res)
        assert res.info["placement"]["shards"] == shards


def test_model_kl_with_device_map_auto_through_the_command_line(kl_path, tmp_path, capfd):
    """``model.device_map=auto`` on this CPU machine: the plan (one device, cpu) is on one log
    line and in summary.json, and the per-token metrics equal the default run's bit for bit."""
    from precsim.cli import main

    args = ["experiment=model_kl", f"model.path={kl_path / 'm'}", "run.steps=24",
            "model.chunk=8", "metrics.window=8", "replay.buffer_len=4", "run.progress=false"]
    assert main([*args, f"hydra.run.dir={tmp_path / 'a'}"]) == 0
    assert main([*args, "model.device_map=auto", f"hydra.run.dir={tmp_path / 'b'}"]) == 0
    a, b = (np.load(tmp_path / d / "per_step.npz") for d in ("a", "b"))
    assert sorted(a.files) == sorted(b.files) and any(k.endswith(":kl") for k in a.files)
    for k in a.files:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    s = json.loads((tmp_path / "b" / "summary.json").read_text())
    line = s["info"]["placement"]["line"]
    assert s["info"]["placement"]["kind"] == "single" and s["info"]["placement"]["devices"] == \
        ["cpu"]
    assert line.startswith("placement: model.device_map=auto -> one device, cpu; needs ")
    log = (tmp_path / "b" / "precsim.log").read_text()
    assert sum(line in ln for ln in log.splitlines()) == 1
    capfd.readouterr()
    with pytest.raises(SystemExit) as e:
        main([*args, "model.device_map=everywhere", f"hydra.run.dir={tmp_path / 'c'}"])
    assert e.value.code == 2
    err = [ln for ln in capfd.readouterr().err.splitlines() if ln.strip()]
    assert err == ["precsim: error: model.device_map='everywhere' is unknown; allowed: none "
                   "(one device: run.device); auto; balanced; a map {module: device} (device: an "
                   "integer GPU index, cuda:N or cpu); a .yaml/.json file holding such a map"]


def test_record_with_a_device_map_writes_the_same_traces(kl_path, tmp_path, capsys):
    pytest.importorskip("accelerate")
    from precsim.record import main

    base = ["--model", str(kl_path / "m"), "--tokens", "12"]
    assert main([*base, "--out", str(tmp_path / "a")]) == 0
    (tmp_path / "map.yaml").write_text("backbone: cpu\nlm_head: cpu\n")
    assert main([*base, "--out", str(tmp_path / "b"), "--device-map",
                 str(tmp_path / "map.yaml")]) == 0
    for f in sorted((tmp_path / "a").glob("layer_*/*.npy")):
        np.testing.assert_array_equal(np.load(f), np.load(tmp_path / "b" / f.relative_to(
            tmp_path / "a")), err_msg=f.name)
    meta = json.loads((tmp_path / "b" / "record.json").read_text())
    assert meta["placement"]["kind"] == "device_map" and meta["device"] == "cpu"
    capsys.readouterr()
    assert main([*base, "--out", str(tmp_path / "c"), "--device-map", "all"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("precsim.record: error: --device-map='all' is "
                                               "unknown; allowed: none (one device: --device); "
                                               "auto; balanced")  # (it said run.device)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["m", "q"])
def test_device_map_auto_on_one_gpu_equals_the_default_run(kl_path, arch):
    """On a GPU (the Triton scan): ``model.device_map=auto`` (accelerate's placement, here all
    on cuda:0 through accelerate's loading path) gives the default run's bits."""
    pytest.importorskip("accelerate")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from conftest import MODEL_SCHEMES as KL_SCHEMES
    from conftest import kl_cfg

    from precsim.models.run import run_model_kl

    path = kl_path / arch
    ref = run_model_kl(kl_cfg(path, KL_SCHEMES, 64, model__chunk=32), "cuda", progress=False)
    got = run_model_kl(kl_cfg(path, KL_SCHEMES, 64, model__chunk=32, model__device_map="auto"),
                       "cuda", progress=False)
    assert got.engine == ref.engine
    _equal(ref, got)


@pytest.mark.parametrize("compute", [torch.float32, torch.float64])
def test_state_bytes_are_what_the_scans_hold(compute):
    """The estimate's bytes a state element takes (``placement.state_bytes``, the groups' mean)
    equal what the torch scan's schemes hold after a segment, counted tensor by tensor: the
    reference's float64 state; a scheme's state in the compute dtype, a split scheme's read
    copy, an error-feedback residual; nothing else (a residual without error feedback is not
    held)."""
    from precsim.config import to_config
    from precsim.models.hook import Step
    from precsim.models.run import build_groups
    from precsim.models.scan import Chunks, scan_torch

    schemes = {"fp32": {"kind": "conventional", "fmt": "fp32"},
               "shared": {"kind": "shared", "fmt": "nvfp4", "rounding": "sr"},
               "split": {"kind": "split", "fmt": "fp32", "read_fmt": "nvfp4"},
               "ef": {"kind": "conventional", "fmt": "fp8_e4m3", "error_feedback": "bf16"}}
    cfg = to_config({"schemes": schemes, "replay": {"buffer_len": 4},
                     "metrics": {"window": 8}, "run": {"progress": False}})
    groups = build_groups(cfg, torch.float32)
    assert [g.name for g in groups][:3] == ["reference", "fp32", "noise_floor"]
    T, K, H, P, G, N = 8, 2, 2, 16, 1, 16
    b = len(groups) * K
    rng = np.random.default_rng(0)
    inp = {"dt": torch.tensor(rng.uniform(0.01, 0.1, (T, b, H))),
           **{k: torch.tensor(rng.standard_normal((T, b, *s)), dtype=torch.float32)
              for k, s in (("x", (H, P)), ("B", (G, N)), ("C", (G, N)))}}
    chunks = Chunks(horizon=T)
    scan_torch(Step(layer=0, family="mamba2", inp=inp, const={"A": -torch.ones(H)},
                    state=None, recurrent=False), groups, K, cfg, compute, chunks=chunks)
    held = 0
    for s in chunks.layers[0]:
        ts = {id(t): t for t in (s.state, s.read, s.resid) if t is not None}
        held += sum(t.numel() * t.element_size() for t in ts.values())
    per_element = held / (len(groups) * K * H * P * N)
    assert per_element == pl.state_bytes(groups, compute)
    want = (8 + (3 * 1 + 2 + 2) * (4 if compute == torch.float32 else 8)) / 6
    assert per_element == want  # ref; fp32, noise, shared 1; split, ef 2 copies
