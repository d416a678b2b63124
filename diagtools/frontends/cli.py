"""The ``diagtools`` command line: argument parsing and printing, nothing else."""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from diagtools.errors import DiagtoolsError, ExitCode, Interrupted, SweepInterrupted, Terminated, UsageError
from diagtools.model.options import (
    DEFAULT_SETTLE_S,
    DEFAULT_TIMEOUT_S,
    DRIVER_CHOICES,
    START_METHODS,
    timeout_problem,
)

if TYPE_CHECKING:
    from typing import TypeAlias

    from diagtools.runner.subkernel import RawRun, SubkernelRequest

    #: a report: its text, or the function that renders it (rendered where its colours are known)
    Report: TypeAlias = str | Callable[[], str]

__all__ = ["main", "run"]


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


def _build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
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
    for name, (text, common, add_arguments) in _COMMANDS.items():
        if named in (None, name):
            add_arguments(commands.add_parser(name, help=text, parents=[common()]))
    return parser


def _command_named(argv: Sequence[str] | None) -> str | None:
    """The command ``argv`` runs: its first word that is not an option (no top-level option takes a value)."""
    if argv is None:
        return None
    word = next((word for word in argv if not word.startswith("-")), None)
    return word if word in _COMMANDS else None


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
    parser.add_argument("targets", nargs="+", metavar="TARGET", help="module to import, e.g. pkg.ops")
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
    parser.add_argument(
        "--no-cuts",
        dest="cuts",
        action="store_false",
        help="do not search where to cut (by default each candidate cut is verified by scanning again)",
    )


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
) -> argparse.ArgumentParser:
    """A parent parser with the options commands share, each written once: ``--path``, ``--driver``,
    ``--timeout`` (with this command's default), ``--json`` (writing this ``document``), ``--own``, ``--python``
    and a ``--debug`` accepted after the command too."""
    parser = argparse.ArgumentParser(add_help=False)
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


def _add_sweep(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("package", metavar="PACKAGE", help="package whose submodules are scanned one by one")
    parser.add_argument("--jobs", type=int, default=None, metavar="N", help="parallel subkernels (default: CPUs)")
    parser.add_argument("--json", metavar="FILE", help="JSON Lines journal: appended as modules finish, resumed")
    parser.add_argument("--fail-on-cuda", action="store_true", help="exit 1 when any module initializes CUDA")
    parser.add_argument(
        "--preload",
        default="auto",
        metavar="auto|none|MOD,...",
        help="modules the zygote imports once before forking (auto: torch when installed, then the package)",
    )
    parser.add_argument("--fresh", action="store_true", help="a fresh subkernel per module, no zygote (slower)")
    parser.add_argument(
        "--no-adapt",
        dest="adapt",
        action="store_false",
        help="keep the preload as given (default: also preload the package modules most children import)",
    )
    parser.add_argument(
        "--exclude", action="append", default=[], metavar="PATTERN", help="glob on module names to skip (repeatable)"
    )
    parser.add_argument(
        "--baseline",
        metavar="FILE",
        help="an earlier sweep's journal or --summary: exit 1 only for root causes it does not list",
    )
    parser.add_argument("--summary", metavar="FILE", help="write the sweep's answer (root causes, rows) as JSON")
    parser.add_argument(
        "--cuts",
        action="store_true",
        help="after the sweep, verify a cut for each root cause (its line to change; a few scans per cause)",
    )
    parser.add_argument("--html", metavar="FILE", help="write the root-cause summary as an HTML page")


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


_Commands = dict[str, tuple[str, Callable[[], argparse.ArgumentParser], Callable[[argparse.ArgumentParser], None]]]
_COMMANDS: _Commands = {
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


def _check_writable(destination: str | None, option: str) -> None:
    """Fail before the run, in one line, when a file option cannot be written."""
    if not destination or destination == "-":
        return
    path = Path(destination)
    problem = ""
    if "\0" in destination:
        problem = "contains a NUL byte"
    elif path.is_dir():
        problem = "is a directory"
    elif path.exists():
        if not os.access(path, os.W_OK):
            problem = "is not writable"
    elif not path.parent.is_dir():
        problem = f"is in {str(path.parent)!r}, which is not a directory"
    else:
        problem = _probe_create(path)
    if problem:
        raise UsageError(f"{option} {destination!r} {problem}; choose another file")


def _check_journal(destination: str) -> None:
    """A journal that can be opened for appending; never created here.

    Creating a probe file (as :func:`_check_writable` does) would race a sweep
    started at the same moment on the same new journal: the loser must meet
    that sweep's lock, not a file that appeared between its checks.
    """
    path = Path(destination)
    if "\0" in destination:
        raise UsageError(f"--json {destination!r} contains a NUL byte; choose another file")
    if path.is_dir() or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"--json {destination!r} is not a writable journal file; choose another file")
    parent = path.parent
    if not path.exists() and not (parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)):
        raise UsageError(f"--json {destination!r} cannot be created in {str(parent)!r}; choose another file")


