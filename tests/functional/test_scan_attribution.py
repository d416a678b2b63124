"""Who initialized CUDA, through which chain, at which line: real subkernels, simulated driver."""

from __future__ import annotations

import contextlib
import site
import subprocess
import sys
import sysconfig
import uuid
import zipfile
from pathlib import Path

import pytest

from tests.conftest import MARK, marked_line, require_installed

CTYPES_LEAF = f"""
    import ctypes

    def query():
        lib = ctypes.CDLL("libcuda.so.1")
        return lib.cuInit(0)  {MARK}

    STATUS = query()
"""

BINDINGS_LEAF = f"""
    from cuda.bindings import driver

    (STATUS,) = driver.cuInit(0)  {MARK}
"""


def test_ctypes_leaf_is_named_with_its_line(sim_scan, make_tree):
    root = make_tree({"pkg/__init__.py": "from .ops import STATUS\n", "pkg/ops.py": CTYPES_LEAF})
    result = sim_scan("pkg", path=[root])
    assert result.status == "ok"
    assert result.driver.kind == "simulated"
    assert result.cuda_initialized
    culprit = result.culprit
    assert culprit.module == "pkg.ops"
    assert culprit.chain == ("pkg", "pkg.ops")
    assert culprit.phase == "import"
    assert culprit.evidence == "driver-hook"
    assert culprit.site.file == str(root / "pkg/ops.py")
    assert culprit.site.line == marked_line(root / "pkg/ops.py")
    assert culprit.site.function == "query"
    assert "cuInit(0)" in culprit.site.source
    assert [f.function for f in culprit.stack][-2:] == ["<module>", "query"]
    assert result.module("pkg.ops").initializes_cuda
    assert not result.module("pkg").initializes_cuda


def test_cuda_python_leaf_behind_a_reexport(sim_scan, make_tree):
    root = make_tree(
        {
            "app/__init__.py": "",
            "app/ops/__init__.py": "from .light import f\nfrom .cutedsl_leaf import STATUS\n",
            "app/ops/light.py": "def f():\n    return 1\n",
            "app/ops/cutedsl_leaf.py": BINDINGS_LEAF,
        }
    )
    result = sim_scan("app.ops", path=[root])
    assert result.status == "ok", result.error
    culprit = result.culprit
    assert culprit.module == "app.ops.cutedsl_leaf"
    assert culprit.chain == ("app.ops", "app.ops.cutedsl_leaf")
    assert culprit.site.line == marked_line(root / "app/ops/cutedsl_leaf.py")
    assert result.module("app.ops.cutedsl_leaf").parent == "app.ops"
    assert result.module("app.ops.light").parent == "app.ops"
    assert not result.module("app.ops.light").initializes_cuda


def test_clean_package_has_no_culprit(sim_scan, make_tree):
    root = make_tree({"clean/__init__.py": "import json\nimport ctypes\nVALUE = json.dumps([1])\n"})
    result = sim_scan("clean", path=[root])
    assert result.status == "ok"
    assert not result.cuda_initialized
    assert result.culprits == ()
    assert "json" in result.module_names()
    assert not any(node.initializes_cuda for node in result.modules)


def test_thread_started_at_import_is_blamed_on_its_starter(sim_scan, make_tree):
    root = make_tree(
        {
            "warm/__init__.py": "from . import pool\nfrom . import innocent\n",
            "warm/innocent.py": "X = 1\n",
            "warm/pool.py": f"""
                import ctypes, threading, time

                def warm_up():
                    time.sleep(0.2)
                    ctypes.CDLL("libcuda.so.1").cuInit(0)  {MARK}

                worker = threading.Thread(target=warm_up)
                worker.start()
            """,
            "waiter.py": "import time, warm\nwarm.pool.worker.join()\n",
        }
    )
    result = sim_scan("waiter", path=[root])
    assert result.status == "ok", result.error
    culprit = result.culprit
    assert culprit.phase == "thread"
    assert culprit.module == "warm.pool"
    assert culprit.chain == ("waiter", "warm", "warm.pool")
    assert culprit.site.line == marked_line(root / "warm/pool.py")
    assert result.module("warm.pool").threads_started == 1
    assert not result.module("warm.innocent").initializes_cuda


