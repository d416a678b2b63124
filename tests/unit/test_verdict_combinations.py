"""How verdicts combine for sweeps and comparisons: any initialization wins, then any doubt."""

from __future__ import annotations

import pytest

from diagtools.model.scan import DriverInfo, ScanResult
from diagtools.model.sweep import SweepResult, SweepRow
from diagtools.model.verdict import ScanStatus, Verdict, combine


@pytest.mark.parametrize(
    ("verdicts", "expected"),
    [
        ((), Verdict.UNKNOWN),
        ((Verdict.CLEAN, Verdict.CLEAN), Verdict.CLEAN),
        ((Verdict.CLEAN, Verdict.UNKNOWN), Verdict.UNKNOWN),
        ((Verdict.UNKNOWN, Verdict.INITIALIZES_CUDA, Verdict.CLEAN), Verdict.INITIALIZES_CUDA),
    ],
)
def test_combine(verdicts, expected):
    assert combine(verdicts) == expected


def scan_result(status: str, initialized: bool, gaps: tuple[str, ...] = ()) -> ScanResult:
    return ScanResult(("pkg",), status, DriverInfo("simulated", "simulated"), initialized, simulation_gaps=gaps)


def test_scan_verdict_rules():
    assert scan_result("ok", False).verdict == Verdict.CLEAN
    assert scan_result("ok", True).verdict == Verdict.INITIALIZES_CUDA
    assert scan_result("timeout", False).verdict == Verdict.UNKNOWN
    assert scan_result("channel-lost", False).verdict == Verdict.UNKNOWN
    assert scan_result("ok", False, ("cuGetExportTable refused",)).verdict == Verdict.UNKNOWN
    with pytest.raises(ValueError, match="'fine'"):
        scan_result("fine", False)


def test_sweep_verdict_is_clean_only_when_every_row_was_seen_clean():
    rows = [
        SweepRow.from_scan("pkg.a", scan_result("ok", False), 0.0, 1.0),
        SweepRow.from_scan("pkg.b", scan_result("crashed", False), 0.0, 1.0),
    ]
    assert SweepResult("pkg", tuple(rows[:1])).verdict == Verdict.CLEAN
    assert SweepResult("pkg", tuple(rows)).verdict == Verdict.UNKNOWN
    assert SweepRow.from_json(rows[1].to_json()).verdict == Verdict.UNKNOWN
    assert ScanStatus("crashed") is ScanStatus.CRASHED