def _probe_create(path: Path) -> str:
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except OSError as exc:
        return f"cannot be created ({exc.strerror or exc})"
    path.unlink()
    return ""


def _check_directory(destination: str, option: str) -> None:
    """Create the output directory now and make sure files can be written in it."""
    try:
        Path(destination).mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{option} {destination!r} cannot be created ({exc}); choose another directory") from None
    problem = _probe_create(Path(destination, ".diagtools-write-check"))
    if problem:
        raise UsageError(f"{option} {destination!r}: a file in it {problem}; choose another directory")


def _write_json(document: dict[str, Any], destination: str) -> None:
    from diagtools.model.serial import json_text
    from diagtools.render.paths import write_report

    text = json_text(document) + "\n"  # json.dumps(document, indent=2, sort_keys=True), faster
    if destination == "-":
        sys.stdout.write(text)
    else:
        write_report(destination, text)


def _run_scan(args: argparse.Namespace) -> int:
    from diagtools.usecases.scan import scan

    _check_writable(args.json, "--json")
    result = scan(
        args.targets,
        path=args.path,
        driver=args.driver,
        timeout=args.timeout,
        settle=args.settle,
        own=args.own,
        python=args.python,
        runner=_run_probe,
        cuts=args.cuts,
    )
    from diagtools.render.text import render_scan  # loaded while the subkernel started

    _emit(result.to_json(), lambda: render_scan(result, stack=args.stack), args.json)
    if args.svg:  # after the report: a graph that cannot be drawn loses nothing else
        from diagtools.render.graph import write_svg

        write_svg(result, args.svg)
    if not result.ok:
        return ExitCode.TARGET_FAILED
    return ExitCode.CUDA if (args.fail_on_cuda and result.cuda_initialized) else ExitCode.OK


def _run_fix(args: argparse.Namespace) -> int:
    from diagtools.render.cuts_text import render_fix
    from diagtools.usecases.fix import fix
    from diagtools.usecases.sweep_journal import read_sweep_rows

    _check_writable(args.json, "--json")
    _check_writable(args.write, "--write")
    rows = read_sweep_rows(args.sweep) if args.sweep else ()
    result = fix(
        args.target,
        path=args.path,
        driver=args.driver,
        timeout=args.timeout,
        own=args.own,
        python=args.python,
        sweep=rows,
    )
    written = bool(args.write and result.patch)
    files = "\n" + _write_fix_files(result, Path(args.write)) if written else ""
    _emit(result.to_json(), lambda: render_fix(result, patch=not written) + files, args.json)
    if result.reason and not result.cut and result.scan.verdict.value == "clean":
        return ExitCode.OK
    return ExitCode.OK if result.verified else ExitCode.TARGET_FAILED


def _write_fix_files(result: Any, patch: Path) -> str:
    """The patch at ``patch`` and the guard beside it (never over an existing file); what was written, in words."""
    from diagtools.render.paths import write_report

    write_report(patch, result.patch)
    guard = patch.parent / result.guard_file
    said = [f"patch written to {patch} (apply it in {result.root}: git apply {patch.resolve()})"]
    if guard.exists():
        said.append(f"guard not written: {guard} exists already")
    else:
        guard.write_text(result.guard, encoding="utf-8")
        said.append(f"guard written to {guard}")
    return "\n".join(said)


def _run_probe(request: SubkernelRequest) -> RawRun:
    """Run a scan's subkernel, and meanwhile import what turns its events into the report.

    Building the result's and the report's types takes about 10 ms; done
    while the keeper and the subkernel start, it is not added to the scan.
    """
    from diagtools.runner.subkernel import run_subkernel

    return run_subkernel(request, meanwhile=_import_report)


