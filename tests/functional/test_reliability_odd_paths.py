"""Odd paths and hand-edited documents: the report is always written and readable, never lost or left empty."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading

import pytest

import diagtools
from diagtools.model.diff import diff_scans
from diagtools.model.scan import ScanResult
from diagtools.render.html import diff_html
from diagtools.render.paths import readable, write_report
from tests.conftest import DIAGTOOLS, cli, require, write_tree

LEAF = "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n"


@pytest.fixture
def undecodable_tree(tmp_path):
    """A package under a folder whose name is the byte 0xff (valid on Linux, not UTF-8)."""
    root = tmp_path / os.fsdecode(b"\xffsrc")
    write_tree(root, {"oddpkg/__init__.py": "from . import leaf\n", "oddpkg/leaf.py": LEAF})
    return root


def test_readable_shows_the_original_byte_and_escapes_any_other_surrogate():
    assert readable(os.fsdecode(b"/a/\xff/b.py")) == "/a/\\xff/b.py"
    assert readable("m\ud800x") == "m\\ud800x"
    assert readable("plain é") == "plain é"


def test_scan_under_an_undecodable_folder_keeps_the_report_and_draws_the_graph(undecodable_tree, tmp_path):
    require("graphviz", "notebook")
    svg = tmp_path / "graph.svg"
    done = cli(
        "scan", "oddpkg", "--path", str(undecodable_tree), "--driver", "simulated", "--no-cuts", "--svg", str(svg)
    )
    assert done.returncode == 0, done.stderr
    assert "culprit: oddpkg.leaf" in done.stdout
    assert "Traceback" not in done.stderr
    assert "codec" not in done.stderr
    assert "\\xffsrc" in svg.read_text(encoding="utf-8")


@pytest.mark.parametrize("command", ["sweep", "run"])
def test_html_under_an_undecodable_folder_is_written_whole(command, undecodable_tree, tmp_path):
    page = tmp_path / "report.html"
    if command == "sweep":
        args = ["sweep", "oddpkg", "--path", str(undecodable_tree), "--driver", "simulated", "--html", str(page)]
    else:
        code = f"import sys; sys.path.insert(0, {str(undecodable_tree)!r}); import oddpkg"
        args = ["run", "--driver", "simulated", "--html", str(page), "--", sys.executable, "-c", code]
    done = cli(*args)
    assert "internal error" not in done.stderr, done.stderr
    assert done.returncode in (0, 1), done.stderr
    text = page.read_text(encoding="utf-8")
    assert "oddpkg.leaf" in text
    assert text.rstrip().endswith("</div>" if command == "sweep" else "</html>")
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]


@pytest.fixture
def scanned(tmp_path, make_tree):
    tree = make_tree({"trimpkg/__init__.py": "from . import leaf\n", "trimpkg/leaf.py": LEAF})
    out = tmp_path / "scan.json"
    done = cli("scan", "trimpkg", "--path", str(tree), "--driver", "simulated", "--no-cuts", "--json", str(out))
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text(encoding="utf-8"))


def test_diff_of_a_document_with_a_lone_surrogate_renders_it_escaped(scanned, tmp_path):
    before = tmp_path / "before.json"
    before.write_text(json.dumps(scanned), encoding="utf-8")
    after = tmp_path / "after.json"
    after.write_text(json.dumps(scanned).replace("trimpkg.leaf", "trimpkg.le\\ud800af"), encoding="utf-8")
    page, document = tmp_path / "diff.html", tmp_path / "diff.json"
    done = cli("diff", str(before), str(after), "--html", str(page), "--json", str(document))
    assert done.returncode == 0, done.stderr
    assert "trimpkg.le\\ud800af" in done.stdout
    assert "trimpkg.le\\ud800af" in page.read_text(encoding="utf-8")
    assert json.loads(document.read_text(encoding="utf-8"))


def test_a_chain_module_trimmed_from_modules_still_renders(scanned):
    require("graphviz", "notebook")
    trimmed = dict(scanned, modules=[m for m in scanned["modules"] if m["name"] != "trimpkg.leaf"])
    whole, cut = ScanResult.from_json(scanned), ScanResult.from_json(trimmed)
    assert "trimpkg.leaf" in cut._repr_html_()
    assert "trimpkg.leaf" in diff_html(diff_scans(whole, cut))
    assert "trimpkg.leaf" in diff_html(diff_scans(cut, whole))
    assert b"trimpkg.leaf" in cut.graph().pipe(format="svg")


RUNTIME_CALL = """
import ctypes
count = ctypes.c_int()
ctypes.CDLL("libcudart.so.13").cudaGetDeviceCount(ctypes.byref(count))
"""


@pytest.mark.parametrize("folder", ["cache with space", "cache:colon"])
def test_a_cache_folder_the_loader_cannot_split_still_gets_the_simulated_runtime(folder, tmp_path, make_tree):
    tree = make_tree({"rtcall.py": RUNTIME_CALL})
    env = dict(os.environ, DIAGTOOLS_CACHE_DIR=str(tmp_path / folder))
    done = subprocess.run(
        [DIAGTOOLS, "scan", "rtcall", "--path", str(tree), "--driver", "simulated", "--no-cuts"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "verdict: initializes-cuda" in done.stdout, done.stdout
    assert "culprit: rtcall" in done.stdout


def test_a_cuda_library_loaded_from_outside_the_simulated_world_makes_a_quiet_scan_unknown(tmp_path, make_tree):
    elsewhere = tmp_path / "toolkit"
    elsewhere.mkdir()
    source = elsewhere / "empty.c"
    source.write_text("int cudaRuntimeGetVersion(int *v) { *v = 12000; return 0; }\n")
    library = elsewhere / "libcudart.so.12"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    tree = make_tree({"loadsother.py": f"import ctypes\nctypes.CDLL({str(library)!r})\n"})
    result = diagtools.scan("loadsother", path=[tree], driver="simulated", cuts=False)
    assert result.verdict == "unknown"
    assert any(str(library) in doubt and "outside the simulated world" in doubt for doubt in result.doubts())
    quiet = diagtools.scan("json", driver="simulated", cuts=False)
    assert quiet.verdict == "clean", quiet.doubts()


def test_a_report_named_as_a_pipe_is_written_into_it_and_the_pipe_stays(tmp_path):
    fifo = tmp_path / "reader"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    write_report(fifo, "{}\n")
    reader.join(timeout=30)
    assert received == [b"{}\n"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_report_through_a_symbolic_link_replaces_the_file_it_names_and_keeps_the_link_and_the_mode(tmp_path):
    real = tmp_path / "reports" / "scan.json"
    real.parent.mkdir()
    real.write_text("old", encoding="utf-8")
    real.chmod(0o640)
    link = tmp_path / "latest.json"
    link.symlink_to(real)
    write_report(link, "new")
    assert link.is_symlink()
    assert os.readlink(link) == str(real)
    assert real.read_text(encoding="utf-8") == "new"
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    assert sorted(p.name for p in real.parent.iterdir()) == ["scan.json"]  # no partial file left behind
