"""The scan use case with a fake runner: validation and the trace rerun."""

from __future__ import annotations

import pytest

import diagtools
from diagtools.errors import UsageError
from diagtools.runner.subkernel import CapturedOutput, RawRun

EMPTY = CapturedOutput("", 0)


def fake_runner(script):
    """A runner that answers each request from ``script`` (a list of event lists)."""
    requests = []

    def run(request):
        requests.append(request)
        events = script[len(requests) - 1]
        return RawRun(tuple(events), 0, False, EMPTY, EMPTY, "", 0.1, "m")

    run.requests = requests
    return run


BASE = [
    {"e": "hello", "t": 0.0, "main_thread": 1},
    {"e": "begin", "t": 1.0, "n": "pkg", "p": None, "f": "/pkg.py", "th": 1},
    {"e": "transition", "t": 1.5, "m": "pkg", "th": 1, "ph": "import"},
    {"e": "end", "t": 2.0, "n": "pkg"},
    {"e": "final", "t": 2.1, "initialized": True},
    {"e": "done", "t": 2.2},
]
REFINED = [
    *BASE[:2],
    {"e": "refined", "t": 1.5, "m": "pkg", "th": 1, "ph": "import", "stack": [["/pkg.py", 3, "<module>"]]},
    *BASE[2:],
]


@pytest.mark.parametrize(
    ("targets", "message"),
    [("", "not a module name"), ("a b", "not a module name"), ("1abc", "not a module name"), ([], "no target")],
)
def test_bad_targets_are_usage_errors(targets, message):
    with pytest.raises(UsageError, match=message):
        diagtools.scan(targets, runner=fake_runner([]))


def test_missing_path_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="is not a directory"):
        diagtools.scan("pkg", path=[tmp_path / "nope"], runner=fake_runner([]))


def test_state_probe_culprit_triggers_one_traced_rerun(tmp_path):
    runner = fake_runner([BASE, REFINED])
    result = diagtools.scan("pkg", path=[tmp_path], driver="simulated", runner=runner)
    assert [r.settings["DIAGTOOLS_PROBE_REFINE"] for r in runner.requests] == ["", "pkg"]
    assert runner.requests[0].settings["DIAGTOOLS_PROBE_PATH"] == str(tmp_path)
    assert result.culprit.evidence == "trace"
    assert result.culprit.site.line == 3


def test_no_rerun_when_refinement_is_off_or_not_needed():
    runner = fake_runner([BASE])
    assert diagtools.scan("pkg", driver="simulated", refine=False, runner=runner).culprit.evidence == "state-probe"
    assert len(runner.requests) == 1


@pytest.mark.parametrize("pattern", ["app", "vllm.*", "app[0-9]*", "app[!x]?", "vllm.model_executor.*.ops"])
def test_own_takes_every_glob_the_readme_promises(pattern):
    from diagtools.usecases.scan import validate_own

    assert validate_own(pattern) == (pattern,)


def test_own_bracket_range_matches_what_it_says():
    from diagtools.model.site import is_own

    assert is_own("app7.models", ("app[0-9]*",))
    assert not is_own("apx.models", ("app[0-9]*",))


@pytest.mark.parametrize("pattern", ["not a package", "app-1", "a..b", "app[", "1app", "app[.]x"])
def test_own_refuses_what_is_no_dotted_name(pattern):
    from diagtools.usecases.scan import validate_own

    with pytest.raises(UsageError, match="not a package name or a glob"):
        validate_own(pattern)


def test_files_of_a_package_are_its_modules_and_scripts_are_left_out(tmp_path):
    from diagtools.usecases.options import targets_and_files
    from tests.conftest import write_tree

    root = write_tree(
        tmp_path / "src",
        {"pkg/__init__.py": "", "pkg/sub/__init__.py": "", "pkg/sub/mod.py": "", "pkg/__main__.py": "", "run.py": ""},
    )
    (tmp_path / "notes.md").write_text("")
    files = [str(root / p) for p in ("pkg/sub/mod.py", "pkg/sub/__init__.py", "pkg/__main__.py", "run.py")]
    names, roots = targets_and_files(["other.mod", *files, str(tmp_path / "notes.md")])
    assert names == ("other.mod", "pkg.sub.mod", "pkg.sub")
    assert roots == (str(root.resolve()),)
    assert targets_and_files([str(root / "run.py")]) == ((), ())
