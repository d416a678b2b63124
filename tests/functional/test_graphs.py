"""Graphs: the culprit highlighted with its line, chains marked, escaping, stable DOT, big trees."""

from __future__ import annotations

import time

import pytest

from diagtools.model.diff import diff_scans
from diagtools.render.graph import scan_graph
from diagtools.specimens import get
from tests.conftest import require, require_installed

graphviz = require("graphviz", "notebook")


@pytest.fixture
def common_ops(sim_scan):
    specimen = get("common_ops")
    return (
        sim_scan(specimen.target, path=[specimen.tree("before")]),
        sim_scan(specimen.target, path=[specimen.tree("after")]),
    )


def node_line(dot: str, name: str) -> str:
    return next(
        line
        for line in dot.splitlines()
        if line.strip().startswith(f'"{name}" [') or line.strip().startswith(f"{name} [")
    )


def test_culprit_node_is_highlighted_with_its_site_line(common_ops):
    before, _ = common_ops
    dot = before.to_dot()
    culprit = node_line(dot, "vmodels.platforms")
    assert "class=culprit" in culprit
    assert 'fillcolor="#d62728"' in culprit
    assert "platforms.py:8: (status,) = driver.cuInit(0)" in dot
    assert "class=chain" in node_line(dot, "vmodels.config")
    assert (
        '"vmodels.config" -> "vmodels.platforms" [label="config.py:5: '
        'from vmodels.platforms import current_platform" class=chain'
    ) in dot
    svg = before.graph().pipe(format="svg").decode()
    assert 'class="node culprit"' in svg


def test_dot_is_deterministic(common_ops, sim_scan):
    before, _ = common_ops
    specimen = get("common_ops")
    again = sim_scan(specimen.target, path=[specimen.tree("before")])
    strip = lambda dot: "\n".join(line for line in dot.splitlines() if " ms" not in line)  # noqa: E731
    assert strip(before.to_dot()) == strip(again.to_dot())


def test_clean_scan_graph_has_no_culprit(common_ops):
    _, after = common_ops
    dot = after.to_dot()
    assert "class=culprit" not in dot
    assert "does not initialize CUDA" in dot


def test_diff_graph_marks_the_removed_edge(common_ops):
    before, after = common_ops
    dot = diff_scans(before, after).graph().source
    edge = next(
        line
        for line in dot.splitlines()
        if '"vmodels.common.ops" -> "vmodels.common.ops.fused_allreduce_rms_norm"' in line
    )
    assert "class=removed" in edge
    assert "label=removed" in edge
    assert dot.count('"vmodels.common.ops" -> "vmodels.common.ops.fused_allreduce_rms_norm"') == 1
    assert "class=removed" in node_line(dot, "vmodels.platforms")
    assert "diff: no longer initializes CUDA" in dot


def test_markup_in_module_names_and_source_lines_is_escaped(sim_scan, make_tree):
    evil = "x<img src=x onerror=alert(1)>"
    root = make_tree(
        {
            "host.py": f"import importlib\nM = importlib.import_module({evil!r})\n",
            f"{evil}.py": "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)  # <script>alert(2)</script>\n",
        }
    )
    result = sim_scan("host", path=[root])
    assert result.culprit.module == evil
    svg = result.graph().pipe(format="svg").decode()
    assert "<img" not in svg
    assert "<script>" not in svg
    assert "&lt;img src=x onerror=alert(1)&gt;" in svg
    html = result._repr_html_()
    assert "<img src=x" not in html
    assert "<script>alert(2)" not in html


def test_torch_culprits_view_stays_small_and_fast(sim_scan):
    require_installed("torch", "kernels")  # never import torch here: the test process stays CUDA-free
    result = sim_scan("torch", timeout=120.0)
    started = time.perf_counter()
    svg = result.graph().pipe(format="svg")
    elapsed = time.perf_counter() - started
    assert svg.count(b'class="node') < 60
    assert len(result.modules) > 300
    assert elapsed < 10  # the benchmark records the real figure; this only catches a runaway layout


def test_unknown_view_is_a_usage_error(common_ops):
    from diagtools.errors import UsageError

    with pytest.raises(UsageError, match="unknown graph view"):
        scan_graph(common_ops[0], "sideways")


def test_chain_edges_carry_their_import_lines_and_the_users_line(sim_scan):
    specimen = get("third_party_init")
    dot = sim_scan(specimen.target, path=[specimen.tree("before")]).to_dot()
    assert (
        '"ringllm.layers" -> "ringllm.layers.quant_fusion" '
        '[label="line to change: __init__.py:3: from .quant_fusion import fused_rms_quant"'
    ) in dot  # the nearest verified cut
    assert '"ringllm.layers.quant_fusion" -> jitkern [label="quant_fusion.py:3: from jitkern import rmsnorm"' in dot
    assert 'jitkern -> "jitkern.jit.env" [label="__init__.py:3: from jitkern.jit.env import CONTEXT"' in dot
    assert "env.py:11: if cuda.cuInit(0) != 0:" in node_line(dot, "jitkern.jit.env")
