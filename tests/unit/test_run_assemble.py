"""Run records to findings and verdicts: pure, no process."""

from __future__ import annotations

import dataclasses

import pytest

from diagtools.errors import SchemaError
from diagtools.model.run import RunResult
from diagtools.model.scan import DriverInfo
from diagtools.render.run_html import run_html
from diagtools.render.run_text import render_run
from diagtools.runner.watch import RunRecords
from diagtools.usecases.run_assemble import RunOutcome, assemble_run, looks_like_python

DRIVER = DriverInfo("simulated", "simulated", "/x/libcuda.so.1")
APP = ["python", "app.py"]
CUINIT_STACK = [["/src/registry.py", 5, "_detect"], ["/src/registry.py", 7, "<module>"], ["/src/app.py", 2, "<module>"]]
FORK_STACK = [["/lib/popen_fork.py", 66, "_launch"], ["/src/app.py", 9, "<module>"]]


def hello(pid, parent, via="exec", **extra):
    return {"e": "hello", "pid": pid, "parent": parent, "via": via, "argv": APP, "python": "3.11", "main_thread": 1,
            "t": float(pid), **extra}  # fmt: skip


def cuinit():
    return {
        "e": "cuinit",
        "m": "registry",
        "chain": [["__main__", "/src/app.py"], ["registry", "/src/registry.py"]],
        "stack": CUINIT_STACK,
        "th": 1,
        "ph": "import",
        "t": 1.0,
    }


def fork(seq, initialized=True):
    return {"e": "start", "kind": "fork", "seq": seq, "child": None, "stack": FORK_STACK, "t": 2.0,
            "driver_initialized": initialized}  # fmt: skip


def assemble(*files, pid=10, command=APP, notes=()):
    return assemble_run(RunRecords(tuple(map(tuple, files))), command, DRIVER, RunOutcome(pid, 0, notes=notes))


def test_fork_after_cuinit_is_a_poisoned_fork_with_the_childs_refusal():
    parent = [hello(10, 1), cuinit(), fork(1)]
    child = [
        hello(11, 10, "fork", fork_seq=1),
        {"e": "refusal", "call": "cuInit", "code": 3, "stack": [["/src/app.py", 5, "work"]], "t": 3.0},
        {"e": "ended", "how": "os._exit", "exitcode": 1, "t": 4.0},
    ]
    result = assemble(parent, child)
    assert result.verdict == "poisoned-fork"
    (finding,) = result.findings
    assert (finding.kind, finding.pid, finding.child) == ("poisoned-fork", 10, 11)
    assert finding.cuinit.module == "registry"
    assert finding.cuinit.stack[0].file == "/src/app.py"  # outermost first
    assert finding.fork_site.file == "/lib/popen_fork.py"
    assert finding.child_saw.exitcode == 1
    assert finding.child_saw.refused[0].describe() == "cuInit at /src/app.py:5 answered CUDA_ERROR_NOT_INITIALIZED (3)"
    assert "app.py:9 <module>" in render_run(result)
    assert RunResult.from_json(result.to_json()) == result


def test_fork_before_cuinit_or_followed_by_exec_is_not_poisoned():
    before = assemble([hello(10, 1), fork(1, initialized=False), cuinit()], [hello(11, 10, "fork", fork_seq=1)])
    assert before.verdict == "initializes-cuda"
    assert [f.kind for f in before.findings] == ["cuda-initialized"]
    execed = assemble(
        [hello(10, 1), cuinit(), fork(1)],
        [hello(11, 10, "fork", fork_seq=1), {"e": "exec", "argv": ["/bin/true"], "t": 3}],
    )
    assert execed.verdict == "initializes-cuda"


def test_a_python_child_that_never_reported_makes_the_verdict_unknown():
    spawn = {"e": "start", "kind": "spawn", "seq": None, "child": 12, "argv": ["/usr/bin/python3", "-c", "x"],
             "stack": FORK_STACK, "driver_initialized": False, "t": 2.0}  # fmt: skip
    result = assemble([hello(10, 1), spawn])
    assert result.verdict == "unknown"
    assert "pid 12" in result.notes[0]
    assert assemble([], command=["python3", "-I", "x.py"]).verdict == "unknown"
    assert assemble([], command=["sh", "-c", "true"]).verdict == "clean"


def test_a_resource_tracker_ended_before_it_reported_leaves_the_verdict_alone():
    # the keeper ends multiprocessing's own helper with the tree; on a loaded machine that can come
    # before its interpreter reached the agent, and it runs no code of the program's
    tracker = ["/usr/bin/python3", "-B", "-c", "from multiprocessing.resource_tracker import main;main(5)"]
    start = {"e": "start", "kind": "subprocess", "seq": None, "child": 12, "argv": tracker,
             "stack": FORK_STACK, "driver_initialized": False, "t": 2.0}  # fmt: skip
    result = assemble([hello(10, 1), start])
    assert result.verdict == "clean", result.notes
    assert not result.notes
    other = {**start, "argv": ["/usr/bin/python3", "-B", "-c", "import resource_tracker_lookalike"]}
    assert assemble([hello(10, 1), other]).verdict == "unknown"


