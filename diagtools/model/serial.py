"""One derived, validating JSON mapping for every result type.

Every frozen dataclass of the model inherits :class:`Serial`: ``to_json``
writes its fields by name (tuples as lists, labels as their text, nested
dataclasses as objects) and ``from_json`` reads them back, checking each
value against the field's annotation.  A document that does not match raises
:class:`~diagtools.errors.SchemaError` naming the field (``processes[2].cuinit.site.line``),
never a ``KeyError`` or a ``TypeError``, so every reader fails the same way.

What a type may declare:

* ``SCHEMA`` (a class variable): the document's ``schema``, written first and
  checked on reading; nested types report errors under their top-level schema.
* ``_json_extra()``: derived keys written beside the fields (a verdict, the
  doubts); readers ignore them, since they are computed again.
* ``field(metadata={"choices": (...)})``: the only texts a ``str`` field accepts.
* ``_JSON_AS_LIST = True``: written as a list of the field values, in order.
* ``_JSON_DEFAULTS``: values for required fields that older documents may lack.
* ``_json_upgrade(data)``: an older document's spelling made current before it is read.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, TypeVar

from diagtools.errors import SchemaError
from diagtools.model._display import TextReport
from diagtools.model.common import check_schema

__all__ = ["Serial", "dump", "json_line", "json_text", "load"]

_T = TypeVar("_T")
_MISSING = dataclasses.MISSING


class Serial(TextReport):
    """Mixin for a frozen dataclass: ``to_json`` and ``from_json`` derived from its fields."""

    SCHEMA: ClassVar[str] = ""
    _READ_AS: ClassVar[str] = ""  # a part read on its own (a journal line): the schema its errors are named under
    _JSON_AS_LIST: ClassVar[bool] = False
    _JSON_DEFAULTS: ClassVar[dict[str, Any]] = {}

    def _json_extra(self) -> dict[str, Any]:
        """Derived keys written beside the fields; none by default."""
        return {}

    @classmethod
    def _json_upgrade(cls, data: Any) -> Any:
        """``data`` as today's type reads it, when an older version wrote it otherwise; as it is by default."""
        return data

    def to_json(self) -> Any:
        """The JSON value of this object: builtin types only, stable key order."""
        return dump(self)

    @classmethod
    def from_json(cls: type[_T], data: Any) -> _T:
        """Read a value ``to_json`` wrote; :class:`SchemaError` names the first field that does not fit."""
        schema = getattr(cls, "SCHEMA", "") or getattr(cls, "_READ_AS", "") or cls.__name__
        if getattr(cls, "SCHEMA", ""):
            check_schema(data, schema)
        return load(cls, cls._json_upgrade(data), schema)  # type: ignore[attr-defined]


# ---- writing -----------------------------------------------------------------------


def dump(value: Any) -> Any:
    """``value`` as builtin JSON types."""
    kind = type(value)
    if kind in _SCALARS:  # exactly a builtin scalar: most values, returned as they are
        return value
    plan = _PLANS.get(kind)
    if plan is not None:
        return _dump_dataclass(value, plan)
    return _dump_other(value)


def _dump_other(value: Any) -> Any:
    """An enum, a dataclass seen for the first time, a container, or anything else (as it is)."""
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _dump_dataclass(value, _plan(type(value)))
    if isinstance(value, (tuple, list)):
        return [dump(item) for item in value]
    if isinstance(value, Mapping):
        return {str(key): dump(item) for key, item in value.items()}
    return value


_SCALARS = frozenset({str, int, float, bool, type(None)})  # JSON's scalars, exactly these types


# How each dataclass type is written, worked out once (``dataclasses.fields`` costs a scan's 1,000 nodes):
# its field names (all of them, in order), whether it is written as a list, and its schema.  A plain tuple,
# not a dataclass: making a class costs every command's start.
_Plan = tuple[tuple[str, ...], bool, str]
_PLANS: dict[type, _Plan] = {}


def _plan(cls: type) -> _Plan:
    """The plan of dataclass ``cls``, remembered."""
    plan = (
        tuple(f.name for f in dataclasses.fields(cls)),
        bool(getattr(cls, "_JSON_AS_LIST", False)),
        getattr(cls, "SCHEMA", ""),
    )
    _PLANS[cls] = plan
    return plan


def _dump_dataclass(value: Any, plan: _Plan) -> Any:
    names, as_list, schema = plan
    if as_list:
        return [dump(getattr(value, name)) for name in names]
    document: dict[str, Any] = {}
    if schema:
        document["schema"] = schema
    for name in names:
        document[name] = dump(getattr(value, name))
    extra = getattr(value, "_json_extra", None)
    if extra is not None:
        document.update({key: dump(item) for key, item in extra().items()})
    return document


