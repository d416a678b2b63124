"""``--python``: run the subkernel with another interpreter, the one of the environment under test.

The agents use only the standard library and the probe extension uses only
CPython's stable ABI (3.10 and later), so any such interpreter can host them.
It is asked once per process what it is, before any subkernel starts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from functools import lru_cache

from diagtools.errors import UsageError

__all__ = ["MIN_VERSION", "validate_python"]

MIN_VERSION = (3, 10)
_QUERY = "import sys; print(sys.implementation.name, *sys.version_info[:2])"


def validate_python(python: str | os.PathLike[str] | None) -> str:
    """An absolute path of a CPython 3.10+ interpreter; ``None`` means this one (``sys.executable``)."""
    if python is None:
        return sys.executable
    text = os.fspath(python)
    if not isinstance(text, str) or not text or "\0" in text:
        raise UsageError(f"--python {text!r} is not an interpreter path")
    found = text if os.sep in text else shutil.which(text)
    if found is None or not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise UsageError(f"--python {text!r} is not an executable file")
    return _checked(os.path.abspath(found))


@lru_cache(maxsize=16)
def _checked(path: str) -> str:
    try:
        done = subprocess.run([path, "-I", "-S", "-c", _QUERY], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"--python {path!r} could not be run: {exc}") from None
    words = done.stdout.split()
    if done.returncode != 0 or len(words) != 3 or not all(w.isdigit() for w in words[1:]):
        raise UsageError(f"--python {path!r} is not a Python interpreter (it answered {done.stdout.strip()[:80]!r})")
    name, version = words[0], (int(words[1]), int(words[2]))
    if name != "cpython" or version < MIN_VERSION:
        wanted = ".".join(map(str, MIN_VERSION))
        raise UsageError(f"--python {path!r} is {name} {version[0]}.{version[1]}; diagtools needs CPython {wanted}+")
    return path
