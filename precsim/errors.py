"""User-facing errors: one line naming the key, the value and what is allowed.

:class:`PrecsimError` is the one base of precsim's own errors: ``formats.FormatError`` (a format
name, rounding or option), ``report.ReportError`` (precsim-report's input) and
``formats.hadamard.RotateError`` subclass it. The policy, every command line's
(:func:`print_error`): such an error is the user's, printed as one line
``<program>: error: <message>`` on stderr, exit status 2, no traceback (``precsim``,
``precsim-report``, ``precsim.record``, ``precsim-lm-eval``); any other exception is a bug and
keeps its traceback.
"""

from __future__ import annotations

import sys

EXIT_USAGE = 2  # the exit status of a user error (as argparse's)


class PrecsimError(ValueError):
    """Bad configuration or input. A command line prints it with :func:`print_error`."""


def print_error(prog: str, message) -> int:
    """The one policy: ``<prog>: error: <message>`` on stderr (one line); returns the exit
    status, :data:`EXIT_USAGE`."""
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
    return EXIT_USAGE


def check(cond: bool, key: str, value, allowed: str) -> None:
    """Raise ``PrecsimError("key=value: allowed")`` unless ``cond``."""
    if not cond:
        raise PrecsimError(f"{key}={value!r} is invalid; allowed: {allowed}")


def check_choice(key: str, value, choices) -> None:
    choices = list(choices)
    if value not in choices:
        raise PrecsimError(f"{key}={value!r} is unknown; allowed: {', '.join(map(str, choices))}")
