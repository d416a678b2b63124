"""No injection: target-controlled text cannot drive the terminal or break Markdown, HTML or SVG; sizes are capped."""

from __future__ import annotations

import re

import pytest

from diagtools.model.scan import Culprit, DriverInfo, ImportNode, ScanResult, Site
from diagtools.render.html import scan_html
from diagtools.render.postmortem import Postmortem, write_postmortem
from diagtools.render.text import render_scan, render_sweep
from diagtools.usecases.sweep import sweep
from tests.conftest import cli

ESC, BEL, CSI = "\x1b", "\x07", "\x9b"
HOSTILE = f"{ESC}]0;owned{BEL}{ESC}[2J{CSI}31m\u202e"  # no CR: Python source would end the line there
GPU_CALL = "ctypes.CDLL('libcuda.so.1').cuInit(0)"


def controls(text: str) -> list[str]:
    return re.findall(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e]", text)


@pytest.fixture
def hostile_root(tmp_path):
    root = tmp_path / f"src{HOSTILE}"
    (root / "evil").mkdir(parents=True)
    (root / "evil" / "__init__.py").write_text(
        f"import ctypes, sys\nsys.stdout.write({HOSTILE!r})\n{GPU_CALL}  # {HOSTILE}\n"
        f"raise RuntimeError({('message' + HOSTILE + chr(13) + 'fake line')!r})\n",
        encoding="utf-8",
    )
    return root


def test_the_cli_report_escapes_control_characters(hostile_root):
    done = cli("scan", "evil", "--path", str(hostile_root), "--driver", "simulated", "--stack", "--timeout", "60")
    assert done.returncode == 3, done.stderr
    assert "culprit: evil" in done.stdout
    assert controls(done.stdout) == []
    assert "\\x1b]0;owned\\x07" in done.stdout  # shown, not obeyed


def test_the_python_report_escapes_control_characters(sim_scan, hostile_root):
    result = sim_scan("evil", path=[hostile_root])
    assert result.culprit.site.source.endswith(HOSTILE)  # the data keeps the text; only the terminal view escapes
    assert controls(render_scan(result, stack=True)) == []
    assert controls(str(result)) == []


def test_sweep_rows_escape_control_characters(hostile_root):
    result = sweep("evil", path=[hostile_root], driver="simulated", timeout=60, jobs=1)
    assert controls(render_sweep(result)) == []


def culprit_result(source: str, file: str = "/src/pkg/mod.py") -> ScanResult:
    site = Site(file, 3, "<module>", source)
    culprit = Culprit("pkg.mod", ("pkg", "pkg.mod"), site, (site,), "import")
    nodes = (
        ImportNode("pkg", None, None, 0.1, 0.2),
        ImportNode("pkg.mod", "pkg", file, 0.1, 0.1, initializes_cuda=True),
    )
    return ScanResult(("pkg",), "ok", DriverInfo("simulated", "simulated"), True, nodes, (culprit,))


def test_markdown_fences_outlast_backticks_in_source(tmp_path):
    source = "x = 1  # ``` closing fence? ```` longer"
    _, markdown = write_postmortem(tmp_path, Postmortem("report", culprit_result(source)))
    whole = markdown.read_text(encoding="utf-8")
    summary = next(row for row in whole.splitlines() if row.startswith("- **The line to change:**"))
    assert "````` x = 1  # ``` closing fence? ```` longer `````" in summary  # inline code outlasts the backticks too
    text = whole[whole.index("## Root cause") :]
    line = next(row for row in text.splitlines() if "closing fence?" in row)
    opening = [row for row in text[: text.index(line)].splitlines() if row.startswith("```")][-1]
    fence = re.match(r"`+", opening).group()
    assert len(fence) >= 5
    assert fence + "\n" in text[text.index(line) :]


def test_html_and_svg_stay_escaped():
    html = scan_html(culprit_result("<script>alert(1)</script>", file="/src/<img src=x onerror=alert(1)>.py"))
    assert "<script>" not in html
    assert "<img src=x" not in html
    assert "&lt;script&gt;" in html


def test_long_source_lines_messages_and_deep_stacks_are_capped(sim_scan, make_tree):
    long_line = "x = 1  # " + "y" * 50_000
    root = make_tree(
        {
            "deep.py": "import ctypes\n"
            "def down(n):\n"
            "    if n == 0:\n"
            f"        {GPU_CALL}; {long_line}\n"
            "    else:\n"
            "        down(n - 1)\n"
            "down(500)\n"
            "raise ValueError('m' * 100_000)\n"
        }
    )
    result = sim_scan("deep", path=[root])
    culprit = result.culprit
    assert len(culprit.site.source) < 2100
    assert "[truncated: " in culprit.site.source
    assert len(culprit.stack) == 200
    assert culprit.stack_dropped > 300
    assert culprit.stack[-1].function == "down"  # the innermost frames are the ones kept
    assert len(result.error.message) < 2100
    assert "[truncated: " in result.error.message
    assert len(result.error.traceback) < 100_000
    round_trip = ScanResult.from_json(result.to_json())
    assert round_trip.culprit.stack_dropped == culprit.stack_dropped
