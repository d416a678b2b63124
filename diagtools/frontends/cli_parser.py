"""The ``diagtools`` command line's parser: every command, its options and their help.

Each command's parser is built only when that command runs (see
:func:`_build_parser`); the options several commands share are written once,
as argparse parent parsers (:func:`_common`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from diagtools.errors import ExitCode
from diagtools.model.options import (
    DEFAULT_SETTLE_S,
    DEFAULT_TIMEOUT_S,
    DRIVER_CHOICES,
    START_METHODS,
    timeout_problem,
)

__all__ = ["COMMANDS", "DRIVER_HELP", "TIMEOUT_HELP", "build_parser"]


def _timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--timeout {text!r} is not a number of seconds") from None
    problem = timeout_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(problem.replace(f"got {value}", f"got {text!r}"))
    return value


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors in one line with exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(ExitCode.USAGE, f"diagtools: error: {message} (see {self.prog} --help)\n")


def _version() -> str:
    from diagtools._version import __version__

    return __version__


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; given ``argv``, only for the command it names.

    Building every command's parser and arguments costs milliseconds on every
    start (argparse looks up a translation for each parser's help texts); one
    command needs only its own.  When ``argv`` names no command (``--help``,
    ``--version``, a typo) every command is there, so help and errors are unchanged.
    """
    parser = _Parser(
        prog="diagtools",
        description="Find which import initializes the CUDA driver.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks for diagtools' own errors")
    parser.add_argument("--version", action="version", version=f"diagtools {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    named = _command_named(argv)
    for name, (text, common, add_arguments) in COMMANDS.items():
        if named in (None, name):
            add_arguments(commands.add_parser(name, help=text, parents=[common()]))
    return parser


def _command_named(argv: Sequence[str] | None) -> str | None:
    """The command ``argv`` runs: its first word that is not an option (no top-level option takes a value)."""
    if argv is None:
        return None
    word = next((word for word in argv if not word.startswith("-")), None)
    return word if word in COMMANDS else None


_EXAMPLES = """examples:
  diagtools scan vllm.models.common.ops                   which import initializes CUDA, and where to cut
  diagtools fix vllm.models.common.ops --write fix.patch  the verified cut as a patch, and its guard test
  diagtools sweep vllm --jobs 2 --json sweep.json         every module of a package
  diagtools run -- python app.py                          a program's processes, and any poisoned fork
  diagtools demo                                          the built-in specimens, with a report"""

DRIVER_HELP = (
    "the CUDA driver (libcuda) to use: auto (the real driver when a GPU answers, else the simulated one), "
    "real, simulated (a stand-in with no GPU) or none (no driver: nothing can be seen initializing)"
)
TIMEOUT_HELP = "stop each subkernel after S seconds (default %(default)s); the verdict is then unknown"


def _add_debug(parser: argparse.ArgumentParser) -> None:
    """Accept --debug after the subcommand too, without resetting one given before it."""
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def _add_scan(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "targets",
        nargs="+",
        metavar="TARGET",
        help="module to import, e.g. pkg.ops, or a file of a package (pkg/ops.py: its folder's root goes on --path)",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=DEFAULT_SETTLE_S,
        metavar="S",
        help=f"after the imports, watch threads the target started for up to S seconds (default {DEFAULT_SETTLE_S})",
    )
    parser.add_argument("--fail-on-cuda", action="store_true", help="exit 1 when CUDA got initialized")
    parser.add_argument("--stack", action="store_true", help="print the whole Python stack of the culprit")
    parser.add_argument("--svg", metavar="FILE", help="write the import graph (culprit chains) as SVG")
    no_cuts = "do not search where to cut (by default each candidate cut is verified by scanning again)"
    parser.add_argument("--no-cuts", dest="cuts", action="store_false", help=no_cuts)


def _add_fix(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="TARGET", help="module whose import initializes CUDA, e.g. pkg.ops")
    parser.add_argument(
        "--write",
        metavar="PATCH",
        help="write the patch to PATCH and the guard test beside it (default: print both; nothing is ever written "
        "into your source tree)",
    )
    parser.add_argument(
        "--sweep",
        metavar="JOURNAL",
        help="a sweep journal or summary of the same code: say how many modules each cut reaches",
    )


def _common(
    *,
    path: bool = False,
    driver: bool = False,
    timeout: float | None = None,
    document: str | None = None,
    own: bool = False,
    python: bool = False,
) -> _Parser:
    """A parent parser with the options commands share, each written once: ``--path``, ``--driver``,
    ``--timeout`` (with this command's default), ``--json`` (writing this ``document``), ``--own``, ``--python``
    and a ``--debug`` accepted after the command too."""
    parser = _Parser(add_help=False)
    if path:
        parser.add_argument("--path", action="append", default=[], metavar="DIR", help="prepend DIR to sys.path")
    if driver:
        parser.add_argument("--driver", choices=DRIVER_CHOICES, default="auto", help=DRIVER_HELP)
    if timeout is not None:
        parser.add_argument("--timeout", type=_timeout, default=timeout, metavar="S", help=TIMEOUT_HELP)
    if document is not None:
        parser.add_argument("--json", metavar="FILE|-", help=f"write the {document} document ('-' for stdout)")
    if own:
        _add_own(parser)
    if python:
        _add_python(parser)
    _add_debug(parser)
    return parser


_SUBKERNEL: dict[str, Any] = {"path": True, "driver": True, "timeout": DEFAULT_TIMEOUT_S, "python": True}


def _add_python(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--python",
        metavar="PATH",
        help="run the subkernel with this interpreter (the environment under test; CPython 3.10+)",
    )


def _add_own(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--own",
        action="append",
        default=[],
        metavar="PATTERN",
        help="your own packages (name or glob, repeatable): only their import statements are cut (default: the "
        "target's top-level package)",
    )


def _add_replay(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="TARGET", help="module the parent imports before starting the child")
    parser.add_argument(
        "--child",
        default="cuinit",
        metavar="ACTION",
        help="what the child does: cuinit, ctypes, torch or module:function (default %(default)s)",
    )
    parser.add_argument(
        "--start-method",
        choices=START_METHODS,
        default="fork",
        help="how the parent starts the child: %(choices)s (default %(default)s, the start that fails)",
    )
    parser.add_argument(
        "--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="replay on both trees, under fork and spawn"
    )


_SWEEP_SWITCHES = (
    ("--fail-on-cuda", "exit 1 when any module initializes CUDA"),
    ("--fresh", "a fresh subkernel per module, no zygote (slower)"),
    ("--cuts", "after the sweep, verify a cut for each root cause (its line to change; a few scans per cause)"),
)
_SWEEP_FILES = (
    ("--json", "JSON Lines journal: appended as modules finish, resumed"),
    ("--baseline", "an earlier sweep's journal or --summary: exit 1 only for root causes it does not list"),
    ("--summary", "write the sweep's answer (root causes, rows) as JSON"),
    ("--html", "write the root-cause summary as an HTML page"),
    ("--junit", "write JUnit XML: a test case per module (failure: initializes CUDA; error: not imported)"),
)


def _add_sweep(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("package", metavar="PACKAGE", help="package whose submodules are scanned one by one")
    parser.add_argument("--jobs", type=int, default=None, metavar="N", help="parallel subkernels (default: CPUs)")
    parser.add_argument(
        "--preload",
        default="auto",
        metavar="auto|none|MOD,...",
        help="modules the zygote imports once before forking (auto: torch when installed, then the package)",
    )
    parser.add_argument(
        "--no-adapt",
        dest="adapt",
        action="store_false",
        help="keep the preload as given (default: also preload the package modules most children import)",
    )
    parser.add_argument(
        "--exclude", action="append", default=[], metavar="PATTERN", help="glob on module names to skip (repeatable)"
    )
    for flag, text in _SWEEP_SWITCHES:
        parser.add_argument(flag, action="store_true", help=text)
    for flag, text in _SWEEP_FILES:
        parser.add_argument(flag, metavar="FILE", help=text)


def _add_bisect(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="TARGET", help="module whose import became CUDA-initializing")
    parser.add_argument("--repo", required=True, metavar="DIR", help="the git repository (never modified)")
    parser.add_argument("--good", required=True, metavar="REV", help="a commit where the import is clean")
    parser.add_argument("--bad", required=True, metavar="REV", help="a commit where it initializes CUDA")
    parser.add_argument("--path-in-repo", default="", metavar="SUBDIR", help="import root inside the repository")


def _add_diff(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("before", metavar="BEFORE.json", help="a diagtools.scan/1 document: the known-good state")
    parser.add_argument("after", metavar="AFTER.json", help="a diagtools.scan/1 document: the state to judge")
    parser.add_argument("--html", metavar="FILE", help="also write the diff as HTML")


def _size(text: str) -> tuple[int, int]:
    groups, sep, head_dim = text.partition("x")
    if not sep or not groups.isdigit() or not head_dim.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not GxD, e.g. 4096x512")
    return int(groups), int(head_dim)


def _add_bench(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", action="append", type=_size, metavar="GxD", help="default: the full grid on a GPU")
    parser.add_argument(
        "--backend",
        action="append",
        choices=("torch", "triton", "cutedsl"),
        metavar="B",
        help="torch, triton or cutedsl; repeat for several (default: every one that runs here)",
    )
    parser.add_argument(
        "--ratio", type=int, default=4, help="compression ratio: tokens merged per compressed row (default %(default)s)"
    )
    parser.add_argument("--chart", metavar="PNG", help="write a bar chart of GB/s")


def _add_demo(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out", default="build/report", metavar="DIR", help="where the report goes (default %(default)s)"
    )
    parser.add_argument("--no-notebooks", action="store_true", help="only scan the specimens")
    parser.add_argument(
        "--notebooks", metavar="DIR", help="the notebooks to run (default: the source checkout's notebooks/)"
    )


def _add_run(parser: argparse.ArgumentParser) -> None:
    parser.usage = "diagtools run [--driver D] [--json FILE|-] [--html FILE] [--timeout S] -- COMMAND [ARGS...]"
    parser.add_argument(
        "--json", metavar="FILE|-", help="write diagtools.run/1 ('-': stdout; the command's stdout then goes to stderr)"
    )
    parser.add_argument("--html", metavar="FILE", help="also write the report as an HTML page")
    parser.add_argument(
        "--timeout",
        type=_timeout,
        default=None,
        metavar="S",
        help="kill the whole tree after S seconds (default: no limit)",
    )
    parser.add_argument("argv", nargs=argparse.REMAINDER, metavar="COMMAND", help="the command, after --")


Commands = dict[str, tuple[str, Callable[[], _Parser], Callable[[argparse.ArgumentParser], None]]]
COMMANDS: Commands = {
    "scan": (
        "import targets in a fresh subkernel and name the culprit",
        lambda: _common(**_SUBKERNEL, document="diagtools.scan/1", own=True),
        _add_scan,
    ),
    "fix": (
        "the verified cut as a patch, checked on a copy, with its guard test",
        lambda: _common(**_SUBKERNEL, document="diagtools.fix/1", own=True),
        _add_fix,
    ),
    "replay": (
        "reproduce the poisoned-fork failure in a subkernel",
        lambda: _common(**{**_SUBKERNEL, "timeout": 60.0}, document="diagtools.replay/1"),
        _add_replay,
    ),
    "sweep": (
        "scan every submodule of a package alone, in parallel",
        lambda: _common(**_SUBKERNEL, own=True),
        _add_sweep,
    ),
    "bisect": (
        "find the commit that made an import initialize CUDA",
        lambda: _common(driver=True, timeout=DEFAULT_TIMEOUT_S, document="diagtools.bisect/1"),
        _add_bisect,
    ),
    "diff": ("what a fix changed between two scan JSON files", lambda: _common(document="diagtools.diff/1"), _add_diff),
    "bench": (
        "time the compress_norm_rope_store kernels side by side",
        lambda: _common(driver=True, document="diagtools.bench/1"),
        _add_bench,
    ),
    "demo": ("scan the built-in specimens and write a report", lambda: _common(driver=True), _add_demo),
    "run": ("run a command and catch a fork after CUDA was initialized", lambda: _common(driver=True), _add_run),
}
