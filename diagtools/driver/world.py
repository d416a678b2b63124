"""The simulated GPU world: a CUDA driver, NVML and runtimes built from the shipped C and the installed
declarations, in one folder put first on a subkernel's library path.

Their export lists are generated at build time from the installed declarations
(see ``_generate``), and that generated C is part of the build's key; a process
reads those declarations once (tens of milliseconds), then only ``stat``s them,
and another process reads the small record an earlier one left.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

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
    cache_dir,
)
from diagtools.errors import DriverBuildError

if TYPE_CHECKING:
    from diagtools.driver._generate import GeneratedRuntime

__all__ = [
    "LOAD_REDIRECT",
    "SIMULATED_LIBRARIES",
    "SimulatedWorld",
    "input_stamp",
    "make_world",
    "record_world",
    "recorded_world",
    "usable",
]

# The simulated libraries, by soname, and the other names that resolve to each.
SIMULATED_LIBRARIES = ("libcuda.so.1", "libnvidia-ml.so.1")
_ALIASES = {"libcuda.so": "libcuda.so.1", "libnvidia-ml.so": "libnvidia-ml.so.1"}
# Preloaded first: a load by path of a library the world holds gets the world's copy (see simloads.c).
LOAD_REDIRECT = "libdiagtools-simloads.so"
_SOURCE_NAMES = ("simcuda.c", "simnvml.c", "simcudart.c", "simworld.h", "simloads.c")


@dataclass(frozen=True)
class SimulatedWorld:
    """A built simulated world: the directory holding its libraries, and how their exports were found."""

    directory: Path
    libraries: tuple[str, ...]
    notes: tuple[str, ...]


def input_stamp() -> tuple[object, ...]:
    """Cheap identity of everything the simulated world's build reads."""
    sources = (_SOURCES / name for name in _SOURCE_NAMES)
    return _stamp((*sources, *input_files()))


def usable(world: SimulatedWorld) -> bool:
    """Whether every library and alias of ``world`` is still there."""
    return all((world.directory / name).exists() for name in (*world.libraries, *_ALIASES, LOAD_REDIRECT))


def make_world() -> SimulatedWorld:
    """Build the simulated driver, NVML and runtime, with stubs for every entry point known here.

    The libraries are linked ``-z nodelete``: a caller that ``dlclose``s the
    driver and opens it again finds the init state it left, as with the real one.
    """
    from diagtools.driver import _generate  # reading the declarations: only when the stamp is new

    simcuda = (_SOURCES / "simcuda.c").read_text()
    simnvml = (_SOURCES / "simnvml.c").read_text()
    simcudart = (_SOURCES / "simcudart.c").read_text()
    world_header = (_SOURCES / "simworld.h").read_text()
    simloads = (_SOURCES / "simloads.c").read_text()
    driver_stubs = _generate.driver_stubs(simcuda)
    nvml_stubs = _generate.nvml_stubs(simnvml)
    runtimes, runtime_notes = _generate.runtime_stubs(simcudart)
    runtime_parts = [part for r in runtimes for part in (r.stubs, r.version_script, str(r.include))]
    key = _build_key(
        simcuda,
        simnvml,
        simcudart,
        world_header,
        simloads,
        driver_stubs.text,
        nvml_stubs.text,
        *runtime_parts,
        *_compiler(),
    )
    directory = cache_dir() / "simdriver" / key
    settled = [*SIMULATED_LIBRARIES, LOAD_REDIRECT, *(r.soname for r in runtimes)]
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
        what = "the simulated world's load redirect"
        _compile(what, _SOURCES / "simloads.c", directory / LOAD_REDIRECT, ["-ldl"])
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
    return SimulatedWorld(directory, (*SIMULATED_LIBRARIES, *built), notes)


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


def recorded_world(stamp: tuple[object, ...]) -> SimulatedWorld | None:
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


def record_world(stamp: tuple[object, ...], world: SimulatedWorld) -> None:
    record = {"key": world.directory.name, "libraries": list(world.libraries), "notes": list(world.notes)}
    _record("simdriver", stamp, record)
