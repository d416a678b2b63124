"""The runner reads the channel's lines as they arrive, and a flood only at the end: the same events either way."""

from __future__ import annotations

import pytest

from diagtools.runner import events, subkernel

DONE = b'{"e":"done"}\n'
BEGIN = b'{"e":"begin","n":"a","p":null,"f":null,"l":null,"th":1,"ph":"import","t":1.0}\n'


def _stream(chunks: list[bytes]) -> events.DecodedEvents:
    stream = subkernel._EventStream()
    for chunk in chunks:
        stream.add(chunk)
    return stream.decoded()


def test_lines_read_as_they_arrive_and_a_flood_read_at_the_end_give_every_event_once():
    flood = BEGIN * 2000 + b"garbage\n" * 10  # one read of a full pipe: the rest waits for the end
    chunks = [DONE, BEGIN[:30], BEGIN[30:], flood, DONE, b'{"e":"do']
    assert len(flood) >= subkernel._FULL_READ
    decoded = _stream(chunks)
    whole = events.decode_events(b"".join(chunks))
    assert decoded.events == whole.events
    assert len(decoded.events) == 2003
    assert decoded.skipped == whole.skipped == 11  # the garbage and the torn last line


def test_past_the_bound_whole_lines_are_dropped_and_counted(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(subkernel.keeper_client, "CHANNEL_LIMIT", len(DONE) * 3 + 5)
    stream = subkernel._EventStream()
    stream.add(DONE * 2)
    stream.add(DONE * 4)  # the first fits, the rest (three lines) is dropped
    decoded = stream.decoded()
    assert stream.truncated
    assert decoded.events == [{"e": "done"}] * 3
    assert decoded.skipped == 3
