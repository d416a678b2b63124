"""``diagtools run``: real programs, real forks, the simulated driver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diagtools.driver import resolve_driver
from diagtools.model.run import RunResult
from diagtools.render.run_html import run_html
from diagtools.render.run_text import render_run
from diagtools.usecases.attribution import INFERRED_EVIDENCE
from diagtools.usecases.run import run
from tests.conftest import DIAGTOOLS, MARK, RUN_REGISTRY, marked_line, require_installed

WORKER_APP = """
    import multiprocessing as mp
    import sys

    import registry

    def work(index):
        import ctypes
        status = ctypes.CDLL("libcuda.so.1").cuInit(0)  # <- child
        if status != 0:
            raise RuntimeError(f"CUDA driver initialization failed ({status})")
        return index

    if __name__ == "__main__":
        ctx = mp.get_context(sys.argv[1])
        worker = ctx.Process(target=work, args=(1,))
        worker.start()  # <- fork
        worker.join()
        print("worker exit", worker.exitcode)
"""


def sim_run(command, **kwargs) -> RunResult:
    kwargs.setdefault("timeout", 60.0)
    return run(command, driver="simulated", output="capture", **kwargs)


@pytest.fixture
def app(make_tree) -> Path:
    return make_tree({"registry.py": RUN_REGISTRY, "app.py": WORKER_APP})


def test_fork_workers_after_a_registry_import_are_poisoned(app):
    result = sim_run([sys.executable, str(app / "app.py"), "fork"], cwd=app)
    assert result.exitcode == 0, result.stderr
    assert "worker exit 1" in result.stdout
    assert result.verdict == "poisoned-fork"
    finding = result.findings[0]
    assert finding.kind == "poisoned-fork"
    parent = result.process(finding.pid)
    child = result.process(finding.child)
    assert child.parent == finding.pid
    assert child.via == "fork"
    assert parent.via == "exec"
    cuinit = finding.cuinit
    assert cuinit.module == "registry"
    assert cuinit.chain == ("__main__", "registry")
    assert cuinit.phase == "import"
    assert cuinit.module_site.file == str(app / "registry.py")
    assert cuinit.module_site.line == marked_line(app / "registry.py")
    assert cuinit.site.function == "_detect_platform"
    fork_lines = [(Path(f.file).name, f.line) for f in finding.fork_stack]
    assert ("app.py", marked_line(app / "app.py", "# <- fork")) in fork_lines
    assert finding.fork_stack[-1].file.endswith("popen_fork.py")
    refused = finding.child_saw.refused[0]
    assert refused.call == "cuInit"
    assert refused.code == 3
    assert refused.site.line == marked_line(app / "app.py", "# <- child")
    assert finding.child_saw.exitcode == 1
    text = render_run(result)
    assert "poisoned fork" in text
    assert "cuInit stack" in text
    assert "fork stack" in text
    assert "CUDA_ERROR_NOT_INITIALIZED" in text
    assert "worker.start()" in text
    assert "lib.cuInit(0)" in text
    assert "&lt;module&gt;" in run_html(result)
    assert RunResult.from_json(json.loads(json.dumps(result.to_json()))).to_json() == result.to_json()


def test_spawn_workers_are_fine(app):
    result = sim_run([sys.executable, str(app / "app.py"), "spawn"], cwd=app)
    assert result.exitcode == 0, result.stderr
    assert "worker exit 0" in result.stdout
    assert result.verdict == "initializes-cuda"
    assert [f.kind for f in result.findings] == ["cuda-initialized"] * 2
    top = next(record for record in result.processes if record.argv[1:] == (str(app / "app.py"), "spawn"))
    spawns = [start for start in top.starts if start.kind == "spawn"]
    assert spawns
    assert all("resource_tracker" not in " ".join(start.argv or ()) for start in spawns)  # a helper, not a worker
    assert any("resource_tracker" in " ".join(start.argv or ()) for start in top.starts if start.kind == "subprocess")
    assert all(start.driver_initialized for start in spawns)
    worker = result.process(spawns[-1].child)
    assert worker.via == "exec"
    assert worker.cuinit.module == "registry"  # the spawned child re-imports the main module, registry with it
    assert worker.cuinit.chain[-2:] == ("__mp_main__", "registry")


def test_cuinit_in_the_script_itself_names_main_and_the_script_line(make_tree):
    root = make_tree(
        {
            "main.py": f"""
                import os
                from cuda.bindings import driver

                (status,) = driver.cuInit(0)  {MARK}
                pid = os.fork()
                if pid == 0:
                    (again,) = driver.cuInit(0)
                    os._exit(7 if int(again) == 3 else 0)
                _, code = os.waitpid(pid, 0)
                print("child", os.waitstatus_to_exitcode(code))
            """
        }
    )
    result = sim_run([sys.executable, str(root / "main.py")])
    assert result.exitcode == 0, result.stderr
    assert "child 7" in result.stdout
    finding = result.findings[0]
    assert finding.kind == "poisoned-fork"
    assert finding.cuinit.module == "__main__"
    assert finding.cuinit.phase == "main"
    assert finding.cuinit.module_site.line == marked_line(root / "main.py")
    assert finding.fork_stack[-1].source == "pid = os.fork()"
    assert finding.child_saw.exitcode == 7
    assert finding.child_saw.refused[0].call == "cuInit"


def test_nested_process_that_forks_is_found_in_the_grandchild(app):
    outer = app / "outer.py"
    outer.write_text(
        "import subprocess, sys\n"
        f"code = subprocess.run([sys.executable, {str(app / 'app.py')!r}, 'fork']).returncode\n"
        "sys.exit(code)\n"
    )
    result = sim_run([sys.executable, str(outer)], cwd=app)
    assert result.exitcode == 0, result.stderr
    finding = result.poisoned_forks[0]
    top = result.processes[0]
    assert top.argv[-1] == str(outer)
    subprocess_start = next(start for start in top.starts if start.kind == "subprocess")
    assert subprocess_start.child == finding.pid
    assert not subprocess_start.driver_initialized
    assert result.process(finding.pid).parent == top.pid
    assert result.process(finding.child).parent == finding.pid


def test_exit_code_is_kept_and_a_clean_program_is_clean(make_tree):
    root = make_tree({"fail.py": "import sys\nprint('out')\nsys.exit(3)\n"})
    result = sim_run([sys.executable, str(root / "fail.py")])
    assert result.exitcode == 3
    assert result.stdout == "out\n"
    assert result.verdict == "clean"
    assert result.findings == ()


def test_a_python_that_skips_the_agent_gives_unknown(make_tree):
    root = make_tree({"quiet.py": "print('hi')\n"})
    result = sim_run([sys.executable, "-I", str(root / "quiet.py")])
    assert result.exitcode == 0
    assert result.verdict == "unknown"
    assert "did not load the agent" in result.notes[0]


def test_a_command_that_cannot_start_is_unknown():
    result = sim_run(["/nonexistent/diagtools-no-such-program"])
    assert result.exitcode is None
    assert result.verdict == "unknown"
    assert "could not be started" in result.notes[0]


def test_timeout_kills_the_whole_tree_and_keeps_the_records(make_tree, tmp_path):
    pids = tmp_path / "pids"
    root = make_tree(
        {
            "hang.py": f"""
                import ctypes, os, subprocess, sys, time
                ctypes.CDLL("libcuda.so.1").cuInit(0)
                child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                         start_new_session=True)
                open({str(pids)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
                time.sleep(600)
            """
        }
    )
    started = time.monotonic()
    result = sim_run([sys.executable, str(root / "hang.py")], timeout=3.0)
    assert time.monotonic() - started < 30
    assert result.timed_out
    assert result.verdict == "unknown"
    assert result.exitcode == -9
    assert result.processes[0].cuinit is not None
    time.sleep(0.2)
    for pid in map(int, pids.read_text().split()):
        assert not _alive(pid), f"pid {pid} outlived the run"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except OSError:
        return False
    return state != "Z"


def test_an_existing_sitecustomize_still_runs(make_tree):
    root = make_tree(
        {
            "custom/sitecustomize.py": "import os\nos.environ['FROM_USER_SITECUSTOMIZE'] = '1'\n",
            "show.py": "import os, sys\nprint(os.getenv('FROM_USER_SITECUSTOMIZE'), 'run_hook' in str(sys.path))\n",
        }
    )
    env_path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(root / "custom")
    try:
        result = sim_run([sys.executable, str(root / "show.py")])
    finally:
        if env_path is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = env_path
    assert result.stdout == "1 False\n", result.stderr
    assert result.verdict == "clean"


def test_cli_keeps_the_exit_code_and_writes_json(app, tmp_path):
    (app / "exit4.py").write_text("import runpy, sys\nsys.argv = ['app.py', 'fork']\nimport registry\nsys.exit(4)\n")
    out = tmp_path / "run.json"
    command = [sys.executable, str(app / "app.py"), "fork"]
    done = subprocess.run(
        [DIAGTOOLS, "run", "--driver", "simulated", "--json", str(out), "--", *command],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=app,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "worker exit 1\n"  # the command's stdout, untouched
    assert "verdict: POISONED FORK" in done.stderr
    document = json.loads(out.read_text())
    assert document["schema"] == "diagtools.run/1"
    assert document["verdict"] == "poisoned-fork"
    assert document["exitcode"] == 0
    assert document["findings"][0]["cuinit"]["module"] == "registry"
    failing = subprocess.run(
        [DIAGTOOLS, "run", "--driver", "simulated", "--json", "-", "--", sys.executable, str(app / "exit4.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=app,
    )
    assert failing.returncode == 4, failing.stderr
    document = json.loads(failing.stdout)  # only JSON on stdout
    assert document["exitcode"] == 4
    assert document["verdict"] == "initializes-cuda"


def test_cli_without_a_command_is_a_usage_error():
    done = subprocess.run([DIAGTOOLS, "run", "--"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert "no command given" in done.stderr


def test_pytest_cuda_watch_names_the_collection_node_and_the_forking_test(make_tree):
    root = make_tree(
        {
            "registry.py": RUN_REGISTRY,
            "test_models.py": """
                import os

                import registry

                def test_forks():
                    pid = os.fork()  # <- fork
                    if pid == 0:
                        os._exit(0)
                    os.waitpid(pid, 0)
            """,
        }
    )
    env = {**os.environ, **resolve_driver("simulated").env}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--cuda-watch", "-p", "no:cacheprovider", "-q", "test_models.py"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=root,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "diagtools cuda watch" in out
    assert "poisoned fork" in out
    assert "culprit: registry" in out
    assert "while: collecting test_models.py" in out
    assert "while: test_models.py::test_forks" in out
    assert f"test_models.py:{marked_line(root / 'test_models.py', '# <- fork')}" in out


def test_a_cuinit_inferred_from_the_cuda_runtime_is_reported_as_inferred(make_tree):
    """cuda-python's runtime (a static cudart) reaches the driver through its export tables, not cuInit."""
    require_installed("cuda.bindings", "cuda")
    root = make_tree(
        {
            "main.py": f"""
                import os
                from cuda.bindings import runtime

                runtime.cudaGetDeviceCount()  {MARK}
                pid = os.fork()
                if pid == 0:
                    os._exit(0)
                os.waitpid(pid, 0)
            """
        }
    )
    result = sim_run([sys.executable, str(root / "main.py")])
    assert result.exitcode == 0, result.stderr
    cuinit = result.findings[0].cuinit
    assert cuinit.evidence == INFERRED_EVIDENCE
    assert cuinit.module_site.line == marked_line(root / "main.py")
