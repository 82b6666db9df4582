"""Every command the README and docs/*.md show is run, at a tiny size, through the command line.

Collected: each `python -m precsim…`, `precsim …`, `precsim-report …` and `python -m
precsim.record …` line of a fenced or indented code block (a `$ ` prompt, `\\` continuations and
`# comments` handled; `pip install … &&` parts skipped; `[optional]` parts of a synopsis left
out). Each runs in process through the entry that parses its argv (`precsim.cli.main`,
`precsim.report.main`, `precsim.record.main`) with its own overrides appended (a tiny layer, few
steps, one job per sweep preset, the torch engine unless the command names one, output into a
temporary directory), its paths replaced by fixtures (a tiny trace, a prior sweep, a tiny
checkpoint built offline and its recording), and, where this machine lacks them, CUDA by the CPU
and SLURM by submitit's local launcher. A traceback, a non-zero exit (other than a documented
one-line error) or a missing result file fails it; a placeholder this file does not know fails
loudly, so a new documented command needs a fixture here.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_trace

from precsim import record, report
from precsim.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PREFIXES = ("python -m precsim.record ", "python -m precsim.report ", "python -m precsim",
            "precsim-report ", "precsim ")

# tiny sizes appended to every layer-level run (later overrides win over the command's own)
TINY_LAYER = ["model.heads=1", "model.groups=1", "model.head_dim=8", "model.state_dim=128"]
TINY_RUN = ["run.steps=64", "run.seqs=1", "metrics.window=32", "metrics.vocab=32",
            "run.progress=false"]
TINY_TRACE = ["run.steps=8", "run.seqs=1", "metrics.window=8", "metrics.vocab=32",
              "run.progress=false"]
TINY_MODEL_KL = ["run.steps=6", "run.seqs=1", "metrics.window=3", "run.progress=false"]
TINY_TASK = ["task.items=2", "task.lengths=[16,32]", "task.limit=2"]  # experiment=task_eval
# swept lists replaced by one value each, so the 24-job preset runs one tiny job
FEWER_JOBS = {"experiment=precision_sweep": ["schemes.candidate.fmt=fp32",
                                             "schemes.candidate.rounding=rne",
                                             "schemes.candidate.read_fmt=nvfp4"],
              "experiment=study_speculative": ["model=qwen35_gdn", "replay.drafts=2",
                                               "replay.acceptance=[0.9,0.8]"]}
# what a command needs that this machine may lack: CUDA (the CPU runs the same config) and SLURM
# (submitit's local launcher runs the same submitit code path)
NO_CUDA = {"run.device=cuda": "run.device=cpu",
           "hydra/launcher=joblib_gpus": "hydra/launcher=joblib"}
NO_SLURM = {"hydra/launcher=slurm_gpu": "hydra/launcher=submitit_local"}
SLURM_ONLY_KEYS = ("hydra.launcher.partition=", "hydra.launcher.account=")
# documented one-line errors: command text -> the start of its one line on stderr
DOCUMENTED_ERRORS: dict[str, str] = {}
# commands known to fail today, keyed by their text (xfail, not strict)
KNOWN_FAILURES: dict[str, str] = {}  # command -> why it is expected to fail (none now)


def collect(path: Path) -> list[tuple[str, int, str]]:
    """(file, line, command) of every precsim command in the code blocks of one markdown file."""
    out, fenced, prev_blank, in_block = [], False, True, False
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            fenced, i, prev_blank = not fenced, i + 1, False
            continue
        indented = line.startswith("    ") and (prev_blank or in_block)
        in_block = bool(line.strip()) and (indented or (in_block and line.startswith("    ")))
        prev_blank = not line.strip()
        start = i
        if fenced or indented:
            text = line.strip()
            while text.endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text[:-1].rstrip() + " " + lines[i].strip()
            text = text.removeprefix("$ ")
            for part in text.split("&&"):
                part = re.sub(r"\s+#\s.*$", "", part).strip()
                if part.startswith(PREFIXES) or part == "python -m precsim":
                    out.append((path.relative_to(ROOT).as_posix(), start + 1, part))
        i += 1
    return out


COMMANDS = [c for doc in DOCS for c in collect(doc)]


def _kind(cmd: str) -> str:
    if cmd.startswith(("python -m precsim.report ", "precsim-report ")):
        return "report"
    if cmd.startswith("python -m precsim.record "):
        return "record"
    return "cli"


def _argv(cmd: str) -> list[str]:
    cmd = re.sub(r"\s\[[^\]]*\]", "", cmd)  # a synopsis' optional parts
    words = shlex.split(cmd)  # `precsim…` scripts, or `python -m precsim…`
    return words[1:] if words[0].startswith("precsim") else words[3:]


@pytest.fixture(scope="module")
def layer_fixtures(tmp_path_factory):
    """Stand-ins for a documented trace file and sweep: a tiny trace and a finished tiny sweep."""
    root = tmp_path_factory.mktemp("docfix")
    np.savez(root / "trace.npz", **make_trace("mamba2", T=64, H=1, P=8, N=32))
    sweep = root / "sweep"
    assert cli_main(["-m", "experiment=split_nvfp4", "replay.buffer_len=8", *TINY_LAYER,
                     *TINY_RUN, "metrics.plot=false", "run.engine=torch",
                     f"hydra.sweep.dir={sweep}"]) == 0
    assert (sweep / "sweep_summary.csv").is_file()
    (root / "prompt.txt").write_text("The recurrent state of a state space model")
    np.save(root / "ids.npy", np.arange(1, 9))
    return {"trace": root / "trace.npz", "sweep": sweep, "run": next(sweep.glob("0_*")),
            "text": root / "prompt.txt", "ids": root / "ids.npy"}


@pytest.fixture(scope="module")
def model_fixtures(tmp_path_factory):
    """Stand-ins for a documented checkpoint and its recording: a tiny Mamba-2 model (random
    weights, built offline from a config) and its recorded traces."""
    from precsim.models.load import require_transformers

    pytest.importorskip("transformers")
    tf = require_transformers()  # (quiets torchao's import-time notices, as the commands do)
    root = tmp_path_factory.mktemp("docmodel")
    torch.manual_seed(0)
    tf.Mamba2ForCausalLM(tf.Mamba2Config(
        vocab_size=96, hidden_size=32, num_hidden_layers=2, num_heads=4, head_dim=16, expand=2,
        state_size=16, n_groups=2, conv_kernel=4, chunk_size=8)).save_pretrained(root / "ckpt")
    char_tokenizer().save_pretrained(root / "ckpt")  # so that documented text files tokenize
    assert record.main(["--model", str(root / "ckpt"), "--tokens", "8", "--out",
                        str(root / "rec")]) == 0
    (root / "placement.yaml").write_text("backbone: cpu\nlm_head: cpu\n")  # an explicit map
    (root / "task.jsonl").write_text(  # experiment=task_eval's task file: token-id items
        '{"context": [5, 6, 7], "choices": [[8], [9]], "gold": 0}\n'
        '{"prompt": [10, 11], "answer": [12]}\n')
    return {"ckpt": root / "ckpt", "rec": root / "rec", "map": root / "placement.yaml",
            "task": root / "task.jsonl"}


def char_tokenizer():
    """A character-level tokenizer of printable ASCII (ids 1..95, 0 unknown), built offline."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, **{chr(c): c - 31 for c in range(32, 127)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


