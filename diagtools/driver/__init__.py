"""The simulated GPU world, the real driver's detection, and the driver a subkernel gets.

The C sources ship inside the package and are compiled on first use by the
build cache (:mod:`diagtools.driver.build`), keyed by a hash of their source,
the compiler and (for the probe extension) the interpreter, so a second run
costs one ``stat``.

The simulated world is one directory put first on the subkernel's
``LD_LIBRARY_PATH``: a CUDA driver (``libcuda.so.1``, also as ``libcuda.so``)
and an NVML (``libnvidia-ml.so.1``, also as ``libnvidia-ml.so``) describing the
same GPU.  Their export lists are generated at build time from the installed
declarations (see ``_generate``), and that generated C is part of the key; a
process reads those declarations once (tens of milliseconds), then only
``stat``s them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from diagtools import protocol
from diagtools.driver._inputs import input_files
from diagtools.driver.build import (
    _SOURCES,
    _build_key,
    _cache_writes,
    _compile,
    _compiler,
    _link_alias,
    _record,
    _recorded,
    _stamp,
    _write_if_changed,
    build_injection_library,
    build_probe_extension,
    build_starts_library,
    cache_dir,
    loader_safe,
)
from diagtools.errors import DriverBuildError, DriverUnavailableError, UsageError
from diagtools.model.driver import DriverInfo
from diagtools.model.options import DRIVER_CHOICES

if TYPE_CHECKING:
    from diagtools.driver._generate import GeneratedRuntime

__all__ = [
    "DRIVER_CHOICES",
    "SIMULATED_LIBRARIES",
    "DriverSetup",
    "SimulatedWorld",
    "build_injection_library",
    "build_probe_extension",
    "build_simulated_driver",
    "build_simulated_world",
    "build_starts_library",
    "cache_dir",
    "preloaded",
    "real_driver_path",
    "resolve_driver",
]

_real_driver_cache: dict[str, str | None] = {}
# The simulated libraries, by soname, and the other names that resolve to each.
SIMULATED_LIBRARIES = ("libcuda.so.1", "libnvidia-ml.so.1")
_ALIASES = {"libcuda.so": "libcuda.so.1", "libnvidia-ml.so": "libnvidia-ml.so.1"}


@dataclass(frozen=True)
class DriverSetup:
    """The driver a subkernel gets: what to report, and the environment to give it.

    ``libraries`` names the simulated libraries the environment puts in front
    (empty for the real driver and for none); ``notes`` says where the
    simulated libraries' export lists came from, or that they fell back to the
    hand-modelled functions.
    """

    info: DriverInfo
    env: dict[str, str]
    libraries: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class SimulatedWorld:
    """A built simulated world: the directory holding its libraries, and how their exports were found."""

    directory: Path
    libraries: tuple[str, ...]
    notes: tuple[str, ...]


_world_cache: dict[tuple[object, ...], SimulatedWorld] = {}


def build_simulated_driver() -> Path:
    """The directory holding the simulated ``libcuda.so.1`` (and NVML beside it), built if needed."""
    return build_simulated_world().directory


def _input_stamp() -> tuple[object, ...]:
    """Cheap identity of everything the simulated world's build reads."""
    sources = (_SOURCES / name for name in ("simcuda.c", "simnvml.c", "simcudart.c", "simworld.h"))
    return _stamp((*sources, *input_files()))


