"""Presentation rules without a kernel or a subprocess: ordering, paths, text, colour, graph view, postmortem."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from diagtools import protocol
from diagtools.frontends.progress import Stopwatch
from diagtools.model.diff import diff_scans
from diagtools.model.replay import ChildOutcome, ParentState, ReplayComparison, ReplayResult
from diagtools.model.scan import Culprit, DriverInfo, ImportNode, ScanResult, Site
from diagtools.model.sweep import SweepResult, SweepRow
from diagtools.render.graphview import graph_view_html, node_details, prepare_svg
from diagtools.render.html import comparison_html
from diagtools.render.ordering import group_modules, is_stdlib, picker_options
from diagtools.render.paths import display_path, import_roots, shareable
from diagtools.render.run_text import user_site
from diagtools.render.text import paint, render_diff, text_table, use_color
from tests.conftest import require

ROOT = "/tmp/work/src"
DRIVER = DriverInfo("simulated", "auto", "/root/.cache/diagtools/simdriver/x/libcuda.so.1")


def node(name: str, parent: str | None, file: str | None = None) -> ImportNode:
    if file is None and not is_stdlib(name):
        file = f"{ROOT}/{name.replace('.', '/')}.py"
    return ImportNode(name, parent, file, 0.001, 0.002)


def result(names: list[tuple[str, str | None]], *, culprit: bool = True) -> ScanResult:
    site = Site(f"{ROOT}/pkg/leaf.py", 4, "probe", "lib.cuInit(0)")
    chain = ("pkg", "pkg.ops", "pkg.leaf")
    return ScanResult(
        targets=("pkg",),
        status="ok",
        driver=DRIVER,
        cuda_initialized=culprit,
        modules=tuple(node(n, p) for n, p in names),
        culprits=(Culprit("pkg.leaf", chain, site, (site,), "import"),) if culprit else (),
    )


BEFORE = [
    ("pkg", None),
    ("_ast", "pkg"),
    ("_bz2", "pkg"),
    ("pkg.ops", "pkg"),
    ("pkg.aaa", "pkg"),
    ("cuda", "pkg.ops"),
    ("cuda.bindings", "cuda"),
    ("numpy", "pkg.ops"),
    ("pkg.leaf", "pkg.ops"),
    ("json", "pkg.leaf"),
]


def test_groups_put_the_chain_first_then_the_own_package_and_collapse_the_rest():
    groups = group_modules([n for n, _ in BEFORE], targets=("pkg",), chain=("pkg", "pkg.ops", "pkg.leaf"))
    assert groups.chain == ("pkg", "pkg.ops", "pkg.leaf")
    assert groups.own == ("pkg.aaa",)
    assert groups.others == (("cuda", ("cuda", "cuda.bindings")), ("numpy", ("numpy",)))
    assert groups.stdlib == ("_ast", "_bz2", "json")
    assert groups.total == len(BEFORE)


def test_module_picker_offers_the_culprit_its_chain_and_the_own_package():
    scan = result(BEFORE)
    assert picker_options(scan) == ["pkg.leaf", "pkg", "pkg.ops", "pkg.aaa"]
    everything = picker_options(scan, everything=True)
    assert sorted(everything) == sorted(n for n, _ in BEFORE)
    assert everything[-3:] == ["_ast", "_bz2", "json"]


def test_diff_text_counts_every_module_once_and_collapses_the_standard_library():
    before, after = result(BEFORE), result([("pkg", None)], culprit=False)
    text = render_diff(diff_scans(before, after), limit=1)
    assert "modules no longer imported: 9" in text
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.strip().startswith("- "))
    assert lines[first].strip() == "- pkg.ops  (culprit chain)"
    assert "- cuda.*: 2 modules" in text
    assert "- ... 1 more packages, 1 modules" in text
    assert "- standard library: 3 modules (_ast, _bz2, json)" in text
    assert "_ast" not in text.split("standard library")[0]


def test_paths_are_shown_relative_and_never_under_tmp_or_the_cache():
    scan = result(BEFORE)
    assert import_roots(scan) == (ROOT,)
    assert display_path(f"{ROOT}/pkg/leaf.py", import_roots(scan)) == "pkg/leaf.py"
    assert display_path(str(Path.home() / "elsewhere" / "x.py")) == "~/elsewhere/x.py"
    assert display_path(str(Path(__file__))) == "tests/unit/test_presentation.py"  # the repository's own file
    shared = shareable(scan)
    text = json.dumps(shared.to_json())
    assert "/tmp" not in text
    assert ".cache" not in text
    assert shared.culprit.site.file == "pkg/leaf.py"


def test_tables_put_numbers_right_and_text_left():
    lines = text_table(["name", "ms"], [["a", 1.5], ["longer", 12.25]])
    assert lines == ["name       ms", "a         1.5", "longer  12.25"]


def test_colour_follows_the_terminal_and_no_color():
    assert use_color(True, {})
    assert not use_color(False, {})
    assert not use_color(True, {"NO_COLOR": "1"})
    assert use_color(False, {"FORCE_COLOR": "1"})
    painted = paint("  CUDA initialized: YES (during import)\n  CUDA initialized: no\n  status: timeout")
    assert "\x1b[31mCUDA initialized: YES\x1b[0m" in painted
    assert "\x1b[32mCUDA initialized: no\x1b[0m" in painted
    assert "\x1b[33mtimeout\x1b[0m" in painted
    assert "\x1b[31m" not in paint("does not initialize CUDA; CUDA not initialized; no longer initializes CUDA")


def replay(variant_failed: bool, method: str) -> ReplayResult:
    child = (
        ChildOutcome("failed", 1, error_type="DriverCallError", error="cuInit(0) failed")
        if variant_failed
        else ChildOutcome("ok", 0, detail="1 device(s)")
    )
    return ReplayResult(
        "pkg", (), "cuinit", method, DRIVER, "failed" if variant_failed else "ok", ParentState(variant_failed), child
    )


def test_replay_results_print_as_text_with_a_short_verdict():
    comparison = ReplayComparison(
        "pkg",
        (
            ("before", replay(True, "fork")),
            ("before", replay(False, "spawn")),
            ("after", replay(False, "fork")),
            ("after", replay(False, "spawn")),
        ),
    )
    text = str(comparison)
    headline = "Reproduced: before/fork fails; fixed: after passes fork and spawn"
    assert comparison.headline() == headline
    assert f"  {headline}" in text.splitlines()
    assert "verdict (after the fix)" not in text
    assert "clean (after the fix)" not in text
    assert all(len(line) <= 100 for line in text.splitlines()), text
    painted = paint(text)
    assert "\x1b[31mReproduced: before/fork fails\x1b[0m" in painted
    assert "\x1b[32mfixed: after passes fork and spawn\x1b[0m" in painted
    html = comparison_html(comparison)
    assert html.count(headline.split(";", maxsplit=1)[0]) == 1
    assert '<span class="bad">Reproduced: before/fork fails</span>' in html
    assert '<span class="good">fixed: after passes fork and spawn</span>' in html
    assert "Verdict:" not in html
    assert "(after the fix)" not in html
    assert str(comparison.runs[0][1]).startswith("diagtools replay pkg --start-method fork")


def test_sweep_results_print_as_a_table():
    rows = (
        SweepRow("pkg.a", "ok", False, None, 0.5),
        SweepRow("pkg.bbbb", "ok", True, result(BEFORE).culprit, 12.0),
    )
    text = str(SweepResult("pkg", rows, seconds=1.0))
    lines = text.splitlines()
    assert lines[1].startswith("pkg.bbbb  YES")  # culprits first
    assert re.search(r"\b12\.000  ok", lines[1])
    assert re.search(r"\s 0\.500  ok", lines[2])
    assert lines[-1].startswith("2 modules: 1 initialize CUDA")


def test_sweep_rows_fit_100_columns_and_zero_failures_are_not_amber():
    deep = "/home/someone/projects/" + "very-long-folder-name/" * 6
    site = Site(f"{deep}pkg/leaf.py", 4, "probe", "lib.cuInit(0)")
    culprit = Culprit("pkg.leaf", ("pkg", "pkg.leaf"), site, (site,), "import", module_site=site)
    rows = (
        SweepRow("pkg.leaf", "ok", True, culprit, 0.5),
        *(SweepRow(f"pkg.leaf.sub{i}", "ok", True, culprit, 0.1, cuda_source="parent") for i in range(3)),
    )
    text = str(SweepResult("pkg", rows, seconds=1.0))
    assert all(len(line) <= 100 for line in text.splitlines()), text
    assert text.count(deep[:30]) <= 1  # the absolute path is not repeated on every row
    assert "leaf.py:4" in text.splitlines()[1]  # the middle goes, the file and its line stay
    assert sum(line.rstrip().endswith("(inherited from pkg)") for line in text.splitlines()) == 3
    painted = paint(text)
    assert "0 failed" in text
    assert "\x1b[33mfailed" not in painted


SVG = (
    '<?xml version="1.0"?>\n<svg width="200pt" height="100pt" viewBox="0.00 0.00 200.00 100.00" '
    'xmlns="http://www.w3.org/2000/svg"><g id="graph0" class="graph"><g id="node1" class="node culprit">'
    '<title>pkg.leaf</title><text>pkg.leaf</text></g><g id="node2" class="node"><title>x&lt;y</title></g></g></svg>'
)


def test_graph_view_is_self_contained_and_escapes_what_it_embeds():
    prepared = prepare_svg(SVG, "p1")
    assert prepared.startswith('<svg width="200.00" height="100.00"')
    assert 'id="p1-node1"' in prepared
    details = {"pkg.leaf": {"file": "</script><script>alert(1)</script>"}, "x<y": {"file": "a"}, "gone": {}}
    html = graph_view_html(SVG, details, selected="pkg.leaf")
    assert html.count("<script") == 2
    assert "alert(1)</script>" not in html
    payload = re.search(r'class="dtg-data">(.*?)</script>', html).group(1)
    assert set(json.loads(payload)) == {"pkg.leaf", "x<y"}
    assert "http" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "").replace("http://www.w3.org/", "")
    assert 'data-selected="pkg.leaf"' in html


def test_node_details_carry_the_culprit_line_and_stack_with_relative_paths():
    details = node_details(result(BEFORE))
    assert details["pkg.leaf"]["CUDA initialized at"] == "pkg/leaf.py:4: lib.cuInit(0)"
    assert "initialized in" not in details["pkg.leaf"]
    assert "line to change" not in details["pkg.leaf"]  # no cut was searched: no line to change is claimed
    assert details["pkg.leaf"]["stack"] == ["pkg/leaf.py:4 in probe"]
    assert details["pkg"]["file"] == "pkg.py"


def test_stopwatch_names_phases_by_subkernel_call():
    now = [100.0]
    watch = Stopwatch(clock=lambda: now[0])
    watch.start("starting")
    run = watch.phased(lambda request: request * 2, ["first", "second"])
    assert run(2) == 4
    assert watch.current == "first"
    run(1)
    run(1)
    now[0] = 102.5
    assert watch.line() == "subkernel 3 (2.5 s)"
    assert watch.stop() == pytest.approx(2.5)


def test_postmortem_markdown_is_paste_ready(tmp_path):
    require("graphviz", "notebook")
    from diagtools.render.postmortem import postmortem

    before = result(BEFORE)
    after = replace(result([("pkg", None), ("pkg.ops", "pkg")], culprit=False), started_at="2")
    html_path, md_path = postmortem(before, after, out=tmp_path)
    markdown = md_path.read_text()
    order = [markdown.index(f"## {heading}") for heading in ("Summary", "Root cause", "Timeline of the analysis")]
    assert order == sorted(order)
    for heading in ("What broke", "The line to change", "The fix", "The guard"):
        assert f"**{heading}:**" in markdown
    assert "Import the leaf lazily" in markdown
    assert "free of heavy re-exports" in markdown
    assert "```dot" not in markdown
    assert "/tmp" not in markdown
    assert ".cache" not in markdown
    assert "/tmp" not in html_path.read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)
    for image in images:
        assert (tmp_path / image).read_text().lstrip().startswith("<?xml")
    assert "the analysis, not the incident" in markdown


def test_postmortem_says_the_impact_and_the_incidents_timeline(tmp_path):
    require("graphviz", "notebook")
    from diagtools.model.bisect import BisectResult
    from diagtools.render.postmortem import postmortem

    before = result(BEFORE)
    after = replace(result([("pkg", None), ("pkg.ops", "pkg")], culprit=False), started_at="2")
    runs = (("before", replay(True, "fork")), ("before", replay(False, "spawn")))
    runs += (("after", replay(False, "fork")), ("after", replay(False, "spawn")))
    found = BisectResult("pkg", "a" * 40, "c" * 40, "b" * 40, "Re-export the ops", ("pkg/__init__.py",), None, ())
    html_path, md_path = postmortem(before, after, replay=ReplayComparison("pkg", runs), bisect=found, out=tmp_path)
    markdown = md_path.read_text()
    impact = markdown[markdown.index("## Impact") : markdown.index("## Timeline of the incident")]
    assert "a child started with fork after importing `pkg` (before): `DriverCallError: cuInit(0) failed`" in impact
    assert "After the fix (after): every child works." in impact
    assert "EngineCore" in impact
    incident = markdown[markdown.index("## Timeline of the incident") : markdown.index("## How to fix")]
    assert incident.index(f"commit {'a' * 12}") < incident.index(f"commit {'b' * 12}") < incident.index("the fix")
    assert "first bad commit: `Re-export the ops`" in incident
    assert "--fail-on-cuda" in incident
    fix = markdown[markdown.index("## The fix") : markdown.index("## Root cause")]
    assert "```diff" in fix or "No change to show yet" in fix
    assert "<h2>Impact</h2>" in html_path.read_text()
    assert "<h2>Timeline of the incident</h2>" in html_path.read_text()
    alone = postmortem(before, out=tmp_path / "alone").markdown.read_text()
    assert "## Timeline of the incident" not in alone  # neither a bisect nor a fix: no incident to tell
    assert "Not replayed in this analysis" in alone


def test_postmortem_is_public_and_lazy():
    import diagtools

    assert "postmortem" in diagtools.__all__
    assert callable(diagtools.postmortem)


def test_every_view_headlines_the_verified_cut_and_names_where_cuda_was_initialized():
    from diagtools.model.cuts import Cut, CutSearch, Edge

    library = Site(f"{ROOT}/libdsl/cuda.py", 163, "get_arch", "cuInit(0)")
    own = Site(f"{ROOT}/pkg/leaf.py", 4, "<module>", "import libdsl")
    reexport = Site(f"{ROOT}/pkg/ops.py", 2, "<module>", "from .leaf import kernel")
    culprit = Culprit(
        "pkg.leaf",
        ("pkg", "pkg.ops", "pkg.leaf"),
        library,
        (reexport, own, library),
        "import",
        module_site=own,
        chain_imports=(None, None, reexport),
    )
    plain = result(BEFORE)
    modules = tuple(replace(n, initializes_cuda=n.name == "pkg.leaf") for n in plain.modules)
    edge = Edge("pkg.ops", "pkg.leaf", reexport)
    cuts = CutSearch(nearest=Cut("nearest", (edge,)), deepest=Cut("deepest", (edge,)))
    scan = replace(plain, culprits=(culprit,), modules=modules, cuts=cuts)
    assert scan.line_to_change == reexport
    leaf = node_details(scan)["pkg.leaf"]
    assert leaf["CUDA initialized at"] == "pkg/leaf.py:4: import libdsl"
    assert leaf["initialized in"].endswith("cuda.py:163: cuInit(0)")
    assert node_details(scan)["pkg.ops"]["line to change"].startswith("pkg/ops.py:2: from .leaf import kernel")
    from diagtools.render.graph import scan_graph
    from diagtools.render.html import scan_html
    from diagtools.render.text import render_scan

    text = render_scan(scan)
    assert (
        text.index("line to change (the nearest verified cut)")
        < text.index("ops.py:2")
        < text.index("CUDA initialized at")
        < text.index("leaf.py:4")
        < text.index("initialized in:")
        < text.index("cuda.py:163")
    )
    require("graphviz", "notebook")
    source = scan_graph(scan).source
    assert "line to change: ops.py:2" in source
    assert "leaf.py:4: import libdsl" in source
    assert "cuda.py:163" not in source
    html = scan_html(scan)
    assert (
        html.index("Line to change")
        < html.index("ops.py")
        < html.index("CUDA initialized at")
        < html.index("Initialized in")
    )
    unsearched = replace(scan, cuts=None)
    assert unsearched.line_to_change is None
    assert "line to change: none verified (no cut was searched: diagtools fix pkg verifies one)" in render_scan(
        unsearched
    )
    assert "Line to change: none verified (no cut was searched" in scan_html(unsearched)
    assert "CUDA initialized at" in scan_html(unsearched)


def test_long_paths_lose_their_middle_never_their_file_name():
    from diagtools.render.html import path_html
    from diagtools.render.paths import short_path

    path = "diagtools/specimens/common_ops/before/vmodels/platforms.py"
    assert short_path(path, 50) == "diagtools/\u2026/common_ops/before/vmodels/platforms.py"
    assert short_path("a/" + "b" * 70 + ".py").endswith("bbb.py")
    assert len(short_path("a/" + "b" * 70 + ".py")) <= 56
    html = path_html(path, 8)
    assert 'title="diagtools/specimens/common_ops/before/vmodels/platforms.py:8"' in html  # the whole path on hover
    assert "platforms.py:8</code>" in html


def test_the_child_failure_shows_the_users_frames_and_the_drivers_answer_only():
    from diagtools.model.replay import user_traceback

    traceback = (
        "Traceback (most recent call last):\n"
        '  File "/x/diagtools/agents/replay_child.py", line 130, in run_child\n'
        "    outcome.update(status='ok', detail=_resolve(action)(calls))\n"
        "                                       ^^^^^^^^^^^^^^^^^^^^^^^\n"
        '  File "/src/acts.py", line 2, in act\n'
        "    lib.cuInit(0)\n"
        "    ~~~~~~~~~~^^^\n"
        "diagtools.agents.replay_child.DriverCallError: cuInit(0) failed with CUDA_ERROR_NOT_INITIALIZED (3)\n"
    )
    shown = user_traceback(traceback)
    assert shown.splitlines() == [
        "Traceback (most recent call last):",
        '  File "/src/acts.py", line 2, in act',
        "    lib.cuInit(0)",
        "DriverCallError: cuInit(0) failed with CUDA_ERROR_NOT_INITIALIZED (3)",
    ]


HOSTILE_NAMES = [
    "a\nclick n0 call alert(1)",
    "b%%comment",
    "c]-->x[",
    'd"quoted"',
    "e|pipe|",
    "f;#35;g",
    "h\r\ti\u2028j",
    "k`<script>`",
]


@pytest.mark.parametrize("hostile", HOSTILE_NAMES)
def test_a_hostile_name_stays_inside_its_mermaid_label(hostile):
    from diagtools.render.postmortem import _mermaid_chain

    site = Site(f"/src/{hostile}.py", 3, "<module>", "import x")
    culprit = Culprit(
        module=hostile,
        chain=("app", hostile, "vmodels.platforms"),
        site=site,
        stack=(),
        phase="import",
        chain_imports=(None, site, site),
    )
    block = _mermaid_chain(culprit)
    lines = block.splitlines()
    assert lines[0] == "graph LR"
    statement = re.compile(
        r'    (n\d+\["[^"\n\]\[|%]*"\]|n\d+ -->(\|[^|"\n\]\[%]*\|)? n\d+|style n\d+ fill:#d62728,color:#fff)'
    )
    assert len(lines) == 1 + 3 + 2 + 1, block
    for line in lines[1:]:
        assert statement.fullmatch(line), line


def test_one_rule_says_whose_code_a_file_is_and_the_fork_line_is_the_users():
    stdlib = f"{sys.base_prefix}/lib/python3.11/multiprocessing/popen_fork.py"
    library = "/env/lib/python3.11/site-packages/vllm/executor.py"
    assert [protocol.file_kind(f) for f in ("/home/me/app.py", library, stdlib, "<string>", "")] == [
        "user",
        "installed",
        "stdlib",
        "generated",
        "generated",
    ]
    user, installed, forked = (
        Site("/home/me/app.py", 3, "<module>"),
        Site(library, 10, "start"),
        Site(stdlib, 66, "_launch"),
    )
    assert user_site((user, installed, forked)) == user  # not the library frame below it
    assert user_site((installed, forked)) == installed
    assert user_site((forked,)) == forked


def test_marks_only_inside_a_coloured_render_and_only_with_its_own_key():
    from diagtools.model.verdict import Tone
    from diagtools.render.style import coloured, toned, visible_len

    assert toned("CUDA initialized: YES", Tone.BAD) == "CUDA initialized: YES"  # files, JSON and HTML: no marks
    forged = "\ue000" + "0" * 16 + "bad\ue001clean"  # a name that copies the mark's shape, not its key
    with coloured() as styling:
        text = f"{toned('YES', Tone.BAD)} {forged} {toned('clean', Tone.GOOD)}"
    assert styling is not None
    shown = styling.ansi(text)
    assert shown == f"\x1b[31mYES\x1b[0m {forged} \x1b[32mclean\x1b[0m"
    assert visible_len(text) == len(f"YES {forged} clean") - len(forged) + len("clean")
    with coloured(False) as off:
        assert off is None
        assert toned("no", Tone.GOOD) == "no"


def test_a_sweep_never_cuts_a_name_what_does_not_fit_goes_below_its_row():
    long_module = "pkg." + "a_long_package_name_segment." * 2 + "leaf"
    site = Site("/src/pkg/leaf.py", 4, "probe", "lib.cuInit(0)")
    culprit = Culprit(long_module, ("pkg", long_module), site, (site,), "import", module_site=site)
    rows = (
        SweepRow(long_module, "ok", True, culprit, 0.5),
        SweepRow("pkg.broken", "import-error", False, None, 0.1, error="ImportError: " + "a long message " * 8),
        *(SweepRow(f"pkg.sibling_module_number_{i}", "ok", True, culprit, 0.1) for i in range(8)),
    )
    lines = str(SweepResult("pkg", rows, seconds=1.0)).splitlines()
    assert all(len(line) <= 100 for line in lines), lines
    names = [word for line in lines for word in line.replace(",", " ").split() if word.startswith("pkg.")]
    assert long_module in names  # whole, wherever it is shown
    cut = [name for name in names if name != long_module and long_module.startswith(name.rstrip("\u2026"))]
    assert not cut, cut
    broken = next(index for index, line in enumerate(lines) if line.startswith("pkg.broken"))
    assert lines[broken + 1].startswith("    ImportError: a long message")  # its detail on its own line
    reached = next(line for line in lines if "reached by" in line)
    assert reached.rstrip().endswith(("more", "(in the table above)")), reached
    if ": " in reached:
        assert all(part.strip().startswith(("pkg.", "...")) for part in reached.split(": ", 1)[1].split(","))
    title = next(index for index, line in enumerate(lines) if line.startswith("  1. "))
    assert lines[title] == f"  1. {long_module}: `lib.cuInit(0)`"  # the module once: it is its own initializer


def test_a_zygote_sweeps_preload_and_notes_wrap_between_names():
    preload = tuple(f"vllm.model_executor.layers.part_{i}" for i in range(14))
    note = "learned from 24 children: " + ", ".join(preload[:6]) + " (each checked clean in the zygote)"
    result = SweepResult("vllm", (), seconds=1.0, mode="zygote", preload=preload, preload_notes=(note,))
    lines = str(result).splitlines()
    assert all(len(line) <= 100 for line in lines), lines
    words = {word.strip(",;()") for line in lines for word in line.split()}
    assert set(preload) <= words  # every name whole, on one line or the next


def test_a_graph_label_breaks_a_long_import_between_names_never_inside_one():
    from diagtools.render.graph import _short

    names = ["fused_allreduce_rms_norm", "fused_allreduce_rms_norm_quant", "fused_allreduce_static_group_launcher"]
    label = _short(Site("/src/ops/__init__.py", 3, "<module>", f"from .fused import {', '.join(names)}"))
    lines = label.split("\n")
    assert lines[0].startswith("__init__.py:3: from .fused import")
    assert all(len(line) <= 60 for line in lines[1:])
    words = {word.strip(",") for line in lines for word in line.split()}
    assert set(names) <= words  # each name whole
    assert _short(Site("/src/x.py", 1, "<module>", "import short")) == "x.py:1: import short"


def test_a_long_driver_line_wraps_between_words_and_keeps_its_path_whole():
    from diagtools.render.lines import wrapped

    library = "~/.cache/diagtools/simdriver/71aa234321d77138/libcuda.so.1"
    text = (
        f"  driver: simulated driver, a libcuda.so.1 stand-in with no GPU ({library}); also simulated: libcudart.so.13"
    )
    lines = wrapped(text)
    assert len(lines) > 1
    assert all(len(line) <= 100 for line in lines)
    assert lines[0].startswith("  driver: ")
    assert all(line.startswith("      ") for line in lines[1:])
    assert any(f"({library});" in line for line in lines)  # the path whole, on one line
    assert wrapped("  short") == ["  short"]


def test_a_table_shows_a_verdict_in_its_tone_and_long_text_under_its_row():
    from diagtools.model.verdict import Verdict
    from diagtools.render.html import table_html

    page = table_html(
        ["module", "verdict", "source"],
        [("pkg", Verdict.INITIALIZES_CUDA, "from .leaf import a_rather_long_name"), ("other", Verdict.CLEAN, "")],
        code=[2],
    )
    assert '<td class="bad">initializes-cuda</td>' in page
    assert '<td class="good">clean</td>' in page
    assert "<th>source</th>" not in page  # not a narrow column: under the row, across the table
    assert '<tr class="dt-under"><td colspan="2"><span class="dt-label">source:</span>' in page
    assert page.count('class="dt-under"') == 1  # an empty one adds no row


def _two_stage_bars(live, capsys, learning: str, total: int) -> tuple[list[str], list[str]]:
    """Two rows under ``learning``, the rest under scanning; the lines each stage's bar drew on stderr."""
    from types import SimpleNamespace

    for stage, rows in ((learning, range(1, 3)), ("scanning", range(3, total + 1))):
        live.stage(stage)
        for done in rows:
            live.update(done, total, SimpleNamespace(module=f"pkg.m{done}"))
    live.close()
    lines = [line.strip() for line in capsys.readouterr().err.replace("\r", "\n").splitlines() if line.strip()]
    drawn = [line for line in lines if line.startswith(f"pkg ({learning}):")]
    scanned = [line for line in lines if line.startswith("pkg (scanning):")]
    assert drawn
    assert scanned
    return drawn, scanned