class Fixtures(dict):
    """The layer fixtures, and the model ones (which need transformers) on first use."""

    def __init__(self, request):
        super().__init__(request.getfixturevalue("layer_fixtures"))
        self.request = request

    def __missing__(self, role):
        self.update(self.request.getfixturevalue("model_fixtures"))
        return self[role]


# what a documented path stands for, by the flag or key that takes it (the report's directory is
# its positional argument): every value there is an example the user replaces
ROLES = {"--model": "ckpt", "model.path": "ckpt", "workload.path": "trace", "--text-file": "text",
         "--prompt-file": "text", "--ids-file": "ids", "model.text": "text", "model.ids": "ids",
         "--out": "out", "model.device_map": "map", "--device-map": "map", "task.path": "task"}
NAMED_MAPS = ("auto", "balanced")  # device_map values that are not a map file


def _substitute(argv: list[str], fx: dict, out: Path, kind: str) -> list[str]:
    """Documented paths -> fixtures by role (a trace: `.npz` the tiny trace file, a directory
    the tiny checkpoint's recording; the report's directory: the tiny sweep, or one of its runs
    for RUN_DIR); outputs -> ``out``. A placeholder left anywhere else fails."""
    res = []
    for k, word in enumerate(argv):
        key, eq, val = word.partition("=") if not word.startswith("-") else (word, "", "")
        role = ROLES.get(key) if eq else ROLES.get(argv[k - 1]) if k else None
        if kind == "report" and k == 0:
            role = "run" if "RUN_DIR" in word else "sweep"
        if role == "map" and (val if eq else word) in NAMED_MAPS:
            role = None
        elif role == "map":
            pytest.importorskip("accelerate")  # (a map goes to transformers through it)
        if role:
            target = val if eq else word
            path = out / "rec" if role == "out" else fx["rec"] if role == "trace" and not \
                target.endswith(".npz") else fx[role]
            word = f"{key}={path}" if eq else str(path)
        left = re.findall(r"<[^>]*>|\b[A-Z][A-Z_]{2,}\b", word)
        assert not left, f"unknown placeholder {left} in {word!r}: give it a fixture in {__file__}"
        res.append(word)
    return res