def test_pep562_getattr_import_is_attributed_to_the_lazy_submodule(sim_scan, make_tree):
    root = make_tree(
        {
            "lazy/__init__.py": """
                import importlib

                def __getattr__(name):
                    return importlib.import_module("lazy." + name)
            """,
            "lazy/gpu.py": BINDINGS_LEAF,
            "user.py": "import lazy\nSTATUS = lazy.gpu.STATUS\n",
        }
    )
    assert not sim_scan("lazy", path=[root]).cuda_initialized
    result = sim_scan("user", path=[root])
    assert result.status == "ok", result.error
    assert result.culprit.module == "lazy.gpu"
    assert result.culprit.chain == ("user", "lazy.gpu")


def test_circular_imports_keep_a_correct_tree(sim_scan, make_tree):
    root = make_tree(
        {
            "ring/__init__.py": "from . import a\n",
            "ring/a.py": "from . import b\nA = 1\n",
            "ring/b.py": "from . import a\nfrom . import leaf\n",
            "ring/leaf.py": BINDINGS_LEAF,
        }
    )
    result = sim_scan("ring", path=[root])
    assert result.status == "ok", result.error
    assert result.culprit.chain == ("ring", "ring.a", "ring.b", "ring.leaf")
    assert result.module_names().count("ring.a") == 1


def test_startup_pth_is_phase_startup_and_the_target_is_not_blamed(sim_scan, make_tree, tmp_path, monkeypatch):
    root = make_tree({"innocent/__init__.py": "X = 1\n"})
    boot_dir = tmp_path / "boot"
    boot_dir.mkdir()
    (boot_dir / "bootcuda.py").write_text("import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n")
    monkeypatch.setenv("DIAGTOOLS_TEST_BOOT_DIR", str(boot_dir))
    with _startup_pth(
        "import os, sys; d = os.environ.get('DIAGTOOLS_TEST_BOOT_DIR'); d and sys.path.insert(0, d)"
        " or d and __import__('bootcuda')"
    ):
        result = sim_scan("innocent", path=[root])
        assert result.status == "ok", result.error
    assert result.startup.cuda_initialized
    assert result.culprit.phase == "startup"
    assert result.culprit.module == "bootcuda"
    assert result.culprit.site.file == str(boot_dir / "bootcuda.py")
    assert "innocent" not in result.culprit.chain
    assert not result.module("innocent").initializes_cuda
    assert result.module("bootcuda").phase == "startup"


@contextlib.contextmanager
def _startup_pth(line):
    """A .pth file in this interpreter's site-packages, active only where the test's variable is set."""
    pth = Path(site.getsitepackages()[0]) / f"zz-diagtools-test-{uuid.uuid4().hex}.pth"
    pth.write_text(line + "\n")
    try:
        yield pth
    finally:
        pth.unlink()


def test_sitecustomize_init_is_startup(sim_scan, make_tree, monkeypatch):
    root = make_tree({"sitecustomize.py": "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n", "t.py": ""})
    # --path entries are added after start-up, so there this sitecustomize is a plain module
    assert not sim_scan("t", path=[root]).startup.cuda_initialized
    monkeypatch.setenv("PYTHONPATH", str(root))
    result = sim_scan("t")
    assert result.status == "ok", result.error
    assert result.culprit.phase == "startup"
    assert result.culprit.module == "sitecustomize"
    assert result.startup.cuda_initialized
    assert result.module("t").phase == "import"
    assert result.culprit.chain == ("sitecustomize",)


