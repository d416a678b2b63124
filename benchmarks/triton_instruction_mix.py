"""The faithful Triton kernel's global loads and stores, by width, as compiled for sm_90 on this CPU.

Run: ``.venv/bin/python benchmarks/triton_instruction_mix.py`` (writes triton_instruction_mix.json
and .md).  Each compressor (C4, C128) is compiled twice: with the divisibility a real launch on
vLLM's tensors gets (every pointer 16-byte aligned, ``state_block`` and ``block_size`` multiples of
16: what Triton specializes on) and with none.  The counts are static (instructions in the PTX,
not executions); a 128-bit load is ``ld.global.v4.b32``.  No GPU is needed, and none was used.
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from rows import write_whole
from scan_overhead import machine

HERE = Path(__file__).resolve().parent
PATTERN = re.compile(r"\b((?:ld|st)\.global(?:\.\w+)*)")

CHILD = """
import json
from diagtools.kernels.state_triton import compile_ptx
names = {True: "aligned", False: "no hints"}
print(json.dumps({f"C{r} {names[a]}": compile_ptx(r, aligned=a) for r in (4, 128) for a in (True, False)}))
"""


def instruction_mix(ptx: str) -> dict[str, int]:
    """Global memory instructions by opcode (``ld.global.v4.b32``: a 128-bit load), counted in the PTX text."""
    return dict(sorted(collections.Counter(match.group(1) for match in PATTERN.finditer(ptx)).items()))


def markdown(document: dict) -> str:
    opcodes = sorted({op for mix in document["kernels"].values() for op in mix})
    lines = ["# The faithful Triton kernel's global loads and stores (static counts, sm_90 PTX)", ""]
    where = ", ".join(f"{key} {value}" for key, value in document["machine"].items())
    lines += [
        f"Compiled {document['measured']} with Triton {document['triton']} on a CPU machine ({where}); no GPU.",
        "",
    ]
    lines += ["`aligned`: the divisibility a real launch on vLLM's tensors gets; `no hints`: none.", ""]
    lines += ["| kernel | " + " | ".join(f"`{op}`" for op in opcodes) + " |", "|" + " --- |" * (len(opcodes) + 1)]
    for name, mix in document["kernels"].items():
        lines.append(f"| {name} | " + " | ".join(str(mix.get(op, 0)) for op in opcodes) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
    ptx = json.loads(done.stdout.strip().splitlines()[-1])
    import triton

    document = {
        "machine": machine(),
        "measured": time.strftime("%Y-%m-%d", time.gmtime()),
        "triton": triton.__version__,
        "kernels": {name: instruction_mix(text) for name, text in ptx.items()},
    }
    write_whole(HERE / "triton_instruction_mix.json", json.dumps(document, indent=2, sort_keys=True) + "\n")
    write_whole(HERE / "triton_instruction_mix.md", markdown(document))
    print(markdown(document))


if __name__ == "__main__":
    main()
