"""Helpers every result type shares: the schema check and timestamps (fields: :mod:`diagtools.model.serial`)."""

from __future__ import annotations

from diagtools.errors import SchemaError

__all__ = ["check_schema", "iso_time"]


def check_schema(data: object, expected: str) -> None:
    """Raise :class:`SchemaError` unless ``data`` is a document of schema ``expected``."""
    if not isinstance(data, dict) or data.get("schema") != expected:
        raise SchemaError(expected, data.get("schema") if isinstance(data, dict) else type(data).__name__)


def iso_time(epoch: float) -> str:
    """UTC ISO-8601 time of an epoch timestamp, to the millisecond; "" for 0."""
    if not epoch:
        return ""
    from datetime import datetime, timezone

    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
