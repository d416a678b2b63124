"""The sweep's JUnit XML stays well-formed whatever a module's name or error holds."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from diagtools.model.scan import Culprit, Site
from diagtools.model.sweep import SweepResult, SweepRow
from diagtools.render.junit import outcome, sweep_junit


def row(module: str, **fields) -> SweepRow:
    return SweepRow(module=module, status=fields.pop("status", "ok"), cuda_initialized=False, culprit=None,
                    import_s=0.01, **fields)  # fmt: skip


def test_hostile_text_is_escaped_and_every_outcome_counted():
    site = Site("/src/pkg/gpu.py", 3, "<module>", "cuInit(0) # \x1b[31m</failure>")
    culprit = Culprit(module="pkg.gpu", chain=("pkg.gpu",), stack=(site,), phase="import", site=site)
    rows = (
        row("pkg.clean"),
        row("pkg.broken", status="import-error", error="ValueError: \x00\x07 <&> ]]> \ud800"),
        row("pkg.pre", preloaded=True),
        SweepRow("pkg.gpu", "ok", True, culprit, 0.02),
    )
    text = sweep_junit(SweepResult("pkg", rows, seconds=1.5))
    root = ET.fromstring(text.encode("utf-8"))  # well-formed: no raw control character, no broken markup
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == (
        "4",
        "1",
        "1",
        "1",
    )
    cases = {case.get("name"): case for case in suite}
    assert cases["pkg.broken"].find("error").get("message").startswith("import-error: ValueError: \\x00\\x07 <&> ]]>")
    assert "</failure>" in cases["pkg.gpu"].find("failure").text  # the source line, as text
    assert [outcome(r) for r in rows] == ["passed", "error", "skipped", "failure"]
