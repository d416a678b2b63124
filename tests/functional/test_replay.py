"""Fork replay with real forks on the simulated driver."""

from __future__ import annotations

import json

import pytest

from diagtools.errors import UsageError
from diagtools.model.replay import ReplayComparison, ReplayResult
from diagtools.model.verdict import Verdict
from diagtools.render.html import comparison_html, replay_html
from diagtools.render.text import render_comparison, render_replay
from diagtools.specimens import all_specimens
from diagtools.usecases import replay
from diagtools.usecases.selfcheck import process_cuda_state
from tests.conftest import CHANNEL_FLOOD, cli, require_installed

BEFORE = [s for s in all_specimens() if "before" in s.variants]
# Specimens whose culprit calls into a real library (installed by the kernels extra) to reach cuInit.
NEEDS = {"deepseek_v4_ops": "cutlass", "triton_is_active": "triton"}


@pytest.fixture
def sim_replay(runner):
    def run(target, **kwargs):
        kwargs.setdefault("timeout", 60.0)
        return replay.replay_fork(target, driver="simulated", runner=runner, **kwargs)

    return run


@pytest.mark.parametrize("specimen", BEFORE, ids=[s.name for s in BEFORE])
def test_before_fails_under_fork_passes_under_spawn_and_after_passes(sim_replay, specimen):
    if specimen.name in NEEDS:
        require_installed(NEEDS[specimen.name], "kernels")
    forked = sim_replay(specimen.target, path=[specimen.tree("before")])
    assert forked.status == "failed"
    assert forked.reproduced
    assert forked.parent.cuda_initialized
    assert forked.child.exitcode == 1
    assert forked.child.driver_calls[0].call == "cuInit(0)"
    assert forked.child.driver_calls[0].name == "CUDA_ERROR_NOT_INITIALIZED"
    assert "CUDA_ERROR_NOT_INITIALIZED" in forked.child.error
    spawned = sim_replay(specimen.target, path=[specimen.tree("before")], start_method="spawn")
    assert spawned.status == "ok", spawned.child
    assert spawned.parent.cuda_initialized
    fixed = sim_replay(specimen.target, path=[specimen.tree("after")])
    assert fixed.status == "ok", fixed.child
    assert not fixed.parent.cuda_initialized
    assert [c.name for c in fixed.child.driver_calls] == ["CUDA_SUCCESS", "CUDA_SUCCESS"]


def test_clean_lazy_specimen_forks_fine(sim_replay):
    specimen = next(s for s in all_specimens() if s.name == "lazy_clean")
    result = sim_replay(specimen.target, path=[specimen.tree("after")], start_method="forkserver")
    assert result.status == "ok"


def test_ctypes_child_sees_the_same_poisoned_driver(sim_replay, make_tree):
    root = make_tree({"early.py": "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n"})
    result = sim_replay("early", path=[root], child="ctypes")
    assert result.status == "failed"
    assert result.child.driver_state_at_start == 3
    assert result.child.driver_calls[0].code == 3


def test_torch_child_on_the_simulated_gpu_needs_a_cuda_build_of_torch(sim_replay, make_tree):
    """The simulated runtime serves a CUDA torch (benchmarks/vllm_runtime.py); a CPU torch has none to use."""
    require_installed("torch", "kernels")
    root = make_tree({"plain.py": "X = 1\n"})
    result = sim_replay("plain", path=[root], child="torch")
    assert not result.reproduced
    if result.status == "unavailable":
        assert "CPU build" in result.child.detail
    else:  # a CUDA build of torch: it runs on the simulated GPU
        assert result.status == "ok", result.child
        assert "simulated GPU" in result.child.detail


def test_torch_child_is_unavailable_without_a_driver(runner, make_tree):
    root = make_tree({"plain.py": "X = 1\n"})
    result = replay.replay_fork("plain", path=[root], child="torch", driver="none", runner=runner, timeout=60.0)
    assert result.status == "unavailable"
    assert "needs a CUDA driver" in result.child.detail


CHILD_FAILURES = {
    "crash": ("import ctypes\ndef act():\n    ctypes.string_at(0)\n", "child-crashed"),
    "hang": ("import time\ndef act():\n    time.sleep(600)\n", "child-timeout"),
    "exits": ("import os\ndef act():\n    os._exit(4)\n", "child-exited"),
    "raises": ("def act():\n    raise KeyError('gone')\n", "failed"),
}


@pytest.mark.parametrize("kind", sorted(CHILD_FAILURES))
def test_child_that_crashes_hangs_exits_or_raises_is_reported(sim_replay, make_tree, kind):
    source, expected = CHILD_FAILURES[kind]
    root = make_tree({"plain.py": "X = 1\n", "acts.py": source})
    result = sim_replay("plain", path=[root], child="acts:act", timeout=8.0)
    assert result.status == expected
    assert result.duration_s < 30
    if kind == "crash":
        assert result.child.signal == 11
    if kind == "exits":
        assert result.child.exitcode == 4
    if kind == "raises":
        assert result.child.error_type == "KeyError"
        assert "KeyError: 'gone'" in result.child.traceback


def test_a_flooded_channel_is_channel_lost_never_a_plain_exit(sim_replay, make_tree):
    """A target that floods the replay's result channel on import leaves the outcome unknown."""
    root = make_tree({"floods_channel.py": CHANNEL_FLOOD})
    result = sim_replay("floods_channel", path=[root])
    assert result.status == "channel-lost"
    assert result.error.kind == "channel-lost"
    assert result.verdict == Verdict.UNKNOWN
    assert "flooded" in result.error.message


