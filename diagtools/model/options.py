"""The choices a command line offers, in a module that imports nothing.

The front ends build their parsers from these before any work starts, so
``diagtools --help`` or a usage error loads no use case, no driver builder
and no result type; the modules that act on a choice import it from here.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_SETTLE_S",
    "DEFAULT_TIMEOUT_S",
    "DRIVER_CHOICES",
    "MAX_TIMEOUT_S",
    "START_METHODS",
    "timeout_problem",
]

DRIVER_CHOICES = ("auto", "real", "simulated", "none")
START_METHODS = ("fork", "spawn", "forkserver")
DEFAULT_SETTLE_S = 1.0
DEFAULT_TIMEOUT_S = 120.0
MAX_TIMEOUT_S = 7 * 24 * 3600.0


def timeout_problem(value: object) -> str | None:
    """What is wrong with ``value`` as a timeout in seconds (``None``: nothing): the one rule the command
    line, the API, the magics and the sweep apply."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"--timeout must be a number of seconds, got {value!r}"
    if not 0 < value <= MAX_TIMEOUT_S:  # also false for NaN
        return f"--timeout must be finite, positive and at most {MAX_TIMEOUT_S:.0f} s, got {value}"
    return None
