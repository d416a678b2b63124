"""Helpers every result type shares: schema checks and timestamps."""

from __future__ import annotations

from typing import Any

from diagtools.errors import SchemaError

__all__ = ["check_fields", "check_schema", "iso_time"]


def check_schema(data: object, expected: str) -> None:
    """Raise :class:`SchemaError` unless ``data`` is a document of schema ``expected``."""
    if not isinstance(data, dict) or data.get("schema") != expected:
        raise SchemaError(expected, data.get("schema") if isinstance(data, dict) else type(data).__name__)


def check_fields(data: object, spec: Any, expected: str, where: str = "document") -> None:
    """Raise :class:`SchemaError` naming the first field of ``data`` that does not match ``spec``.

    ``spec`` is a type (``int`` and ``float`` never accept a bool), ``None``,
    a tuple of alternatives, a one-item list (a list of those), a frozenset of
    allowed values, or a dict of fields (a name ending in ``?`` may be absent;
    fields the spec does not name are ignored).
    """
    if not _matches(data, spec):
        raise SchemaError(expected, f"must be {_describe(spec)}, found {_shown(data)}", where)
    if isinstance(spec, tuple):
        spec = next(option for option in spec if _matches(data, option))
    if isinstance(spec, list) and isinstance(data, list):
        for index, item in enumerate(data):
            check_fields(item, spec[0], expected, f"{where}[{index}]")
    elif isinstance(spec, dict) and isinstance(data, dict):
        for name, sub in spec.items():
            key = name.rstrip("?")
            if key in data:
                check_fields(data[key], sub, expected, key if where == "document" else f"{where}.{key}")
            elif not name.endswith("?"):
                raise SchemaError(expected, "is missing", key if where == "document" else f"{where}.{key}")


def _matches(value: object, spec: Any) -> bool:  # noqa: PLR0911 - one line per kind of spec
    if spec is None:
        return value is None
    if isinstance(spec, tuple):
        return any(_matches(value, option) for option in spec)
    if isinstance(spec, list):
        return isinstance(value, list)
    if isinstance(spec, dict):
        return isinstance(value, dict)
    if isinstance(spec, frozenset):
        return isinstance(value, str) and value in spec
    if spec is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value - value == 0
    if spec is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, spec)


def _describe(spec: Any) -> str:
    if spec is None:
        return "null"
    if isinstance(spec, tuple):
        return " or ".join(_describe(option) for option in spec)
    if isinstance(spec, list):
        return "a list"
    if isinstance(spec, dict):
        return "an object"
    if isinstance(spec, frozenset):
        return "one of " + ", ".join(sorted(spec))
    return {str: "a string", int: "an integer", float: "a finite number", bool: "true or false"}.get(spec, str(spec))


def _shown(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'…' if len(text) > 40 else ''}"


def iso_time(epoch: float) -> str:
    """UTC ISO-8601 time of an epoch timestamp, to the millisecond; "" for 0."""
    if not epoch:
        return ""
    from datetime import datetime, timezone

    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