def test_setup_import_error_and_parent_hang(sim_replay, make_tree):
    root = make_tree({"broken.py": "raise ImportError('no config')\n", "stuck.py": "import time\ntime.sleep(600)\n"})
    broken = sim_replay("broken", path=[root])
    assert broken.status == "setup-error"
    assert "no config" in broken.error.message
    assert broken.child is None
    stuck = sim_replay("stuck", path=[root], timeout=3.0)
    assert stuck.status == "timeout"
    assert "stuck.py" in stuck.error.where


def test_bad_arguments_are_usage_errors():
    with pytest.raises(UsageError, match="unknown child action"):
        replay.replay_fork("x", child="nonsense")
    with pytest.raises(UsageError, match="unknown start method"):
        replay.replay_fork("x", start_method="vfork")


def test_compare_before_after_fork_spawn(runner):
    specimen = next(s for s in all_specimens() if s.name == "common_ops")
    comparison = replay.compare_replays(
        specimen.target,
        before=specimen.tree("before"),
        after=specimen.tree("after"),
        driver="simulated",
        runner=runner,
    )
    assert comparison.run("before", "fork").reproduced
    assert not comparison.run("before", "spawn").reproduced
    assert not comparison.run("after", "fork").reproduced
    assert comparison.verdict == Verdict.CLEAN
    assert comparison.variant_verdicts() == {"before": Verdict.INITIALIZES_CUDA, "after": Verdict.CLEAN}
    explanation = comparison.explanation()
    assert explanation[0] == "Reproduced: before/fork fails; fixed: after passes fork and spawn"
    assert "before: the parent initialized CUDA before starting the child" in explanation
    assert "after: the parent did not initialize CUDA before starting the child" in explanation
    document = json.loads(json.dumps(comparison.to_json()))
    assert ReplayComparison.from_json(document).to_json() == document
    text = render_comparison(comparison)
    assert "CUDA_ERROR_NOT_INITIALIZED" in text or "cuInit(0) failed" in text
    assert all(len(line) <= 100 for line in text.splitlines()), text
    html = comparison_html(comparison)
    assert "<table>" in html
    assert "CUDA_ERROR_NOT_INITIALIZED" in html
    failing = comparison.run("before", "fork")
    assert "replay_child.py" in failing.child.traceback  # the JSON keeps diagtools' own frames
    assert "replay_child" not in replay_html(failing)
    assert "^^^" not in replay_html(failing)
    assert "CUDA_ERROR_NOT_INITIALIZED" in failing.child.shown_traceback


def test_the_calling_process_never_touches_cuda(sim_replay, make_tree):
    root = make_tree({"early.py": "from cuda.bindings import driver\ndriver.cuInit(0)\n"})
    assert sim_replay("early", path=[root]).reproduced
    state = process_cuda_state()  # other test modules may have imported CPU torch; the driver never loaded here
    assert not state.libcuda_loaded
    assert not state.torch_cuda_initialized


def test_result_round_trips_and_renders_escaped(sim_replay, make_tree):
    root = make_tree(
        {
            "early.py": "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n",
            "acts.py": "def act():\n    raise ValueError('<script>alert(1)</script>')\n",
        }
    )
    result = sim_replay("early", path=[root], child="acts:act")
    document = json.loads(json.dumps(result.to_json()))
    assert document["schema"] == "diagtools.replay/1"
    assert {"parent", "child", "start_method", "driver", "status"} <= set(document)
    assert {"ok", "exitcode", "error", "traceback", "stdout", "stderr"} <= set(document["child"])
    assert ReplayResult.from_json(document).to_json() == document
    html = replay_html(result)
    assert "<script>" not in html
    assert "&lt;script&gt;" in html
    assert "status: failed" in render_replay(result)


def test_cli_replay_and_compare(make_tree):
    specimen = next(s for s in all_specimens() if s.name == "common_ops")
    done = cli(
        "replay", specimen.target, "--path", str(specimen.tree("before")), "--driver", "simulated", "--json", "-"
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "failed"
    done = cli(
        "replay",
        specimen.target,
        "--compare",
        str(specimen.tree("before")),
        str(specimen.tree("after")),
        "--driver",
        "simulated",
    )
    assert done.returncode == 0, done.stderr
    assert "  Reproduced: before/fork fails; fixed: after passes fork and spawn\n" in done.stdout
    assert all(len(line) <= 100 for line in done.stdout.splitlines()), done.stdout
    bad = cli("replay", "x", "--child", "??")
    assert bad.returncode == 2
    assert bad.stderr.startswith("diagtools: error: unknown child action")


def test_a_setup_on_the_runners_descriptors_gets_no_stack_dump_in_its_own_file(sim_replay, make_tree, tmp_path):
    data = tmp_path / "data.bin"
    data.write_bytes(b"the user's bytes\n")
    clobbers = (
        f"import os, time\nfd = os.open({str(data)!r}, os.O_RDWR)\n"
        "for number in range(2048, 2101):\n"
        "    if number != fd:\n"
        "        os.dup2(fd, number)\n"
        "time.sleep(600)\n"
    )
    root = make_tree({"clobbers.py": clobbers})
    result = sim_replay("clobbers", path=[root], timeout=3.0)
    assert result.status == "timeout"
    assert data.read_bytes() == b"the user's bytes\n"
