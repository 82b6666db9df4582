"""Runs every Hydra study of ``experiments/studies/`` (issue 14): a dispatcher over each study's
own driver ``experiments/studies/<name>/run.py`` (its definition, plot and result table; the
shared code is ``experiments/studies/studylib.py``).

    python experiments/run_studies.py                      # GPU sizes, into experiments/studies/
    python experiments/run_studies.py --out $OUT           # the same, one archive in $OUT
    python experiments/run_studies.py --unpack studies.tar.gz   # the archive into studies/
    python experiments/run_studies.py --smoke              # CPU, reduced sizes, experiments/_smoke
    python experiments/run_studies.py --notes              # NOTES.md tables from the CSVs again
    python experiments/run_studies.py --only study_buffer_len   # = studies/study_buffer_len/run.py

The names below (``STUDIES``, ``BY_NAME``, ``run_study``, ``pack``, ``unpack``, ...) are
studylib's, re-exported for the scripts and tests that import this file.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "studies"))
import studylib  # noqa: E402
from studylib import *  # noqa: E402,F403 - this file's names are studylib's

STUDIES = studylib.all_studies()
BY_NAME = {s.name: s for s in STUDIES}


def main(argv: list[str] | None = None) -> int:
    return studylib.main(argv, STUDIES, prog="experiments/run_studies.py")


if __name__ == "__main__":
    sys.exit(main())
