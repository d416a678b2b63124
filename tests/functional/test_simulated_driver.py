"""The simulated libcuda.so.1: init and fork semantics, for every kind of caller."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from diagtools.driver import build_simulated_driver, resolve_driver
from tests.conftest import MARK, marked_line


def run_with_driver(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter that resolves libcuda.so.1 to the stand-in."""
    env = dict(os.environ, **resolve_driver("simulated").env)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done


def test_ctypes_caller_sees_real_driver_semantics():
    done = run_with_driver(
        """
        import ctypes
        lib = ctypes.CDLL("libcuda.so.1")
        count = ctypes.c_int(-1)
        print(lib.cuDeviceGetCount(ctypes.byref(count)))
        print(lib.cuInit(0), lib.cuInit(0))
        print(lib.cuDeviceGetCount(ctypes.byref(count)), count.value)
        major, minor = ctypes.c_int(), ctypes.c_int()
        print(lib.cuDeviceComputeCapability(ctypes.byref(major), ctypes.byref(minor), 0), major.value, minor.value)
        name = ctypes.create_string_buffer(128)
        print(lib.cuDeviceGetName(name, 128, 0), name.value.decode())
        print(lib.cuInit(1))
        """
    )
    lines = done.stdout.splitlines()
    assert lines[0] == "3"  # CUDA_ERROR_NOT_INITIALIZED before cuInit
    assert lines[1] == "0 0"
    assert lines[2] == "0 1"
    assert lines[3] == "0 9 0"
    assert lines[4].startswith("0 ")
    assert "simulated" in lines[4]
    assert lines[5] == "1"  # flags must be 0


def test_fork_after_init_poisons_the_child_but_not_a_child_forked_before():
    done = run_with_driver(
        """
        import ctypes, os
        lib = ctypes.CDLL("libcuda.so.1")
        count = ctypes.c_int()

        def child(report):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.write(w, report().encode())
                os._exit(0)
            os.close(w)
            os.waitpid(pid, 0)
            return os.read(r, 100).decode()

        print(child(lambda: f"{lib.cuInit(0)} {lib.cuDeviceGetCount(ctypes.byref(count))}"))
        lib.cuInit(0)
        print(child(lambda: f"{lib.cuInit(0)} {lib.cuDeviceGetCount(ctypes.byref(count))}"))
        print(lib.cuDeviceGetCount(ctypes.byref(count)))
        """
    )
    before, after, parent = done.stdout.splitlines()
    assert before == "0 0"
    assert after == "3 3"
    assert parent == "0"


def test_cuda_python_resolves_every_entry_point_through_the_stand_in():
    done = run_with_driver(
        """
        from cuda.bindings import driver as d
        print(d.cuDeviceGetCount()[0].value)
        print(d.cuInit(0)[0].value)
        err, dev = d.cuDeviceGet(0)
        print(err.value, d.cuDeviceGetName(64, dev)[1].split(b"\\0")[0].decode())
        attr = d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
        print(d.cuDeviceGetAttribute(attr, dev))
        err, ctx = d.cuDevicePrimaryCtxRetain(dev)
        print(err.value, d.cuDevicePrimaryCtxGetState(dev)[2])
        print(d.cuCtxSetCurrent(ctx)[0].value, d.cuCtxGetDevice()[0].value)
        print(d.cuStreamCreate(0)[0].value)
        print(d.cuDriverGetVersion()[1])
        """
    )
    lines = done.stdout.splitlines()
    assert lines[0] == "3"
    assert lines[1] == "0"
    assert lines[2] == "0 diagtools simulated GPU (no hardware)"
    assert "9" in lines[3]
    assert lines[4] == "0 1"
    assert lines[5] == "0 0"
    assert lines[6] == "801"  # unmodelled entry points answer CUDA_ERROR_NOT_SUPPORTED
    assert int(lines[7]) >= 12000


