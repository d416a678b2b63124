"""The agents run inside subkernels: standard library only, and the probe leaves a bare interpreter bare."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from diagtools import agents, protocol
from diagtools.driver import build_probe_extension
from diagtools.runner.subkernel import SubkernelRequest, run_subkernel
from diagtools.usecases.scan import SCAN_PROBE
from tests.conftest import huge_pages_available

AGENT_FILES = sorted(agents.AGENTS_DIR.rglob("*.py"))
OURS = {"diagtools", "diagtools.protocol", protocol.PROTOCOL_MODULE, "_diagtools_run_agent"}


def top_level_imports(path: Path) -> set[str]:
    """Modules a file imports outside its functions (what loading it costs)."""
    imported: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module if node.module != "diagtools" else "diagtools.protocol")
    return imported


@pytest.mark.parametrize("path", AGENT_FILES, ids=lambda path: path.name)
def test_agents_import_only_the_standard_library_and_the_protocol(path):
    foreign = {name for name in top_level_imports(path) if name.split(".")[0] not in sys.stdlib_module_names}
    assert foreign <= OURS, foreign - OURS


def test_the_protocol_imports_only_what_a_bare_interpreter_has_loaded():
    bare = bare_modules()
    assert top_level_imports(Path(protocol.__file__)) <= bare


def bare_modules() -> set[str]:
    done = subprocess.run(
        [sys.executable, "-S", "-c", "import sys; print(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def test_probe_set_up_loads_nothing_beyond_a_bare_interpreter(tmp_path):
    """A target imported under the probe sees exactly the modules ``python -S`` starts with."""
    out = tmp_path / "modules.txt"
    (tmp_path / "witness.py").write_text(
        f"import sys\nopen({str(out)!r}, 'w').write(' '.join(sorted(sys.modules)))\n", encoding="utf-8"
    )
    settings = {
        protocol.CUPROBE: str(build_probe_extension()),
        protocol.SCAN_TARGETS: "witness",
        protocol.SCAN_PATH: str(tmp_path),
        protocol.SCAN_NO_SITE: "1",
    }
    raw = run_subkernel(SubkernelRequest(SCAN_PROBE, settings, {}, 60.0, flags=("-S",)))
    assert raw.returncode == 0, raw.stderr.text
    seen = set(out.read_text(encoding="utf-8").split())
    extra = seen - bare_modules() - {"witness", protocol.PROTOCOL_MODULE}
    assert extra == set()


def test_the_subkernel_runs_the_protocol_and_the_probe_from_their_bytecode_caches(tmp_path, monkeypatch):
    """Compiled once, not on every start; read back through the import system's own loader, which imports nothing."""
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    prefix = tmp_path / "pycache"
    settings = {protocol.CUPROBE: str(build_probe_extension()), protocol.SCAN_TARGETS: "colorsys"}
    request = SubkernelRequest(SCAN_PROBE, settings, {"PYTHONPYCACHEPREFIX": str(prefix)}, 60.0, flags=("-S",))
    first = run_subkernel(request)
    assert first.returncode == 0, first.stderr.text
    sources = [Path(protocol.__file__).resolve(), SCAN_PROBE.resolve()]
    cached = {
        source.stem: prefix / source.parent.relative_to("/") / f"{source.stem}.{sys.implementation.cache_tag}.pyc"
        for source in sources
    }
    assert all(path.is_file() for path in cached.values()), sorted(prefix.rglob("*.pyc"))
    written = {name: path.stat().st_mtime_ns for name, path in cached.items()}
    second = run_subkernel(request)
    assert second.returncode == 0, second.stderr.text
    assert {name: path.stat().st_mtime_ns for name, path in cached.items()} == written  # read, not written again
    assert [e["e"] for e in second.events] == [e["e"] for e in first.events]


HUGE_PAGES_WITNESS = """
import ctypes, importlib.util, json, mmap, sys
spec = importlib.util.spec_from_file_location("_diagtools_cuprobe", sys.argv[1])
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)
flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
dense, sparse = mmap.mmap(-1, 64 << 20, flags=flags), mmap.mmap(-1, 64 << 20, flags=flags)
dense.madvise(mmap.MADV_DONTFORK)  # flags no other mapping has: the kernel merges neither with a neighbour
sparse.madvise(mmap.MADV_DONTDUMP)
for at in range(0, len(dense), 4096):
    dense[at] = 1
for at in range(0, len(sparse), 2 << 20):
    sparse[at] = 1
where = {ctypes.addressof(ctypes.c_char.from_buffer(m)): name for name, m in (("dense", dense), ("sparse", sparse))}

def mapped():
    sizes, current = {}, None
    for line in open("/proc/self/smaps"):
        field = line.split()
        if "-" in field[0] and not field[0].endswith(":"):
            current = where.get(int(field[0].split("-")[0], 16))
        elif current and field[0] in ("Rss:", "AnonHugePages:"):
            sizes[current + " " + field[0][:-1]] = int(field[1]) << 10
    return sizes

before = mapped()
moved = probe.collapse_to_huge_pages()
print(json.dumps({"moved": moved, "before": before, "after": mapped()}))
"""


@pytest.mark.skipif(not huge_pages_available(), reason="this kernel has no transparent huge pages")
def test_the_probe_moves_touched_memory_into_huge_pages_and_never_fills_in_untouched_memory(tmp_path):
    """What makes a zygote's forks cheap: its resident private memory collapsed into 2 MiB pages, while a
    mapping an allocator reserved and barely touched keeps its few 4 KiB pages."""
    script = tmp_path / "witness.py"
    script.write_text(HUGE_PAGES_WITNESS, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script), str(build_probe_extension())],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["before"]["dense AnonHugePages"] == 0
    assert seen["after"]["dense AnonHugePages"] >= 32 << 20  # a block may find no free 2 MiB to move into
    assert seen["moved"] >= seen["after"]["dense AnonHugePages"]
    assert seen["after"]["sparse AnonHugePages"] == 0
    assert seen["after"]["sparse Rss"] == seen["before"]["sparse Rss"] == 32 << 12
