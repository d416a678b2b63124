"""The GPU-box path (``--driver real`` and ``auto``) end to end, against a vendor-like driver stand-in.

``vendor_driver/libcuda.c`` is built here into a folder put on the loader's path,
as the NVIDIA container toolkit mounts a driver: a ``libcuda.so.1`` that knows
nothing of diagtools and, on the first ``cuInit``, opens the library named by
``CUDA_INJECTION64_PATH`` and calls its ``InitializeInjection``.  Every command
must then take the real-driver branch, say ``real`` and name that library, and
see ``cuInit`` through the injection hook (evidence ``driver-hook``): the test
that disconnects the hook shows those assertions cannot pass without it.
Faulty builds of the same file are the drivers the tool must not trust blindly.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import diagtools
from diagtools import driver as drivers
from diagtools.specimens import get
from tests.conftest import DIAGTOOLS, MARK, marked_line

SOURCE = Path(__file__).with_name("vendor_driver") / "libcuda.c"
VARIANTS = {
    "vendor": [],
    "blind": ["-DSTANDIN_NO_INJECTION", "-DSTANDIN_NO_STATE"],  # no injection call, no cuDeviceGetCount
    "old": ["-DSTANDIN_NO_INJECTION", "-DSTANDIN_VERSION=9000"],  # too old to load an injection library
}
EARLY = f"import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)  {MARK}\n"
FORKS = f"""
import ctypes
import multiprocessing as mp


def child():
    pass


ctypes.CDLL("libcuda.so.1").cuInit(0)  {MARK}
if __name__ == "__main__":
    worker = mp.get_context("fork").Process(target=child)
    worker.start()
    worker.join()
"""


@pytest.fixture(scope="session")
def stand_ins(tmp_path_factory) -> dict[str, Path]:
    """Each variant's folder, holding its ``libcuda.so.1`` (and ``libcuda.so``), as a container mounts one."""
    if shutil.which(os.environ.get("CC", "cc").split()[0]) is None:
        pytest.skip("no C compiler (cc) to build the driver stand-in")
    root = tmp_path_factory.mktemp("drivers")
    folders = {}
    for name, flags in VARIANTS.items():
        folder = root / name / "lib64"
        folder.mkdir(parents=True)
        command = ["cc", "-shared", "-fPIC", "-O2", *flags, "-Wl,-soname,libcuda.so.1", "-o"]
        subprocess.run([*command, str(folder / "libcuda.so.1"), str(SOURCE), "-ldl"], check=True)
        (folder / "libcuda.so").symlink_to("libcuda.so.1")
        folders[name] = folder
    return folders


def env_with(folder: Path, **extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("LD_LIBRARY_PATH", "")) if p)
    return {**os.environ, "LD_LIBRARY_PATH": path, **extra}


def diagtools_cli(folder: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DIAGTOOLS, *args], capture_output=True, text=True, env=env_with(folder, **extra), timeout=300, check=False
    )


@pytest.fixture
def on_driver(monkeypatch, stand_ins):
    """Put a variant on this process's loader path (the subkernels inherit it), forgetting the earlier choice."""

    def use(name: str) -> Path:
        monkeypatch.setenv("LD_LIBRARY_PATH", env_with(stand_ins[name])["LD_LIBRARY_PATH"])
        monkeypatch.setattr(drivers, "_real_driver_cache", {})
        return stand_ins[name] / "libcuda.so.1"

    yield use
    drivers._real_driver_cache.clear()


@pytest.mark.parametrize("choice", ["auto", "real"])
def test_scan_takes_the_real_driver_and_sees_cuinit_through_its_injection_hook(stand_ins, make_tree, choice):
    root = make_tree({"early.py": EARLY})
    out = root / "scan.json"
    done = diagtools_cli(
        stand_ins["vendor"], "scan", "early", "--path", str(root), "--driver", choice, "--json", str(out)
    )
    assert done.returncode == 0, done.stderr
    document = json.loads(out.read_text())
    library = str(stand_ins["vendor"] / "libcuda.so.1")
    assert document["driver"] == {"kind": "real", "requested": choice, "library": library, "libraries": []}
    assert f"driver: real CUDA driver ({library})" in done.stdout
    culprit = document["culprits"][0]
    assert culprit["evidence"] == "driver-hook"
    assert (culprit["site"]["file"], culprit["site"]["line"]) == (
        str(root / "early.py"),
        marked_line(root / "early.py"),
    )


