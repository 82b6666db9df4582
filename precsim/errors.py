"""User-facing errors: one line naming the key, the value and what is allowed."""

from __future__ import annotations


class PrecsimError(ValueError):
    """Bad configuration or input. The CLI prints ``precsim: error: <message>`` and exits 2."""


def check(cond: bool, key: str, value, allowed: str) -> None:
    """Raise ``PrecsimError("key=value: allowed")`` unless ``cond``."""
    if not cond:
        raise PrecsimError(f"{key}={value!r} is invalid; allowed: {allowed}")


def check_choice(key: str, value, choices) -> None:
    choices = list(choices)
    if value not in choices:
        raise PrecsimError(f"{key}={value!r} is unknown; allowed: {', '.join(map(str, choices))}")
