"""pytest plugin: modules that must import without initializing CUDA.

Three ways to use it, each check in a fresh subkernel (the test process never
imports the module it checks):

* ``assert_import_cuda_free("pkg.ops", path=[...])`` inside any test;
* ``@pytest.mark.cuda_free("pkg.ops", "pkg.models", path=[...])`` on a test:
  the modules are checked before the test body runs;
* ``cuda_free_modules`` in the ini file (one module per line, with optional
  ``cuda_free_path`` and ``cuda_free_driver``): one test item per module.

Loaded through the ``pytest11`` entry point; disable with ``-p no:diagtools``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
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


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    modules = config.getini("cuda_free_modules")
    if not modules:
        return
    root = config.rootpath
    path = tuple(str(root / entry) for entry in config.getini("cuda_free_path"))
    driver = config.getini("cuda_free_driver")
    for module in modules:
        items.append(
            CudaFreeItem.from_parent(session, name=f"cuda_free[{module}]", module=module, path=path, driver=driver)
        )