def _cli_argv(argv: list[str], out: Path) -> tuple[list[str], bool, Path]:
    sweep = "-m" in argv or "--multirun" in argv
    if not torch.cuda.is_available():
        argv = [NO_CUDA.get(a, a) for a in argv]
    argv = [NO_SLURM.get(a, a) for a in argv if not a.startswith(SLURM_ONLY_KEYS)]
    extra = []
    if "experiment=model_kl" in argv or "experiment=per_layer" in argv \
            or "experiment=task_eval" in argv:
        extra += TINY_MODEL_KL + (TINY_TASK if "experiment=task_eval" in argv else [])
        if "model.mode=generate" in argv:
            extra.append("model.new_tokens=4")
    elif "workload=trace" in argv:
        extra += TINY_TRACE
    else:
        extra += TINY_LAYER + TINY_RUN
    if not any(a.startswith("run.engine=") for a in argv):
        extra.append("run.engine=torch")  # no numba compile for a tiny run
    for key, more in FEWER_JOBS.items():
        if key in argv:
            extra += more
    if any(a.startswith("hydra/launcher=") for a in argv):
        extra.append("hydra.launcher.n_jobs=1" if "hydra/launcher=joblib" in argv else
                     "hydra.launcher.timeout_min=10")
    if sweep:
        # job directories by number: the appended overrides would make their names too long
        extra += ["metrics.plot=false", f"hydra.sweep.dir={out / 'sweep'}",
                  "hydra.sweep.subdir=${hydra.job.num}"]
    else:
        extra.append(f"hydra.run.dir={out / 'run'}")
    return [*argv, *extra], sweep, out / ("sweep" if sweep else "run")


def _run_inprocess(fn, argv, capfd) -> tuple[int, str]:
    try:
        rc = fn(argv)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    cap = capfd.readouterr()
    return rc or 0, cap.out + cap.err