def _import_report() -> None:
    import diagtools.render.text
    import diagtools.usecases.assemble  # noqa: F401


def _run_replay(args: argparse.Namespace) -> int:
    from diagtools.model.replay import REPLAY_BROKEN
    from diagtools.render.text import render_comparison, render_replay
    from diagtools.usecases.replay import compare_replays, replay_fork

    _check_writable(args.json, "--json")
    common = {
        "child": args.child,
        "path": args.path,
        "driver": args.driver,
        "timeout": args.timeout,
        "python": args.python,
    }
    if args.compare:
        before, after = args.compare
        comparison = compare_replays(args.target, before=before, after=after, **common)
        _emit(comparison.to_json(), lambda: render_comparison(comparison), args.json)
        failed = [r for _, r in comparison.runs if r.status in REPLAY_BROKEN]
        return ExitCode.TARGET_FAILED if failed else ExitCode.OK
    result = replay_fork(args.target, start_method=args.start_method, **common)
    _emit(result.to_json(), lambda: render_replay(result), args.json)
    return ExitCode.TARGET_FAILED if result.status in REPLAY_BROKEN else ExitCode.OK


def _emit(document: dict[str, Any], text: Report, json_destination: str | None) -> None:
    """Write the document and print the report; a file that cannot be written still leaves the report."""
    failure = None
    if json_destination:
        try:
            _write_json(document, json_destination)
        except OSError as exc:
            failure = UsageError(f"cannot write {json_destination}: {exc.strerror or exc}")
    if json_destination != "-" or failure is not None:
        _print(text)
    if failure is not None:
        raise failure


def _print(report: Report, stream: TextIO | None = None) -> None:
    """Print a report, coloured when the stream is a terminal (``NO_COLOR`` and ``FORCE_COLOR`` respected).

    A report given as a function is rendered here, where the colours are known: its renderers mark what each
    word means (:mod:`diagtools.render.style`), and only those marks become colour.
    """
    import os

    from diagtools.render.paths import readable
    from diagtools.render.style import coloured
    from diagtools.render.text import use_color

    stream = stream or sys.stdout
    with coloured(use_color(stream.isatty(), os.environ)) as styling:
        text = readable(report() if callable(report) else report)
    print(styling.ansi(text) if styling is not None else text, file=stream, flush=True)


def _run_sweep(args: argparse.Namespace) -> int:
    from diagtools.render.text import render_baseline, render_sweep
    from diagtools.usecases.sweep_journal import read_baseline

    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
    if args.json:
        _check_journal(args.json)
    _check_writable(args.summary, "--summary")
    _check_writable(args.html, "--html")
    known = read_baseline(args.baseline) if args.baseline else None
    try:
        result = _sweep_for(args)
    except SweepInterrupted as exc:
        _write_sweep_files(exc.result, args)  # what it has, for the summary main() prints
        raise
    _print(lambda: render_sweep(result))
    _write_sweep_files(result, args)
    if known is not None:
        _print(lambda: render_baseline(result, known, args.baseline))
        return ExitCode.CUDA if result.new_causes(known) else ExitCode.OK
    return ExitCode.CUDA if (args.fail_on_cuda and result.culprits) else ExitCode.OK


def _sweep_for(args: argparse.Namespace) -> Any:
    from diagtools.frontends.progress import terminal_progress
    from diagtools.usecases.sweep import sweep

    return sweep(
        args.package,
        path=args.path,
        jobs=args.jobs,
        driver=args.driver,
        timeout=args.timeout,
        json_path=args.json,
        progress=terminal_progress(args.package),
        preload=args.preload,
        fresh=args.fresh,
        exclude=args.exclude,
        own=args.own,
        python=args.python,
        adapt=args.adapt,
        cuts=args.cuts,
    )


def _write_sweep_files(result: Any, args: argparse.Namespace) -> None:
    """``--summary`` and ``--html``: written after the report is printed, so a failure loses nothing."""
    if args.summary:
        _write_json(result.to_json(), args.summary)
    if args.html:
        from diagtools.render.html import sweep_html
        from diagtools.render.paths import write_report

        write_report(args.html, sweep_html(result))


