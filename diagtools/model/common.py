"""Helpers every result type shares: the schema check, timestamps and exit statuses (fields: ``serial``)."""

from __future__ import annotations

import math
import time

from diagtools.errors import SchemaError

__all__ = ["check_schema", "describe_exit", "iso_time", "signal_name"]


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9; ``signal N`` for a number with no name here."""
    import signal  # its enums cost a scan's fixed cost a millisecond: only a failed run needs them

    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def describe_exit(code: int | None) -> str:
    """A process's exit status in words, the one way every report says it (``-N``: killed by signal N)."""
    if code is None:
        return "did not start"
    if code < 0:
        return f"killed by signal {-code} ({signal_name(-code)})"
    return f"exit code {code}"


def check_schema(data: object, expected: str) -> None:
    """Raise :class:`SchemaError` unless ``data`` is a document of schema ``expected``."""
    if not isinstance(data, dict) or data.get("schema") != expected:
        raise SchemaError(expected, data.get("schema") if isinstance(data, dict) else type(data).__name__)


def iso_time(epoch: float) -> str:
    """UTC ISO-8601 time of an epoch timestamp, to the millisecond; "" for 0.

    What ``datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds")``
    writes (``Z`` for ``+00:00``), without importing ``datetime``: every scan
    stamps its result, and that import cost a scan's fixed cost a millisecond.
    As ``datetime`` does, the fraction is first rounded, half to even, to the
    microsecond, then cut to the millisecond.
    """
    if not epoch:
        return ""
    seconds = math.floor(epoch)
    micro = round((epoch - seconds) * 1e6)
    if micro >= 1_000_000:
        seconds, micro = seconds + 1, micro - 1_000_000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{micro // 1000:03d}Z"