def test_the_specimens_cut_is_verified_on_the_real_driver(on_driver):
    library = on_driver("vendor")
    specimen = get("common_ops")
    result = diagtools.scan(specimen.target, path=[specimen.tree("before")], driver="real")
    assert (result.driver.kind, result.driver.library) == ("real", str(library))
    assert result.culprit.evidence == "driver-hook"
    assert result.line_to_change.source == "from .fused_allreduce_rms_norm import fused_allreduce_rms_norm"
    assert not diagtools.scan(specimen.target, path=[specimen.tree("after")], driver="real").cuda_initialized


def foreign_injection(kind: str, folder: Path) -> Path:
    """An injection library that does not load: missing, not an ELF file, or built for another machine."""
    path = folder / "libdiagtools_injection.so"
    if kind == "not-elf":
        path.write_text("not an ELF file\n")
    elif kind == "aarch64":
        image = bytearray(drivers.build_injection_library().read_bytes())
        image[18:20] = (183).to_bytes(2, "little")  # e_machine: EM_AARCH64
        path.write_bytes(bytes(image))
    return path


@pytest.mark.parametrize("kind", ["missing", "not-elf", "aarch64"])
def test_a_disconnected_injection_hook_fails_the_driver_hook_assertions(on_driver, make_tree, monkeypatch, kind):
    """Break CUDA_INJECTION64_PATH (a library that does not load): the same scan no longer has the hook's
    evidence, so every test here that asserts ``driver-hook`` depends on the injection path."""
    on_driver("vendor")
    broken = foreign_injection(kind, make_tree({}))
    monkeypatch.setattr(drivers, "build_injection_library", lambda: broken)
    root = make_tree({"early.py": EARLY})
    result = diagtools.scan("early", path=[root], driver="real")
    assert result.cuda_initialized  # the driver's state still shows the initialization...
    assert result.culprit.evidence != "driver-hook"  # ...but not the hook
    assert result.culprit.evidence in ("state-probe", "trace")
    assert (result.culprit.site.file, result.culprit.site.line) == (
        str(root / "early.py"),
        marked_line(root / "early.py"),
    )
    assert "never called the injection library" in str(result)


def test_replay_on_the_real_driver_sees_the_forked_child_refused(stand_ins, make_tree):
    root = make_tree({"early.py": EARLY})
    out = root / "replay.json"
    done = diagtools_cli(
        stand_ins["vendor"], "replay", "early", "--path", str(root), "--driver", "real", "--child", "ctypes",
        "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads(out.read_text())
    assert document["driver"]["kind"] == "real"
    assert document["driver"]["library"] == str(stand_ins["vendor"] / "libcuda.so.1")
    assert f"driver: real CUDA driver ({stand_ins['vendor'] / 'libcuda.so.1'})" in done.stdout
    assert document["child"]["status"] == "failed"
    assert document["child"]["driver_calls"][0][:2] == ["cuInit(0)", 3]


def test_run_on_the_real_driver_reports_the_poisoned_fork(stand_ins, make_tree):
    root = make_tree({"app.py": FORKS})
    out = root / "run.json"
    done = diagtools_cli(stand_ins["vendor"], "run", "--json", str(out), "--", sys.executable, str(root / "app.py"))
    assert done.returncode == 0, done.stderr
    document = json.loads(out.read_text())
    assert document["driver"]["kind"] == "real"
    assert document["driver"]["library"] == str(stand_ins["vendor"] / "libcuda.so.1")
    assert document["verdict"] == "poisoned-fork"
    (finding,) = [f for f in document["findings"] if f["kind"] == "poisoned-fork"]
    assert finding["cuinit"]["evidence"] == "driver-hook"
    assert finding["cuinit"]["site"]["line"] == marked_line(root / "app.py")


@pytest.mark.parametrize("fresh", [False, True], ids=["zygote", "fresh"])
def test_sweep_on_the_real_driver_hands_nothing_across_a_fork(on_driver, make_tree, fresh):
    library = on_driver("vendor")
    root = make_tree(
        {
            "rk/__init__.py": "",
            "rk/gpu/__init__.py": "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n",  # a package that inits
            "rk/gpu/a.py": "VALUE = 1\n",
            "rk/gpu/b.py": "import json\n",
            "rk/calm.py": "VALUE = 2\n",
        }
    )
    result = diagtools.sweep("rk", path=[root], driver="real", jobs=2, fresh=fresh)
    assert (result.driver.kind, result.driver.library) == ("real", str(library))
    assert f"driver: real CUDA driver ({library})" in str(result)
    verdicts = {row.module: (row.verdict.value, row.cuda_source) for row in result.rows}
    assert verdicts == {
        "rk": ("clean", "none"),
        "rk.calm": ("clean", "none"),
        "rk.gpu": ("initializes-cuda", "self"),
        "rk.gpu.a": ("initializes-cuda", "parent"),
        "rk.gpu.b": ("initializes-cuda", "parent"),
    }
    assert all(row.culprit.evidence == "driver-hook" for row in result.culprits)
    assert result.mode == ("fresh" if fresh else "zygote")


def test_the_pytest_guard_on_the_real_driver_names_it(stand_ins, make_tree):
    root = make_tree(
        {
            "early.py": EARLY,
            "test_guard.py": "from diagtools.pytest_plugin import assert_import_cuda_free\n\n\n"
            "def test_guard():\n    assert_import_cuda_free('early', driver='auto')\n",
        }
    )
    env = env_with(stand_ins["vendor"], PYTHONPATH=str(root))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(root / "test_guard.py")],
        capture_output=True, text=True, env=env, cwd=root, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout
    assert f"[real CUDA driver ({stand_ins['vendor'] / 'libcuda.so.1'})]" in done.stdout
    assert "evidence: driver-hook" in done.stdout