def test_the_sweep_bar_names_each_stage_and_starts_its_rate_afresh(capsys):
    """Each stage of an adaptive sweep gets a bar of its own, named after it, starting from the rows done."""
    from diagtools.frontends.progress import SweepProgress

    require("tqdm", "notebook")
    live = SweepProgress("pkg")
    live.phase("finding the modules of pkg")
    learning, scanning = _two_stage_bars(live, capsys, "learning what to preload from 24 sampled modules", 4)
    assert "2/4" in learning[-1]
    assert "4/4" in scanning[-1]
    assert "2/4" in scanning[0]  # the new bar starts where the last one ended


def test_a_new_stage_is_named_before_its_first_row(capsys):
    """The seconds between stages (a zygote starting) show under the new stage's name, not the last one's;
    a stage named after the last row opens no bar."""
    from types import SimpleNamespace

    from diagtools.frontends.progress import SweepProgress

    require("tqdm", "notebook")
    live = SweepProgress("pkg")
    live.stage("learning what to preload from 8 sampled modules")
    live.update(1, 2, SimpleNamespace(module="pkg.m1"))
    live.stage("checking 3 learned preload(s)")
    shown = capsys.readouterr().err.replace("\r", "\n")
    assert any(line.strip().startswith("pkg (checking 3 learned preload(s)): ") for line in shown.splitlines())
    assert "1/2" in shown.split("pkg (checking")[-1]
    live.update(2, 2, SimpleNamespace(module="pkg.m2"))
    live.stage("scanning")
    live.close()
    assert "pkg (scanning)" not in capsys.readouterr().err


