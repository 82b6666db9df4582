"""User-facing errors: one line naming the key, the value and what is allowed.

:class:`PrecsimError` is the one base of precsim's own errors: ``formats.FormatError`` (a format
name, rounding or option), ``report.ReportError`` (precsim-report's input) and
``formats.hadamard.RotateError`` subclass it. The policy, every command line's
(:func:`print_error`): such an error is the user's, printed as one line
``<program>: error: <message>`` on stderr, exit status 2, no traceback (``precsim``,
``precsim-report``, ``precsim.record``, ``precsim-lm-eval``); any other exception is a bug and
keeps its traceback. Hydra's and OmegaConf's config errors are the user's too
(:func:`is_user_error`); :func:`one_line` makes their multi-line messages one line.
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


def argument_parser(error_prog: str, **kwargs):
    """An ``argparse.ArgumentParser(**kwargs)`` whose own errors (an unknown, missing or
    malformed option) follow the policy: one line ``<error_prog>: error: <message>``, exit
    status 2, without argparse's usage block before it."""
    import argparse

    class OneLineParser(argparse.ArgumentParser):
        def error(self, message: str) -> None:
            self.exit(print_error(error_prog, message))

    return OneLineParser(**kwargs)


def user_error_types() -> tuple:
    """The bases of config and input errors: ours, Hydra's, OmegaConf's."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    return PrecsimError, OmegaConfBaseException, HydraException


def is_user_error(e: BaseException) -> bool:
    """Config and input errors (:func:`user_error_types`), as opposed to bugs."""
    return isinstance(e, user_error_types())


def one_line(e: BaseException) -> str:
    """Collapse a multi-line Hydra/OmegaConf message into one line that keeps the key."""
    text = str(e)
    if e.__cause__ is not None:  # e.g. "Error merging override" hides the reason in its cause
        text += "\n" + str(e.__cause__)
    text = text.split("Config search path")[0]
    parts = [p.strip() for p in text.splitlines() if p.strip()]
    if not parts:
        return type(e).__name__
    head, rest = parts[0], parts[1:]
    keep = [p for p in rest if p.startswith(("full_key", "Available options"))
            or not p.startswith(("object_type", "reference_type", "provider", "Set the env"))]
    if any(p.startswith("Available options") for p in keep):
        i = next(i for i, p in enumerate(keep) if p.startswith("Available options"))
        keep = keep[:i] + [keep[i].rstrip(":") + ": " + ", ".join(keep[i + 1:])]
    line = "; ".join([head, *keep])
    import re  # a value of the wrong type: the key, the value and what is allowed


    m = re.search(r"Value '(.*)' of type '\w+' could not be converted to (\w+).*full_key: (\S+)",
                  line)
    kinds = {"Integer": "an integer", "Float": "a number", "Boolean": "true or false"}
    if m and m.group(2) in kinds:
        return f"{m.group(3)}={m.group(1)!r} is invalid; allowed: {kinds[m.group(2)]}"
    m = re.search(r"Value '(.*)' is not a valid bool.*full_key: (\S+)", line)
    if m:
        return f"{m.group(2)}={m.group(1)!r} is invalid; allowed: true or false"
    return line


def check(cond: bool, key: str, value, allowed: str) -> None:
    """Raise ``PrecsimError("key=value: allowed")`` unless ``cond``."""
    if not cond:
        raise PrecsimError(f"{key}={value!r} is invalid; allowed: {allowed}")


def check_choice(key: str, value, choices) -> None:
    choices = list(choices)
    if value not in choices:
        raise PrecsimError(f"{key}={value!r} is unknown; allowed: {', '.join(map(str, choices))}")
