"""The data model: JSON round trips, schema checks, errors that survive pickling."""

from __future__ import annotations

import json
import pickle

import pytest

from diagtools.errors import (
    DriverBuildError,
    DriverUnavailableError,
    MissingExtraError,
    SchemaError,
    UsageError,
)
from diagtools.model.scan import Culprit, DriverInfo, ImportNode, ScanResult, Site, StartupInfo, TargetFailure
from diagtools.model.verdict import Evidence


def sample_result() -> ScanResult:
    site = Site("/src/pkg/leaf.py", 4, "probe", "return lib.cuInit(0)")
    return ScanResult(
        targets=("pkg",),
        status="import-error",
        driver=DriverInfo("simulated", "auto", "/cache/libcuda.so.1"),
        cuda_initialized=True,
        modules=(
            ImportNode("pkg", None, "/src/pkg/__init__.py", 0.001, 0.01),
            ImportNode("pkg.leaf", "pkg", "/src/pkg/leaf.py", 0.009, 0.009, True, 1, "import", False),
        ),
        culprits=(Culprit("pkg.leaf", ("pkg", "pkg.leaf"), site, (site,), "import", "MainThread", "driver-hook"),),
        startup=StartupInfo(False, 12, 0.02),
        error=TargetFailure("import-error", "pkg: ValueError: x", "Traceback", "/src/pkg/x.py", 3),
        torch_cuda_initialized=None,
        exitcode=0,
        stdout="out",
        stderr="err",
        duration_s=0.5,
        python="3.11.7",
    )


def test_scan_result_round_trips_through_json():
    result = sample_result()
    document = json.loads(json.dumps(result.to_json()))
    assert document["schema"] == "diagtools.scan/1"
    assert ScanResult.from_json(document) == result


def test_json_is_deterministic():
    first = json.dumps(sample_result().to_json(), sort_keys=True)
    assert first == json.dumps(ScanResult.from_json(json.loads(first)).to_json(), sort_keys=True)


def test_foreign_documents_are_rejected():
    with pytest.raises(SchemaError, match=r"expected a diagtools\.scan/1 document, found schema 'other/2'"):
        ScanResult.from_json({"schema": "other/2"})
    with pytest.raises(SchemaError, match="found schema 'list'"):
        ScanResult.from_json([])


def test_lookups():
    result = sample_result()
    assert result.culprit.module == "pkg.leaf"
    assert result.module("pkg.leaf").parent == "pkg"
    assert result.module_names() == ("pkg", "pkg.leaf")
    assert not result.ok
    with pytest.raises(KeyError):
        result.module("absent")


def test_driver_description_says_which_driver():
    assert "simulated" in DriverInfo("simulated", "auto").describe()
    assert "real CUDA driver" in DriverInfo("real", "auto", "/usr/lib/libcuda.so.1").describe()
    assert DriverInfo("none", "none").describe() == "no CUDA driver"


@pytest.mark.parametrize(
    "error",
    [
        UsageError("bad target"),
        DriverBuildError("the simulated CUDA driver", "cc -shared", "fatal: no\n"),
        DriverUnavailableError("libcuda.so.1 did not load"),
        MissingExtraError("graphviz", "notebook"),
        SchemaError("diagtools.scan/1", "x"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_errors_pickle_and_print_actionably(error):
    clone = pickle.loads(pickle.dumps(error))
    assert type(clone) is type(error)
    assert str(clone) == str(error)
    assert "\n" not in str(error)


def test_missing_extra_prints_the_install_line():
    assert "pip install 'diagtools[notebook]'" in str(MissingExtraError("graphviz", "notebook"))


def test_evidence_is_a_word_and_an_older_documents_sentence_reads_as_it():
    culprit = Culprit(module="m", chain=("m",), site=None, stack=(), phase="import", evidence="trace")
    assert culprit.evidence is Evidence.TRACE
    old = {**culprit.to_json(), "evidence": "driver-hook, inferred from the CUDA runtime's export-table request"}
    assert Culprit.from_json(old).evidence is Evidence.INFERRED
    with pytest.raises(ValueError, match="not a valid Evidence"):
        Culprit(module="m", chain=(), site=None, stack=(), phase="import", evidence="a sentence of prose")