def json_line(value: Any) -> str:
    """One line of a JSON Lines file (a sweep journal, a bisect's steps): ``value`` (what :func:`dump` or
    ``to_json`` gives) on one line, keys sorted, with no newline inside."""
    return json.dumps(value, sort_keys=True)


def json_text(document: Any) -> str:
    """``json.dumps(document, indent=2, sort_keys=True)``: the same text, written several times faster.

    With ``indent`` the standard library runs its pure-Python encoder, which
    costs a torch scan's document (1,100 modules) about 8 ms.  Here each
    container whose items are all scalars (a module, a site) is written by one
    call of the C encoder, its item separator carrying the line break and the
    indentation, and only the few containers above them go through Python.  A
    document with anything else than builtin JSON types and text keys is left
    to ``json.dumps`` itself.
    """
    chunks: list[str] = []
    try:
        _pretty(document, 0, chunks, set())
    except _NotPlainError:
        return json.dumps(document, indent=2, sort_keys=True)
    return "".join(chunks)


class _NotPlainError(Exception):
    """A value :func:`json_text` leaves to ``json.dumps`` (a subclass, a key that is not text)."""


_TEXT = frozenset({str})
_FLAT_ENCODERS: dict[int, Callable[[Any], str]] = {}


def _pretty(value: Any, level: int, out: list[str], seen: set[int]) -> None:
    """Append the indented text of ``value``, nested ``level`` deep, to ``out``."""
    kind = type(value)
    if kind in _SCALARS:
        out.append(json.dumps(value))
        return
    if kind is not dict and kind is not list:
        raise _NotPlainError
    if not value:
        out.append("{}" if kind is dict else "[]")
        return
    if kind is dict and not _TEXT.issuperset(map(type, value)):
        raise _NotPlainError
    if _flat(value.values() if kind is dict else value):
        out.append(_flat_text(value, level))
        return
    if id(value) in seen:
        raise ValueError("Circular reference detected")
    seen.add(id(value))
    _pretty_nested(value, level, out, seen)
    seen.discard(id(value))


def _flat(items: Iterable[Any]) -> bool:
    """Whether every item is a scalar or an empty container (written as ``{}`` or ``[]`` on its line)."""
    kinds = set(map(type, items))
    return kinds <= _SCALARS or all(
        type(item) in _SCALARS or (type(item) in (dict, list) and not item) for item in items
    )


def _pretty_nested(value: dict[str, Any] | list[Any], level: int, out: list[str], seen: set[int]) -> None:
    """A container with containers inside: one item per line, each written by :func:`_pretty`."""
    inner = "\n" + "  " * (level + 1)
    out.append("{" if type(value) is dict else "[")
    pairs = sorted(value.items()) if type(value) is dict else ((None, item) for item in value)
    for index, (key, item) in enumerate(pairs):
        out.append(inner if index == 0 else "," + inner)
        if key is not None:
            out.append(json.dumps(key) + ": ")
        _pretty(item, level + 1, out, seen)
    out.append("\n" + "  " * level + ("}" if type(value) is dict else "]"))


def _flat_text(value: dict[str, Any] | list[Any], level: int) -> str:
    """A container of scalars, indented as ``indent=2`` would, in one call of the C encoder."""
    encode = _FLAT_ENCODERS.get(level) or _flat_encoder(level)
    text = encode(value)
    return text[0] + "\n" + "  " * (level + 1) + text[1:-1] + "\n" + "  " * level + text[-1]


def _flat_encoder(level: int) -> Callable[[Any], str]:
    """The compact encoder whose item separator is a line break and the indentation of ``level + 1``.

    The C encoder is called directly where the interpreter has one (as
    ``json.dumps`` does): a ``JSONEncoder`` would build a new one for every
    container, a third of the time here.
    """
    separator = ",\n" + "  " * (level + 1)
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        encode: Callable[[Any], str] = json.JSONEncoder(sort_keys=True, separators=(separator, ": ")).encode
    else:
        c_encode = make(
            None, _unwritable, json.encoder.encode_basestring_ascii, None, ": ", separator, True, False, True
        )

        def encode(value: Any) -> str:
            return "".join(c_encode(value, 0))

    _FLAT_ENCODERS[level] = encode
    return encode


