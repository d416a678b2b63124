"""No lost result: the channel survives a hostile target, or the result says it was lost."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

import diagtools
from diagtools import protocol
from diagtools.runner import events
from tests.conftest import CHANNEL_FLOOD, cli

GPU = "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n"


def test_closing_every_low_descriptor_keeps_the_channel(sim_scan, make_tree):
    root = make_tree({"closes.py": "import os\nos.closerange(3, 1024)\n" + GPU})
    result = sim_scan("closes", path=[root])
    assert result.status == "ok", result.error
    assert result.culprit.module == "closes"


def test_dup2_over_every_low_descriptor_keeps_the_channel(sim_scan, make_tree):
    root = make_tree(
        {
            "clobbers.py": "import os\nnull = os.open(os.devnull, os.O_WRONLY)\n"
            "for fd in range(3, 1024):\n"
            "    if fd != null:\n"
            "        os.dup2(null, fd)\n" + GPU
        }
    )
    result = sim_scan("clobbers", path=[root])
    assert result.status == "ok", result.error
    assert result.culprit.module == "clobbers"


CLOSE_ALL = """
import os
for name in os.listdir("/proc/self/fd"):
    if int(name) > 2:
        try:
            os.close(int(name))
        except OSError:
            pass
"""


def test_a_channel_closed_anyway_is_channel_lost_never_clean(sim_scan, make_tree):
    root = make_tree({"closes_all.py": CLOSE_ALL + GPU})
    result = sim_scan("closes_all", path=[root])
    assert result.status == "channel-lost"
    assert not result.ok
    assert result.error.kind == "channel-lost"
    assert "unknown" in str(result)


def test_a_channel_replaced_by_another_file_is_channel_lost(sim_scan, make_tree, tmp_path):
    sink = tmp_path / "sink"
    root = make_tree(
        {
            "replaces.py": f"import os\nfd = os.open({str(sink)!r}, os.O_WRONLY | os.O_CREAT)\n"
            f"os.dup2(fd, int(os.environ[{protocol.CHANNEL_FD!r}]))\n"
        }
    )
    result = sim_scan("replaces", path=[root])
    assert result.status == "channel-lost"


def test_the_cli_says_channel_lost_and_exits_3(make_tree):
    root = make_tree({"closes_all.py": CLOSE_ALL})
    done = cli("scan", "closes_all", "--path", str(root), "--driver", "simulated", "--timeout", "60")
    assert done.returncode == 3, done.stderr
    assert "status: channel-lost" in done.stdout
    assert "CUDA initialized: unknown" in done.stdout


def test_200_megabytes_of_stdout_is_not_a_timeout(sim_scan, make_tree):
    flood = "import sys\nchunk = b'x' * (1 << 20)\nfor _ in range(200):\n    sys.stdout.buffer.write(chunk)\n"
    root = make_tree({"floods.py": flood})
    result = sim_scan("floods", path=[root], timeout=20)
    assert result.status == "ok", result.error
    assert "truncated: 209715200 bytes" in result.stdout


def test_a_target_that_prints_forever_still_times_out(sim_scan, make_tree):
    root = make_tree({"prints.py": "import sys\nwhile True:\n    sys.stdout.write('y' * 65536)\n"})
    result = sim_scan("prints", path=[root], timeout=2)
    assert result.status == "timeout"
    assert result.duration_s < 15


HOSTILE_LINES = [
    b'{"e":"begin","n":["list"],"t":1.0,"th":1,"ph":"import"}',
    b'{"e":"begin","n":"pkg","t":"soon","th":1}',
    b'{"e":"begin","n":"pkg","t":1.0,"th":{"a":1}}',
    b'{"e":"end","n":"pkg","ok":"yes","t":NaN}',
    b'{"e":"cuinit","m":"pkg","stack":[["f",1]],"th":1,"ph":"import"}',
    b'{"e":"final","initialized":"no"}',
    b"\xff\xfe not json",
    b"[1, 2, 3]",
]


def test_hostile_event_lines_are_skipped_and_counted(sim_scan, make_tree):
    payload = b"".join(line + b"\n" for line in HOSTILE_LINES)
    root = make_tree(
        {
            "forges.py": f"import os\nos.write(int(os.environ[{protocol.CHANNEL_FD!r}]), {payload!r})\n" + GPU,
        }
    )
    result = sim_scan("forges", path=[root])
    assert result.status == "ok", result.error
    assert result.skipped_events == len(HOSTILE_LINES)
    assert result.to_json()["skipped_events"] == len(HOSTILE_LINES)
    assert f"{len(HOSTILE_LINES)} malformed event line(s)" in str(result)
    assert result.culprit.module == "forges"


def test_the_decoder_checks_every_field_type():
    decoded = events.decode_events(b"".join(line + b"\n" for line in HOSTILE_LINES))
    assert decoded.events == []
    assert decoded.skipped == len(HOSTILE_LINES)


class BreaksOne(ThreadPoolExecutor):
    """An executor on which one module's scan raises, as a bug or a lost worker would."""

    def submit(self, fn, /, *args, **kwargs):
        if args and args[0] == "sweeppkg.bad":
            return super().submit(_raise)
        return super().submit(fn, *args, **kwargs)


