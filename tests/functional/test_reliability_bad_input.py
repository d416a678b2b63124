"""Bad input: one line, exit code 2, never a traceback, never accepted silently."""

from __future__ import annotations

import json
import os
import stat
import textwrap

import pytest

import diagtools
from diagtools.errors import SchemaError, UsageError
from diagtools.model.scan import ScanResult
from diagtools.specimens import get
from diagtools.usecases.bisect import bisect
from tests.conftest import cli

BAD_TIMEOUTS = ["nan", "inf", "1e309", "0", "-1", "-inf", "soon"]


def assert_one_line_usage_error(done) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize("value", BAD_TIMEOUTS)
@pytest.mark.parametrize(
    "command",
    [
        ["scan", "json"],
        ["sweep", "json"],
        ["replay", "json"],
        ["bisect", "json", "--repo", ".", "--good", "HEAD", "--bad", "HEAD"],
        ["run", "--", "true"],
    ],
    ids=lambda command: command[0],
)
def test_the_cli_rejects_a_timeout_that_is_not_finite_and_positive(command, value):
    assert_one_line_usage_error(cli(command[0], f"--timeout={value}", *command[1:]))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 0, True, "10"])
def test_the_python_api_rejects_a_bad_timeout(value, tmp_path):
    with pytest.raises(UsageError, match="--timeout"):
        diagtools.scan("json", timeout=value, driver="none")
    with pytest.raises(UsageError, match="--timeout"):
        diagtools.replay_fork("json", timeout=value, driver="none")
    with pytest.raises(UsageError, match="--timeout"):
        diagtools.sweep("json", timeout=value, driver="none")
    with pytest.raises(UsageError, match="--timeout"):
        bisect(tmp_path, "HEAD", "HEAD", "json", timeout=value)
    with pytest.raises(UsageError, match="--timeout"):
        diagtools.run(["true"], timeout=value, driver="none")


@pytest.mark.parametrize("path", ["src\nother", "src\0other"], ids=["newline", "NUL"])
def test_paths_with_newlines_or_nul_are_rejected(path):
    with pytest.raises(UsageError, match="newline or NUL"):
        diagtools.scan("json", path=[path], driver="none")
    assert_one_line_usage_error(cli("scan", "json", "--path", path.replace("\0", "\n")))


VALID = {"schema": "diagtools.scan/1", "status": "ok", "driver": {"kind": "simulated"}, "cuda_initialized": False}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"modules": 5}, "modules"),
        ({"targets": "pkg"}, "targets"),
        ({"cuda_initialized": "yes"}, "cuda_initialized"),
        ({"driver": {"kind": "quantum"}}, "driver.kind"),
        ({"culprits": [{"site": {"file": "f", "line": "x", "function": "g"}}]}, "culprits[0].site.line"),
        ({"modules": [{"name": "a", "self_s": "fast"}]}, "modules[0].self_s"),
        ({"error": {"message": "no kind"}}, "error.kind"),
        ({"duration_s": float("nan")}, "duration_s"),
    ],
)
def test_from_json_rejects_wrong_types_naming_the_field(change, field):
    with pytest.raises(SchemaError) as raised:
        ScanResult.from_json({**VALID, **change})
    assert field in str(raised.value)


@pytest.mark.parametrize(
    "content",
    [
        '{"schema": "diagtools.scan/1", "status": "ok", "driv',
        json.dumps({**VALID, "modules": 5}),
        json.dumps({**VALID, "culprits": [{"site": {"file": "f", "line": "x", "function": "g"}}]}),
        "[" * 100_000,
        "\xff\xfe",
        "",
    ],
    ids=["truncated", "modules-int", "line-str", "deep", "binary", "empty"],
)
def test_diff_of_corrupt_json_is_a_one_line_error(tmp_path, content):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(VALID), encoding="utf-8")
    bad = tmp_path / "bad.json"
    bad.write_bytes(content.encode("latin-1") if content == "\xff\xfe" else content.encode())
    assert_one_line_usage_error(cli("diff", str(good), str(bad)))
    assert_one_line_usage_error(cli("diff", str(bad), str(good)))


@pytest.fixture
def package(make_tree):
    return make_tree({"tinypkg/__init__.py": "", "tinypkg/leaf.py": "X = 1\n"})


@pytest.mark.parametrize(
    "rows",
    [
        ['{"module": "tinypkg.leaf", "status": "ok", "cuda_initialized": false, "culprit": 5}'],
        ['{"module": "tinypkg.leaf", "status": "ok"}'],
    ],
    ids=["culprit-int", "missing-fields"],
)
def test_sweep_resume_from_a_corrupt_journal_is_a_one_line_error(tmp_path, package, rows):
    journal = tmp_path / "journal.jsonl"
    header = json.dumps({"schema": "diagtools.sweep/1", "package": "tinypkg"})
    journal.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    done = cli("sweep", "tinypkg", "--path", str(package), "--driver", "simulated", "--json", str(journal))
    assert_one_line_usage_error(done)
    assert "journal.jsonl:2" in done.stderr