def _run_bisect(args: argparse.Namespace) -> int:
    from diagtools.render.text import render_bisect
    from diagtools.usecases.bisect import bisect

    _check_writable(args.json, "--json")
    result = bisect(
        args.repo,
        args.good,
        args.bad,
        args.target,
        path_in_repo=args.path_in_repo,
        driver=args.driver,
        timeout=args.timeout,
    )
    _emit(result.to_json(), lambda: render_bisect(result), args.json)
    return ExitCode.OK if result.first_bad else ExitCode.TARGET_FAILED


def _read_scan(path: str) -> Any:
    from diagtools.model.scan import ScanResult

    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"{path} is not JSON: {exc}") from None
    return ScanResult.from_json(document)


def _run_diff(args: argparse.Namespace) -> int:
    from diagtools.model.diff import diff_scans
    from diagtools.render.html import diff_html
    from diagtools.render.paths import write_report
    from diagtools.render.text import render_diff

    _check_writable(args.html, "--html")
    _check_writable(args.json, "--json")
    diff = diff_scans(_read_scan(args.before), _read_scan(args.after))
    if args.html:
        try:
            write_report(args.html, diff_html(diff))
        except OSError as exc:
            print(render_diff(diff))
            raise UsageError(f"cannot write {args.html}: {exc.strerror or exc}") from None
    _emit(diff.to_json(), lambda: render_diff(diff), args.json)
    return ExitCode.OK


def _run_bench(args: argparse.Namespace) -> int:
    from diagtools.bench import compare

    _check_writable(args.json, "--json")
    _check_writable(args.chart, "--chart")
    backends = tuple(args.backend or ("torch", "triton", "cutedsl"))
    report = compare(args.size, backends, ratio=args.ratio, driver=args.driver)
    text = report.table()
    if not report.timing_meaningful:
        text += "\nmeasured on a CPU: times are not meaningful (reference and Triton interpreter only)"
    if report.error:
        text += f"\nerror: {report.error}"
    _emit(report.to_json(), text, args.json)
    if args.chart:
        report.chart(args.chart)
    return ExitCode.TARGET_FAILED if report.error else ExitCode.OK


def _run_demo(args: argparse.Namespace) -> int:
    from diagtools.frontends.demo import NOTEBOOKS, write_demo_report

    _check_directory(args.out, "--out")
    if args.notebooks is not None and not Path(args.notebooks).is_dir():
        raise UsageError(f"--notebooks {args.notebooks!r} is not a directory")
    notebooks = None if args.no_notebooks else Path(args.notebooks) if args.notebooks else NOTEBOOKS
    report = write_demo_report(Path(args.out), driver=args.driver, notebooks=notebooks)
    _print(lambda: report.summary)
    print(f"report written to {report.index.resolve()}")
    postmortem = report.index.parent / "postmortem.html"
    if postmortem.exists():
        print(f"postmortem: {postmortem.resolve()}")
    return ExitCode.OK if report.as_expected else ExitCode.TARGET_FAILED


def _run_run(args: argparse.Namespace) -> int:
    """``diagtools run``: the files are checked before the command starts and written after the report.

    The exit code is the command's (``128+N`` for signal N, 127 when it could
    not start); when the CLI itself is interrupted it is 130 (SIGINT), 143
    (SIGTERM) or 129 (SIGHUP), whatever the command did with the signal.
    """
    from diagtools.usecases.run import RunInterrupted, run

    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        raise UsageError("no command given: diagtools run [OPTIONS] -- COMMAND [ARGS...]")
    _check_writable(args.json, "--json")
    _check_writable(args.html, "--html")
    output = "stderr" if args.json == "-" else "inherit"
    try:
        result = run(command, driver=args.driver, timeout=args.timeout, output=output)
    except RunInterrupted as stopped:
        _report_run(stopped.result, args)
        return stopped.exit_code
    _report_run(result, args)
    if result.exitcode is None:
        return ExitCode.NOT_STARTED
    return result.exitcode if result.exitcode >= 0 else ExitCode.for_signal(-result.exitcode)


