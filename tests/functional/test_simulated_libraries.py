"""Real CUDA libraries in the simulated world: each reaches cuInit there, and the scan names the line.

Every test runs the real library in a real subprocess against the real
simulated driver and NVML; a library that is not installed is skipped with
the reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from diagtools.driver import resolve_driver
from diagtools.render.text import render_scan
from diagtools.usecases.attribution import INFERRED_EVIDENCE
from tests.conftest import MARK, marked_line, require_installed

# The extra that installs each library these tests drive.
_EXTRA = {"cuda.bindings": "cuda", "cuda.core": "cuda", "triton": "kernels"}


def needs(module: str) -> None:
    require_installed(module, _EXTRA.get(module, "dev"))


def run_simulated(code: str, timeout: float = 120) -> list[str]:
    """Run ``code`` in a fresh interpreter inside the simulated world; its stdout lines."""
    env = dict(os.environ, **resolve_driver("simulated").env)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def final_event(runner) -> dict:
    """The scan's own run's final event (later runs verify cuts)."""
    return next(event for event in runner.runs[0].events if event["e"] == "final")


def assert_attributed(result, module: str, file, *, exact_site: bool = False, inferred: bool = False) -> None:
    """The culprit is ``module``, and the marked line of ``file`` is on the stack that called cuInit.

    ``exact_site``: no Python frame lies between that line and the driver (a compiled
    binding), so it is the reported site itself; otherwise the site is inside the library.
    """
    assert result.cuda_initialized, result.error
    culprit = result.culprit
    assert culprit.module == module
    assert culprit.evidence == (INFERRED_EVIDENCE if inferred else "driver-hook")
    line = marked_line(file)
    assert any(frame.file == str(file) and frame.line == line for frame in culprit.stack), culprit.stack
    if exact_site:
        assert (culprit.site.file, culprit.site.line) == (str(file), line)


# ---- the driver library itself ----------------------------------------------------


def test_both_sonames_are_one_driver_and_unmodelled_entry_points_answer_801():
    lines = run_simulated(
        """
        import ctypes
        versioned = ctypes.CDLL("libcuda.so.1")
        plain = ctypes.CDLL("libcuda.so")
        count = ctypes.c_int(-1)
        print(plain.cuInit(0), versioned.cuDeviceGetCount(ctypes.byref(count)), count.value)
        print(plain.diagtools_sim_refusals(), versioned.cuMemCreate(None, 0, None, 0))
        versioned.diagtools_sim_first_refusal.restype = ctypes.c_char_p
        print(versioned.diagtools_sim_refusals(), versioned.diagtools_sim_first_refusal().decode())
        """
    )
    assert lines == ["0 0 1", "0 801", "2 cuMemCreate"]


def test_binding_unmodelled_functions_by_name_does_not_hide_a_later_init(sim_scan, make_tree):
    """vLLM's pattern: bind the VMM and checkpoint API through ctypes at import, then initialize."""
    root = make_tree(
        {
            "vmm.py": f"""
                import ctypes

                LIB = ctypes.CDLL("libcuda.so.1")
                BOUND = {{name: getattr(LIB, name) for name in (
                    "cuMemCreate", "cuMemAddressReserve", "cuMemMap", "cuMemSetAccess",
                    "cuCheckpointProcessLock", "cuCheckpointProcessGetState",
                )}}
                STATUS = LIB.cuInit(0)  {MARK}
                CREATE = BOUND["cuMemCreate"](None, 0, None, 0)
            """
        }
    )
    result = sim_scan("vmm", path=[root])
    assert result.status == "ok", result.error
    assert_attributed(result, "vmm", root / "vmm.py", exact_site=True)


def test_every_declared_entry_point_is_exported():
    needs("cuda.bindings")
    lines = run_simulated(
        """
        import ctypes, pathlib, re
        import cuda.bindings
        pxd = pathlib.Path(cuda.bindings.__path__[0]) / "cydriver.pxd"
        names = re.findall(r"cdef\\s+CUresult\\s+(cu[A-Z]\\w*)\\s*\\(", pxd.read_text())
        lib = ctypes.CDLL("libcuda.so.1")
        missing = [name for name in names if not hasattr(lib, name)]
        print(len(names), missing)
        """
    )
    count, missing = lines[0].split(" ", 1)
    assert int(count) > 400
    assert missing == "[]"


