"""Build the simulated CUDA driver and the probe extension, and pick a driver.

The C sources ship inside the package and are compiled on first use into a
cache directory, keyed by a hash of their source, the compiler and (for the
probe extension) the interpreter, so a second run costs one ``stat``.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from diagtools.errors import DriverBuildError, DriverUnavailableError, UsageError
from diagtools.model.scan import DriverInfo

__all__ = [
    "DRIVER_CHOICES",
    "DriverSetup",
    "build_injection_library",
    "build_probe_extension",
    "build_simulated_driver",
    "cache_dir",
    "real_driver_path",
    "resolve_driver",
]

DRIVER_CHOICES = ("auto", "real", "simulated", "none")
_SOURCES = Path(__file__).resolve().parent
_real_driver_cache: dict[str, str | None] = {}


@dataclass(frozen=True)
class DriverSetup:
    """The driver a subkernel gets: what to report, and the environment to give it."""

    info: DriverInfo
    env: dict[str, str]


def cache_dir() -> Path:
    """Where compiled artefacts live: ``$DIAGTOOLS_CACHE_DIR`` or the XDG cache."""
    override = os.environ.get("DIAGTOOLS_CACHE_DIR")
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "diagtools"


def _compiler() -> list[str]:
    return shlex.split(os.environ.get("CC", "cc"))


def _build_key(*parts: str | bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _compile(what: str, source: Path, output: Path, extra: list[str]) -> Path:
    """Compile ``source`` into the shared object ``output`` unless it already exists."""
    if output.exists():
        return output
    import tempfile  # only needed to compile

    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=output.parent, suffix=".so.tmp")
    os.close(fd)
    command = [*_compiler(), "-shared", "-fPIC", "-O2", "-o", tmp, str(source), *extra]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as exc:
        os.unlink(tmp)
        raise DriverBuildError(what, shlex.join(command), str(exc)) from None
    if done.returncode != 0:
        os.unlink(tmp)
        raise DriverBuildError(what, shlex.join(command), done.stderr or done.stdout)
    os.replace(tmp, output)
    return output


def build_simulated_driver() -> Path:
    """The directory holding the simulated ``libcuda.so.1``, built if needed."""
    source = _SOURCES / "simcuda.c"
    key = _build_key(source.read_bytes(), *_compiler())
    library = cache_dir() / "simdriver" / key / "libcuda.so.1"
    _compile("the simulated CUDA driver", source, library, ["-Wl,-soname,libcuda.so.1", "-ldl"])
    return library.parent


def build_injection_library() -> Path:
    """A ``CUDA_INJECTION64_PATH`` library that reports a real cuInit to the probe."""
    source = _SOURCES / "simcuda.c"
    key = _build_key(source.read_bytes(), *_compiler(), "injection")
    library = cache_dir() / "injection" / key / "libdiagtools_injection.so"
    return _compile("the CUDA injection hook", source, library, ["-DDIAGTOOLS_INJECTION_ONLY", "-ldl"])


def build_probe_extension() -> Path:
    """The compiled ``_diagtools_cuprobe`` extension for the running interpreter."""
    source = _SOURCES / "cuprobe.c"
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    key = _build_key(source.read_bytes(), *_compiler(), sys.version, sys.prefix, suffix)
    library = cache_dir() / "cuprobe" / key / f"_diagtools_cuprobe{suffix}"
    if library.exists():
        return library
    import sysconfig  # only needed to compile: finding the headers costs a few ms

    include = sysconfig.get_paths()["include"]
    return _compile("the CUDA state probe", source, library, [f"-I{include}", "-ldl"])


def real_driver_path() -> str | None:
    """Path of a real ``libcuda.so.1`` that loads here, or ``None``.

    The check runs in a throwaway interpreter, so the caller's process never
    even loads the driver library.
    """
    if "path" not in _real_driver_cache:
        _real_driver_cache["path"] = _find_real_driver()
    return _real_driver_cache["path"]


def _find_real_driver() -> str | None:
    env = _without_simulated_paths(dict(os.environ))
    code = (
        "import ctypes\n"
        "lib = ctypes.CDLL('libcuda.so.1')\n"
        "lib.cuInit\n"
        "maps = open('/proc/self/maps').read()\n"
        "print(next(l.split()[-1] for l in maps.splitlines() if 'libcuda.so' in l))\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    path = done.stdout.strip()
    if done.returncode != 0 or not path or _is_simulated(path):
        return None
    return path


def _is_simulated(path: str) -> bool:
    try:
        return b"diagtools simulated GPU" in Path(path).read_bytes()
    except OSError:
        return False


def _without_simulated_paths(env: dict[str, str]) -> dict[str, str]:
    entries = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p and not _is_simulated(f"{p}/libcuda.so.1")]
    env["LD_LIBRARY_PATH"] = ":".join(entries)
    return env


def resolve_driver(requested: str = "auto") -> DriverSetup:
    """The driver a subkernel should get for ``requested`` (auto|real|simulated|none)."""
    if requested not in DRIVER_CHOICES:
        raise UsageError(f"unknown driver {requested!r}: choose one of {', '.join(DRIVER_CHOICES)}")
    if requested == "none":
        return DriverSetup(DriverInfo("none", requested), {"CUDA_VISIBLE_DEVICES": "", "DIAGTOOLS_DRIVER": "none"})
    real = real_driver_path() if requested in ("auto", "real") else None
    if requested == "real" and real is None:
        raise DriverUnavailableError("libcuda.so.1 did not load")
    if real is not None:
        injection = str(build_injection_library())
        return DriverSetup(
            DriverInfo("real", requested, real), {"CUDA_INJECTION64_PATH": injection, "DIAGTOOLS_DRIVER": "real"}
        )
    return _simulated_setup(requested)


def _simulated_setup(requested: str) -> DriverSetup:
    directory = build_simulated_driver()
    current = _without_simulated_paths(dict(os.environ)).get("LD_LIBRARY_PATH", "")
    env = {
        "LD_LIBRARY_PATH": ":".join(p for p in (str(directory), current) if p),
        "TRITON_LIBCUDA_PATH": str(directory),
        "DIAGTOOLS_DRIVER": "simulated",
    }
    return DriverSetup(DriverInfo("simulated", requested, str(directory / "libcuda.so.1")), env)
