"""How the benchmarks keep what they measured when they are killed: rows appended to a JSON Lines file and
flushed as they come, documents replaced whole (a kill mid-write leaves the previous one, never half a file)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path


def append_rows(rows_file: Path, rows: Iterable[dict]) -> None:
    """Each row as one JSON line at the end of ``rows_file``, on disk before this returns."""
    with rows_file.open("a", encoding="utf-8") as stream:
        for row in rows:
            stream.write(json.dumps(row, sort_keys=True) + "\n")
        stream.flush()
        os.fsync(stream.fileno())


def read_rows(rows_file: Path) -> list[dict]:
    """The rows of a JSON Lines file; a last line cut short by a kill is left out."""
    if not rows_file.exists():
        return []
    rows = []
    for line in rows_file.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def write_whole(path: Path, text: str) -> None:
    """``text`` as the new content of ``path``, replaced in one step."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)
