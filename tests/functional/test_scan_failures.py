"""Every way a target can fail still yields a result, a clear status and no orphans."""

from __future__ import annotations

import signal

import pytest

from tests.conftest import MARK, marked_line

RECORD_FIRST = "import json, decimal\n"


def test_missing_module_is_an_import_error(sim_scan, make_tree):
    root = make_tree({"present.py": "X = 1\n"})
    result = sim_scan(["present", "absent_module_xyz"], path=[root])
    assert result.status == "import-error"
    assert "ModuleNotFoundError" in result.error.message
    assert "absent_module_xyz" in result.error.message
    assert "\n" not in result.error.message
    assert "present" in result.module_names()


def test_syntax_error_deep_in_the_tree_names_file_and_line(sim_scan, make_tree):
    root = make_tree({"deep/__init__.py": "from . import inner\n", "deep/inner.py": "X = 1\ndef broken(:\n"})
    result = sim_scan("deep", path=[root])
    assert result.status == "import-error"
    assert result.error.file == str(root / "deep/inner.py")
    assert result.error.line == 2
    assert "SyntaxError" in result.error.message


def test_exception_at_import_keeps_traceback_and_tree(sim_scan, make_tree):
    root = make_tree(
        {
            "boom/__init__.py": "import json\nfrom . import first\nfrom . import second\n",
            "boom/first.py": "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n",
            "boom/second.py": f"raise RuntimeError('config missing')  {MARK}\n",
        }
    )
    result = sim_scan("boom", path=[root])
    assert result.status == "import-error"
    assert result.error.message == "boom: RuntimeError: config missing"
    assert result.error.file == str(root / "boom/second.py")
    assert result.error.line == marked_line(root / "boom/second.py")
    assert 'boom/second.py", line 1, in <module>' in result.error.traceback
    assert {"boom", "boom.first", "boom.second", "json"} <= set(result.module_names())
    assert result.module("boom.first").complete
    assert not result.module("boom.second").complete  # it raised: the tree keeps it, marked unfinished
    assert result.culprit.module == "boom.first"


def test_segfault_is_crashed_with_the_signal_and_keeps_results(sim_scan, make_tree):
    root = make_tree(
        {
            "segv/__init__.py": "from . import gpu\nfrom . import crash\n",
            "segv/gpu.py": "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n",
            "segv/crash.py": f"import ctypes\nctypes.string_at(0)  {MARK}\n",
        }
    )
    result = sim_scan("segv", path=[root])
    assert result.status == "crashed"
    assert result.error.signal == signal.SIGSEGV
    assert "SIGSEGV" in result.error.message
    assert result.error.where.endswith(" in string_at")  # the innermost frame when the signal came
    assert f'File "{root / "segv/crash.py"}", line {marked_line(root / "segv/crash.py")} in <module>' in (
        result.error.traceback
    )
    assert result.culprit.module == "segv.gpu"
    assert not result.module("segv.crash").complete


def test_hang_times_out_says_where_and_kills_the_group(sim_scan, make_tree):
    root = make_tree(
        {
            "hang/__init__.py": "from . import gpu\nfrom . import spawner\nfrom . import stuck\n",
            "hang/gpu.py": "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n",
            "hang/spawner.py": "import subprocess, sys\n"
            "CHILD = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n",
            "hang/stuck.py": f"import time\nwhile True:\n    time.sleep(0.05)  {MARK}\n",
        }
    )
    result = sim_scan("hang", path=[root], timeout=3.0)
    assert result.status == "timeout"
    assert result.error.where == f"{root / 'hang/stuck.py'}:{marked_line(root / 'hang/stuck.py')} in <module>"
    assert "hang.stuck" in result.module_names()
    assert result.culprit.module == "hang.gpu"
    assert result.duration_s < 30
    # the `runner` fixture asserts afterwards that the grandchild sleeper is gone too


@pytest.mark.parametrize(
    ("code", "expected"),
    [("import os\nos._exit(0)\n", 0), ("import sys\nsys.exit(3)\n", 3), ("import os\nos._exit(7)\n", 7)],
    ids=["os._exit(0)", "sys.exit(3)", "os._exit(7)"],
)
def test_exit_at_import_is_exited_with_the_code(sim_scan, make_tree, code, expected):
    root = make_tree(
        {
            "quits/__init__.py": "from . import gpu\nfrom . import bye\n",
            "quits/gpu.py": "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n",
            "quits/bye.py": code,
        }
    )
    result = sim_scan("quits", path=[root])
    assert result.status == "exited"
    assert result.error.exitcode == expected
    assert result.exitcode == expected
    assert result.culprit.module == "quits.gpu"


def test_junk_on_stdout_and_stderr_leaves_results_intact(sim_scan, make_tree):
    root = make_tree(
        {
            "noisy.py": """
                import sys, os
                print('{"e": "done"} not an event')
                sys.stdout.write("x" * 200000)
                sys.stderr.write("warning: noise\\n")
                os.write(1, b"\\xff\\xfe raw bytes\\n")
                import ctypes
                ctypes.CDLL("libcuda.so.1").cuInit(0)
            """
        }
    )
    result = sim_scan("noisy", path=[root])
    assert result.status == "ok"
    assert result.culprit.module == "noisy"
    assert result.stdout.startswith('{"e": "done"} not an event')
    assert "truncated" in result.stdout
    assert "warning: noise" in result.stderr


def test_closing_fd1_and_fd2_leaves_results_intact(sim_scan, make_tree):
    root = make_tree(
        {
            "closer/__init__.py": "import os\nos.close(1)\nos.close(2)\nfrom . import gpu\n",
            "closer/gpu.py": "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n",
        }
    )
    result = sim_scan("closer", path=[root])
    assert result.status == "ok"
    assert result.culprit.module == "closer.gpu"
    assert result.culprit.chain == ("closer", "closer.gpu")


def test_fork_during_import_does_not_corrupt_the_channel(sim_scan, make_tree):
    root = make_tree(
        {
            "forks.py": """
                import os, json
                pid = os.fork()
                if pid == 0:
                    import decimal
                    os._exit(0)
                os.waitpid(pid, 0)
            """
        }
    )
    result = sim_scan("forks", path=[root])
    assert result.status == "ok"
    assert "decimal" not in result.module_names()


def test_a_grandchild_that_left_the_process_group_is_killed_too(sim_scan, make_tree):
    root = make_tree(
        {
            "escapes.py": """
                import subprocess, sys
                CHILD = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                         start_new_session=True)
            """
        }
    )
    result = sim_scan("escapes", path=[root])
    assert result.status == "ok", result.error
    # the `runner` fixture asserts that no process carrying this scan's marker survived