def _valid_as_written(argv: list[str], doc: str, line: int, cmd: str) -> None:
    """The command's own config, before the tiny sizes are appended, passes the config's checks
    (``precsim.config.to_config``): the tiny overrides must not hide an error a user copying
    it would get (``run.steps=8`` with the default 256-step metrics window did). A sweep is
    checked with each swept key's first value."""
    from hydra import compose, initialize_config_module

    from precsim.cli import register_configs
    from precsim.config import to_config

    if not torch.cuda.is_available():
        argv = [NO_CUDA.get(a, a) for a in argv]
    over = []
    for a in argv:
        if a.startswith("-") or a.startswith(("hydra/", "hydra.")):
            continue
        key, eq, val = a.partition("=")
        if not eq:  # ~key: a deletion, as written
            over.append(a)
            continue
        if "(" in val and val.split("(")[0] in ("range", "choice", "interval", "glob",
                                                 "sort", "shuffle", "tag"):
            continue  # a sweep function: its values are the sweep's, not checked here
        if "," in val and not val.startswith(("[", "{", "'", '"')):
            val = val.split(",")[0]  # a swept list: its first value
        over.append(f"{key}={val}")
    register_configs()
    with initialize_config_module(config_module="precsim.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=over)
    try:
        to_config(cfg)
    except Exception as e:  # noqa: BLE001 - the message is the finding
        pytest.fail(f"{doc}:{line}: as written, {cmd!r} fails the config's checks: {e}")


PASSED: set[str] = set()  # a command shown twice runs once


@pytest.mark.parametrize("doc,line,cmd", COMMANDS, ids=[f"{d}:{n}" for d, n, _ in COMMANDS])
def test_documented_command_runs(doc, line, cmd, tmp_path, capfd, request):
    if cmd in KNOWN_FAILURES:
        request.node.add_marker(pytest.mark.xfail(reason=KNOWN_FAILURES[cmd], strict=False))
    if cmd in PASSED:
        return
    kind = _kind(cmd)
    argv = _substitute(_argv(cmd), Fixtures(request), tmp_path, kind)
    if kind == "report":
        rc, text = _run_inprocess(report.main, argv, capfd)
        results = [Path(argv[0]) / "sweep_summary.csv"]
    elif kind == "record":
        argv = [*argv, "--tokens", "4"]
        rc, text = _run_inprocess(record.main, argv, capfd)
        results = [tmp_path / "rec" / "record.json", tmp_path / "rec" / "layer_00"]
    elif "--help" in argv or "-h" in argv:
        rc, text = _run_inprocess(cli_main, argv, capfd)
        assert "usage:" in text
        results = []
    else:
        if cmd not in DOCUMENTED_ERRORS:
            _valid_as_written(argv, doc, line, cmd)
        argv, sweep, where = _cli_argv(argv, tmp_path)
        rc, text = _run_inprocess(cli_main, argv, capfd)
        if sweep:
            results = [where / "sweep_summary.csv"]
            jobs = [d for d in where.iterdir() if d.is_dir() and d.name[0].isdigit()]
            assert jobs, f"no job directories in {where}"
            results += [d / "summary.json" for d in jobs]
        elif "workload=trace" in argv and not any(a.startswith("workload.layer=") for a in argv) \
                and not any(a.endswith(".npz") for a in argv):  # every layer of a recording
            results = [where / "summary.json", where / "layers.csv", where / "layer_00"]
        else:
            results = [where / "summary.json", where / "metrics.csv"]
        if "experiment=per_layer" in argv:
            results += [where / "sensitivity.csv", where / "sensitivity.png"]
        if "experiment=task_eval" in argv:
            results = [where / "summary.json", where / "items.csv"]
        elif any(a.startswith(("task.path=", "task.name=")) for a in argv):  # per_layer, a task
            results = [*(r for r in results if r.name != "metrics.csv"), where / "items.csv"]
    assert "Traceback" not in text, f"{doc}:{line}: {cmd}\n{text[-3000:]}"
    if rc != 0:
        first = DOCUMENTED_ERRORS.get(cmd)
        lines = [ln for ln in text.splitlines() if ln.strip()]
        assert first and lines and lines[-1].startswith(first), \
            f"{doc}:{line}: exit {rc}: {cmd}\n{text[-3000:]}"
        return
    missing = [str(p) for p in results if not p.exists()]
    assert not missing, f"{doc}:{line}: {cmd}: missing {missing}"
    for p in results:
        if p.name == "summary.json":
            json.loads(p.read_text())
    PASSED.add(cmd)


def test_every_page_and_block_is_covered(capsys):
    """The collection itself: each page with commands counted, every command has a runner, and the
    README's test line is the one CI runs."""
    pages = {d for d, _, _ in COMMANDS}
    readme = (ROOT / "README.md").read_text()
    unlinked = [p.name for p in DOCS[1:] if f"](docs/{p.name})" not in readme]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"
    assert {"README.md", "docs/sweeps.md", "docs/real-models.md"} <= pages, pages
    assert len(COMMANDS) >= 15 and all(_kind(c) in ("cli", "report", "record")
                                       for _, _, c in COMMANDS)
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    test_line = next(ln for ln in ci if ln.startswith("pip install"))
    assert test_line in [ln.strip() for ln in readme.splitlines()], \
        "the README's test command differs from .ci/run's"
    with capsys.disabled():
        per = {d: sum(1 for x, _, _ in COMMANDS if x == d) for d in sorted(pages)}
        print(f"\ndocumented commands: {len(COMMANDS)} from {len(pages)} pages {per}")


def test_doc_links_resolve():
    """Every relative link of the README, docs/ and experiments/README.md names a file that
    exists (after the docs and experiments/ moved, a stale path is a dead link)."""
    dead = []
    for page in [*DOCS, ROOT / "experiments" / "README.md"]:
        for link in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not link.startswith("http") and not (page.parent / link).exists():
                dead.append(f"{page.relative_to(ROOT)}: {link}")
    assert not dead, dead
