"""The verdicts every result carries, and the statuses a run can end in.

A verdict never says ``clean`` unless the run could see: an import error, a
crash, a timeout, an early exit, a lost channel, a child that never ran or a
library that failed under the simulated driver all give ``unknown``.
``poisoned-fork`` is what ``diagtools run`` says when it saw a process fork
after initializing CUDA.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

__all__ = ["Evidence", "Label", "ScanStatus", "Tone", "Verdict", "combine"]


class Label(str, Enum):
    """An enum whose members are their JSON spelling: compared, printed and serialized as that text."""

    def __str__(self) -> str:
        return str(self.value)


class Verdict(Label):
    """What a run established about CUDA initialization."""

    POISONED_FORK = "poisoned-fork"
    INITIALIZES_CUDA = "initializes-cuda"
    CLEAN = "clean"
    UNKNOWN = "unknown"


class Tone(Label):
    """How a word reads in every output: ``bad`` (CUDA initialized, a failure reproduced: red), ``good`` (clean,
    a fix that passes: green), ``unknown`` (amber).  A run's own health has no tone: it is said in neutral words."""

    BAD = "bad"
    GOOD = "good"
    UNKNOWN = "unknown"


VERDICT_TONES = {
    Verdict.POISONED_FORK: Tone.BAD,
    Verdict.INITIALIZES_CUDA: Tone.BAD,
    Verdict.CLEAN: Tone.GOOD,
    Verdict.UNKNOWN: Tone.UNKNOWN,
}


class ScanStatus(Label):
    """How a scan's subkernel ended."""

    OK = "ok"
    IMPORT_ERROR = "import-error"
    CRASHED = "crashed"
    TIMEOUT = "timeout"
    EXITED = "exited"
    CHANNEL_LOST = "channel-lost"
    ERROR = "error"  # the scan itself could not run (diagtools' own error): no subkernel ended


class Evidence(Label):
    """How the moment CUDA got initialized was caught (the renderers say it in words)."""

    DRIVER_HOOK = "driver-hook"  # the driver called back during cuInit
    INFERRED = "driver-hook-inferred"  # the simulated driver inferred a cuInit from a runtime's export-table request
    TRACE = "trace"  # a line-traced rerun
    STATE_PROBE = "state-probe"  # the driver's state changed between two observations


def combine(verdicts: Iterable[Verdict]) -> Verdict:
    """One verdict for several runs: a poisoned fork wins, then any initialization, then any doubt;
    ``clean`` only when all are.

    No runs at all is ``unknown``: nothing was seen.
    """
    seen = set(verdicts)
    for decisive in (Verdict.POISONED_FORK, Verdict.INITIALIZES_CUDA):
        if decisive in seen:
            return decisive
    if not seen or Verdict.UNKNOWN in seen:
        return Verdict.UNKNOWN
    return Verdict.CLEAN