def build_simulated_world() -> SimulatedWorld:
    """Build (once) the simulated driver, NVML and runtime, with stubs for every entry point known here.

    The libraries are linked ``-z nodelete``: a caller that ``dlclose``s the
    driver and opens it again finds the init state it left, as with the real one.
    """
    stamp = _input_stamp()
    cached = _world_cache.get(stamp) or _recorded_world(stamp)
    if cached is not None and all((cached.directory / name).exists() for name in (*cached.libraries, *_ALIASES)):
        _world_cache[stamp] = cached
        return cached
    from diagtools.driver import _generate  # reading the declarations: only when the stamp is new

    simcuda = (_SOURCES / "simcuda.c").read_text()
    simnvml = (_SOURCES / "simnvml.c").read_text()
    simcudart = (_SOURCES / "simcudart.c").read_text()
    world_header = (_SOURCES / "simworld.h").read_text()
    driver_stubs = _generate.driver_stubs(simcuda)
    nvml_stubs = _generate.nvml_stubs(simnvml)
    runtimes, runtime_notes = _generate.runtime_stubs(simcudart)
    runtime_parts = [part for r in runtimes for part in (r.stubs, r.version_script, str(r.include))]
    key = _build_key(
        simcuda, simnvml, simcudart, world_header, driver_stubs.text, nvml_stubs.text, *runtime_parts, *_compiler()
    )
    directory = cache_dir() / "simdriver" / key
    settled = [*SIMULATED_LIBRARIES, *(r.soname for r in runtimes)]
    if not all((directory / name).exists() or (directory / f"{name}.failed").exists() for name in settled):
        with _cache_writes("the simulated CUDA driver", directory):
            directory.mkdir(parents=True, exist_ok=True)
        include = f"-I{_SOURCES}"
        for what, soname, source, stubs, name in (
            ("the simulated CUDA driver", "libcuda.so.1", "simcuda.c", driver_stubs, "simcuda_stubs.c"),
            ("the simulated NVML", "libnvidia-ml.so.1", "simnvml.c", nvml_stubs, "simnvml_stubs.c"),
        ):
            generated = _write_if_changed(directory / name, stubs.text)
            extra = [include, f"-Wl,-soname,{soname}", "-Wl,-z,nodelete", "-ldl"]
            _compile(what, [_SOURCES / source, generated], directory / soname, extra)
        for runtime in runtimes:
            _build_runtime(directory, runtime)
    for alias, target in _ALIASES.items():
        _link_alias(directory, alias, target)
    built = tuple(r.soname for r in runtimes if (directory / r.soname).exists())
    failed = tuple(
        f"the simulated {r.soname} did not build, so the real runtime is used: {_first_error(directory, r.soname)}"
        for r in runtimes
        if r.soname not in built
    )
    notes = (driver_stubs.note, nvml_stubs.note, *runtime_notes, *failed)
    world = SimulatedWorld(directory, (*SIMULATED_LIBRARIES, *built), notes)
    _world_cache[stamp] = world
    _record_world(stamp, world)
    return world


def _first_error(directory: Path, soname: str) -> str:
    """The compiler's first error line from a failed runtime build (kept in ``SONAME.failed``)."""
    try:
        lines = (directory / f"{soname}.failed").read_text(errors="replace").splitlines()
    except OSError:
        return "(no record of the failure)"
    return next((line for line in lines if "error" in line), lines[0] if lines else "")[:300]


def _build_runtime(directory: Path, runtime: GeneratedRuntime) -> None:
    """Compile one simulated ``libcudart.so.N``: its SONAME, version node and names are the real one's."""
    stem = runtime.soname.replace(".", "_")
    stubs = _write_if_changed(directory / f"{stem}_stubs.c", runtime.stubs)
    script = _write_if_changed(directory / f"{stem}.map", runtime.version_script)
    extra = [
        f"-I{_SOURCES}",
        f"-I{runtime.include}",
        f"-I{_SOURCES / 'include'}",  # crt/host_defines.h, when the runtime wheel ships no crt/ headers
        f"-Wl,-soname,{runtime.soname}",
        f"-Wl,--version-script={script}",
        "-Wl,-z,nodelete",
        "-ldl",
        "-lpthread",
    ]
    what = f"the simulated CUDA runtime {runtime.soname}"
    try:
        _compile(what, [_SOURCES / "simcudart.c", stubs], directory / runtime.soname, extra)
    except DriverBuildError as exc:
        # the driver and NVML stand without it (headers of a release simcudart.c does not know)
        _write_if_changed(directory / f"{runtime.soname}.failed", f"{exc.output}\n{exc}\n")


def _recorded_world(stamp: tuple[object, ...]) -> SimulatedWorld | None:
    """The world an earlier process built from inputs with this stamp (same files, sizes, times, compiler).

    Reading one small file instead of generating the stubs again is most of
    the driver's share of a scan's fixed cost.
    """
    record = _recorded("simdriver", stamp)
    if record is None:
        return None
    try:
        directory = cache_dir() / "simdriver" / str(record["key"])
        libraries = tuple(map(str, record.get("libraries", SIMULATED_LIBRARIES)))
        return SimulatedWorld(directory, libraries, tuple(map(str, record["notes"])))
    except (KeyError, TypeError):
        return None


