"""``diagtools run``: load the agent into this process, then the sitecustomize it would have had.

This directory is first on ``PYTHONPATH`` only so that this file runs at start-up;
it takes itself off ``sys.path`` again, so the program sees the path it would
have seen.  Whatever ``sitecustomize`` comes next on the path runs as before.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _chain_to_next_sitecustomize() -> None:
    """Run the ``sitecustomize`` that this one shadows, if there is one."""
    external = sys.modules["_frozen_importlib_external"]
    bootstrap = sys.modules["_frozen_importlib"]
    rest = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != _HERE]
    spec = external.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = bootstrap.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _start() -> None:
    agent = __import__("_diagtools_run_agent").install_from_environment()
    try:
        _chain_to_next_sitecustomize()
    finally:
        sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != _HERE]
        agent.startup_done()


_start()
