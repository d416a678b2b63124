"""Sweep over a generated 60-module package: exactly the two culprits, in parallel, resumable."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest

from diagtools.errors import UsageError
from diagtools.usecases.sweep import discover_modules, sweep
from tests.conftest import cli, require

CULPRITS = {"big.sub3.gpu_a", "big.sub5.nested.gpu_b"}


@pytest.fixture
def big_package(make_tree):
    files = {"big/__init__.py": "", "big/__main__.py": "raise SystemExit('never imported by a sweep')\n"}
    for sub in range(6):
        files[f"big/sub{sub}/__init__.py"] = "import json\n"
        for leaf in range(8):
            files[f"big/sub{sub}/m{leaf}.py"] = f"from big.sub{sub} import m0 as _m0\nVALUE = {leaf}\n"
    files["big/sub5/nested/__init__.py"] = ""
    files["big/sub3/gpu_a.py"] = "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n"
    files["big/sub5/nested/gpu_b.py"] = "from cuda.bindings import driver\ndriver.cuInit(0)\n"
    files["big/data-files/readme.py"] = "not a package: the directory name is not an identifier\n"
    return make_tree(files)


def test_discovery_walks_files_without_importing(big_package):
    modules = discover_modules("big", [big_package])
    assert len(modules) >= 50
    assert "big.__main__" not in modules
    assert not any("data-files" in m for m in modules)
    assert {"big", "big.sub5.nested", *CULPRITS} <= set(modules)
    with pytest.raises(UsageError, match="not found"):
        discover_modules("absent_pkg_xyz", [big_package])


def test_sweep_finds_exactly_the_two_culprits_in_parallel_and_resumes(big_package, tmp_path):
    journal = tmp_path / "sweep.jsonl"
    seen = []
    result = sweep(
        "big",
        path=[big_package],
        jobs=2,
        driver="simulated",
        json_path=journal,
        progress=lambda done, total, row: seen.append((done, total)),
    )
    assert {row.module for row in result.culprits} == CULPRITS
    assert result.failures == ()
    assert result.row("big.sub3.gpu_a").culprit.site.line == 2
    assert seen[-1] == (len(result.rows), len(result.rows))
    ordered = sorted(result.rows, key=lambda row: row.started)
    concurrent = any(later.started < earlier.finished for earlier, later in itertools.pairwise(ordered))
    assert concurrent, "with --jobs 2 some scans must overlap in time"

    lines = journal.read_text().splitlines()
    assert json.loads(lines[0]) == {"schema": "diagtools.sweep/1", "package": "big", "paths": [str(big_package)]}
    assert [next(iter(json.loads(line))) for line in lines[1:3]] == ["environment", "files"]
    assert len(lines) == len(result.rows) + 3
    journal.write_text("\n".join(lines[:23]) + '\n{"module": "big.sub0.m1", "sta')  # an interrupted run
    seen.clear()
    resumed = sweep(
        "big",
        path=[big_package],
        jobs=2,
        driver="simulated",
        json_path=journal,
        progress=lambda done, total, row: seen.append(row.module),
    )
    assert resumed.resumed == 20
    assert len(seen) == len(result.rows) - 20
    assert {row.module for row in resumed.culprits} == CULPRITS
    records = [json.loads(line) for line in journal.read_text().splitlines()[1:] if line.endswith("}")]
    assert len({record["module"] for record in records if "module" in record}) == len(result.rows)
    assert set(resumed.rescanned.values()) == {"it was not in the journal"}  # the rows the interrupt lost


def test_sweep_accepts_any_executor(big_package):
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=2) as pool:
        result = sweep("big.sub3", path=[big_package], executor=pool, driver="simulated")
    assert {row.module for row in result.culprits} == {"big.sub3.gpu_a"}


def test_journal_of_another_package_is_refused(big_package, tmp_path):
    journal = tmp_path / "other.jsonl"
    journal.write_text('{"schema": "diagtools.sweep/1", "package": "other"}\n')
    with pytest.raises(UsageError, match=re.escape("not a diagtools.sweep/1 journal of 'big'")):
        sweep("big", path=[big_package], driver="simulated", json_path=journal)


def test_cli_sweep_table_and_fail_on_cuda(big_package):
    done = cli(
        "sweep", "big.sub5", "--path", str(big_package), "--jobs", "2", "--driver", "simulated", "--fail-on-cuda"
    )
    assert done.returncode == 1, done.stderr
    assert "big.sub5.nested.gpu_b" in done.stdout
    assert "1 initialize CUDA" in done.stdout
    bad = cli("sweep", "big", "--jobs", "0")
    assert bad.returncode == 2
    assert bad.stderr.strip() == "diagtools: error: --jobs must be at least 1, got 0"


JUNIT_XSD = Path(__file__).with_name("junit.xsd")


def junit_schema():
    xmlschema = require("xmlschema", "dev", "the JUnit report is validated against the JUnit XML schema")
    return xmlschema.XMLSchema(JUNIT_XSD)


def junit_cases(path) -> dict[str, str]:
    """Each test case's outcome by module, after validating the report against the JUnit XML schema and
    checking the rules a JUnit reader relies on beyond it: one suite in ``testsuites``, its counts equal to
    its cases' outcomes, every outcome with a message."""
    import xml.etree.ElementTree as ET

    junit_schema().validate(str(path))
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    outcomes = {}
    for case in suite.findall("testcase"):
        assert case.get("classname")
        assert float(case.get("time")) >= 0
        children = [child for child in case if child.tag in ("failure", "error", "skipped")]
        assert len(children) <= 1, ET.tostring(case)
        assert all(child.get("message") for child in children)
        outcomes[case.get("name")] = children[0].tag if children else "passed"
    counted = {"failures": "failure", "errors": "error", "skipped": "skipped"}
    for attribute, tag in counted.items():
        assert int(suite.get(attribute)) == int(root.get(attribute)) == list(outcomes.values()).count(tag)
    assert int(suite.get("tests")) == len(outcomes)
    return outcomes