def test_torn_and_foreign_lines_are_dropped(tmp_path):
    from diagtools.runner.watch import read_records

    good = b'{"e":"hello","pid":10,"parent":1,"python":"3.11"}\n'
    forged = b'{"e":"hello","pid":"10","python":"3.11"}\n{"e":"start","kind":"fork"}\n'
    (tmp_path / "10-1.jsonl").write_bytes(good + b"not json\n" + forged + b'{"e":"cuinit","mod')
    records = read_records(tmp_path)
    assert records.files == (({"e": "hello", "pid": 10, "parent": 1, "python": "3.11"},),)
    assert records.skipped == 4


def test_schema_is_checked_and_html_is_escaped():
    with pytest.raises(SchemaError):
        RunResult.from_json({"schema": "diagtools.scan/1"})
    result = assemble([hello(10, 1)], command=["python", "<b>.py"])
    assert "&lt;b&gt;.py" in run_html(result)
    assert looks_like_python(["/usr/bin/python3.11"])
    assert not looks_like_python(["bash"])


def test_the_watch_summary_and_the_report_are_terminal_safe():
    from diagtools.render.run_text import render_watch

    evil = [["/src/\x1b[2Jevil\u202e.py", 3, "f\x07"], ["/src/app.py", 2, "<module>"]]
    event = {**cuinit(), "stack": evil, "context": "tests/test_x.py::test_\x1b]0;t\x07"}
    result = assemble([hello(10, 1), event, fork(1)], [hello(11, 10, "fork", fork_seq=1)], command=["a\x1b[31m"])
    for text in (render_watch(result), render_run(result)):
        assert not any(raw in text for raw in ("\x1b", "\x07", "\u202e")), text
        assert "\\x1b" in text


def test_identical_findings_are_grouped_with_compact_pids():
    from diagtools.render.run_text import compact_pids

    parent = [hello(10, 1), cuinit(), *(fork(seq) for seq in range(1, 7))]
    pids = (101, 102, 103, 105, 106, 109)
    children = [[hello(pid, 10, "fork", fork_seq=seq)] for seq, pid in enumerate(pids, start=1)]
    text = render_run(assemble(parent, *children))
    assert "poisoned fork x6: pid 10 started children 101-103, 105-106, 109 (fork)" in text
    assert text.count("finding") == 1
    assert compact_pids(range(1, 40, 2), limit=3) == "1, 3, 5, … (17 more)"


def test_a_run_documents_verdict_is_judged_again_when_read_back_never_trusted():
    """One rule in one place: an edited verdict does not survive reading; neither does a note added later."""
    result = assemble([hello(10, 1), cuinit(), fork(1)], [hello(11, 10, "fork", fork_seq=1)])
    assert result.verdict == "poisoned-fork"
    document = result.to_json()
    document["verdict"] = "clean"
    assert RunResult.from_json(document).verdict == "poisoned-fork"
    document["verdict"] = "maybe"
    with pytest.raises(SchemaError, match="verdict"):
        RunResult.from_json(document)
    quiet = assemble([hello(10, 1), cuinit()])
    assert quiet.verdict == "initializes-cuda"
    seen_less = dataclasses.replace(quiet, notes=("a python child never reported",))
    assert seen_less.verdict == "unknown"


def test_a_runs_lines_are_wrapped_at_the_width_they_are_shown_at(tmp_path, monkeypatch):
    """A path under the working directory is shown relative to it; whether its line fits 100 columns is judged on
    what is shown, so a checkout's depth never changes the report."""
    deep = tmp_path / ("d" * 70)
    deep.mkdir()
    (deep / "app.py").write_text("import os\nimport registry\n")
    (deep / "registry.py").write_text("import ctypes\n\n\n\ndef _detect(): ...\n\n_detect()\n")
    monkeypatch.chdir(deep)
    stack = [[str(deep / "registry.py"), 5, "_detect"], [str(deep / "registry.py"), 7, "<module>"],
             [str(deep / "app.py"), 2, "<module>"]]  # fmt: skip
    chain = [["__main__", str(deep / "app.py")], ["registry", str(deep / "registry.py")]]
    event = {**cuinit(), "stack": stack, "chain": chain}
    text = render_run(assemble([hello(10, 1), event, fork(1)], [hello(11, 10, "fork", fork_seq=1)]))
    assert "        __main__ -> registry: app.py:2  import registry" in text.splitlines(), text
    assert str(deep) not in text
