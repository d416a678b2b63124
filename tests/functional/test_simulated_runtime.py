"""The simulated CUDA runtime (libcudart.so.N): built from the installed real one, and what it models.

The real runtime the tests compare against is the one ``make test`` installs
(nvidia-cuda-runtime, the ``dev`` extra); without it no simulated runtime is built
and these tests skip with the reason.  What the repository's venv cannot show:

- torch: only its CUDA build binds to a runtime (``make setup`` installs that build on
  these machines; a CPU build is said so, and the vLLM pins run in ``benchmarks/``).
- cupy and cuda-python's runtime bindings (``cuda.bindings.runtime``) link the runtime
  statically and export none of it, so no shared runtime can stand in for theirs: they
  reach the simulated driver's export-table door, which ``test_simulated_libraries``
  covers (the inferred cuInit, the recorded refusal).  cuda-pathfinder, which finds the
  shared runtime for the libraries that load it, is covered here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from textwrap import dedent

import pytest

from diagtools.driver import _elf, _generate, build_simulated_world, resolve_driver
from diagtools.driver._elf import read_dynamic_identity
from diagtools.render.text import render_scan
from tests.conftest import MARK, _missing, marked_line
from tests.functional.test_simulated_libraries import needs, run_simulated

RUNTIME_SOURCE = Path(_generate.__file__).with_name("simcudart.c").read_text()


def built_runtime() -> tuple[Path, Path]:
    """(the simulated libcudart.so.N, the real one it imitates); skips when none is installed."""
    runtimes, notes = _generate.runtime_stubs(RUNTIME_SOURCE)
    if not runtimes:  # nvidia-cuda-runtime comes with the dev extra: under CI its absence fails
        _missing("nvidia-cuda-runtime", "dev", "; ".join(notes))
    world = build_simulated_world()
    return world.directory / runtimes[0].soname, runtimes[0].real


def with_runtime(code: str) -> list[str]:
    """Run ``code`` with ``ctypes`` imported and ``rt``, the simulated runtime, loaded, in the simulated world."""
    simulated, _ = built_runtime()
    return run_simulated(f"import ctypes\nrt = ctypes.CDLL({str(simulated)!r}, ctypes.RTLD_GLOBAL)\n" + dedent(code))


def exported(library: Path) -> set[str]:
    """``name@version`` of every defined dynamic function, as binutils' nm sees it (not our reader)."""
    if shutil.which("nm") is None:
        pytest.skip("binutils' nm is not installed")
    done = subprocess.run(
        ["nm", "-D", "--defined-only", "--with-symbol-versions", str(library)],
        capture_output=True,
        text=True,
        check=True,
    )
    found = set()
    for line in done.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in ("T", "W"):
            found.add(parts[2].replace("@@", "@"))
    return found


def test_soname_version_node_and_exports_match_the_real_runtime():
    simulated, real = built_runtime()
    ours, theirs = read_dynamic_identity(simulated), read_dynamic_identity(real)
    assert ours.soname == theirs.soname
    assert ours.versions == theirs.versions
    extra = exported(simulated) - exported(real)
    assert exported(real) <= exported(simulated)
    assert {name.split("@")[0] for name in extra} == {
        "diagtools_simcudart_refusals",
        "diagtools_simcudart_first_refusal",
    }


