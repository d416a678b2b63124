"""Helpers every result type shares: the schema check and timestamps (fields: :mod:`diagtools.model.serial`)."""

from __future__ import annotations

import math
import time

from diagtools.errors import SchemaError

__all__ = ["check_schema", "iso_time"]


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
