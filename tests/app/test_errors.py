"""One error base and one policy (issue 43): every error class of the package derives from
``precsim.errors.PrecsimError``, and every command line prints one as ``<prog>: error: <message>``
(one line on stderr, exit status 2) through ``errors.print_error``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from precsim.errors import EXIT_USAGE, PrecsimError, print_error

ROOT = Path(__file__).resolve().parents[2]


def _error_classes() -> dict[str, tuple[str, list[str]]]:
    """Every class of precsim/, formats/ and kernels/ whose name ends in Error or Exception:
    name -> (file, the names of its bases)."""
    out = {}
    for folder in ("precsim", "formats", "kernels"):
        for p in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, ast.ClassDef) and node.name.endswith(("Error", "Exception")):
                    bases = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "")
                             for b in node.bases]
                    out[node.name] = (str(p.relative_to(ROOT)), bases)
    return out


def test_every_error_class_derives_from_precsim_error():
    classes = _error_classes()
    assert {"PrecsimError", "FormatError", "ReportError", "RotateError"} <= set(classes)
    for name, (where, bases) in classes.items():
        seen, todo = set(), [name]
        while todo and "PrecsimError" not in todo:
            n = todo.pop()
            seen.add(n)
            todo += [b for b in classes.get(n, ("", []))[1] if b not in seen]
        assert name == "PrecsimError" or "PrecsimError" in todo, \
            f"{where}: {name}({', '.join(bases)}) does not derive from PrecsimError"


def test_the_error_classes_are_precsim_and_value_errors():
    from precsim.formats.hadamard import RotateError

    from precsim import formats as pf
    from precsim.report import ReportError

    for cls in (pf.FormatError, ReportError, RotateError):
        assert issubclass(cls, PrecsimError) and issubclass(cls, ValueError)
    with pytest.raises(PrecsimError, match="format='fp7' is unknown"):
        pf.get("fp7")


def test_print_error_is_the_policy(capsys):
    from precsim.report import ReportError

    assert print_error("precsim-report", ReportError("no run results under x")) == EXIT_USAGE
    assert EXIT_USAGE == 2
    assert capsys.readouterr().err == "precsim-report: error: no run results under x\n"


def test_each_command_line_prints_a_precsim_error_as_one_line(tmp_path, capsys):
    from precsim import record, report

    with pytest.raises(SystemExit) as e:
        report.main([str(tmp_path / "missing")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("precsim-report: error: ") and err.count("\n") == 1
    rc = record.main(["--model", str(tmp_path), "--out", str(tmp_path / "o"), "--tokens", "0"])
    err = capsys.readouterr().err
    assert rc == 2 and err == ("precsim.record: error: --tokens=0 is invalid; allowed: an "
                               "integer >= 1\n")


def test_record_usage_and_device_errors_are_one_line(tmp_path, capsys, monkeypatch):
    """precsim.record printed argparse's usage block before a malformed option (precsim-report
    already said one line), and took any --device: --device tpu ended in torch's traceback
    after the model was read; --prompt-file is one source of tokens among the others."""
    import torch

    from precsim import record

    base = ["--model", str(tmp_path), "--out", str(tmp_path / "o"), "--tokens", "4"]
    (tmp_path / "p.txt").write_text("hi")
    # --prompt-file is one source of tokens (it was taken over --prompt without a word)
    pf = ["--prompt-file", str(tmp_path / "p.txt")]
    for argv, want in ((base[:-1] + ["abc"], "argument --tokens: invalid int value: 'abc'"),
                       (base[:2], "the following arguments are required: --out"),
                       (base + pf + ["--prompt", "x"],
                        "argument --prompt: not allowed with argument --prompt-file"),
                       (base + pf + ["--ids-file", "i.npy"],
                        "argument --ids-file: not allowed with argument --prompt-file")):
        with pytest.raises(SystemExit) as e:
            record.main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err == f"precsim.record: error: {want}\n", err
    for device, want in (("tpu", "--device='tpu' is unknown; allowed: cpu, cuda or cuda:N"),
                         ("auto", "--device='auto' is unknown; allowed: cpu, cuda or cuda:N")):
        assert record.main([*base, "--device", device]) == 2
        assert capsys.readouterr().err == f"precsim.record: error: {want}\n"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a 2-GPU machine
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert record.main([*base, "--device", "cuda:2"]) == 2
    assert capsys.readouterr().err == ("precsim.record: error: --device='cuda:2' but 2 CUDA "
                                       "device(s) are visible; allowed: cpu, cuda:0..cuda:1\n")
    assert not (tmp_path / "o").exists()
