"""The dependencies to install beside a ``--no-deps`` vLLM for a sweep, without touching torch.

``requirements METADATA``: the wheel's ``Requires-Dist`` (markers evaluated, no extras), minus
torch and the CUDA kernel stack that pins its own torch, minus what the venv already has (its
version is used); one requirement a line.

``pins REPORT``: from a ``pip install --dry-run --report`` in the venv, the wheels to put in the
cache folder (``name==version``), leaving out any distribution the venv already has (pip would
otherwise shadow the venv's numpy, say, with another version) and anything torch-like.

Run by ``sweep_vllm.sh``; standard library plus ``packaging`` (pip's own dependency).
"""

from __future__ import annotations

import json
import sys
from email.parser import Parser
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

# torch itself and what needs a CUDA torch of its own (a CPU sweep never imports these for real)
NEVER = {
    "torch",
    "torchaudio",
    "torchvision",
    "torchcodec",
    "triton",
    "pynvvideocodec",
    "flashinfer-python",
    "tilelang",
    "nvtx",
    "fastsafetensors",
    "instanttensor",
    "quack-kernels",
    "tokenspeed-mla",
    "humming-kernels",
}


def _never(name: str) -> bool:
    name = canonicalize_name(name)
    return name in NEVER or name.startswith(("nvidia-", "torch"))


def _in_venv(name: str) -> bool:
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def requirements(metadata_file: Path) -> list[str]:
    message = Parser().parsestr(metadata_file.read_text(encoding="utf-8"))
    wanted = []
    for line in message.get_all("Requires-Dist") or []:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        if _never(requirement.name) or _in_venv(requirement.name):
            continue
        requirement.marker = None
        wanted.append(str(requirement))
    return wanted


def pins(report_file: Path) -> list[str]:
    report = json.loads(report_file.read_text(encoding="utf-8"))
    found = []
    for item in report["install"]:
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        if not _never(name) and not _in_venv(name):
            found.append(f"{name}=={version}")
    return found


def main() -> None:
    command, path = sys.argv[1], Path(sys.argv[2])
    lines = requirements(path) if command == "requirements" else pins(path)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
