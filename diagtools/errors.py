"""The one exception hierarchy of diagtools.

Every error a user can cause or meet derives from :class:`DiagtoolsError`, has
typed fields, a message that says what to do next, and survives pickling,
because errors cross the subkernel boundary.
"""

from __future__ import annotations

import enum

__all__ = [
    "CacheDirectoryError",
    "CannotDeferError",
    "DiagtoolsError",
    "DriverBuildError",
    "DriverUnavailableError",
    "JournalLockedError",
    "MissingExtraError",
    "SchemaError",
    "SweepInterrupted",
    "UsageError",
]


class DiagtoolsError(Exception):
    """Base class: raised for every failure diagtools can explain."""

    def __reduce__(self):
        return (self.__class__, tuple(self.__dict__.values()))


class UsageError(DiagtoolsError):
    """Raised when the caller's input (a target, a path, an option) is invalid."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class DriverBuildError(DiagtoolsError):
    """Raised when the simulated driver or the probe extension cannot be compiled."""

    def __init__(self, what: str, command: str, output: str) -> None:
        super().__init__(what, command, output)
        self.what = what
        self.command = command
        self.output = output

    def __str__(self) -> str:
        last = self.output.strip().splitlines()[-1:] or ["no compiler output"]
        return (
            f"could not build {self.what}: {last[0]} "
            f"(command: {self.command}; install gcc and the Python headers, or set CC)"
        )


class CacheDirectoryError(DiagtoolsError):
    """Raised when a compiled artefact (the simulated driver, the injection hook, the probe) cannot be written
    into the cache directory."""

    def __init__(self, what: str, where: str, reason: str) -> None:
        super().__init__(what, where, reason)
        self.what = what
        self.where = where
        self.reason = reason

    def __str__(self) -> str:
        return (
            f"could not build {self.what} in {self.where}: {self.reason}; set DIAGTOOLS_CACHE_DIR (or "
            "XDG_CACHE_HOME) to a writable directory"
        )


class DriverUnavailableError(DiagtoolsError):
    """Raised when ``driver="real"`` is asked for but no real libcuda.so.1 loads."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return f"no real CUDA driver: {self.reason}; use --driver simulated or auto"


class MissingExtraError(DiagtoolsError):
    """Raised when a feature needs an optional dependency that is not installed."""

    def __init__(self, module: str, extra: str) -> None:
        super().__init__(module, extra)
        self.module = module
        self.extra = extra

    def __str__(self) -> str:
        return f"this feature needs {self.module!r}, which is not installed: pip install 'diagtools[{self.extra}]'"


class SchemaError(DiagtoolsError):
    """Raised when JSON handed to diagtools is not a result it wrote, or has a field of the wrong type.

    ``field`` names the offending field (``modules[3].line``); ``found`` then
    says what is wrong with it.
    """

    def __init__(self, expected: str, found: object, field: str = "") -> None:
        super().__init__(expected, found, field)
        self.expected = expected
        self.found = found
        self.field = field

    def __str__(self) -> str:
        if self.field:
            return f"not a valid {self.expected} document: {self.field} {self.found}"
        return f"expected a {self.expected} document, found schema {self.found!r}"


class CannotDeferError(DiagtoolsError):
    """Raised when an import statement cannot wait until first use: a name is needed at import, or the line
    is not a plain module-level import.  ``line`` is where (0: the file as a whole)."""

    def __init__(self, file: str, line: int, reason: str) -> None:
        super().__init__(file, line, reason)
        self.file = file
        self.line = line
        self.reason = reason

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.reason}"


class JournalLockedError(DiagtoolsError):
    """Raised when another sweep holds the lock on the same ``--json`` journal."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path

    def __str__(self) -> str:
        return f"{self.path} is in use by another sweep; wait for it to finish or choose another --json"


_SIGINT = 2  # signal.SIGINT on every platform Python supports; signal itself is not imported for it


class ExitCode(enum.IntEnum):
    """What the CLI's exit status says: the verdict first, then how the run went."""

    OK = 0  # clean, or the command asked for succeeded
    CUDA = 1  # CUDA was initialized (or a fork was poisoned)
    USAGE = 2  # bad input or an error of ours: nothing was judged
    TARGET_FAILED = 3  # the target could not be judged (crash, hang, lost channel)
    NOT_STARTED = 127  # run: the command could not be started, as a shell says

    @staticmethod
    def for_signal(signum: int) -> int:
        """A shell's status for a process stopped by ``signum``: 128 + N (130 for Ctrl-C)."""
        return 128 + int(signum)


class Interrupted(KeyboardInterrupt):
    """Work stopped by Ctrl-C, SIGTERM or SIGHUP (``signum``), carrying what it had seen (``result``).

    A ``KeyboardInterrupt``, so code that stops on an interrupt still stops.
    """

    def __init__(self, signum: int | None = None, result: object = None) -> None:
        super().__init__(signum, result)
        self.signum = signum
        self.result = result

    def __reduce__(self):
        return (self.__class__, (self.signum, self.result))

    @property
    def exit_code(self) -> int:
        """128 + the signal's number; 130 (Ctrl-C) when no signal was named."""
        return ExitCode.for_signal(self.signum if self.signum is not None else _SIGINT)


class Terminated(Interrupted):
    """SIGTERM or SIGHUP, raised where the main thread is, so every ``finally`` cleans up."""


class SweepInterrupted(Interrupted):
    """Raised by a sweep stopped by Ctrl-C (or SIGTERM/SIGHUP, ``signum``), carrying what it had.

    ``result`` is the partial ``SweepResult`` (its ``interrupted`` counts the
    modules left unscanned), so the caller can show the summary of what was done.
    """

    def __init__(self, result: object, signum: int | None = None) -> None:
        super().__init__(signum, result)

    def __reduce__(self):
        return (self.__class__, (self.result, self.signum))

    def __str__(self) -> str:
        return f"sweep interrupted; {getattr(self.result, 'interrupted', '?')} modules were not scanned"
