"""The package's rooms stay small enough to read: no module over 600 lines outside the kernels and specimens."""

from __future__ import annotations

from pathlib import Path

import diagtools

ROOT = Path(diagtools.__file__).parent
LIMIT = 600


def test_no_module_outside_kernels_and_specimens_is_over_600_lines():
    long = {}
    for source in ROOT.rglob("*.py"):
        relative = source.relative_to(ROOT)
        if relative.parts[0] in ("kernels", "specimens"):
            continue
        count = len(source.read_text(encoding="utf-8").splitlines())
        if count > LIMIT:
            long[str(relative)] = count
    assert not long, long


def test_every_agent_file_the_zygote_loads_ships_beside_it():
    agents = ROOT / "agents"
    loads = {
        "sweep_zygote.py": ("zygote_serving.py", "zygote_descent.py", "zygote_candidates.py"),
        "zygote_candidates.py": ("zygote_environ.py",),
    }
    for loader, parts in loads.items():
        for part in parts:
            assert (agents / part).is_file()
            assert f'"/{part}"' in (agents / loader).read_text(encoding="utf-8")