def test_unknown_entry_points_never_crash():
    done = run_with_driver(
        """
        import ctypes
        lib = ctypes.CDLL("libcuda.so.1")
        fn = ctypes.c_void_p()
        status = ctypes.c_int()
        name = b"cuGraphInstantiateWithParams"
        print(lib.cuGetProcAddress_v2(name, ctypes.byref(fn), 12000, 0, ctypes.byref(status)))
        proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int)
        print(proto(fn.value)(None, 5))
        lib.cuInit(0)
        print(proto(fn.value)(None, 5))
        """
    )
    # before cuInit every call answers CUDA_ERROR_NOT_INITIALIZED, as the real driver does; after it, 801
    assert done.stdout.split() == ["0", "3", "801"]


def test_driver_is_built_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAGTOOLS_CACHE_DIR", str(tmp_path))
    first = build_simulated_driver()
    stamp = (first / "libcuda.so.1").stat().st_mtime_ns
    assert build_simulated_driver() == first
    assert (first / "libcuda.so.1").stat().st_mtime_ns == stamp
    assert first.is_relative_to(tmp_path)


def test_a_cache_record_is_trusted_only_for_the_inputs_it_names(tmp_path, monkeypatch):
    """Records are named by a cheap checksum of their inputs' stamp, so each holds the whole stamp and is checked."""
    import json
    import shutil

    from diagtools import driver

    monkeypatch.setenv("DIAGTOOLS_CACHE_DIR", str(tmp_path))
    world, probe = driver.build_simulated_world(), driver.build_probe_extension()
    elsewhere = shutil.copytree(world.directory, tmp_path / "elsewhere", symlinks=True)
    shutil.copy(probe, elsewhere / probe.name)
    records = sorted(tmp_path.glob("*/by-stamp/*"))
    assert len(records) == 2
    for record in records:  # what a record of other inputs, sharing the name, would say
        document = json.loads(record.read_text())
        document.update(stamp="other inputs", key="../elsewhere", library=str(elsewhere / probe.name))
        record.write_text(json.dumps(document))
    monkeypatch.setattr(driver, "_world_cache", {})
    assert driver.build_simulated_world().directory == world.directory
    assert driver.build_probe_extension() == probe


def test_broken_compiler_is_a_clear_error(tmp_path, monkeypatch):
    from diagtools.errors import DriverBuildError

    monkeypatch.setenv("DIAGTOOLS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "false")
    with pytest.raises(DriverBuildError, match="could not build the simulated CUDA driver"):
        build_simulated_driver()


def test_auto_picks_simulated_without_a_gpu_and_says_so():
    setup = resolve_driver("auto")
    if setup.info.kind == "real":
        pytest.skip(f"a real driver is present here ({setup.info.library})")
    assert setup.info.kind == "simulated"
    assert "stand-in" in setup.info.describe()


def test_driver_none_and_unknown_choice():
    from diagtools.errors import UsageError

    assert resolve_driver("none").info.kind == "none"
    with pytest.raises(UsageError, match="unknown driver"):
        resolve_driver("fake")


def test_real_driver_requested_without_one_is_a_clear_error():
    from diagtools.driver import real_driver_path
    from diagtools.errors import DriverUnavailableError

    if real_driver_path() is not None:
        pytest.skip("a real driver is present here")
    with pytest.raises(DriverUnavailableError, match="use --driver simulated or auto"):
        resolve_driver("real")


def test_scan_with_no_driver_sees_no_driver(sim_scan, make_tree):
    import diagtools

    root = make_tree(
        {"probe.py": "import ctypes\ntry:\n    ctypes.CDLL('libcuda.so.1').cuInit(0)\nexcept OSError:\n    pass\n"}
    )
    result = diagtools.scan("probe", path=[root], driver="none")
    assert result.driver.kind == "none"
    assert result.status == "ok"
    if result.driver.library is None:
        assert not result.cuda_initialized


def test_resolve_driver_reports_the_simulated_libraries_and_puts_them_first(tmp_path, monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))
    monkeypatch.setenv("LD_PRELOAD", str(tmp_path / "libother.so"))
    setup = resolve_driver("simulated")
    assert setup.libraries[:2] == ("libcuda.so.1", "libnvidia-ml.so.1")
    assert set(setup.libraries[2:]) <= {"libcudart.so.13", "libcudart.so.12"}  # the runtimes installed here
    assert setup.notes
    preload = setup.env.get("LD_PRELOAD", "").split(":")
    # the load redirect, the simulated runtimes (none when none is built), then what the caller preloaded
    world = Path(setup.info.library).parent
    assert preload[:-1] == [str(world / name) for name in ("libdiagtools-simloads.so", *setup.libraries[2:])]
    assert preload[-1] == str(tmp_path / "libother.so")
    first, *rest = setup.env["LD_LIBRARY_PATH"].split(":")
    assert rest == [str(tmp_path)]
    for name in ("libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1", "libnvidia-ml.so"):
        assert (Path(first) / name).exists(), name
    assert setup.info.library == str(Path(first) / "libcuda.so.1")
    assert resolve_driver("none").libraries == ()


