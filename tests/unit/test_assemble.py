"""Events to results: culprit choice, chains, times and statuses, without a process."""

from __future__ import annotations

import signal

from diagtools.model.scan import DriverInfo
from diagtools.runner.subkernel import CapturedOutput, RawRun
from diagtools.usecases.assemble import assemble, pick_site
from diagtools.usecases.scan import SCAN_PROBE as PROBE_FILE

DRIVER = DriverInfo("simulated", "simulated")
EMPTY = CapturedOutput("", 0)


def raw(events, returncode=0, timed_out=False, dump=""):
    return RawRun(tuple(events), returncode, timed_out, EMPTY, EMPTY, dump, 1.0, "m")


def tree_events(*, done=True):
    events = [
        {"e": "hello", "t": 0.0, "main_thread": 1, "python": "3.11.7 (main)", "library": "/lib/libcuda.so.1"},
        {"e": "phase", "t": 0.0, "phase": "startup"},
        {"e": "phase", "t": 0.1, "phase": "import"},
        {"e": "begin", "t": 1.0, "n": "a", "p": None, "f": "/a.py", "th": 1, "ph": "import"},
        {"e": "begin", "t": 1.5, "n": "a.b", "p": "a", "f": "/a/b.py", "th": 1, "ph": "import"},
        {
            "e": "cuinit",
            "t": 1.7,
            "m": "a.b",
            "th": 1,
            "ph": "import",
            "stack": [[str(PROBE_FILE), 10, "_traced_load"], ["/a/b.py", 3, "f"], ["/a.py", 1, "<module>"]],
        },
        {"e": "transition", "t": 1.8, "m": "a.b", "th": 1, "ph": "import", "at": "end"},
        {"e": "end", "t": 2.0, "n": "a.b", "ok": True},
        {"e": "end", "t": 3.0, "n": "a", "ok": True},
    ]
    if done:
        events += [{"e": "final", "t": 3.1, "initialized": True, "torch": None}, {"e": "done", "t": 3.2}]
    return events


def test_hook_event_wins_and_chain_and_times_follow_the_tree():
    result = assemble(raw(tree_events()), ["a"], DRIVER)
    assert result.status == "ok"
    assert result.culprit.evidence == "driver-hook"
    assert result.culprit.chain == ("a", "a.b")
    assert result.culprit.site.file == "/a/b.py"
    assert [f.file for f in result.culprit.stack] == ["/a.py", "/a/b.py"]
    assert result.module("a").cumulative_s == 2.0
    assert result.module("a").self_s == 1.5
    assert result.module("a.b").initializes_cuda
    assert not result.module("a").initializes_cuda
    assert result.python == "3.11.7"
    assert result.driver.library == "/lib/libcuda.so.1"


def test_state_probe_alone_gives_module_without_site():
    events = [e for e in tree_events() if e["e"] != "cuinit"]
    result = assemble(raw(events), ["a"], DRIVER)
    assert result.culprit.evidence == "state-probe"
    assert result.culprit.module == "a.b"
    assert result.culprit.site is None


def test_pick_site_skips_importlib_and_probe_frames():
    frames = [
        ["<frozen importlib._bootstrap>", 241, "_call_with_frames_removed"],
        [str(PROBE_FILE), 99, "_traced_load"],
        ["/user/mod.py", 7, "<module>"],
    ]
    assert pick_site(frames).file == "/user/mod.py"
    assert pick_site(frames[:2]) is None


def test_unfinished_run_keeps_the_tree_and_is_exited():
    result = assemble(raw(tree_events(done=False)[:5], returncode=0), ["a"], DRIVER)
    assert result.status == "exited"
    assert result.error.exitcode == 0
    assert not result.module("a").complete
    assert result.module_names() == ("a", "a.b")


def test_signal_is_crashed_with_where_from_the_fault_dump():
    dump = (
        "Fatal Python error: Segmentation fault\n\nCurrent thread 0x01 (most recent call first):\n"
        f'  File "{PROBE_FILE}", line 5 in _traced_load\n'
        '  File "/user/crash.py", line 2 in <module>\n'
    )
    result = assemble(raw(tree_events(done=False), returncode=-signal.SIGSEGV, dump=dump), ["a"], DRIVER)
    assert result.status == "crashed"
    assert result.error.signal == signal.SIGSEGV
    assert result.error.where == "/user/crash.py:2 in <module>"
    assert result.culprit.module == "a.b"


def test_timeout_wins_over_the_kill_signal():
    result = assemble(raw(tree_events(done=False), returncode=-9, timed_out=True), ["a"], DRIVER)
    assert result.status == "timeout"


def test_import_error_event_gives_file_and_line():
    events = tree_events()
    events.insert(
        -2,
        {
            "e": "error",
            "t": 3.0,
            "target": "a",
            "type": "ValueError",
            "msg": "ValueError: x",
            "tb": [["/probe", 1, "main"], ["/a.py", 4, "<module>"]],
            "file": None,
            "line": None,
        },
    )
    result = assemble(raw(events), ["a"], DRIVER)
    assert result.status == "import-error"
    assert result.error.message == "a: ValueError: x"
    assert (result.error.file, result.error.line) == ("/a.py", 4)


def test_torn_and_foreign_events_are_ignored():
    events = [{"no": "kind"}, *tree_events()]
    assert assemble(raw(events), ["a"], DRIVER).status == "ok"
