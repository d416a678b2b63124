"""The choices a command line offers, in a module that imports nothing.

The front ends build their parsers from these before any work starts, so
``diagtools --help`` or a usage error loads no use case, no driver builder
and no result type; the modules that act on a choice import it from here.
"""

from __future__ import annotations

__all__ = ["DEFAULT_SETTLE_S", "DRIVER_CHOICES", "START_METHODS"]

DRIVER_CHOICES = ("auto", "real", "simulated", "none")
START_METHODS = ("fork", "spawn", "forkserver")
DEFAULT_SETTLE_S = 1.0