def test_get_proc_address_follows_the_documented_contract():
    lines = run_simulated(
        """
        import ctypes
        lib = ctypes.CDLL("libcuda.so.1")
        addr = lambda name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value

        def lookup(name, flags=0, version=13000):
            fn, status = ctypes.c_void_p(), ctypes.c_int(-7)
            rc = lib.cuGetProcAddress_v2(name.encode(), ctypes.byref(fn), version, ctypes.c_uint64(flags),
                                         ctypes.byref(status))
            return rc, fn.value, status.value

        print(lookup("cuMemAlloc")[1] == addr("cuMemAlloc_v2"), lookup("cuMemAlloc")[0])
        print(lookup("cuMemAlloc_v2")[1] == addr("cuMemAlloc_v2"))
        print(lookup("cuGetProcAddress")[1] == addr("cuGetProcAddress_v2"))
        print(lookup("cuInit")[1] == addr("cuInit"), lookup("cuDeviceTotalMem")[1] == addr("cuDeviceTotalMem_v2"))
        print(*lookup("cuNoSuchFunction"))
        fn = ctypes.c_void_p(1)
        print(lib.cuGetProcAddress(b"cuNoSuchFunction", ctypes.byref(fn), 13000, ctypes.c_uint64(0)), fn.value)
        if hasattr(lib, "cuMemcpyHtoD_v2_ptds"):
            print(lookup("cuMemcpyHtoD", flags=2)[1] == addr("cuMemcpyHtoD_v2_ptds"),
                  lookup("cuMemcpyHtoD", flags=1)[1] == addr("cuMemcpyHtoD_v2"),
                  lookup("cuLaunchKernel", flags=2)[1] == addr("cuLaunchKernel_ptsz"))
        """
    )
    assert lines[:6] == ["True 0", "True", "True", "True True", "500 None 1", "500 None"]
    if len(lines) > 6:  # a cuda.h was found at build time: per-thread-stream forms are exported
        assert lines[6] == "True True True"


def test_dlclose_keeps_the_init_state():
    lines = run_simulated(
        """
        import ctypes, _ctypes
        count = ctypes.c_int()
        lib = ctypes.CDLL("libcuda.so")
        print(lib.cuInit(0))
        _ctypes.dlclose(lib._handle)
        again = ctypes.CDLL("libcuda.so.1")
        print(again.cuDeviceGetCount(ctypes.byref(count)), count.value)
        """
    )
    assert lines == ["0", "0 1"]


def test_device_attributes_describe_an_sm90_board():
    needs("cuda.bindings")
    lines = run_simulated(
        """
        from cuda.bindings import driver as d
        d.cuInit(0)
        A = d.CUdevice_attribute
        failed = [a.name for a in A if a.name != "CU_DEVICE_ATTRIBUTE_MAX"
                  and d.cuDeviceGetAttribute(a, 0)[0] != d.CUresult.CUDA_SUCCESS]
        print(failed)
        for name in ("MULTIPROCESSOR_COUNT", "MAX_THREADS_PER_BLOCK", "WARP_SIZE", "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN",
                     "L2_CACHE_SIZE", "CLOCK_RATE", "GLOBAL_MEMORY_BUS_WIDTH", "UNIFIED_ADDRESSING", "MANAGED_MEMORY",
                     "COMPUTE_MODE", "CONCURRENT_KERNELS", "PCI_BUS_ID", "COMPUTE_CAPABILITY_MAJOR"):
            print(name, d.cuDeviceGetAttribute(getattr(A, "CU_DEVICE_ATTRIBUTE_" + name), 0)[1])
        """
    )
    assert lines[0] == "[]"
    values = dict(line.split() for line in lines[1:])
    assert values == {
        "MULTIPROCESSOR_COUNT": "132",
        "MAX_THREADS_PER_BLOCK": "1024",
        "WARP_SIZE": "32",
        "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": "232448",
        "L2_CACHE_SIZE": "52428800",
        "CLOCK_RATE": "1980000",
        "GLOBAL_MEMORY_BUS_WIDTH": "5120",
        "UNIFIED_ADDRESSING": "1",
        "MANAGED_MEMORY": "1",
        "COMPUTE_MODE": "0",
        "CONCURRENT_KERNELS": "1",
        "PCI_BUS_ID": "1",
        "COMPUTE_CAPABILITY_MAJOR": "9",
    }


# ---- the CUDA runtime ---------------------------------------------------------------


def test_cudart_reaches_the_driver_and_its_refusal_is_recorded():
    needs("cuda.bindings")
    lines = run_simulated(
        """
        import ctypes
        from cuda.bindings import runtime
        print(runtime.cudaGetDeviceCount()[0].name)
        lib = ctypes.CDLL("libcuda.so.1")
        lib.diagtools_sim_first_refusal.restype = ctypes.c_char_p
        count = ctypes.c_int()
        print(lib.cuDeviceGetCount(ctypes.byref(count)), lib.diagtools_sim_refusals())
        print(lib.diagtools_sim_first_refusal().decode())
        """
    )
    assert lines[0] == "cudaErrorNotSupported"  # the runtime stops at its private tables...
    assert lines[1] == "0 5"  # ...after initializing the driver: export table refused (1), init for it (4)
    assert lines[2].startswith("cuGetExportTable(")