def test_entry_point_plugin_loading_is_attributed_to_the_plugin(sim_scan, make_tree):
    root = make_tree(
        {
            "host/__init__.py": """
                from importlib.metadata import entry_points

                PLUGINS = [ep.load() for ep in entry_points(group="host.plugins")]
            """,
            "gpuplugin/__init__.py": BINDINGS_LEAF,
            "gpuplugin-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: gpuplugin\nVersion: 1.0\n",
            "gpuplugin-1.0.dist-info/entry_points.txt": "[host.plugins]\ngpu = gpuplugin\n",
        }
    )
    result = sim_scan("host", path=[root])
    assert result.status == "ok", result.error
    assert result.culprit.module == "gpuplugin"
    assert result.culprit.chain == ("host", "gpuplugin")
    assert result.culprit.site.line == marked_line(root / "gpuplugin/__init__.py")


def test_extension_module_init_is_blamed_on_the_extension(sim_scan, make_tree, tmp_path):
    source = tmp_path / "cuext.c"
    source.write_text(
        """
        #include <Python.h>
        #include <dlfcn.h>
        static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "cuext", NULL, -1, NULL};
        PyMODINIT_FUNC PyInit_cuext(void) {
            void *lib = dlopen("libcuda.so.1", RTLD_NOW);
            int (*init)(unsigned) = (int (*)(unsigned))dlsym(lib, "cuInit");
            init(0);
            return PyModule_Create(&def);
        }
        """
    )
    root = make_tree({"extpkg/__init__.py": f"from . import cuext  {MARK}\n"})
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    include = sysconfig.get_paths()["include"]
    done = subprocess.run(
        ["cc", "-shared", "-fPIC", f"-I{include}", "-o", str(root / "extpkg" / f"cuext{suffix}"), str(source), "-ldl"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = sim_scan("extpkg", path=[root])
    assert result.status == "ok", result.error
    assert result.culprit.module == "extpkg.cuext"
    assert result.culprit.site.file == str(root / "extpkg/__init__.py")
    assert result.culprit.site.line == marked_line(root / "extpkg/__init__.py")


def test_namespace_and_self_replacing_modules(sim_scan, make_tree):
    root = make_tree(
        {
            "nspkg/part/__init__.py": "from . import leaf\n",
            "nspkg/part/leaf.py": BINDINGS_LEAF,
            "swap.py": "import sys, types\nsys.modules[__name__] = types.SimpleNamespace(SWAPPED=True)\n",
            "top.py": "import swap\nimport nspkg.part\nassert swap.SWAPPED\n",
        }
    )
    result = sim_scan("top", path=[root])
    assert result.status == "ok", result.error
    names = result.module_names()
    assert {"swap", "nspkg", "nspkg.part", "nspkg.part.leaf"} <= set(names)
    assert result.module("nspkg").file is None
    assert result.culprit.chain == ("top", "nspkg.part", "nspkg.part.leaf")


def test_zip_import_is_traced(sim_scan, make_tree, tmp_path):
    archive = tmp_path / "bundle.zip"
    with zipfile.ZipFile(archive, "w") as bundle:
        bundle.writestr("zipped/__init__.py", "from . import inner\n")
        bundle.writestr("zipped/inner.py", "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n")
    root = make_tree({"usezip.py": f"import sys\nsys.path.insert(0, {str(archive)!r})\nimport zipped\n"})
    result = sim_scan("usezip", path=[root])
    assert result.status == "ok", result.error
    assert result.culprit.module == "zipped.inner"
    assert result.culprit.chain == ("usezip", "zipped", "zipped.inner")
    assert result.culprit.site.line == 2


def test_frozen_and_builtin_modules_appear_in_the_tree(sim_scan, make_tree):
    root = make_tree({"uses_stdlib.py": "import math, _json, zlib\n"})
    names = sim_scan("uses_stdlib", path=[root]).module_names()
    assert {"math", "_json", "zlib"} <= set(names)


def test_state_probe_plus_trace_rerun_finds_the_line_without_the_driver_hook(sim_scan, make_tree, monkeypatch):
    root = make_tree({"pkg/__init__.py": "from .ops import STATUS\n", "pkg/ops.py": CTYPES_LEAF})
    monkeypatch.setenv("DIAGTOOLS_SIMCUDA_NO_HOOK", "1")
    result = sim_scan("pkg", path=[root])
    assert result.status == "ok", result.error
    culprit = result.culprit
    assert culprit.evidence == "trace"
    assert culprit.module == "pkg.ops"
    assert culprit.chain == ("pkg", "pkg.ops")
    assert culprit.site.line == marked_line(root / "pkg/ops.py")
    unrefined = sim_scan("pkg", path=[root], refine=False)
    assert unrefined.culprit.evidence == "state-probe"
    assert unrefined.culprit.module == "pkg.ops"
    assert unrefined.culprit.site is None


def test_subkernel_honours_pythonpath_and_is_the_same_interpreter(sim_scan, make_tree, monkeypatch):
    root = make_tree({"frompp/__init__.py": "import sys\nEXE = sys.executable\n"})
    monkeypatch.setenv("PYTHONPATH", str(root))
    result = sim_scan("frompp")
    assert result.status == "ok"
    assert result.module("frompp").file == str(root / "frompp/__init__.py")
    assert result.python == sys.version.split()[0]


@pytest.mark.parametrize("count", [3])
def test_several_targets_in_one_subkernel(sim_scan, make_tree, count):
    files = {f"m{i}.py": "X = 1\n" for i in range(count)}
    files["m_last.py"] = BINDINGS_LEAF
    root = make_tree(files)
    targets = [f"m{i}" for i in range(count)] + ["m_last"]
    result = sim_scan(targets, path=[root])
    assert result.status == "ok", result.error
    assert result.targets == tuple(targets)
    assert result.culprit.module == "m_last"
    assert result.culprit.chain == ("m_last",)


def test_scanning_torch_reports_torch_cuda_state_without_initializing(sim_scan):
    require_installed("torch", "kernels")  # never import torch here: the test process stays CUDA-free
    result = sim_scan("torch", timeout=120.0)
    assert result.status == "ok", result.error
    assert not result.cuda_initialized
    assert result.torch_cuda_initialized is False
    assert len(result.modules) > 300
    torch_node = result.module("torch")
    assert torch_node.parent is None
    assert torch_node.cumulative_s >= max(n.cumulative_s for n in result.modules if n.parent == "torch")


def test_lazy_loader_module_is_blamed_when_its_code_runs(sim_scan, make_tree):
    root = make_tree(
        {
            "lz/__init__.py": """
                import importlib.util, sys

                spec = importlib.util.find_spec("lz.gpu")
                spec.loader = importlib.util.LazyLoader(spec.loader)
                gpu = importlib.util.module_from_spec(spec)
                sys.modules["lz.gpu"] = gpu
                spec.loader.exec_module(gpu)
                VALUE = gpu.STATUS  # the first attribute access runs lz/gpu.py
            """,
            "lz/gpu.py": CTYPES_LEAF,
        }
    )
    result = sim_scan("lz", path=[root])
    assert result.status == "ok", result.error
    assert result.culprit.module == "lz.gpu"
    assert result.culprit.chain == ("lz", "lz.gpu")
    assert result.culprit.site.line == marked_line(root / "lz/gpu.py")


def test_module_imported_by_a_thread_is_chained_through_the_starter(sim_scan, make_tree):
    # the thread imports a module outside the package still being initialized (importing a
    # submodule of it from another thread while the main thread waits would deadlock)
    root = make_tree(
        {
            "th/__init__.py": """
                import threading

                def load():
                    import gpuleaf

                worker = threading.Thread(target=load)
                worker.start()
                worker.join()
            """,
            "gpuleaf.py": BINDINGS_LEAF,
        }
    )
    result = sim_scan("th", path=[root])
    assert result.status == "ok", result.error
    culprit = result.culprit
    assert culprit.module == "gpuleaf"
    assert culprit.phase == "thread"
    assert culprit.chain == ("th", "gpuleaf")
    assert culprit.thread.endswith("(load)")  # threading's own name
    assert culprit.thread_started_by == "th"
    assert culprit.thread_started_at.file == str(root / "th/__init__.py")
    assert culprit.thread_started_at.source == "worker.start()"
    assert result.module("gpuleaf").parent == "th"