def _unwritable(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# ---- reading -----------------------------------------------------------------------


def load(cls: type[_T], data: Any, schema: str, where: str = "") -> _T:
    """An instance of dataclass ``cls`` from ``data``; ``where`` is the field path so far."""
    fields = _fields(cls)
    if getattr(cls, "_JSON_AS_LIST", False):
        if not isinstance(data, list) or len(data) != len(fields):
            raise SchemaError(
                schema, f"must be a list of {len(fields)} items, found {_shown(data)}", where or "document"
            )
        data = {f.name: item for f, item in zip(fields, data, strict=True)}
    if not isinstance(data, dict):
        raise SchemaError(schema, f"must be an object, found {_shown(data)}", where or "document")
    hints = _hints(cls)
    defaults = getattr(cls, "_JSON_DEFAULTS", {})
    values = {}
    for f in fields:  # the values given first, so a wrong one is named before a missing one
        if f.name in data:
            values[f.name] = _value(
                hints[f.name], data[f.name], schema, _path(where, f.name), f.metadata.get("choices")
            )
    for f in fields:
        if f.name in values:
            continue
        if f.name in defaults:
            values[f.name] = defaults[f.name]
        elif f.default is _MISSING and f.default_factory is _MISSING:
            raise SchemaError(schema, "is missing", _path(where, f.name))
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:  # a __post_init__ that refuses the combination
        raise SchemaError(schema, f"is not valid: {exc}", where or "document") from None


def _path(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


_FIELDS: dict[type, tuple[dataclasses.Field[Any], ...]] = {}
_HINTS: dict[type, dict[str, Any]] = {}


def _fields(cls: type) -> tuple[dataclasses.Field[Any], ...]:
    """The fields a constructor takes (cached per type)."""
    if cls not in _FIELDS:
        _FIELDS[cls] = tuple(f for f in dataclasses.fields(cls) if f.init)
    return _FIELDS[cls]


def _hints(cls: type) -> dict[str, Any]:
    """The fields' annotations, resolved (cached per type)."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _value(hint: Any, data: Any, schema: str, path: str, choices: Any = None) -> Any:  # noqa: PLR0911 - one kind per line
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return _union(typing.get_args(hint), data, schema, path, choices)
    if origin is tuple:
        return _tuple(typing.get_args(hint), data, schema, path)
    if origin is dict:
        return _dict(typing.get_args(hint)[1], data, schema, path)
    if hint is Any:
        return data
    if hint is type(None):
        if data is not None:
            raise _wrong(schema, "null", data, path)
        return None
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return load(hint, data, schema, path)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum(hint, data, schema, path)
    return _scalar(hint, data, schema, path, choices)


def _union(options: tuple[Any, ...], data: Any, schema: str, path: str, choices: Any) -> Any:
    if data is None and type(None) in options:
        return None
    rest = [option for option in options if option is not type(None)]
    if len(rest) == 1:
        return _value(rest[0], data, schema, path, choices)
    for option in rest:
        try:
            return _value(option, data, schema, path, choices)
        except SchemaError:
            continue
    raise _wrong(schema, " or ".join(_describe(option) for option in options), data, path)


def _tuple(args: tuple[Any, ...], data: Any, schema: str, path: str) -> tuple[Any, ...]:
    if not isinstance(data, list):
        raise _wrong(schema, "a list", data, path)
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_value(args[0], item, schema, f"{path}[{index}]") for index, item in enumerate(data))
    if len(data) != len(args):
        raise _wrong(schema, f"a list of {len(args)} items", data, path)
    return tuple(
        _value(arg, item, schema, f"{path}[{index}]") for index, (arg, item) in enumerate(zip(args, data, strict=True))
    )


def _dict(item_hint: Any, data: Any, schema: str, path: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise _wrong(schema, "an object", data, path)
    return {str(key): _value(item_hint, item, schema, f"{path}.{key}") for key, item in data.items()}


def _enum(hint: type[enum.Enum], data: Any, schema: str, path: str) -> Any:
    allowed = [member.value for member in hint]
    if not isinstance(data, str) or data not in allowed:
        raise _wrong(schema, "one of " + ", ".join(map(str, allowed)), data, path)
    return hint(data)


def _scalar(hint: Any, data: Any, schema: str, path: str, choices: Any) -> Any:
    if hint is bool:
        if type(data) is not bool:
            raise _wrong(schema, "true or false", data, path)
        return data
    if hint is int:
        if type(data) is not int:
            raise _wrong(schema, "an integer", data, path)
        return data
    if hint is float:
        if type(data) not in (int, float) or not math.isfinite(data):
            raise _wrong(schema, "a finite number", data, path)
        return float(data)
    if hint is str:
        if type(data) is not str:
            raise _wrong(schema, "a string", data, path)
        if choices is not None and data not in choices:
            raise _wrong(schema, "one of " + ", ".join(choices), data, path)
        return data
    raise SchemaError(schema, f"has a type diagtools cannot read ({hint!r})", path)


def _wrong(schema: str, expected: str, data: Any, path: str) -> SchemaError:
    return SchemaError(schema, f"must be {expected}, found {_shown(data)}", path or "document")


def _describe(hint: Any) -> str:
    names = {str: "a string", int: "an integer", float: "a finite number", bool: "true or false"}
    if hint is type(None):
        return "null"
    if hint in names:
        return names[hint]
    return "an object" if isinstance(hint, type) and dataclasses.is_dataclass(hint) else "a list"


def _shown(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'…' if len(text) > 40 else ''}"