CONSUMER = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
int cudaGetDeviceCount(int *);
int cudaRuntimeGetVersion(int *);
const char *cudaGetErrorName(int);
int main(void)
{
    int count = -1, version = 0;
    int status = cudaGetDeviceCount(&count);
    cudaRuntimeGetVersion(&version);
    Dl_info info;
    dladdr((void *)cudaGetDeviceCount, &info);
    printf("%s %d %d\n%s\n", cudaGetErrorName(status), count, version, info.dli_fname);
    return 0;
}
"""


def linked_consumer(tmp_path: Path, real: Path, *, rpath: bool) -> Path:
    """A program linked against the real runtime, so its references carry the real version node.

    With ``rpath``, it finds the real runtime through DT_RPATH as torch's libtorch_cuda.so does.
    """
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler")
    source = tmp_path / "consumer.c"
    source.write_text(CONSUMER)
    program = tmp_path / "consumer"
    flags = [f"-Wl,-rpath,{real.parent}", "-Wl,--disable-new-dtags"] if rpath else []
    subprocess.run(
        [os.environ.get("CC", "cc"), "-o", str(program), str(source), f"-L{real.parent}", f"-l:{real.name}", *flags],
        check=True,
        capture_output=True,
    )
    return program


def run_consumer(program: Path, env: dict[str, str]) -> list[str]:
    done = subprocess.run([str(program)], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_a_program_linked_against_the_real_runtime_binds_to_the_simulated_one(tmp_path):
    simulated, real = built_runtime()
    program = linked_consumer(tmp_path, real, rpath=False)
    env = dict(os.environ, **resolve_driver("simulated").env)
    env["LD_PRELOAD"] = ""  # found on LD_LIBRARY_PATH alone: the version node must match
    status, library = run_consumer(program, env)
    assert status.split()[:2] == ["cudaSuccess", "1"]
    assert Path(library).resolve() == simulated.resolve()


def test_the_preloaded_runtime_wins_over_the_real_one_an_rpath_names(tmp_path):
    simulated, real = built_runtime()
    program = linked_consumer(tmp_path, real, rpath=True)
    env = dict(os.environ, **resolve_driver("simulated").env)
    status, library = run_consumer(program, env)
    assert status.split()[:2] == ["cudaSuccess", "1"]
    assert Path(library).resolve() == simulated.resolve()
    # without the preload, DT_RPATH wins: the real runtime, which stops at the driver's export tables
    env["LD_PRELOAD"] = ""
    status, library = run_consumer(program, env)
    assert Path(library).resolve() == real.resolve()
    assert status.split()[0] != "cudaSuccess"


def test_devices_memory_and_copies_are_modelled_and_launches_refused():
    lines = with_runtime(
        """
        rt.cudaGetErrorName.restype = ctypes.c_char_p
        rt.diagtools_simcudart_first_refusal.restype = ctypes.c_char_p
        count = ctypes.c_int(-1)
        print(rt.cudaGetDeviceCount(ctypes.byref(count)), count.value)
        props = ctypes.create_string_buffer(4096)
        print(rt.cudaGetDeviceProperties(props, 0), props.value.decode())
        major, minor = ctypes.c_int(), ctypes.c_int()
        rt.cudaDeviceGetAttribute(ctypes.byref(major), 75, 0)  # cudaDevAttrComputeCapabilityMajor
        rt.cudaDeviceGetAttribute(ctypes.byref(minor), 76, 0)
        print(major.value, minor.value)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        pointer = ctypes.c_void_p()
        print(rt.cudaMalloc(ctypes.byref(pointer), 1 << 20), rt.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)),
              total.value - free.value >= 1 << 20)
        source = ctypes.create_string_buffer(b"simulated", 16)
        back = ctypes.create_string_buffer(16)
        rt.cudaMemcpy(pointer, source, 16, 1)  # host to "device"
        rt.cudaMemcpy(back, pointer, 16, 2)    # and back
        print(back.value.decode(), rt.cudaFree(pointer))
        print(rt.cudaFree(source), rt.cudaFree(ctypes.c_void_p(4096)))  # never handed out: refused
        print(rt.diagtools_simcudart_refusals())
        launched = rt.cudaLaunchKernel(None, 0, 0, 0, 0, 0, 0, None, 0, None)
        print(launched, rt.cudaGetErrorName(rt.cudaGetLastError()).decode())
        graph = rt.cudaGraphCreate(None, 0)
        print(graph, rt.diagtools_simcudart_refusals(), rt.diagtools_simcudart_first_refusal().decode())
        """
    )
    assert lines == [
        "0 1",
        "0 diagtools simulated GPU (no hardware)",
        "9 0",
        "0 0 True",
        "simulated 0",
        "1 1",  # cudaErrorInvalidValue, and nothing unmapped
        "0",  # nothing refused yet
        "801 cudaErrorNotSupported",  # a kernel launch: refused, and the last error says so
        "801 3 cudaLaunchKernel",  # an unmodelled call too: both kinds recorded, the first named
    ]


def test_a_child_forked_after_the_runtime_initialized_cuda_fails_as_on_a_gpu():
    simulated, _ = built_runtime()
    lines = run_simulated(
        f"""
        import ctypes, os
        rt = ctypes.CDLL({str(simulated)!r}, ctypes.RTLD_GLOBAL)
        count = ctypes.c_int()
        print(rt.cudaGetDeviceCount(ctypes.byref(count)))
        pid = os.fork()
        if pid == 0:
            os._exit(rt.cudaGetDeviceCount(ctypes.byref(count)))
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        """
    )
    assert lines == ["0", "3"]  # cudaErrorInitializationError in the child


def test_cuda_pathfinder_finds_the_simulated_runtime():
    needs("cuda.pathfinder")
    simulated, _ = built_runtime()
    lines = run_simulated(
        """
        from cuda.pathfinder import load_nvidia_dynamic_lib
        print(load_nvidia_dynamic_lib("cudart").abs_path)
        """
    )
    assert Path(lines[0]).resolve() == simulated.resolve()


def test_scan_names_the_runtime_caller_and_shows_the_gaps_in_the_text(sim_scan, runner, make_tree):
    simulated, _ = built_runtime()
    root = make_tree(
        {
            "rtlaunch.py": f"""
                import ctypes

                RT = ctypes.CDLL({str(simulated)!r})
                COUNT = ctypes.c_int()
                RT.cudaGetDeviceCount(ctypes.byref(COUNT))  {MARK}
                LAUNCHED = RT.cudaLaunchKernel(None, 0, 0, 0, 0, 0, 0, None, 0, None)
            """
        }
    )
    result = sim_scan("rtlaunch", path=[root])
    assert result.status == "ok", result.error
    assert result.culprit.module == "rtlaunch"
    assert result.culprit.evidence == "driver-hook"  # the simulated runtime calls cuInit by name
    line = marked_line(root / "rtlaunch.py")
    assert any(frame.line == line for frame in result.culprit.stack)
    assert any("kernel launch was refused" in gap for gap in result.simulation_gaps), result.simulation_gaps
    text = render_scan(result)
    assert "simulation gaps" in text
    assert "kernel launch was refused" in text


def test_without_runtime_headers_no_runtime_is_built_and_a_note_says_why(monkeypatch, tmp_path):
    _, real = built_runtime()
    fake = tmp_path / "nvidia" / "cu99" / "lib"
    fake.mkdir(parents=True)
    shutil.copy(real, fake / real.name)
    monkeypatch.setattr(_generate, "_real_runtimes", lambda: iter([fake / real.name]))
    monkeypatch.setattr(_generate, "_runtime_headers", lambda real, major: None)
    runtimes, notes = _generate.runtime_stubs(RUNTIME_SOURCE)
    assert runtimes == []
    assert any("no CUDA" in note and "headers" in note for note in notes), notes


def test_the_repository_venv_torch_binds_to_the_simulated_runtime(sim_scan):
    """A CUDA torch (what ``make setup`` installs) sees the simulated GPU, and importing it stays clean.

    torch 2.14 also loads each nvidia wheel's library by its path; the real runtime must
    not be mapped beside the simulated one, or every scan that imports torch would be
    ``unknown``.  A CPU torch has no runtime to bind: said so, not skipped silently.
    """
    needs("torch")
    lines = run_simulated(
        """
        import torch
        print(torch.version.cuda, torch.cuda.is_available())
        print(any("libcudart" in line and "simdriver" not in line for line in open("/proc/self/maps")))
        """
    )
    if lines[0].split()[0] == "None":
        assert lines[0] == "None False"
        return
    assert lines[0].endswith("True")
    assert lines[1] == "False"
    result = sim_scan("torch")
    assert (result.status, result.verdict) == ("ok", "clean"), result.blind_spots


def test_a_runtime_loaded_by_its_path_is_the_simulated_one(tmp_path):
    """``ctypes.CDLL("/.../nvidia/cu13/lib/libcudart.so.13")`` gets the world's copy; without the load
    redirect the real file is mapped beside it (so this test can fail)."""
    _, real = built_runtime()
    wheel_copy = tmp_path / "nvidia" / "cu13" / "lib" / real.name
    wheel_copy.parent.mkdir(parents=True)
    shutil.copy(real, wheel_copy)
    code = f"""
        import ctypes
        handle = ctypes.CDLL({str(wheel_copy)!r})
        print(hasattr(handle, "diagtools_simcudart_refusals"))
        print(any({str(wheel_copy)!r} in line for line in open("/proc/self/maps")))
    """
    assert run_simulated(code) == ["True", "False"]
    env = resolve_driver("simulated").env
    without = ":".join(p for p in env["LD_PRELOAD"].split(":") if "simloads" not in p)
    done = subprocess.run(
        [sys.executable, "-c", dedent(code)],
        env={**os.environ, **env, "LD_PRELOAD": without},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.split() == ["False", "True"]


def test_a_scan_that_loads_the_runtime_by_its_path_keeps_its_verdict(sim_scan, make_tree, tmp_path):
    """Loading the real runtime's file by path and calling it is seen: the world's copy answered."""
    _, real = built_runtime()
    wheel_copy = tmp_path / "wheel" / real.name
    wheel_copy.parent.mkdir()
    shutil.copy(real, wheel_copy)
    root = make_tree(
        {
            "bypath.py": f"""
                import ctypes

                RT = ctypes.CDLL({str(wheel_copy)!r})
            """,
            "bypathcall.py": f"""
                import ctypes

                RT = ctypes.CDLL({str(wheel_copy)!r})
                COUNT = ctypes.c_int()
                RT.cudaGetDeviceCount(ctypes.byref(COUNT))  {MARK}
            """,
        }
    )
    loaded = sim_scan("bypath", path=[root])
    assert (loaded.status, loaded.verdict) == ("ok", "clean"), loaded.blind_spots
    called = sim_scan("bypathcall", path=[root])
    assert called.verdict == "initializes-cuda"
    assert called.culprit.evidence == "driver-hook"
    assert any(frame.line == marked_line(root / "bypathcall.py") for frame in called.culprit.stack)


def test_unmodelled_functions_answer_not_supported_and_modelled_ones_are_not_stubbed():
    runtimes, notes = _generate.runtime_stubs(RUNTIME_SOURCE)
    if not runtimes:
        _missing("nvidia-cuda-runtime", "dev", "; ".join(notes))
    stubs = runtimes[0].stubs
    # a call the header declares returning cudaError_t answers 801
    assert 'int cudaGraphCreate(void) { return diagtools_simcudart_unmodelled("cudaGraphCreate"); }' in stubs
    assert " cudaMalloc(void)" not in stubs  # modelled by hand, never stubbed


def test_a_call_the_header_renames_is_modelled_under_the_new_name_and_the_old_one_stubbed(monkeypatch, tmp_path):
    """CUDA 12's header maps cudaGetDeviceProperties to _v2 (a newer cudaDeviceProp); the old name stays, refused."""
    include = tmp_path / "include"
    include.mkdir()
    (include / "cuda_runtime_api.h").write_text(
        "#define CUDART_VERSION 12090\n"
        "#define cudaGetDeviceProperties cudaGetDeviceProperties_v2\n"
        "extern cudaError_t CUDARTAPI cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);\n"
    )
    real = tmp_path / "libcudart.so.12"
    identity = _elf.DynamicIdentity(
        "libcudart.so.12",
        ("libcudart.so.12",),
        {"cudaGetDeviceProperties": "libcudart.so.12", "cudaGetDeviceProperties_v2": "libcudart.so.12"},
    )
    monkeypatch.setattr(_generate, "_real_runtimes", lambda: iter([real]))
    monkeypatch.setattr(_generate, "read_dynamic_identity", lambda path: identity)
    monkeypatch.setattr(_generate, "_runtime_headers", lambda real, major: include)
    (runtime,), _ = _generate.runtime_stubs(RUNTIME_SOURCE)
    assert "int cudaGetDeviceProperties(void)" in runtime.stubs  # the old layout: refused
    assert "cudaGetDeviceProperties_v2(void)" not in runtime.stubs  # simcudart.c defines it
    assert "cudaGetDeviceProperties_v2;" in runtime.version_script


