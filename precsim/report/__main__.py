"""``python -m precsim.report DIR ...``: :func:`precsim.report.command.main`."""

import sys

from .command import main

sys.exit(main())
