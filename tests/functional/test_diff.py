"""diff: what the fix changed in the import tree, from two scan JSON files."""

from __future__ import annotations

import json
import re

from diagtools.model.diff import diff_scans
from diagtools.render.html import diff_html
from diagtools.specimens import get
from tests.conftest import cli


def test_diff_marks_the_removed_edge_and_the_verdict(sim_scan):
    specimen = get("common_ops")
    before = sim_scan(specimen.target, path=[specimen.tree("before")])
    after = sim_scan(specimen.target, path=[specimen.tree("after")])
    diff = diff_scans(before, after)
    assert diff.fixed
    assert diff.broken_edge == ("vmodels.common.ops", "vmodels.common.ops.fused_allreduce_rms_norm")
    assert ("vmodels.common.ops", "vmodels.common.ops.fused_allreduce_rms_norm") in diff.removed_edges
    assert {"vmodels.platforms", "vmodels.config", "cuda.bindings.driver"} <= set(diff.removed_modules)
    assert diff.summary().startswith("no longer initializes CUDA: the chain is broken at vmodels.common.ops")
    assert "<del>vmodels.platforms</del>" in diff_html(diff)
    reverse = diff_scans(after, before)
    assert "a regression" in reverse.summary()


def test_cli_diff_from_two_json_files(make_tree, tmp_path):
    specimen = get("deepseek_v4_ops")
    paths = []
    for variant in ("before", "after"):
        out = tmp_path / f"{variant}.json"
        done = cli(
            "scan", specimen.target, "--path", str(specimen.tree(variant)), "--driver", "simulated", "--json", str(out)
        )
        assert done.returncode == 0, done.stderr
        paths.append(str(out))
    html = tmp_path / "diff.html"
    done = cli("diff", *paths, "--html", str(html))
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stdout.split())  # lines wrap at 100 columns between words
    assert "no longer initializes CUDA: the chain is broken at deepseek_v4.nvidia.ops -> " in said
    long = [line for line in done.stdout.splitlines() if len(line) > 100]
    assert all(re.fullmatch(r" *\S+:\d+( in \S+)?", line) for line in long), long  # only a path alone, kept whole
    assert "sparse_attn_compress_cutedsl" in html.read_text()
    garbage = tmp_path / "garbage.json"
    garbage.write_text(json.dumps({"schema": "other"}))
    bad = cli("diff", str(garbage), paths[1])
    assert bad.returncode == 2
    assert bad.stderr.strip() == "diagtools: error: expected a diagtools.scan/1 document, found schema 'other'"