def test_a_runtime_that_does_not_compile_leaves_the_driver_standing_with_a_note(monkeypatch, tmp_path):
    _, real = built_runtime()
    broken = tmp_path / "include"
    broken.mkdir()
    (broken / "cuda_runtime_api.h").write_text('#error "a release simcudart.c cannot build"\n')
    monkeypatch.setenv("DIAGTOOLS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(_generate, "_real_runtimes", lambda: iter([real]))
    monkeypatch.setattr(_generate, "_runtime_headers", lambda real, major: broken)
    world = build_simulated_world()
    assert world.libraries == ("libcuda.so.1", "libnvidia-ml.so.1")
    assert any("did not build" in note and "cannot build" in note for note in world.notes), world.notes
    setup = resolve_driver("simulated")
    preloads = [p for p in setup.env["LD_PRELOAD"].split(":") if p]
    assert [Path(p).name for p in preloads] == ["libdiagtools-simloads.so"]  # the load redirect, no runtime


def test_bad_pointers_and_handles_are_errors_as_in_the_real_runtime_never_a_crash():
    lines = with_runtime(
        """
        P = ctypes.c_void_p
        legacy, per_thread = P(1), P(2)
        print(rt.cudaMemcpy(None, None, 16, 4), rt.cudaMemset(None, 0, 16))
        print(rt.cudaMemcpy(P(4096), P(8192), 16, 4), rt.cudaMemcpy(None, None, 0, 4))
        code_page = ctypes.cast(rt.cudaMemset, P)  # mapped, readable, not writable
        print(rt.cudaMemset(code_page, 0, 4))
        print(rt.cudaStreamDestroy(per_thread), rt.cudaStreamDestroy(legacy), rt.cudaStreamDestroy(None))
        stream, event = P(), P()
        print(rt.cudaStreamCreate(ctypes.byref(stream)), rt.cudaEventCreate(ctypes.byref(event)))
        print(rt.cudaEventRecord(event, stream), rt.cudaStreamSynchronize(per_thread), rt.cudaStreamQuery(event))
        print(rt.cudaStreamDestroy(stream), rt.cudaStreamDestroy(stream))
        print(rt.cudaEventDestroy(event), rt.cudaEventDestroy(event), rt.cudaEventQuery(event))
        print(rt.cudaStreamSynchronize(stream), rt.cudaMemcpyAsync(None, None, 8, 4, stream))
        block, other = P(), P()
        print(rt.cudaMalloc(ctypes.byref(block), 4000), rt.cudaMalloc(ctypes.byref(other), 4000))  # a page holds more
        print(rt.cudaMemset(block, 0, 4001), rt.cudaMemcpy(other, block, 4001, 4), rt.cudaMemcpy(other, block, 4000, 4))
        """
    )
    assert lines == [
        "1 1",  # cudaErrorInvalidValue, not SIGSEGV
        "1 0",  # unmapped pointers too; a copy of nothing is fine
        "1",  # a read-only page cannot be set
        "400 400 400",  # cudaErrorInvalidResourceHandle: the special streams are not destroyed (free() crashed)
        "0 0",
        "0 0 400",  # an event is no stream
        "0 400",  # destroyed twice: an error, not a double free
        "0 400 400",
        "400 400",  # a destroyed stream is gone for every call
        "0 0",
        "1 1 0",  # one byte past an allocation is refused, as the real runtime checks a device allocation
    ]


ENTRY_POINTS = {  # name: the kinds of its arguments
    "cudaMemcpy": "pps k",
    "cudaMemcpyAsync": "pps kh",
    "cudaMemset": "pis",
    "cudaMemsetAsync": "pish",
    "cudaFree": "p",
    "cudaFreeAsync": "ph",
    "cudaStreamDestroy": "h",
    "cudaStreamSynchronize": "h",
    "cudaStreamQuery": "h",
    "cudaStreamWaitEvent": "hhi",
    "cudaEventDestroy": "h",
    "cudaEventRecord": "hh",
    "cudaEventSynchronize": "h",
    "cudaEventQuery": "h",
    "cudaEventElapsedTime": "ohh",  # an output pointer: the real runtime checks it only for null
}


def test_the_runtimes_entry_points_survive_random_arguments():
    """A seeded fuzz: pointers and handles drawn from null, small numbers, unmapped addresses, live and freed
    allocations, host buffers, live and destroyed streams and events; every call must return an error code,
    never crash.  Sizes past an allocation are refused as the real runtime refuses them; host buffers are
    larger than any size drawn that fits in memory (no runtime can know a host buffer's end), and a random
    address is drawn where nothing is mapped (a runtime cannot tell a stray pointer into mapped memory)."""
    lines = with_runtime(
        f"""
        import random
        entry_points = {ENTRY_POINTS!r}
        """
        + """
        P = ctypes.c_void_p
        rng = random.Random(1234)
        pool, handles = [], [P(1), P(2)]
        for _ in range(8):
            block, stream, event = P(), P(), P()
            rt.cudaMalloc(ctypes.byref(block), 4096)
            rt.cudaStreamCreate(ctypes.byref(stream))
            rt.cudaEventCreate(ctypes.byref(event))
            pool.append(block)
            handles += [stream, event]
        buffers = [ctypes.create_string_buffer(8192) for _ in range(4)]
        pool += [P(ctypes.addressof(b)) for b in buffers]

        def unmapped_address():
            with open("/proc/self/maps") as maps:
                spans = [[int(end, 16) for end in line.split()[0].split("-")] for line in maps]
            while True:
                address = rng.randrange(1 << 20, 1 << 47)
                if all(not lo - 8192 <= address < hi + 8192 for lo, hi in spans):
                    return address

        def draw(kind):
            roll = rng.random()
            if kind == "s":
                return ctypes.c_size_t(rng.choice([0, 1, 16, 4096, 4097, 1 << 40, 2**64 - 1]))
            if kind == "i" or kind == "k":
                return ctypes.c_int(rng.choice([0, 1, 2, 3, 4, 5, -1, 2**31 - 1]))
            if kind == "o":
                return None if roll < 0.3 else ctypes.byref(ctypes.c_float())
            if roll < 0.15:
                return None
            if roll < 0.3:
                return P(rng.randrange(1, 1 << 16))
            if roll < 0.45:
                return P(unmapped_address())
            return rng.choice(handles if kind == "h" else pool)

        calls = 0
        for _ in range(4000):
            name = rng.choice(sorted(entry_points))
            kinds = entry_points[name].replace(" ", "")
            code = getattr(rt, name)(*[draw(kind) for kind in kinds])
            assert isinstance(code, int) and 0 <= code < 1000, (name, code)
            calls += 1
        print(calls)
        """
    )
    assert lines == ["4000"]