def test_a_libcuda_so_elsewhere_does_not_bypass_the_simulation(tmp_path, monkeypatch):
    impostor = tmp_path / "impostor.c"
    impostor.write_text("int cuInit(unsigned int flags) { (void)flags; return 999; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(tmp_path / "libcuda.so"), str(impostor)], check=True)
    (tmp_path / "libcuda.so.1").symlink_to("libcuda.so")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))
    done = run_with_driver(
        """
        import ctypes
        print(ctypes.CDLL("libcuda.so").cuInit(0), ctypes.CDLL("libcuda.so.1").cuInit(0))
        """
    )
    assert done.stdout.split() == ["0", "0"]


def test_generated_stubs_are_part_of_the_build(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAGTOOLS_CACHE_DIR", str(tmp_path))
    directory = build_simulated_driver()
    stubs = (directory / "simcuda_stubs.c").read_text()
    assert "cuMemCreate" in stubs
    assert "nvmlDeviceGetSerial" in (directory / "simnvml_stubs.c").read_text()


def test_without_cuda_bindings_the_hand_modelled_set_is_exported_with_a_note(monkeypatch):
    from diagtools.driver import _generate

    monkeypatch.setattr(_generate, "_first_in_site", lambda relative: None)
    monkeypatch.setattr(_generate, "_newest_cuda_header", lambda: None)
    driver = _generate.driver_stubs((Path(_generate.__file__).parent / "simcuda.c").read_text())
    assert "cuda-bindings is not installed" in driver.note
    assert "cuInit" in driver.exported
    assert "cuMemCreate" not in driver.exported
    assert '{"cuMemGetInfo", "cuMemGetInfo_v2", NULL}' in driver.text  # hand-modelled versions still map
    nvml = _generate.nvml_stubs((Path(_generate.__file__).parent / "simnvml.c").read_text())
    assert "hand-modelled NVML functions" in nvml.note
    assert "nvmlInit_v2" in nvml.exported


DLCLOSER = f"""
    import ctypes, _ctypes

    lib = ctypes.CDLL("libcuda.so")
    STATUS = lib.cuInit(0)  {MARK}
    _ctypes.dlclose(lib._handle)
"""


def test_scan_and_replay_agree_on_a_caller_that_dlcloses_the_driver(sim_scan, runner, make_tree):
    from diagtools.usecases.replay import replay_fork

    root = make_tree({"closer.py": DLCLOSER})
    scanned = sim_scan("closer", path=[root])
    assert scanned.status == "ok", scanned.error
    assert scanned.cuda_initialized
    assert scanned.culprit.site.line == marked_line(root / "closer.py")
    replayed = replay_fork("closer", path=[root], driver="simulated", child="ctypes", runner=runner, timeout=60.0)
    assert replayed.parent.cuda_initialized == scanned.cuda_initialized
    assert replayed.status == "failed"
    assert replayed.child.driver_state_at_start == 3
