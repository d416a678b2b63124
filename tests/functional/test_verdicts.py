"""Three verdicts: never ``clean`` when the run could not see."""

from __future__ import annotations

import json

import diagtools
from diagtools.model.diff import diff_scans
from diagtools.model.driver import DriverInfo
from diagtools.model.scan import ScanResult
from diagtools.model.verdict import ScanStatus, Verdict
from tests.conftest import cli

INIT = "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n"


def test_clean_and_initializing_targets(sim_scan, make_tree):
    root = make_tree({"calm.py": "import json\n", "hot.py": INIT})
    assert sim_scan("calm", path=[root]).verdict == Verdict.CLEAN
    assert sim_scan("hot", path=[root]).verdict == Verdict.INITIALIZES_CUDA


def test_runs_that_could_not_see_are_unknown(sim_scan, make_tree):
    root = make_tree(
        {
            "broken.py": "import no_such_module_xyz\n",
            "crasher.py": "import ctypes\nctypes.string_at(0)\n",
            "quitter.py": "import os\nos._exit(0)\n",
        }
    )
    for target, status in (("broken", "import-error"), ("crasher", "crashed"), ("quitter", "exited")):
        result = sim_scan(target, path=[root])
        assert result.status == status
        assert result.verdict == Verdict.UNKNOWN, target
        assert result.doubts(), target
        assert json.loads(json.dumps(result.to_json()))["verdict"] == "unknown"


def test_an_initialization_seen_before_a_crash_still_counts(sim_scan, make_tree):
    root = make_tree({"hotcrash.py": INIT + "ctypes.string_at(0)\n"})
    result = sim_scan("hotcrash", path=[root])
    assert result.status == ScanStatus.CRASHED
    assert result.verdict == Verdict.INITIALIZES_CUDA


def test_no_driver_means_nothing_could_be_observed(make_tree, runner):
    root = make_tree({"hot.py": INIT.replace("cuInit(0)", "cuInit(0) if False else None")})
    result = diagtools.scan("hot", path=[root], driver="none", runner=runner)
    assert result.verdict == Verdict.UNKNOWN
    assert any("no driver" in reason for reason in result.doubts())


def test_verdicts_survive_json_and_the_cli_prints_them(sim_scan, make_tree, tmp_path):
    root = make_tree({"broken.py": "raise ValueError('nope')\n"})
    result = sim_scan("broken", path=[root])
    again = ScanResult.from_json(json.loads(json.dumps(result.to_json())))
    assert again.verdict == Verdict.UNKNOWN
    assert again.status is ScanStatus.IMPORT_ERROR
    done = cli("scan", "broken", "--path", str(root), "--driver", "simulated")
    assert done.returncode == 3, done.stderr
    assert "verdict: unknown" in done.stdout
    assert "CUDA initialized: no" not in done.stdout


def test_a_diff_with_a_side_that_could_not_see_is_unknown(sim_scan, make_tree):
    root = make_tree({"hot.py": INIT, "broken.py": "raise ValueError('nope')\n"})
    diff = diff_scans(sim_scan("hot", path=[root]), sim_scan("broken", path=[root]))
    assert diff.verdict == Verdict.UNKNOWN
    assert not diff.fixed
    assert diff.to_json()["verdict"] == "unknown"


def test_the_guard_fails_a_module_it_could_not_see(pytester):
    pytester.makepyfile(
        """
        import pytest
        from diagtools.pytest_plugin import assert_import_cuda_free

        def test_gone():
            assert_import_cuda_free("json", driver="none")
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    assert "verdict unknown, not clean: no driver was loaded" in result.stdout.str()


def test_run_without_a_driver_is_unknown_as_a_scan_is(make_tree):
    result = diagtools.run(["python3", "-c", "print(1)"], driver="none", timeout=60)
    assert result.verdict == "unknown"
    assert result.notes[0] == DriverInfo("none").blind
    assert diagtools.scan("json", driver="none", cuts=False).doubts()[0] == DriverInfo("none").blind


def test_bisect_never_calls_a_commit_good_that_it_could_not_see(make_tree):
    from diagtools.usecases.bisect_step import SKIP, verdict

    root = make_tree({"calm.py": "import json\n"})
    code, record = verdict("calm", str(root), "none", 60)
    assert code == SKIP
    assert record["verdict"] == "skip"
    assert "no driver was loaded" in record["error"]
    assert verdict("calm", str(root), "simulated", 60)[1]["verdict"] == "good"


def test_the_postmortem_timeline_says_unknown_for_a_scan_that_could_not_see(make_tree):
    from diagtools.render.postmortem import _verdict

    root = make_tree({"calm.py": "import json\n"})
    blind = diagtools.scan("calm", path=[root], driver="none", cuts=False)
    assert _verdict(blind).startswith("unknown: no driver was loaded")
    assert _verdict(diagtools.scan("calm", path=[root], driver="simulated", cuts=False)) == "CUDA not initialized"