def _record_world(stamp: tuple[object, ...], world: SimulatedWorld) -> None:
    record = {"key": world.directory.name, "libraries": list(world.libraries), "notes": list(world.notes)}
    _record("simdriver", stamp, record)


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


def _is_simulated_world(directory: str) -> bool:
    return bool(directory) and _is_simulated(f"{directory}/libcuda.so.1")


def preloaded(env: Mapping[str, str]) -> list[str]:
    """The libraries ``env`` has the loader preload, in order (``LD_PRELOAD`` separates them by colons or blanks)."""
    return [p for p in env.get("LD_PRELOAD", "").replace(" ", ":").split(":") if p]


def _without_simulated_paths(env: dict[str, str]) -> dict[str, str]:
    entries = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p and not _is_simulated_world(p)]
    env["LD_LIBRARY_PATH"] = ":".join(entries)
    kept = [p for p in preloaded(env) if not _is_simulated_world(os.path.dirname(p))]
    if kept:
        env["LD_PRELOAD"] = ":".join(kept)
    else:
        env.pop("LD_PRELOAD", None)
    return env


def resolve_driver(requested: str = "auto") -> DriverSetup:
    """The driver a subkernel should get for ``requested`` (auto|real|simulated|none)."""
    if requested not in DRIVER_CHOICES:
        raise UsageError(f"unknown driver {requested!r}: choose one of {', '.join(DRIVER_CHOICES)}")
    if requested == "none":
        return DriverSetup(DriverInfo("none", requested), {"CUDA_VISIBLE_DEVICES": "", protocol.DRIVER_KIND: "none"})
    real = real_driver_path() if requested in ("auto", "real") else None
    if requested == "real" and real is None:
        raise DriverUnavailableError("libcuda.so.1 did not load")
    if real is not None:
        injection = str(build_injection_library())
        return DriverSetup(
            DriverInfo("real", requested, real), {"CUDA_INJECTION64_PATH": injection, protocol.DRIVER_KIND: "real"}
        )
    return _simulated_setup(requested)


def _simulated_setup(requested: str) -> DriverSetup:
    """The simulated world's environment: its directory first on the library path, its runtime preloaded.

    A library that finds the CUDA runtime through its own DT_RPATH (torch's
    ``libtorch_cuda.so`` does, to the nvidia wheel's ``libcudart.so.13``) would
    never see the simulated one on ``LD_LIBRARY_PATH``; but the loader reuses an
    already-loaded library whose SONAME matches, so the simulated runtime is
    preloaded (``LD_PRELOAD``) into every process of the subkernel: the agents,
    a spawned child, a worker the target starts.  It does nothing until called.
    """
    world = build_simulated_world()
    directory = loader_safe(world.directory)
    current = _without_simulated_paths(dict(os.environ))
    runtimes = [str(directory / name) for name in world.libraries if name.startswith("libcudart.")]
    env = {
        "LD_LIBRARY_PATH": ":".join(p for p in (str(directory), current.get("LD_LIBRARY_PATH", "")) if p),
        "TRITON_LIBCUDA_PATH": str(directory),
        protocol.DRIVER_KIND: "simulated",
        protocol.SIMULATED_WORLD: os.path.realpath(world.directory),
    }
    # set even when empty: a preload of an older simulated world must not be inherited
    env["LD_PRELOAD"] = ":".join(p for p in (*runtimes, current.get("LD_PRELOAD", "")) if p)
    info = DriverInfo("simulated", requested, str(world.directory / "libcuda.so.1"), world.libraries)
    return DriverSetup(info, env, libraries=world.libraries, notes=world.notes)


"""Characters the loader's path lists cannot carry: ``LD_LIBRARY_PATH`` splits at ``:`` and ``;``,
``LD_PRELOAD`` also at spaces, and both expand ``$ORIGIN``-style tokens."""