def test_cli_sweep_writes_junit_a_test_case_per_module(big_package, tmp_path):
    (big_package / "big" / "sub4" / "broken.py").write_text("raise RuntimeError('broken at import')\n")
    report = tmp_path / "sweep.xml"
    done = cli(
        "sweep", "big", "--path", str(big_package), "--jobs", "2", "--driver", "simulated", "--junit", str(report)
    )
    assert done.returncode == 0, done.stderr
    outcomes = junit_cases(report)
    assert {name for name, outcome in outcomes.items() if outcome == "failure"} == CULPRITS
    assert outcomes["big.sub4.broken"] == "error"
    assert outcomes["big"] == "skipped"  # preloaded by the zygote: not judged on its own
    assert outcomes["big.sub0.m1"] == "passed"
    text = report.read_text()
    assert "initializes CUDA through big.sub3.gpu_a" in text
    assert "big/sub3/gpu_a.py:2" in text
    assert str(big_package) not in text  # paths as the reports write them
    assert "RuntimeError" in text
    bad = cli("sweep", "big", "--path", str(big_package), "--junit", str(tmp_path / "no" / "such" / "dir.xml"))
    assert bad.returncode == 2
    assert "--junit" in bad.stderr


@pytest.mark.parametrize(
    ("broken", "why"),
    [
        ('<testcase classname="c" time="0.1"/>', "name"),  # a case with no name
        ('<testcase name="m" classname="c" time="-1"/>', "time"),
        ('<testcase name="m" classname="c"><failure/><error/></testcase>', "error"),  # two outcomes
        ('<testcase name="m" classname="c"><passed/></testcase>', "passed"),
    ],
)
def test_the_junit_schema_refuses_what_a_reader_would(broken, why):
    """The schema the reports are validated against is not a formality: each of these reports is refused."""
    xmlschema = require("xmlschema", "dev")
    text = f'<testsuites><testsuite name="s" tests="1">{broken}</testsuite></testsuites>'
    with pytest.raises(xmlschema.XMLSchemaValidationError, match=why):
        junit_schema().validate(text)
