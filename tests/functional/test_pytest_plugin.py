"""The regression guard, run as pytest itself runs: a generated test file in a subprocess."""

from __future__ import annotations

import textwrap

from diagtools.specimens import get

SPECIMEN = get("common_ops")


def write_tests(pytester, body: str) -> None:
    pytester.makepyfile(test_guard=textwrap.dedent(body))


def test_helper_fails_before_with_culprit_chain_and_site_and_passes_after(pytester):
    write_tests(
        pytester,
        f"""
        from diagtools.pytest_plugin import assert_import_cuda_free

        def test_before():
            assert_import_cuda_free("vmodels.common.ops", path=[{str(SPECIMEN.tree("before"))!r}], driver="simulated")

        def test_after():
            assert_import_cuda_free("vmodels.common.ops", path=[{str(SPECIMEN.tree("after"))!r}], driver="simulated")
        """,
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    output = result.stdout.str()
    assert "importing vmodels.common.ops initialized CUDA" in output
    assert "culprit: vmodels.platforms" in output
    assert "chain: vmodels.common.ops -> vmodels.common.ops.fused_allreduce_rms_norm" in output
    assert "platforms.py:8 in __init__" in output
    assert "driver.cuInit(0)" in output


def test_marker_checks_before_the_test_body_runs(pytester):
    write_tests(
        pytester,
        f"""
        import pytest

        @pytest.mark.cuda_free("vmodels.common.ops", path=[{str(SPECIMEN.tree("before"))!r}], driver="simulated")
        def test_marked():
            raise RuntimeError("the body must not run")

        @pytest.mark.cuda_free("vmodels.common.ops", path=[{str(SPECIMEN.tree("after"))!r}], driver="simulated")
        def test_clean():
            pass
        """,
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    assert "the body must not run" not in result.stdout.str()
    assert "culprit: vmodels.platforms" in result.stdout.str()


def test_ini_option_makes_one_item_per_module(pytester):
    after = SPECIMEN.tree("after")
    pytester.makeini(
        f"""
        [pytest]
        cuda_free_modules =
            vmodels.common.ops
            vmodels.platforms
        cuda_free_path = {after}
        cuda_free_driver = simulated
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=1, failed=1)
    output = result.stdout.str()
    assert "cuda_free[vmodels.common.ops] PASSED" in output
    assert "cuda_free[vmodels.platforms] FAILED" in output
    assert "culprit: vmodels.platforms" in output


def test_a_target_that_cannot_import_fails_with_the_reason(pytester):
    write_tests(
        pytester,
        """
        from diagtools.pytest_plugin import assert_import_cuda_free

        def test_missing():
            assert_import_cuda_free("no_such_module_abc", driver="simulated")
        """,
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    assert "could not be imported in a fresh subkernel (import-error)" in result.stdout.str()
