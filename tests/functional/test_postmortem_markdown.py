"""postmortem.md as GitHub shows it: rendered by a CommonMark renderer, from a real analysis of a specimen."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import diagtools
from diagtools.specimens import get
from tests.conftest import require

markdown_it = require("markdown_it", "dev")
require("graphviz", "notebook")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def postmortem_md(tmp_path_factory) -> tuple[str, str, Path]:
    specimen = get("common_ops")
    before = diagtools.scan(specimen.target, path=[specimen.tree("before")], driver="simulated")
    after = diagtools.scan(specimen.target, path=[specimen.tree("after")], driver="simulated")
    replay = diagtools.compare_replays(
        specimen.target, before=specimen.tree("before"), after=specimen.tree("after"), driver="simulated"
    )
    out = tmp_path_factory.mktemp("postmortem")
    cpu_rows = [{"size": "G=64 D=512", "backend": "cpu-only-backend", "median_ms": 12.5, "GB/s": 0.01}]
    files = diagtools.postmortem(before, after, replay=replay, out=out, bench_rows=cpu_rows, bench_device="cpu")
    text = files.markdown.read_text(encoding="utf-8")
    return text, markdown_it.MarkdownIt("commonmark").render(text), out


def test_dunder_names_render_literally(postmortem_md):
    _, html, _ = postmortem_md
    prose = re.sub(r"<pre>.*?</pre>|<code>.*?</code>", "", html, flags=re.DOTALL)
    assert "__init__" in prose
    assert "__getattr__" in prose
    assert "<strong>init</strong>" not in html
    assert "<strong>getattr</strong>" not in html


def test_the_chain_is_a_mermaid_block_and_the_svg_is_named_not_embedded(postmortem_md):
    """Pasted into an issue, a relative image breaks: the Mermaid block is the graph there."""
    text, html, out = postmortem_md
    block = re.search(r'<pre><code class="language-mermaid">(.*?)</code></pre>', html, re.DOTALL)
    assert block is not None, html[:2000]
    assert "graph LR" in block.group(1)
    assert "vmodels.platforms" in block.group(1)
    assert "<img" not in html
    assert "`postmortem-graph.svg` beside this file" in text
    assert (out / "postmortem-graph.svg").is_file()


def test_no_line_ends_in_whitespace(postmortem_md):
    text, _, _ = postmortem_md
    assert [n for n, line in enumerate(text.splitlines(), 1) if line != line.rstrip()] == []


def test_no_local_path_and_no_cpu_timing_table(postmortem_md):
    text, _html, out = postmortem_md
    for local in (str(ROOT), str(out), "/tmp/", os.path.expanduser("~") + "/", ".cache/diagtools"):
        assert local not in text, local
    assert "cpu-only-backend" not in text  # CPU times mean nothing in a postmortem
    assert "CPU only" in text


def test_the_line_to_change_is_said_once_and_the_verdict_is_the_replays(postmortem_md):
    text, _, _ = postmortem_md
    line = next(row for row in text.splitlines() if row.startswith("- **The line to change:**"))
    assert "platforms.py:" in line
    assert "(via" not in line
    assert "Reproduced: before/fork fails; fixed: after passes fork and spawn" in text
