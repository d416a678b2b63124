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

Loaded through the ``pytest11`` entry point; disable with ``-p no:diagtools``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = ["assert_import_cuda_free"]


def assert_import_cuda_free(
    module: str, *, path: Iterable[str | os.PathLike[str]] = (), driver: str = "auto", timeout: float = 120.0
) -> Any:
    """Fail unless importing ``module`` in a fresh subkernel leaves CUDA uninitialized.

    The failure message names the culprit, its import chain and its source line.
    Returns the :class:`diagtools.ScanResult` when the module is clean.
    """
    from diagtools.render.text import render_guard_failure
    from diagtools.usecases.scan import scan

    result = scan(module, path=tuple(path), driver=driver, timeout=timeout)
    if not result.ok or result.cuda_initialized:
        raise AssertionError(render_guard_failure(result))
    return result


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("cuda_free_modules", "modules that must import without initializing CUDA", type="linelist")
    parser.addini("cuda_free_path", "directories to put on sys.path for cuda_free_modules", type="linelist")
    parser.addini("cuda_free_driver", "driver for the cuda_free checks: auto, real, simulated, none", default="auto")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "cuda_free(*modules, path=(), driver='auto'): the modules must import without initializing CUDA"
    )


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
