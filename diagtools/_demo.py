"""The main job: scan every built-in specimen, before and after its fix, and write a report."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from diagtools._model import ScanResult
from diagtools._render_text import render_scan
from diagtools._scan import scan
from diagtools.specimens import Specimen, all_specimens

__all__ = ["DemoReport", "SpecimenOutcome", "write_demo_report"]


@dataclass(frozen=True)
class SpecimenOutcome:
    """One specimen variant's scan and whether it matched the specimen's story."""

    specimen: Specimen
    variant: str
    result: ScanResult

    @property
    def as_expected(self) -> bool:
        if not self.result.ok:
            return False
        if self.variant == "after" or self.specimen.culprit is None:
            return not self.result.cuda_initialized
        culprit = self.result.culprit
        return (
            culprit is not None
            and culprit.module == self.specimen.culprit
            and culprit.site is not None
            and self.specimen.site_text in culprit.site.source
        )

    def verdict(self) -> str:
        if not self.result.cuda_initialized:
            return "clean: CUDA not initialized"
        culprit = self.result.culprit
        where = f" at {culprit.site.file}:{culprit.site.line}" if culprit and culprit.site else ""
        return f"initializes CUDA: {culprit.module if culprit else '?'}{where}"


@dataclass(frozen=True)
class DemoReport:
    """Where the report went and what it found."""

    index: Path
    outcomes: tuple[SpecimenOutcome, ...]

    @property
    def as_expected(self) -> bool:
        return all(outcome.as_expected for outcome in self.outcomes)

    @property
    def summary(self) -> str:
        lines = [f"driver: {self.outcomes[0].result.driver.describe()}" if self.outcomes else "no specimens"]
        for outcome in self.outcomes:
            mark = "ok " if outcome.as_expected else "UNEXPECTED"
            lines.append(f"  [{mark}] {outcome.specimen.name}/{outcome.variant}: {outcome.verdict()}")
        return "\n".join(lines)


def _markdown(report_outcomes: tuple[SpecimenOutcome, ...]) -> str:
    lines = ["# diagtools: built-in specimens", ""]
    if report_outcomes:
        lines += [f"Driver: {report_outcomes[0].result.driver.describe()}", ""]
    for outcome in report_outcomes:
        specimen = outcome.specimen
        lines += [f"## {specimen.title} ({outcome.variant}/)", "", specimen.story, ""]
        if outcome.variant == "after":
            lines += [f"Fix: {specimen.fix}.", ""]
        lines += ["```text", render_scan(outcome.result, stack=True), "```", ""]
    return "\n".join(lines)


def write_demo_report(out: Path, *, driver: str = "auto") -> DemoReport:
    """Scan each specimen variant in its own subkernel and write Markdown and JSON."""
    outcomes = tuple(
        SpecimenOutcome(specimen, variant, scan(specimen.target, path=[specimen.tree(variant)], driver=driver))
        for specimen in all_specimens()
        for variant in specimen.variants
    )
    out.mkdir(parents=True, exist_ok=True)
    scans = {f"{o.specimen.name}/{o.variant}": o.result.to_json() for o in outcomes}
    (out / "specimens.json").write_text(json.dumps(scans, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    index = out / "specimens.md"
    index.write_text(_markdown(outcomes), encoding="utf-8")
    return DemoReport(index, outcomes)
