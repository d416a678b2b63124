"""What the CuTe DSL kernels' CPU tests share: compiling in a fresh interpreter, PTX without its
comments, and a driver stand-in that decodes a launch's parameter array."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

from tests.conftest import require


def compile_in_child(code: str, folder) -> dict[str, str]:
    """Run ``code`` (which prints one JSON object of PTX texts, given a dump folder as argv[1]) in a
    fresh interpreter with ``CUTE_DSL_ARCH=sm_90a``, which the DSL reads at import."""
    require("cutlass", "kernels")
    done = subprocess.run(
        [sys.executable, "-c", code, str(folder)],
        env=dict(os.environ, CUTE_DSL_ARCH="sm_90a"),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def code_lines(text: str) -> list[str]:
    """The PTX's lines without its comments (which name the compiler's temporary files)."""
    return [line for line in text.splitlines() if not line.lstrip().startswith("//")]


class FakeDriver:
    """Records each launch and decodes the ``void**`` parameter array as the driver would."""

    def __init__(self, param_types) -> None:
        self.param_types = tuple(param_types)
        self.calls: list[dict] = []

    def launch(self, function, grid, block, stream, params) -> None:
        slots = (ctypes.c_void_p * len(self.param_types)).from_address(params)
        kinds = [ctypes.c_uint64 if t == "u64" else ctypes.c_float for t in self.param_types]
        values = [kind.from_address(slot).value for kind, slot in zip(kinds, slots, strict=True)]
        self.calls.append({"function": function, "grid": grid, "block": block, "stream": stream, "values": values})
