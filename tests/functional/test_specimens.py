"""The built-in specimens: each before/ caught at the right module and line, each after/ clean."""

from __future__ import annotations

import pytest

from diagtools.specimens import all_specimens, get

CASES = [(s.name, v) for s in all_specimens() for v in s.variants]


@pytest.mark.parametrize(("name", "variant"), CASES, ids=[f"{n}/{v}" for n, v in CASES])
def test_specimen_behaves_as_its_story_says(sim_scan, name, variant):
    specimen = get(name)
    result = sim_scan(specimen.target, path=[specimen.tree(variant)])
    assert result.status == "ok", result.error
    if variant == "after" or specimen.culprit is None:
        assert not result.cuda_initialized
        assert result.culprits == ()
        return
    culprit = result.culprit
    assert culprit.module == specimen.culprit
    assert culprit.chain[0] == specimen.target
    assert culprit.phase == "import"
    assert specimen.site_text in culprit.site.source
    assert culprit.evidence == "driver-hook"


def test_deepseek_site_is_the_cuinit_line_inside_cutlass(sim_scan):
    specimen = get("deepseek_v4_ops")
    site = sim_scan(specimen.target, path=[specimen.tree("before")]).culprit.site
    assert site.file.endswith("cutlass/base_dsl/runtime/cuda.py")
    assert site.function == "get_compute_capability_major_minor"


def test_triton_site_is_the_cu_init_line_in_tritons_driver(sim_scan):
    specimen = get("triton_is_active")
    result = sim_scan(specimen.target, path=[specimen.tree("before")])
    assert result.culprit.site.file.endswith("triton/backends/nvidia/driver.py")
    assert result.culprit.site.function == "_cuda_driver_is_active"


def test_common_ops_chain_runs_through_the_reexport(sim_scan):
    specimen = get("common_ops")
    result = sim_scan(specimen.target, path=[specimen.tree("before")])
    assert result.culprit.chain == (
        "vmodels.common.ops",
        "vmodels.common.ops.fused_allreduce_rms_norm",
        "vmodels.config",
        "vmodels.platforms",
    )


def test_unknown_specimen_and_variant():
    with pytest.raises(KeyError, match="known: deepseek_v4_ops"):
        get("nope")
    with pytest.raises(ValueError, match="has no 'before' tree"):
        get("lazy_clean").tree("before")