def _report_run(result: Any, args: argparse.Namespace) -> None:
    """The report on stderr (coloured as a scan's on a terminal), then the files asked for."""
    from diagtools.render.paths import write_report
    from diagtools.render.run_html import run_page
    from diagtools.render.run_text import render_run

    _print(lambda: render_run(result), sys.stderr)
    for destination, write in (
        (args.json, lambda: _write_json(result.to_json(), args.json)),
        (args.html, lambda: write_report(args.html, run_page(result))),
    ):
        try:
            if destination:
                write()
        except OSError as exc:
            raise UsageError(f"cannot write {destination}: {exc.strerror or exc}") from None


def run() -> NoReturn:
    """The installed ``diagtools`` command: :func:`main` on ``sys.argv``, then the exit.

    The cyclic garbage collector runs every 100,000 new objects instead of
    every 700 (mypy's command does the same): a scan's own imports and its
    events would otherwise pay dozens of collections, milliseconds of a
    scan's fixed cost, to free almost nothing (reference counting frees the rest).
    """
    gc.set_threshold(100_000, 50, 50)
    _leave(main())


def _leave(code: int) -> NoReturn:
    """Exit with ``code``, without tearing the interpreter down when nothing is left to do at exit.

    Freeing every module and object costs a scan about 10 ms of CPU after
    its report is out.  When no other thread runs and no exit handler is
    registered (a pool, a logger, a temporary directory's finalizer would
    register one), teardown has nothing left to do for the user: the streams
    are flushed and the process leaves at once.  Otherwise, or when a stream
    cannot be flushed (a closed pipe), it exits the usual way.
    """
    handlers = getattr(atexit, "_ncallbacks", None)  # CPython's count of registered exit handlers
    if handlers is None or handlers() or threading.active_count() > 1:
        sys.exit(code)
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        sys.exit(code)
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``diagtools`` command; returns the exit code."""
    args = _build_parser(sys.argv[1:] if argv is None else argv).parse_args(argv)
    handlers = {
        "scan": _run_scan,
        "fix": _run_fix,
        "replay": _run_replay,
        "sweep": _run_sweep,
        "bisect": _run_bisect,
        "diff": _run_diff,
        "bench": _run_bench,
        "demo": _run_demo,
        "run": _run_run,
    }
    restore = _translate_termination()
    try:
        return handlers[args.command](args)
    except SweepInterrupted as exc:
        return _interrupted_sweep(exc)
    except Interrupted as exc:
        return _stopped(exc)
    except KeyboardInterrupt:
        return _stopped(Interrupted())
    except (DiagtoolsError, OSError) as exc:
        if args.debug:
            raise
        print(f"diagtools: error: {_one_line(exc)}", file=sys.stderr)
        return ExitCode.USAGE
    except Exception as exc:  # a bug of ours must not exit 1, which means "CUDA was initialized"
        if args.debug:
            raise
        print(
            f"diagtools: internal error: {_one_line(f'{type(exc).__name__}: {exc}')} (--debug shows the traceback)",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    finally:
        restore()


def _interrupted_sweep(exc: SweepInterrupted) -> int:
    """Ctrl-C (or SIGTERM/SIGHUP) in a sweep: the summary of what it had, then the signal's exit code."""
    from diagtools.render.text import render_sweep

    _print(lambda: render_sweep(exc.result))  # type: ignore[arg-type]
    return _stopped(exc)


def _stopped(exc: Interrupted) -> int:
    """Say what stopped the work; the signal's exit code (130 for Ctrl-C)."""
    if exc.signum is None or exc.signum == signal.SIGINT:
        print("diagtools: interrupted, subkernels killed", file=sys.stderr)
    else:
        print(f"diagtools: {signal.Signals(exc.signum).name}: stopped, subkernels killed", file=sys.stderr)
    return exc.exit_code


def _one_line(value: object) -> str:
    """An error message for the terminal: control characters escaped, first lines only."""
    from diagtools.render.text import terminal_safe

    return terminal_safe(str(value)).replace("\n", " ")[:2000]


def _translate_termination() -> Callable[[], None]:
    """Turn SIGTERM and SIGHUP into an exception in the main thread, so cleanup runs; returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def raise_terminated(signum: int, frame: Any) -> None:
        raise Terminated(signum)

    previous = {signum: signal.signal(signum, raise_terminated) for signum in (signal.SIGTERM, signal.SIGHUP)}

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    return restore


if __name__ == "__main__":
    run()
