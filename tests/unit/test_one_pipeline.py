"""One pipeline: the scan and ``diagtools run`` share the attribution rule, the culprit type, the verdict
enum, the protocol and the JSON mapping; none of them is copied."""

from __future__ import annotations

import dataclasses
import typing

from diagtools import protocol
from diagtools.agents.run_hook import AGENT_FILE
from diagtools.model import bisect, cuts, diff, fix, replay, run, scan, sweep
from diagtools.model.serial import Serial
from diagtools.model.verdict import Verdict
from diagtools.usecases import assemble, attribution, run_assemble

MODELS = (scan, run, replay, bisect, sweep, diff, cuts, fix)


def test_both_assemblies_use_the_one_attribution_function():
    assert assemble.attribute is attribution.attribute
    assert run_assemble.attribute is attribution.attribute


def test_a_run_cuinit_is_a_scan_culprit_and_the_verdict_is_the_one_enum():
    assert not hasattr(run, "CudaInit")
    hints = typing.get_type_hints(run.ProcessRecord)
    assert hints["cuinit"] == scan.Culprit | None
    assert typing.get_type_hints(run.Finding)["cuinit"] == scan.Culprit | None
    assert typing.get_type_hints(run.RunResult)["verdict"] is Verdict
    assert Verdict("poisoned-fork") is Verdict.POISONED_FORK


def test_no_result_type_writes_its_own_json_pair():
    for module in MODELS:
        for value in vars(module).values():
            if isinstance(value, type) and dataclasses.is_dataclass(value) and value.__module__ == module.__name__:
                assert issubclass(value, Serial), value
                assert not set(vars(value)) & {"to_json", "from_json"}, value


def test_the_run_agent_speaks_the_protocols_names_and_events():
    source = AGENT_FILE.read_text()
    for name in ("RUN_DIR", "RUN_CUPROBE", "RUN_CUPROBE_FOR", "open_high", "Channel("):
        assert f"protocol.{name}" in source, name
    assert '"DIAGTOOLS_' not in source  # every environment name comes from the protocol
    emitted = {"hello", "cuinit", "transition", "start", "fork-child", "refusal", "raised", "exec", "ended", "waited"}
    assert emitted <= set(protocol.EVENTS)
    for kind in emitted:
        assert f'"{kind}"' in source, kind


def test_json_documents_and_lines_come_from_the_derived_serializer():
    """No use case or front end writes JSON by hand: documents through ``json_text``, lines through ``json_line``."""
    from pathlib import Path

    import diagtools

    root = Path(diagtools.__file__).parent
    for folder in ("usecases", "frontends", "render", "runner", "bench"):
        for source in sorted((root / folder).glob("*.py")):
            text = source.read_text(encoding="utf-8")
            hand_written = [line for line in text.splitlines() if "json.dumps(" in line and "payload" not in line]
            assert not hand_written, (source.name, hand_written)
