"""The one record format of ``experiments/bench/`` (issue 43): JSON lines, one line per run.

Every benchmark writes its figures through :func:`write`, which appends one line to
``OUT/<bench>.jsonl``::

    {"date": "2026-12-06T23:10:00+00:00", "machine": {"host": ..., "cpus": ..., "gpu": ...},
     "command": "python experiments/bench/gpu_sweep.py --out OUT", "figures": {...}}

``figures`` is the script's own dictionary of numbers (rows, settings, card). A run that may be
cut short keeps its figures so far with :func:`write_partial` (the same line in
``OUT/<bench>.partial.jsonl``, replaced at each call). Committed records go to
``experiments/bench/records/<bench>.jsonl``, newest last (copy the run's line there); the
older ``.txt`` / ``.md`` / ``.json`` files beside the scripts are historical records kept as
written.
Shell scripts write through the command line::

    python experiments/bench/record.py OUT BENCH --command "bash ..." < figures.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import sys
from pathlib import Path

KEYS = ("date", "machine", "command", "figures")


def machine() -> dict:
    """Host, platform, CPU count, Python, and torch and its GPU where torch is importable."""
    out = {"host": platform.node(), "platform": platform.platform(), "cpus": os.cpu_count(),
           "python": platform.python_version()}
    try:
        import torch

        out["torch"] = torch.__version__
        if torch.cuda.is_available():
            out["gpu"] = torch.cuda.get_device_name(0)
            out["gpus"] = torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no torch: the machine without it
        pass
    return out


def command(argv: list[str] | None = None) -> str:
    """The command that ran: ``python <script as given> <args>``."""
    argv = sys.argv if argv is None else argv
    return "python " + shlex.join(argv)


def make(figures: dict, cmd: str | None = None) -> dict:
    return {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": machine(), "command": cmd or command(), "figures": figures}


def write(out, bench: str, figures: dict, cmd: str | None = None) -> Path:
    """Append one record of ``figures`` to ``out/<bench>.jsonl``; returns the file."""
    path = Path(out) / f"{bench}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(make(figures, cmd), default=str) + "\n")
    return path


def write_partial(out, bench: str, figures: dict, cmd: str | None = None) -> Path:
    """The figures so far of a run that may be cut short: ``out/<bench>.partial.jsonl``, one
    line in the same format, replaced at each call."""
    path = Path(out) / f"{bench}.partial.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(make(figures, cmd), default=str) + "\n")
    return path


class transcript:  # noqa: N801 - used as ``with record.transcript(...)``
    """Everything a print-only benchmark prints inside the block, kept as its figures
    (``{"args": ..., "printed": [lines]}``) and written as one record at the block's end (also
    when the block fails or returns early); still printed as it comes."""

    def __init__(self, out, bench: str, args: dict | None = None):
        self.out, self.bench, self.args, self.lines = out, bench, args or {}, []

    def write(self, text: str) -> int:
        self._stdout.write(text)
        self.lines.append(text)
        return len(text)

    def flush(self) -> None:
        self._stdout.flush()

    def __enter__(self):
        self._stdout, sys.stdout = sys.stdout, self
        return self

    def __exit__(self, *exc) -> bool:
        sys.stdout = self._stdout
        printed = "".join(self.lines).splitlines()
        path = write(self.out, self.bench, {"args": self.args, "printed": printed,
                                            "completed": exc[0] is None})
        print(f"record: {path}")
        return False


def read(path) -> list[dict]:
    """Every record of a ``.jsonl`` file, each checked to have the four keys."""
    recs = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    for r in recs:
        missing = [k for k in KEYS if k not in r]
        if missing:
            raise ValueError(f"{path}: a record without {missing}")
    return recs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Append one record (figures as JSON on stdin).")
    ap.add_argument("out", help="directory of the record file")
    ap.add_argument("bench", help="the record file's name: OUT/BENCH.jsonl")
    ap.add_argument("--command", help="the command that ran (default: this one)")
    a = ap.parse_args(argv)
    print(write(a.out, a.bench, json.load(sys.stdin), a.command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