def test_cuda_watch_on_the_real_driver(on_driver):
    from tests.conftest import require

    interactiveshell = require("IPython.core.interactiveshell", "notebook")
    library = on_driver("vendor")
    shell = interactiveshell.InteractiveShell.instance()
    try:
        shell.run_line_magic("load_ext", "diagtools")
        result = shell.run_cell_magic(
            "cuda_watch", "--timeout 120", FORKS.replace('if __name__ == "__main__":', "if True:")
        )
    finally:
        interactiveshell.InteractiveShell.clear_instance()
    assert (result.driver.kind, result.driver.library) == ("real", str(library))
    assert result.verdict == "poisoned-fork"


def test_a_driver_neither_hook_nor_state_can_see_is_never_called_clean(stand_ins, make_tree):
    root = make_tree({"early.py": EARLY, "calm.py": "VALUE = 1\n", "app.py": FORKS})
    for target in ("early", "calm"):
        out = root / f"{target}.json"
        done = diagtools_cli(stand_ins["blind"], "scan", target, "--path", str(root), "--json", str(out))
        assert done.returncode == 0, done.stderr
        document = json.loads(out.read_text())
        assert document["driver"]["kind"] == "real"
        assert document["verdict"] == "unknown", document["doubts"]
        assert "has no cuDeviceGetCount" in document["doubts"][0]
    ran = diagtools_cli(stand_ins["blind"], "run", "--json", "-", "--", sys.executable, str(root / "app.py"))
    report = json.loads(ran.stdout)
    assert report["verdict"] == "unknown"
    assert any("whether the fork was poisoned is unknown" in note for note in report["notes"])


def test_a_driver_too_old_for_injection_is_seen_by_its_state_and_says_so(stand_ins, make_tree):
    root = make_tree({"early.py": EARLY})
    done = diagtools_cli(stand_ins["old"], "scan", "early", "--path", str(root), "--json", "-")
    document = json.loads(done.stdout)
    assert document["verdict"] == "initializes-cuda"
    culprit = document["culprits"][0]
    assert culprit["evidence"] in ("state-probe", "trace")
    assert culprit["module"] == "early"
    text = diagtools_cli(stand_ins["old"], "scan", "early", "--path", str(root), "--no-cuts").stdout
    assert "note: the driver never called the injection library" in text


def test_a_cache_directory_the_hook_cannot_be_built_in_is_one_line(stand_ins, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    done = diagtools_cli(stand_ins["vendor"], "scan", "json", "--driver", "real", DIAGTOOLS_CACHE_DIR=str(blocker))
    assert done.returncode == 2
    line = done.stderr.strip()
    assert line.startswith(f"diagtools: error: could not build the CUDA injection hook in {blocker}/injection/")
    assert "set DIAGTOOLS_CACHE_DIR" in line
    assert "Traceback" not in done.stderr
