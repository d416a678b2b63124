"""The documented import path of the pytest helper; the plugin lives in :mod:`diagtools.frontends.pytest_plugin`.

Only the helper is re-exported: the plugin's hooks are registered once,
through the ``pytest11`` entry point.
"""

from diagtools.frontends.pytest_plugin import assert_import_cuda_free

__all__ = ["assert_import_cuda_free"]
