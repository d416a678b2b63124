"""The same attribution checks against the real CUDA driver, where one is present."""

from __future__ import annotations

import pytest

import diagtools
from diagtools.driver import real_driver_path
from diagtools.specimens import get

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(real_driver_path() is None, reason="no real libcuda.so.1 loads on this machine (no GPU driver)"),
]


def test_real_driver_is_used_and_reported():
    result = diagtools.scan("json", driver="real")
    assert result.driver.kind == "real"
    assert not result.cuda_initialized


@pytest.mark.parametrize("name", ["common_ops", "triton_is_active", "deepseek_v4_ops"])
def test_before_specimens_are_caught_on_the_real_driver(name):
    specimen = get(name)
    result = diagtools.scan(specimen.target, path=[specimen.tree("before")], driver="real")
    assert result.culprit.module == specimen.culprit
    assert specimen.site_text in result.culprit.site.source
    assert result.culprit.evidence in ("driver-hook", "trace")
    clean = diagtools.scan(specimen.target, path=[specimen.tree("after")], driver="real")
    assert not clean.cuda_initialized