def test_the_notebook_bar_names_a_new_stage_at_once():
    """In a notebook the label says the new stage as soon as it begins, with the rows done so far."""
    from types import SimpleNamespace

    from diagtools.frontends.progress import notebook_progress

    require("ipywidgets", "notebook")
    bar = notebook_progress("pkg")
    bar.display = lambda _box: None  # no front end here: the widgets are read back directly
    bar.stage("learning what to preload from 8 sampled modules")
    bar(1, 4, SimpleNamespace(module="pkg.m1"))
    bar.stage("checking 3 learned preload(s)")
    assert bar.label.value == "checking 3 learned preload(s): 1/4"


def test_the_bar_gives_a_time_left_only_where_the_rate_holds(capsys):
    """Learning's and checking's rows each import what they teach: their bars give no time left, where the
    old one read hours at the start of a sweep that took minutes; the scanning stage's bar gives one."""
    from diagtools.frontends.progress import SweepProgress

    require("tqdm", "notebook")
    live = SweepProgress("pkg")
    learning, scanning = _two_stage_bars(live, capsys, "learning what to preload from 8 sampled modules", 5)
    assert all("time left once scanning" in line and "<" not in line for line in learning)
    assert all("time left" not in line for line in scanning)
    assert "5/5 [" in scanning[-1]
    assert "<" in scanning[-1].split("5/5 [")[1]  # elapsed<remaining


def test_the_notebook_bar_gives_the_scanning_stage_time_left_at_its_average_rate():
    """In a notebook the label gives the time left once the rows come at the rate of the rest, measured on
    the scanning stage's rows only (not on learning's slow ones)."""
    from types import SimpleNamespace

    from diagtools.frontends.progress import notebook_progress

    require("ipywidgets", "notebook")
    now = [0.0]
    bar = notebook_progress("pkg")
    bar.display, bar.clock = (lambda _box: None), (lambda: now[0])
    bar.stage("learning what to preload from 8 sampled modules")
    now[0] = 50.0  # 10 slow learning rows
    bar(10, 1000, SimpleNamespace(module="pkg.m10"))
    assert "left" not in bar.label.value
    bar.stage("scanning")
    now[0] = 60.0  # 100 rows in 10 s: 890 more take 89 s
    bar(110, 1000, SimpleNamespace(module="pkg.m110"))
    assert bar.label.value == "scanning: 110/1000, about 1 min left pkg.m110"
    now[0] = 150.0  # 900 rows in 100 s: 90 more take 10 s
    bar(990, 1000, SimpleNamespace(module="pkg.m990"))
    assert bar.label.value == "scanning: 990/1000, under a minute left pkg.m990"