def test_sweep_resume_from_a_binary_journal_is_a_one_line_error(tmp_path, package):
    journal = tmp_path / "journal.jsonl"
    journal.write_bytes(b"\xff\xfe\x00garbage")
    assert_one_line_usage_error(
        cli("sweep", "tinypkg", "--path", str(package), "--driver", "simulated", "--json", str(journal))
    )


@pytest.mark.parametrize(
    "destination",
    ["{tmp}", "{tmp}/missing/out.json", "{tmp}/file.txt/out.json", "/proc/version/out.json"],
    ids=["directory", "missing-parent", "parent-is-a-file", "proc"],
)
@pytest.mark.parametrize(
    "option", ["scan --json", "sweep --json", "diff --json", "diff --html", "bisect --json", "run --json", "run --html"]
)
def test_an_unwritable_output_is_refused_before_the_run(tmp_path, package, destination, option):
    (tmp_path / "file.txt").write_text("x", encoding="utf-8")
    target = destination.format(tmp=tmp_path)
    command, flag = option.split()
    scan_json = tmp_path / "scan.json"
    scan_json.write_text(json.dumps(VALID), encoding="utf-8")
    leading = {
        "scan": ["scan", "tinypkg", "--path", str(package), "--driver", "simulated"],
        "sweep": ["sweep", "tinypkg", "--path", str(package), "--driver", "simulated"],
        "diff": ["diff", str(scan_json), str(scan_json)],
        "bisect": ["bisect", "tinypkg", "--repo", str(package), "--good", "HEAD", "--bad", "HEAD"],
        "run": ["run", "--driver", "simulated"],
    }[command]
    trailing = ["--", "echo", "ran"] if command == "run" else []
    done = cli(*leading, flag, target, *trailing)
    assert_one_line_usage_error(done)
    assert done.stdout == ""  # refused before anything ran
    assert "--" in done.stderr


@pytest.mark.parametrize("destination", ["{tmp}/file.txt", "{tmp}/file.txt/report", "/proc/version/report"])
def test_an_unusable_demo_directory_is_refused_before_the_run(tmp_path, destination):
    (tmp_path / "file.txt").write_text("x", encoding="utf-8")
    done = cli("demo", "--no-notebooks", "--driver", "simulated", "--out", destination.format(tmp=tmp_path))
    assert_one_line_usage_error(done)
    assert done.stdout == ""


def test_a_json_file_that_fails_at_write_time_still_prints_the_report(package):
    done = cli("scan", "tinypkg", "--path", str(package), "--driver", "simulated", "--json", "/dev/full")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "diagtools scan tinypkg" in done.stdout
    assert "cannot write /dev/full" in done.stderr
    done = cli("run", "--driver", "simulated", "--json", "/dev/full", "--", "true")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "diagtools run: true" in done.stderr  # the report came first
    assert "cannot write /dev/full" in done.stderr
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)  # written to, never replaced by a file


SPECIMEN = get("common_ops")


def ini_project(pytester) -> None:
    pytester.makeini(
        f"""
        [pytest]
        cuda_free_modules =
            vmodels.common.ops
            vmodels.platforms
        cuda_free_path = {SPECIMEN.tree("after")}
        cuda_free_driver = simulated
        """
    )
    pytester.makepyfile(test_plain=textwrap.dedent("def test_one():\n    pass\n\ndef test_two():\n    pass\n"))


def test_ini_checks_stay_out_of_a_run_of_chosen_tests(pytester):
    ini_project(pytester)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "test_plain.py::test_one")
    result.assert_outcomes(passed=1)


def test_ini_checks_honour_k_and_deselect(pytester):
    ini_project(pytester)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "common", "-v")
    result.assert_outcomes(passed=1)
    assert "cuda_free[vmodels.common.ops] PASSED" in result.stdout.str()
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--deselect", "tox.ini::cuda_free[vmodels.platforms]", "-v"
    )
    result.assert_outcomes(passed=3)


def test_an_ini_check_is_selectable_by_node_id(pytester):
    ini_project(pytester)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v", "tox.ini::cuda_free[vmodels.platforms]")
    result.assert_outcomes(failed=1)
    assert "tox.ini::cuda_free[vmodels.platforms] FAILED" in result.stdout.str()
    everything = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    everything.assert_outcomes(passed=3, failed=1)


@pytest.mark.parametrize(("targets", "path"), [(123, ()), ("json", 5), ("json", [5])])
def test_wrong_argument_types_are_usage_errors(targets, path):
    with pytest.raises(UsageError):
        diagtools.scan(targets, path=path, driver="none")
