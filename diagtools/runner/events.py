"""Read a channel's events on the host: every line validated against the protocol's kinds and field types.

The agents write events with :class:`diagtools.protocol.Channel`; this side
reads them back, and counts what it had to skip, so a torn, malformed or
hostile line never breaks a result.  Only the host needs it, so it stays out
of the module every subkernel loads before its tracer starts.
"""

from diagtools.protocol import EVENTS

__all__ = ["FIELD_TYPES", "DecodedEvents", "EventReader", "decode_events"]


class DecodedEvents:
    """The valid events of a channel, in order, and how many lines had to be skipped."""

    def __init__(self, events, skipped):
        self.events = events
        self.skipped = skipped


def decode_events(data):
    """Split a channel's bytes into validated events.

    A line is kept when it is a JSON object whose ``e`` is a known kind with
    all of that kind's fields; anything else (a torn last line, garbage a
    target wrote into the descriptor) is skipped and counted.
    """
    reader = EventReader()
    reader.feed(data)
    return reader.close()


class EventReader:
    """:func:`decode_events` on bytes that arrive in pieces: each line is read as soon as it is complete.

    The runner feeds the channel's bytes to it while the subkernel is still
    running, so reading a large import tree costs nothing once the subkernel
    is gone.  :meth:`close` gives what :func:`decode_events` gives on all the
    bytes at once: a last line with no newline after it is torn, and counted.
    """

    def __init__(self):
        self.events = []
        self.skipped = 0
        self._tail = []  # the pieces of a line still waiting for its newline
        self._parse = None

    def feed(self, data):
        """Read the complete lines of ``data`` (with what came before it); keep the rest for later."""
        if b"\n" not in data:
            if data:
                self._tail.append(data)
            return
        if self._tail:
            data = b"".join([*self._tail, data])
            self._tail = []
        lines = data.split(b"\n")
        last = lines.pop()
        if last:
            self._tail.append(last)
        self._read(lines)

    def close(self):
        """The events read, and the lines skipped (a torn last line among them)."""
        return DecodedEvents(self.events, self.skipped + (1 if self._tail else 0))

    def _read(self, lines):
        if self._parse is None:
            import json

            self._parse = _line_parser(json)
        parse, events, skipped = self._parse, self.events, 0
        for line in lines:
            event = _decode_line(parse, line)
            if event is None:
                skipped += line.strip() != b""
            else:
                events.append(event)
        self.skipped += skipped


def _line_parser(json):
    """``json.loads`` for one line, without its two whitespace scans when the line has no blank around it.

    An agent's line starts with ``{`` and ends with ``}``: the decoder's
    ``raw_decode`` reads it whole.  A line with blanks before it goes through
    ``json.loads`` itself; one that does not parse, or has more than blanks
    after its value, is refused as ``json.loads`` refuses it, without a
    second parse (a flood of garbage costs no more than before).
    """
    raw_decode = json.JSONDecoder().raw_decode
    loads = json.loads

    def parse(text):
        if text[:1] in _BLANKS:
            return loads(text)  # blanks first (or no text at all): json.loads's own answer
        value, end = raw_decode(text)
        if end != len(text) and text[end:].strip(_BLANKS):
            raise ValueError("extra data after the event")
        return value

    return parse


_BLANKS = " \t\n\r"  # what json.loads skips around a value


def _decode_line(parse, line):
    try:
        event = parse(line.decode("utf-8", "backslashreplace"))
    except (ValueError, RecursionError):
        return None
    return event if type(event) is dict and _valid(event) else None


def _valid(event):
    """Whether ``event`` is of a known kind, with all of its fields, each of the type it must have."""
    kind = event.get("e")
    required = EVENTS.get(kind) if type(kind) is str else None
    if required is None:
        return False
    for name in required:
        if name not in event:
            return False
    if kind not in _TYPED_KINDS:
        return "t" not in event or _is_number(event["t"])
    for name, value in event.items():
        check = FIELD_TYPES.get(name)
        if check is not None and not check(value):
            return False
    return True


# ---- the fields' types, checked on the host for the scan probe's events ---------


def _is_str(value):
    return type(value) is str


def _is_int(value):
    return type(value) is int


def _is_bool(value):
    return type(value) is bool


def _is_number(value):
    return type(value) in (int, float) and value - value == 0  # finite: json.loads accepts NaN and Infinity


def _optional(check):
    return lambda value: value is None or check(value)


def _is_frames(value):
    """A stack: ``[[file, line, function], ...]`` (a line may be unknown)."""
    return type(value) is list and all(_is_frame(frame) for frame in value)


def _is_frame(value):
    """One frame, ``[file, line, function]``: the import line of a ``begin`` event."""
    return (
        type(value) is list
        and len(value) >= 3
        and type(value[0]) is str
        and (value[1] is None or type(value[1]) is int)
        and type(value[2]) is str
    )


def _is_str_list(value):
    return type(value) is list and all(_is_str(item) for item in value)


def _is_chain(value):
    """The run agent's chain: ``[[module, file], ...]`` (a file may be unknown)."""
    return type(value) is list and all(
        type(item) is list and len(item) == 2 and _is_str(item[0]) and (item[1] is None or _is_str(item[1]))
        for item in value
    )


_TYPED_KINDS = frozenset(
    (
        *("hello", "phase", "begin", "end", "thread", "transition", "refined", "cuinit", "error", "exit", "final"),
        *("start", "fork-child", "refusal", "raised", "exec", "ended", "waited"),
        *("rewritten", "resolved"),
    )
)
FIELD_TYPES = {
    "e": _is_str,
    "t": _is_number,
    "n": _is_str,
    "p": _optional(_is_str),
    "f": _optional(_is_str),
    "l": _optional(_is_frame),
    "th": _is_int,
    "ph": _is_str,
    "ok": _is_bool,
    "by": _optional(_is_str),
    "m": _optional(_is_str),
    "at": _is_str,
    "stack": _is_frames,
    "tb": _is_frames,
    "target": _is_str,
    "type": _is_str,
    "msg": _is_str,
    "file": _optional(_is_str),
    "line": _optional(_is_int),
    "code": _is_int,
    "initialized": _is_bool,
    "torch": _optional(_is_bool),
    "pid": _is_int,
    "python": _is_str,
    "main_thread": _is_int,
    "library": _optional(_is_str),
    "importer": _optional(_is_str),
    "origin": _optional(_is_str),
    "phase": _is_str,
    "name": _optional(_is_str),
    "started": _optional(_is_frames),
    # the run agent's fields
    "parent": _optional(_is_int),
    "via": _is_str,
    "argv": _optional(_is_str_list),
    "fork_seq": _optional(_is_int),
    "parent_initialized": _is_bool,
    "executable": _optional(_is_str),
    "chain": _is_chain,
    "context": _optional(_is_str),
    "kind": _is_str,
    "seq": _optional(_is_int),
    "child": _optional(_is_int),
    "driver_initialized": _is_bool,
    "driver_unaskable": _is_bool,
    "state": _is_int,
    "call": _is_str,
    "how": _is_str,
    "exitcode": _optional(_is_int),
    # the name check of a patch
    "module": _is_str,
    "error": _optional(_is_str),
}
