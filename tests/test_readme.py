"""Every console example in the README is what the command prints today.

Each ```` ```console ```` block starts with ``$ COMMAND``; the test runs the
command from the repository root, as the README says, and the lines shown must
be a contiguous run of the real output's lines, once the facts that change
from run to run (seconds, module counts, process ids, the driver cache's key)
are written the same way.  A line ``...`` in an example skips any number of
lines; nothing else may be left out or differ.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.conftest import DIAGTOOLS

ROOT = Path(__file__).resolve().parents[1]
ELIDED = "..."

_CHANGING = (
    (re.compile(r"\b\d+\.\d+ s\b"), "N.NN s"),
    (re.compile(r"\(\d+ modules imported"), "(N modules imported"),
    (re.compile(r"\b(pid|child) \d+"), r"\1 N"),
    (re.compile(r"(simdriver/)[^/\s]+/"), r"\1…/"),
)


def console_examples(readme: str) -> list[tuple[str, list[str]]]:
    """(command, lines shown) for each console block, in README order."""
    blocks = re.findall(r"^```console\n(.*?)^```", readme, flags=re.S | re.M)
    examples = []
    for block in blocks:
        first, *shown = block.rstrip("\n").split("\n")
        assert first.startswith("$ "), f"a console example starts with '$ COMMAND': {first!r}"
        examples.append((first[2:], shown))
    return examples


def normalised(line: str) -> str:
    for pattern, written in _CHANGING:
        line = pattern.sub(written, line)
    return line.rstrip()


def shown_in(shown: list[str], real: list[str]) -> str:
    """Why ``shown`` is not a contiguous run of ``real`` (with ``...`` skipping lines), or "" when it is."""
    wanted = [normalised(line) for line in shown]
    lines = [normalised(line) for line in real]
    for start in (i for i, line in enumerate(lines) if wanted and line == wanted[0]):
        position, ok = start, True
        for index, line in enumerate(wanted):
            if line.strip() == ELIDED:
                following = wanted[index + 1] if index + 1 < len(wanted) else None
                while following is not None and position < len(lines) and lines[position] != following:
                    position += 1
                continue
            if position >= len(lines) or lines[position] != line:
                ok = False
                break
            position += 1
        if ok:
            return ""
    first_missing = next((line for line in wanted if line.strip() != ELIDED and line not in lines), None)
    return f"not in the real output: {first_missing!r}" if first_missing else "lines out of order or not contiguous"


EXAMPLES = console_examples((ROOT / "README.md").read_text())


def test_the_readme_shows_console_examples():
    assert len(EXAMPLES) >= 4
    assert all(command.startswith(".venv/bin/diagtools ") for command, _ in EXAMPLES)


EXAMPLE_IDS = [f"{command.split()[1]}{number}" for number, (command, _) in enumerate(EXAMPLES)]


@pytest.mark.parametrize(("command", "shown"), EXAMPLES, ids=EXAMPLE_IDS)
def test_console_example_matches_the_real_output(command, shown):
    argv = shlex.split(command)
    argv[0] = DIAGTOOLS  # the README's .venv/bin/diagtools: the one this suite runs
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "100"}
    done = subprocess.run(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300, check=False
    )
    problem = shown_in(shown, done.stdout.splitlines())
    assert not problem, f"{command}: {problem}\n--- real output ---\n{done.stdout}"


def test_the_matcher_fails_on_a_changed_or_missing_line():
    real = ["a", "b 0.12 s", "c", "d"]
    assert shown_in(["b 9.99 s", "c"], real) == ""
    assert shown_in(["a", "...", "d"], real) == ""
    assert shown_in(["a", "c"], real)  # a line left out without '...'
    assert shown_in(["b 0.1 s", "x"], real)
    assert shown_in(["c", "b 0.12 s"], real)
