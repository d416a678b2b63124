"""The driver a subkernel gets: the real one when it loads here, else the simulated world, or none.

The package keeps what a process finds and builds once (the real driver's
path, the simulated world) and hands each subkernel its environment; the
rooms below it do the work: :mod:`~diagtools.driver.build` (the build cache:
compiling the shipped C, keyed by what it was built from),
:mod:`~diagtools.driver.world` (the simulated driver, NVML and runtimes) and
:mod:`~diagtools.driver.detect` (a real driver told apart from a simulated one).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from diagtools import protocol
from diagtools.driver.build import (
    build_injection_library,
    build_probe_extension,
    build_starts_library,
    cache_dir,
    loader_safe,
)
from diagtools.driver.detect import find_real_driver, preloaded, without_simulated_paths
from diagtools.driver.world import (
    LOAD_REDIRECT,
    SIMULATED_LIBRARIES,
    SimulatedWorld,
    input_stamp,
    make_world,
    record_world,
    recorded_world,
    usable,
)
from diagtools.errors import DriverUnavailableError, UsageError
from diagtools.model.driver import DriverInfo
from diagtools.model.options import DRIVER_CHOICES

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


_world_cache: dict[tuple[object, ...], SimulatedWorld] = {}


def build_simulated_driver() -> Path:
    """The directory holding the simulated ``libcuda.so.1`` (and NVML beside it), built if needed."""
    return build_simulated_world().directory


def build_simulated_world() -> SimulatedWorld:
    """The simulated driver, NVML and runtime (:func:`diagtools.driver.world.make_world`), built once: this
    process remembers it, and another finds the record an earlier one left for the same inputs."""
    stamp = input_stamp()
    cached = _world_cache.get(stamp) or recorded_world(stamp)
    if cached is not None and usable(cached):
        _world_cache[stamp] = cached
        return cached
    world = make_world()
    _world_cache[stamp] = world
    record_world(stamp, world)
    return world


def real_driver_path() -> str | None:
    """Path of a real ``libcuda.so.1`` that loads here, or ``None`` (found once per process)."""
    if "path" not in _real_driver_cache:
        _real_driver_cache["path"] = find_real_driver()
    return _real_driver_cache["path"]


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
    A load by path (torch 2.14 loads its wheels' ``libcudart.so.13`` so) gets
    the world's copy through the load redirect preloaded before it (``simloads.c``).
    """
    world = build_simulated_world()
    directory = loader_safe(world.directory)
    current = without_simulated_paths(dict(os.environ))
    runtimes = [str(directory / name) for name in world.libraries if name.startswith("libcudart.")]
    redirect = [str(directory / LOAD_REDIRECT)] if (world.directory / LOAD_REDIRECT).exists() else []
    env = {
        "LD_LIBRARY_PATH": ":".join(p for p in (str(directory), current.get("LD_LIBRARY_PATH", "")) if p),
        "TRITON_LIBCUDA_PATH": str(directory),
        protocol.DRIVER_KIND: "simulated",
        protocol.SIMULATED_WORLD: os.path.realpath(world.directory),
    }
    # set even when empty: a preload of an older simulated world must not be inherited
    env["LD_PRELOAD"] = ":".join(p for p in (*redirect, *runtimes, current.get("LD_PRELOAD", "")) if p)
    info = DriverInfo("simulated", requested, str(world.directory / "libcuda.so.1"), world.libraries)
    return DriverSetup(info, env, libraries=world.libraries, notes=world.notes)


"""Characters the loader's path lists cannot carry: ``LD_LIBRARY_PATH`` splits at ``:`` and ``;``,
``LD_PRELOAD`` also at spaces, and both expand ``$ORIGIN``-style tokens."""
