"""The run agent inside this very process: ``pytest --cuda-watch``.

The agent is loaded from its file under the same module name the
``sitecustomize`` uses, so a process never holds two agents; when pytest runs
under ``diagtools run`` already, the watch shares that agent's records.
:func:`watch_result` assembles what this process and the processes forked
from it recorded, by the same rules as ``diagtools run``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from diagtools import protocol
from diagtools.agents.run_hook import AGENT_FILE
from diagtools.driver import build_probe_extension
from diagtools.errors import DiagtoolsError
from diagtools.model.run import RunResult
from diagtools.model.scan import DriverInfo
from diagtools.runner.watch import RunRecords, read_records
from diagtools.usecases.run_assemble import RunOutcome, assemble_run

__all__ = ["agent_cuprobe", "load_agent", "watch_result"]


def agent_cuprobe() -> str | None:
    """The driver-state extension for this interpreter; without it the driver's hook alone decides."""
    try:
        return str(build_probe_extension())
    except DiagtoolsError:
        return None


def load_agent(directory: str, context: str | None = None) -> Any:
    """The agent of this very process, recording into ``directory`` unless one already records.

    ``context`` names what ran before (``pytest start-up: conftest.py``): a cuInit
    the agent finds already done when it loads is attributed to it.
    """
    module = sys.modules.get(protocol.RUN_AGENT_MODULE)
    if module is None:
        sys.modules.setdefault(protocol.PROTOCOL_MODULE, protocol)  # the agent's name for the protocol module
        try:
            module = protocol.load_source(protocol.RUN_AGENT_MODULE, str(AGENT_FILE), register=True)
        except OSError as exc:
            raise DiagtoolsError(f"cannot load the run agent from {AGENT_FILE}: {exc}") from None
    agent = module.install(directory, agent_cuprobe(), context)
    if not agent.directory:
        agent.directory = directory
        agent.open()
        agent.hello("exec")
        agent.context = context
        agent.check_state("startup")
        agent.context = None
    agent.startup_done()
    return agent


def _lineage(records: RunRecords, pid: int) -> RunRecords:
    """The files of ``pid`` and of the processes forked from it, directly or not."""
    pids = {pid}
    kept = []
    for events in sorted(records.files, key=lambda events: float(events[0].get("t", 0.0))):
        hello = next((event for event in events if event["e"] == "hello"), None)
        if hello is None:
            continue
        forked_from_ours = hello.get("via") == "fork" and hello.get("parent") in pids
        if (hello["pid"] == pid and hello.get("via") == "exec") or forked_from_ours:
            pids.add(hello["pid"])
            kept.append(events)
    return RunRecords(tuple(kept), records.skipped, tuple(lost for lost in records.lost if lost in pids))


def _watch_driver(agent_state: int | None) -> DriverInfo:
    kind = os.environ.get(protocol.DRIVER_KIND, "")
    if kind not in ("real", "simulated", "none"):
        kind = "none" if agent_state in (None, protocol.NO_DRIVER) else "real"
    return DriverInfo(kind, "inherited")


def watch_result(directory: str, pid: int, argv: Sequence[str], driver_state: int | None = None) -> RunResult:
    """What the agent recorded in process ``pid`` and its forked children, as a run result."""
    records = _lineage(read_records(directory), pid)
    return assemble_run(records, argv, _watch_driver(driver_state), RunOutcome(pid=None, exitcode=0))
