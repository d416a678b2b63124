"""``diagtools run``: load the agent into this process, then the sitecustomize it would have had.

This directory is first on ``PYTHONPATH`` only so that this file runs at start-up;
it takes itself off ``sys.path`` again, so the program sees the path it would
have seen.  Whatever ``sitecustomize`` comes next on the path runs as before.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_PROTOCOL = "_diagtools_protocol"


def _load_protocol() -> None:
    """Register diagtools' protocol module by file, as the runner does: this interpreter may not have diagtools."""
    if _PROTOCOL in sys.modules:
        return
    path = os.path.join(os.path.dirname(os.path.dirname(_HERE)), "protocol.py")
    module = type(sys)(_PROTOCOL)
    module.__file__ = path
    loader = sys.modules["_frozen_importlib_external"].SourceFileLoader(_PROTOCOL, path)  # as protocol.load_source
    exec(loader.get_code(_PROTOCOL), module.__dict__)
    sys.modules[_PROTOCOL] = module


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
    _load_protocol()
    agent = __import__("_diagtools_run_agent").install_from_environment()
    try:
        _chain_to_next_sitecustomize()
    finally:
        sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != _HERE]
        agent.startup_done()


_start()