def _raise():
    raise RuntimeError("worker lost")


def test_one_failing_module_does_not_stop_a_sweep(make_tree):
    root = make_tree({"sweeppkg/__init__.py": "", "sweeppkg/bad.py": "X = 1\n", "sweeppkg/good.py": GPU})
    with BreaksOne(max_workers=2) as pool:
        result = diagtools.sweep("sweeppkg", path=[root], driver="simulated", timeout=60, executor=pool, fresh=True)
    assert result.row("sweeppkg.bad").status == "error"
    assert "worker lost" in result.row("sweeppkg.bad").error
    assert result.row("sweeppkg.good").cuda_initialized
    json.dumps(result.to_json())


def test_a_flooded_channel_is_bounded_and_channel_lost(sim_scan, make_tree):
    root = make_tree({"floods_channel.py": CHANNEL_FLOOD})
    result = sim_scan("floods_channel", path=[root])
    assert result.status == "channel-lost"
    assert result.skipped_events >= 20 * 1024  # the junk, and the events that came after it


class LosesChunks(ThreadPoolExecutor):
    """An executor whose zygote tasks all fail, as lost workers would."""

    def submit(self, fn, /, *args, **kwargs):
        return super().submit(_raise)


def test_a_lost_zygote_chunk_becomes_error_rows(make_tree):
    root = make_tree({"sweeppkg/__init__.py": "", "sweeppkg/bad.py": "X = 1\n", "sweeppkg/good.py": GPU})
    with LosesChunks(max_workers=2) as pool:
        result = diagtools.sweep("sweeppkg", path=[root], driver="simulated", timeout=60, executor=pool)
    assert {row.status for row in result.rows} == {"error"}
    assert result.verdict == "unknown"


def _clobbers_high(data, then: str) -> str:
    """A module that puts its own data file on descriptors 2048-2100 (where the runner's files live), then ``then``."""
    return (
        f"import os\nfd = os.open({str(data)!r}, os.O_RDWR)\n"
        "for number in range(2048, 2101):\n"
        "    if number != fd:\n"
        "        os.dup2(fd, number)\n" + then
    )


CRASH = "import ctypes\nctypes.string_at(0)\n"
HANG = "import time\ntime.sleep(600)\n"


@pytest.mark.parametrize("then", [CRASH, HANG], ids=["crash", "hang"])
def test_a_target_on_the_runners_descriptors_gets_no_dump_in_its_own_file(sim_scan, make_tree, tmp_path, then):
    data = tmp_path / "data.bin"
    data.write_bytes(b"the user's bytes\n")
    root = make_tree({"clobbers_high.py": _clobbers_high(data, then)})
    result = sim_scan("clobbers_high", path=[root], timeout=5 if then == HANG else 60)
    assert data.read_bytes() == b"the user's bytes\n"
    assert result.status in ("crashed", "timeout", "channel-lost"), result.status
    assert result.verdict == "unknown"
    if then == CRASH:
        assert "clobbers_high.py" in result.error.traceback  # the dump reached the runner through its spare descriptor


@pytest.mark.parametrize("fresh", [False, True], ids=["zygote", "fresh"])
def test_a_sweep_child_on_the_runners_descriptors_gets_no_dump_in_its_own_file(make_tree, tmp_path, fresh):
    data = tmp_path / "data.bin"
    data.write_bytes(b"the user's bytes\n")
    root = make_tree({"swc/__init__.py": "", "swc/crashes.py": _clobbers_high(data, CRASH)})
    swept = diagtools.sweep("swc", path=[root], driver="simulated", jobs=1, fresh=fresh)
    assert data.read_bytes() == b"the user's bytes\n"
    assert {row.module: row.status for row in swept.rows}["swc.crashes"] != "ok"