def test_scan_attributes_cudart_init_to_the_calling_line(sim_scan, runner, make_tree):
    needs("cuda.bindings")
    root = make_tree(
        {
            "rtapp/__init__.py": "from . import probe\n",
            "rtapp/probe.py": f"""
                from cuda.bindings import runtime

                ERR, COUNT = runtime.cudaGetDeviceCount()  {MARK}
            """,
        }
    )
    result = sim_scan("rtapp", path=[root])
    assert result.status == "ok", result.error
    assert_attributed(result, "rtapp.probe", root / "rtapp/probe.py", exact_site=True, inferred=True)
    assert "inferred from the CUDA runtime's export-table request" in render_scan(result)
    refusals = final_event(runner)["refusals"]
    assert refusals["driver"] & 1
    assert refusals["driver"] & 4
    assert refusals["first"].startswith("cuGetExportTable(")


def test_scan_attributes_cupy_init_even_though_cupy_then_fails(sim_scan, runner, make_tree):
    needs("cupy")
    root = make_tree(
        {
            "cpapp.py": f"""
                import cupy

                try:
                    COUNT = cupy.cuda.runtime.getDeviceCount()  {MARK}
                except cupy.cuda.runtime.CUDARuntimeError as exc:
                    FAILED = exc
            """
        }
    )
    result = sim_scan("cpapp", path=[root], timeout=120.0)
    assert result.status == "ok", result.error
    assert_attributed(result, "cpapp", root / "cpapp.py", inferred=True)
    assert final_event(runner)["refusals"]["driver"] & 4


# ---- driver-API libraries ----------------------------------------------------------


def test_scan_attributes_numba_cuda_detection(sim_scan, runner, make_tree):
    needs("numba.cuda")
    root = make_tree(
        {
            "nbapp.py": f"""
                from numba import cuda

                AVAILABLE = cuda.is_available()  {MARK}
                NAMES = [gpu.name for gpu in cuda.gpus]
            """
        }
    )
    result = sim_scan("nbapp", path=[root], timeout=120.0)
    assert result.status == "ok", result.error
    assert_attributed(result, "nbapp", root / "nbapp.py")
    assert final_event(runner)["refusals"]["driver"] & 1 == 0


def test_numba_sees_the_simulated_device():
    needs("numba.cuda")
    lines = run_simulated(
        """
        from numba import cuda
        print(cuda.is_available(), len(cuda.gpus))
        device = cuda.get_current_device()
        print(tuple(device.compute_capability), device.MULTIPROCESSOR_COUNT, device.name.decode()
              if isinstance(device.name, bytes) else device.name)
        """
    )
    assert lines == ["True 1", "(9, 0) 132 diagtools simulated GPU (no hardware)"]


def test_scan_attributes_cuda_core_device(sim_scan, make_tree):
    needs("cuda.core")
    root = make_tree(
        {
            "coreapp.py": f"""
                from cuda.core import Device

                DEVICE = Device()  {MARK}
                DEVICE.set_current()
            """
        }
    )
    result = sim_scan("coreapp", path=[root])
    assert result.status == "ok", result.error
    assert_attributed(result, "coreapp", root / "coreapp.py")


def test_scan_attributes_warp_init(sim_scan, make_tree):
    needs("warp")
    root = make_tree(
        {
            "wpapp.py": f"""
                import warp

                warp.config.quiet = True
                warp.init()  {MARK}
                DEVICES = warp.get_cuda_device_count()
            """
        }
    )
    result = sim_scan("wpapp", path=[root], timeout=120.0)
    assert result.status == "ok", result.error
    assert_attributed(result, "wpapp", root / "wpapp.py")


def test_scan_attributes_tritons_driver_check(sim_scan, make_tree):
    needs("triton")
    root = make_tree(
        {
            "tritonapp.py": f"""
                from triton.backends.nvidia.driver import CudaDriver

                ACTIVE = CudaDriver.is_active()  {MARK}
            """
        }
    )
    result = sim_scan("tritonapp", path=[root], timeout=120.0)
    assert result.status == "ok", result.error
    assert_attributed(result, "tritonapp", root / "tritonapp.py")


# ---- NVML ----------------------------------------------------------------------------


