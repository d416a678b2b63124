"""pytest plugin: modules that must import without initializing CUDA.

Three ways to use it, each check in a fresh subkernel (the test process never
imports the module it checks):

* ``assert_import_cuda_free("pkg.ops", path=[...])`` inside any test;
* ``@pytest.mark.cuda_free("pkg.ops", "pkg.models", path=[...])`` on a test:
  the modules are checked before the test body runs;
* ``cuda_free_modules`` in the ini file (one module per line, with optional
  ``cuda_free_path`` and ``cuda_free_driver``): one test item per module,
  with the node id ``INIFILE::cuda_free[MODULE]`` (``pytest
  "pytest.ini::cuda_free[pkg.ops]"`` runs one).  They join a run of the
  whole suite (no arguments, or directories) and honour ``-k``, ``-m`` and
  ``--deselect``; a run of chosen files or tests leaves them out.

``--cuda-watch`` watches the pytest process itself instead: it names the
collection node or test during which CUDA got initialized, and any fork after
it, with both stacks, in the terminal summary.

Loaded through the ``pytest11`` entry point; disable with ``-p no:diagtools``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from diagtools.model.options import DEFAULT_TIMEOUT_S

__all__ = ["assert_import_cuda_free"]


def assert_import_cuda_free(
    module: str,
    *,
    path: Iterable[str | os.PathLike[str]] = (),
    driver: str = "auto",
    timeout: float = DEFAULT_TIMEOUT_S,
) -> Any:
    """Fail unless importing ``module`` in a fresh subkernel leaves CUDA uninitialized.

    The failure message names the culprit, its import chain and its source line.
    Returns the :class:`diagtools.ScanResult` when the module is clean.
    """
    from diagtools.model.verdict import Verdict
    from diagtools.render.text import render_guard_failure
    from diagtools.usecases.scan import scan

    result = scan(module, path=tuple(path), driver=driver, timeout=timeout)
    if result.verdict != Verdict.CLEAN:
        raise AssertionError(render_guard_failure(result))
    return result


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("cuda_free_modules", "modules that must import without initializing CUDA", type="linelist")
    parser.addini("cuda_free_path", "directories to put on sys.path for cuda_free_modules", type="linelist")
    parser.addini("cuda_free_driver", "driver for the cuda_free checks: auto, real, simulated, none", default="auto")
    parser.getgroup("diagtools").addoption(
        "--cuda-watch",
        action="store_true",
        default=False,
        help="name the collection node or test that initialized CUDA, and any fork after it",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "cuda_free(*modules, path=(), driver='auto'): the modules must import without initializing CUDA"
    )
    if config.getoption("cuda_watch", default=False):
        config.pluginmanager.register(CudaWatch(_start_up_context(config)), "diagtools-cuda-watch")


def _start_up_context(config: pytest.Config) -> str:
    """What ran before the watch was loaded: pytest's start-up, with its ``conftest.py`` files when it had any."""
    from diagtools.usecases.run_assemble import CONFTEST_CONTEXT

    conftests = [
        p for p in config.pluginmanager.get_plugins() if str(getattr(p, "__file__", "")).endswith("conftest.py")
    ]
    return CONFTEST_CONTEXT if conftests else "pytest start-up"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    for marker in item.iter_markers("cuda_free"):
        for module in marker.args:
            assert_import_cuda_free(
                module, path=marker.kwargs.get("path", ()), driver=marker.kwargs.get("driver", "auto")
            )


class CudaFreeItem(pytest.Item):
    """One ``cuda_free_modules`` entry, checked in its own subkernel."""

    def __init__(self, *, module: str, path: tuple[str, ...], driver: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.module = module
        self.import_path = path
        self.driver = driver

    def runtest(self) -> None:
        assert_import_cuda_free(self.module, path=self.import_path, driver=self.driver)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, AssertionError):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"cuda_free: {self.module}"


class CudaFreeFile(pytest.File):
    """The ini file as a collector: its ``cuda_free_modules`` become items ``INIFILE::cuda_free[MODULE]``."""

    def collect(self) -> Iterator[CudaFreeItem]:
        config = self.config
        path = tuple(str(config.rootpath / entry) for entry in config.getini("cuda_free_path"))
        driver = config.getini("cuda_free_driver")
        for module in config.getini("cuda_free_modules"):
            yield CudaFreeItem.from_parent(self, name=f"cuda_free[{module}]", module=module, path=path, driver=driver)


def _ini_path(config: pytest.Config) -> Path:
    return Path(config.inipath) if config.inipath else config.rootpath / "pytest.ini"


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> CudaFreeFile | None:
    """Collect the ini file when it is named (``pytest pyproject.toml::cuda_free[pkg.ops]``) or walked."""
    config = parent.config
    if config.getini("cuda_free_modules") and file_path == _ini_path(config):
        return CudaFreeFile.from_parent(parent, path=file_path)
    return None


def _whole_suite(config: pytest.Config) -> bool:
    """True when pytest was asked for directories (or nothing), not for chosen files or tests."""
    return all("::" not in arg and Path(arg).is_dir() for arg in config.args)


@pytest.hookimpl(tryfirst=True)  # before -k, -m and --deselect, so they apply to these items too
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Add the ini checks to a whole-suite run whose walk did not reach the ini file (``testpaths`` elsewhere)."""
    if not config.getini("cuda_free_modules") or not _whole_suite(config):
        return
    if any(isinstance(item, CudaFreeItem) for item in items):
        return
    items.extend(CudaFreeFile.from_parent(session, path=_ini_path(config)).collect())


class CudaWatch:
    """``--cuda-watch``: the run agent inside the pytest process, told which node is running.

    It never initializes CUDA itself: the driver's state is read only from a
    libcuda the process already loaded.  On the simulated driver, start pytest
    with it (``diagtools run --driver simulated -- pytest --cuda-watch``).
    """

    def __init__(self, start_up: str = "pytest start-up") -> None:
        import shutil
        import tempfile

        from diagtools.usecases.run_watch import load_agent

        self.pid = os.getpid()
        self.owned: str | None = tempfile.mkdtemp(prefix="diagtools-watch-")
        self.agent = load_agent(self.owned, context=start_up)
        if self.agent.directory != self.owned:  # already watched by diagtools run: share its records
            shutil.rmtree(self.owned, ignore_errors=True)
            self.owned = None

    def _during(self, context: str) -> Any:
        previous, self.agent.context = self.agent.context, context
        return previous

    @pytest.hookimpl(hookwrapper=True)
    def pytest_make_collect_report(self, collector: pytest.Collector) -> Any:
        previous = self._during(f"collecting {collector.nodeid or '<session>'}")
        yield
        self.agent.check_state("import")
        self.agent.context = previous

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Any:
        previous = self._during(item.nodeid)
        yield
        self.agent.check_state("main")
        self.agent.context = previous

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        from diagtools.render.run_text import render_watch
        from diagtools.usecases.run_watch import watch_result

        result = watch_result(self.agent.directory, self.pid, tuple(sys.argv), self.agent.driver_state())
        terminalreporter.write_sep("=", "diagtools cuda watch")
        terminalreporter.write_line(render_watch(result))

    def pytest_unconfigure(self) -> None:
        if self.owned and os.getpid() == self.pid:
            import shutil

            shutil.rmtree(self.owned, ignore_errors=True)
