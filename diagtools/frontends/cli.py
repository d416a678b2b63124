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
from diagtools.frontends.cli_files import check_directory, check_journal, check_writable, write_json
from diagtools.frontends.cli_parser import COMMANDS as _COMMANDS  # noqa: F401 - where readers of the CLI look
from diagtools.frontends.cli_parser import build_parser as _build_parser

if TYPE_CHECKING:
    from typing import TypeAlias

    from diagtools.runner.subkernel import RawRun, SubkernelRequest

    #: a report: its text, or the function that renders it (rendered where its colours are known)
    Report: TypeAlias = str | Callable[[], str]

__all__ = ["main", "run"]

_SHARED = ("path", "driver", "timeout", "own", "python")


def _shared(args: argparse.Namespace) -> dict[str, Any]:
    """The options the command's parent parser gave it (``--path``, ``--driver``, ``--timeout``, ``--own``,
    ``--python``), as the use case's keyword arguments."""
    return {name: getattr(args, name) for name in _SHARED if hasattr(args, name)}


def _run_scan(args: argparse.Namespace) -> int:
    from diagtools.usecases.options import targets_and_files
    from diagtools.usecases.scan import scan

    check_writable(args.json, "--json")
    args.targets, roots = targets_and_files(args.targets)
    args.path = [*(args.path or []), *roots]
    if not args.targets:  # files only, none of them a package's module (a hook handed scripts or tests)
        print("diagtools scan: no module among the files given: nothing to import", file=sys.stderr)
        return ExitCode.OK
    from diagtools.frontends.progress import named_runs, phase_line

    titled: list[bool] = []

    def titled_first(request: SubkernelRequest) -> RawRun:
        """The report's first line as the first subkernel starts (the input checked, the driver chosen), so a
        long scan says at once what it scans, on a terminal or a pipe."""
        if not titled and args.json != "-":
            from diagtools.render.text import scan_title

            _print(scan_title(args.targets))
            titled.append(True)
        return _run_probe(request)

    with phase_line() as live:
        runner = named_runs(titled_first, live.phase)
        result = scan(args.targets, **_shared(args), settle=args.settle, runner=runner, cuts=args.cuts)
    from diagtools.render.text import render_scan  # loaded while the subkernel started

    _emit(result.to_json(), lambda: render_scan(result, stack=args.stack, title=not titled), args.json)
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

    check_writable(args.json, "--json")
    check_writable(args.write, "--write")
    rows = read_sweep_rows(args.sweep) if args.sweep else ()
    result = fix(args.target, **_shared(args), sweep=rows)
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

    check_writable(args.json, "--json")
    common = {"child": args.child, **_shared(args)}
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
            write_json(document, json_destination)
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
        check_journal(args.json)
    check_writable(args.summary, "--summary")
    check_writable(args.html, "--html")
    check_writable(args.junit, "--junit")
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
    from diagtools.frontends.progress import SweepProgress
    from diagtools.usecases.sweep import sweep

    live = SweepProgress(args.package)
    try:
        chosen = {name: getattr(args, name) for name in ("jobs", "preload", "fresh", "exclude", "adapt", "cuts")}
        return sweep(
            args.package,
            **_shared(args),
            **chosen,
            json_path=args.json,
            progress=live.update,
            phase=live.phase,
            stage=live.stage,
        )
    finally:
        live.close()


def _write_sweep_files(result: Any, args: argparse.Namespace) -> None:
    """``--summary``, ``--html`` and ``--junit``: written after the report is printed, so a failure loses nothing."""
    from diagtools.render.paths import write_report

    if args.summary:
        write_json(result.to_json(), args.summary)
    if args.html:
        from diagtools.render.html import sweep_html

        write_report(args.html, sweep_html(result))
    if args.junit:
        from diagtools.render.junit import sweep_junit

        write_report(args.junit, sweep_junit(result))


def _run_bisect(args: argparse.Namespace) -> int:
    from diagtools.render.text import render_bisect
    from diagtools.usecases.bisect import bisect

    check_writable(args.json, "--json")
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

    check_writable(args.html, "--html")
    check_writable(args.json, "--json")
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

    check_writable(args.json, "--json")
    check_writable(args.chart, "--chart")
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

    check_directory(args.out, "--out")
    if args.notebooks is not None and not Path(args.notebooks).is_dir():
        raise UsageError(f"--notebooks {args.notebooks!r} is not a directory")
    notebooks = None if args.no_notebooks else Path(args.notebooks) if args.notebooks else NOTEBOOKS
    from diagtools.frontends.progress import phase_line

    with phase_line() as live:

        def said(lines: list[str]) -> None:  # each specimen's line as its scan ends, above the live line
            live.above(lambda: _print("\n".join(lines)))

        report = write_demo_report(
            Path(args.out), driver=args.driver, notebooks=notebooks, progress=live.phase, said=said
        )
    if report.closing_lines():
        _print("\n".join(report.closing_lines()))
    from diagtools.render.paths import display_path

    print(f"report written to {display_path(str(report.index.resolve()))}")
    postmortem = report.index.parent / "postmortem.html"
    if postmortem.exists():
        print(f"postmortem: {display_path(str(postmortem.resolve()))}")
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
    check_writable(args.json, "--json")
    check_writable(args.html, "--html")
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
        (args.json, lambda: write_json(result.to_json(), args.json)),
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