def test_nvml_describes_the_same_gpu_and_leaves_cuda_uninitialized():
    needs("pynvml")
    lines = run_simulated(
        """
        import ctypes, pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        print(pynvml.nvmlDeviceGetCount())
        print(pynvml.nvmlDeviceGetName(handle))
        print(pynvml.nvmlDeviceGetUUID(handle))
        print(pynvml.nvmlDeviceGetMemoryInfo(handle).total, pynvml.nvmlDeviceGetCudaComputeCapability(handle))
        print(pynvml.nvmlDeviceGetPciInfo(handle).busId, pynvml.nvmlSystemGetCudaDriverVersion())
        try:
            pynvml.nvmlDeviceGetSerial(handle)
        except pynvml.NVMLError as exc:
            print(exc.value)
        cuda = ctypes.CDLL("libcuda.so")
        count = ctypes.c_int()
        print(cuda.cuDeviceGetCount(ctypes.byref(count)))
        cuda.cuInit(0)
        name = ctypes.create_string_buffer(128)
        uuid = (ctypes.c_ubyte * 16)()
        total = ctypes.c_size_t()
        cuda.cuDeviceGetName(name, 128, 0)
        cuda.cuDeviceGetUuid(uuid, 0)
        cuda.cuDeviceTotalMem_v2(ctypes.byref(total), 0)
        print(name.value.decode())
        print("GPU-" + "-".join(bytes(uuid)[a:b].hex() for a, b in ((0, 4), (4, 6), (6, 8), (8, 10), (10, 16))))
        print(total.value)
        pynvml.nvmlShutdown()
        """
    )
    count, name, uuid, memory, bus, unsupported, cuda_state, cuda_name, cuda_uuid, cuda_total = lines
    assert count == "1"
    assert name == cuda_name == "diagtools simulated GPU (no hardware)"
    assert uuid == cuda_uuid
    assert memory == f"{cuda_total} (9, 0)"
    assert bus == "00000000:01:00.0 13000"
    assert unsupported == "3"  # NVML_ERROR_NOT_SUPPORTED for an unmodelled function
    assert cuda_state == "3"  # NVML never initialized CUDA


def test_scan_of_nvml_detection_finds_no_cuda_init(sim_scan, runner, make_tree):
    needs("pynvml")
    root = make_tree(
        {
            "nvmlapp.py": """
                import pynvml

                pynvml.nvmlInit()
                COUNT = pynvml.nvmlDeviceGetCount()
                NAME = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
                assert COUNT == 1, COUNT
                pynvml.nvmlShutdown()
            """
        }
    )
    result = sim_scan("nvmlapp", path=[root])
    assert result.status == "ok", result.error
    assert not result.cuda_initialized
    assert result.culprits == ()
    refusals = final_event(runner)["refusals"]
    assert {key: refusals[key] for key in ("driver", "first", "nvml", "nvml_first")} == {
        "driver": 0,
        "first": None,
        "nvml": 0,
        "nvml_first": None,
    }
    assert (refusals.get("runtime"), refusals.get("runtime_first")) in ((0, None), (None, None))


def test_platform_gated_init_is_caught_at_the_right_line(sim_scan, make_tree):
    """vLLM's pattern: NVML decides the platform, then only the CUDA platform initializes CUDA."""
    needs("pynvml")
    needs("cuda.bindings")
    root = make_tree(
        {
            "gated/__init__.py": """
                from gated.platforms import current_platform

                PLATFORM = current_platform()
            """,
            "gated/platforms/__init__.py": """
                def cuda_platform_plugin():
                    import pynvml

                    pynvml.nvmlInit()
                    try:
                        return "gated.platforms.cuda" if pynvml.nvmlDeviceGetCount() > 0 else None
                    finally:
                        pynvml.nvmlShutdown()

                def current_platform():
                    import importlib

                    name = cuda_platform_plugin() or "gated.platforms.cpu"
                    return importlib.import_module(name).Platform()
            """,
            "gated/platforms/cpu.py": "class Platform:\n    device = 'cpu'\n",
            "gated/platforms/cuda.py": f"""
                import pynvml
                from cuda.bindings import driver

                pynvml.nvmlInit()
                CAPABILITY = pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(0))
                (STATUS,) = driver.cuInit(0)  {MARK}

                class Platform:
                    device = "cuda"
            """,
        }
    )
    result = sim_scan("gated", path=[root])
    assert result.status == "ok", result.error
    assert_attributed(result, "gated.platforms.cuda", root / "gated/platforms/cuda.py", exact_site=True)
    assert result.culprit.chain == ("gated", "gated.platforms.cuda")
    assert not result.module("gated.platforms").initializes_cuda
