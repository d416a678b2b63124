"""The agents run inside subkernels: standard library only, and the probe leaves a bare interpreter bare."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from diagtools import agents, protocol
from diagtools.driver import build_probe_extension
from diagtools.runner.subkernel import SubkernelRequest, run_subkernel
from diagtools.usecases.scan import SCAN_PROBE

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
