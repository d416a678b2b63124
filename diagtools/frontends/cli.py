"""The ``diagtools`` command line: argument parsing and printing, nothing else."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from diagtools.driver import DRIVER_CHOICES
from diagtools.errors import DiagtoolsError, UsageError
from diagtools.model.replay import START_METHODS

__all__ = ["main"]

EXIT_OK, EXIT_CUDA, EXIT_USAGE, EXIT_TARGET_FAILED = 0, 1, 2, 3


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors in one line with exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"diagtools: error: {message} (see {self.prog} --help)\n")


def _version() -> str:
    from diagtools import __version__

    return __version__


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="diagtools", description="Find which import initializes the CUDA driver.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for diagtools' own errors")
    parser.add_argument("--version", action="version", version=f"diagtools {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_scan(commands.add_parser("scan", help="import targets in a fresh subkernel and name the culprit"))
    _add_replay(commands.add_parser("replay", help="reproduce the poisoned-fork failure in a subkernel"))
    _add_sweep(commands.add_parser("sweep", help="scan every submodule of a package alone, in parallel"))
    _add_bisect(commands.add_parser("bisect", help="find the commit that made an import initialize CUDA"))
    _add_diff(commands.add_parser("diff", help="what a fix changed between two scan JSON files"))
    _add_bench(commands.add_parser("bench", help="time the compress_norm_rope_store kernels side by side"))
    _add_demo(commands.add_parser("demo", help="scan the built-in specimens and write a report"))
    return parser


def _add_debug(parser: argparse.ArgumentParser) -> None:
    """Accept --debug after the subcommand too, without resetting one given before it."""
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def _add_scan(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("targets", nargs="+", metavar="TARGET", help="module to import, e.g. pkg.ops")
    parser.add_argument("--path", action="append", default=[], metavar="DIR", help="prepend DIR to sys.path")
    parser.add_argument("--driver", choices=DRIVER_CHOICES, default="auto")
    parser.add_argument("--timeout", type=float, default=120.0, metavar="S")
    parser.add_argument("--json", metavar="FILE|-", help="write the diagtools.scan/1 document ('-' for stdout)")
    parser.add_argument("--fail-on-cuda", action="store_true", help="exit 1 when CUDA got initialized")
    parser.add_argument("--stack", action="store_true", help="print the whole Python stack of the culprit")
    parser.add_argument("--svg", metavar="FILE", help="write the import graph (culprit chains) as SVG")
    _add_debug(parser)


def _add_replay(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="TARGET", help="module the parent imports before starting the child")
    parser.add_argument("--path", action="append", default=[], metavar="DIR", help="prepend DIR to sys.path")
    parser.add_argument("--child", default="cuinit", metavar="ACTION", help="cuinit, ctypes, torch or module:function")
    parser.add_argument("--start-method", choices=START_METHODS, default="fork")
    parser.add_argument(
        "--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="replay on both trees, under fork and spawn"
    )
    parser.add_argument("--driver", choices=DRIVER_CHOICES, default="auto")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="S")
    parser.add_argument("--json", metavar="FILE|-", help="write the diagtools.replay/1 document ('-' for stdout)")
    _add_debug(parser)


def _add_sweep(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("package", metavar="PACKAGE", help="package whose submodules are scanned one by one")
    parser.add_argument("--path", action="append", default=[], metavar="DIR", help="prepend DIR to sys.path")
    parser.add_argument("--jobs", type=int, default=None, metavar="N", help="parallel subkernels (default: CPUs)")
    parser.add_argument("--json", metavar="FILE", help="JSON Lines journal: appended as modules finish, resumed")
    parser.add_argument("--driver", choices=DRIVER_CHOICES, default="auto")
    parser.add_argument("--timeout", type=float, default=120.0, metavar="S")
    parser.add_argument("--fail-on-cuda", action="store_true", help="exit 1 when any module initializes CUDA")
    _add_debug(parser)


def _add_bisect(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="TARGET", help="module whose import became CUDA-initializing")
    parser.add_argument("--repo", required=True, metavar="DIR", help="the git repository (never modified)")
    parser.add_argument("--good", required=True, metavar="REV", help="a commit where the import is clean")
    parser.add_argument("--bad", required=True, metavar="REV", help="a commit where it initializes CUDA")
    parser.add_argument("--path-in-repo", default="", metavar="SUBDIR", help="import root inside the repository")
    parser.add_argument("--driver", choices=DRIVER_CHOICES, default="auto")
    parser.add_argument("--timeout", type=float, default=120.0, metavar="S")
    parser.add_argument("--json", metavar="FILE|-", help="write the diagtools.bisect/1 document")
    _add_debug(parser)


def _add_diff(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("before", metavar="BEFORE.json")
    parser.add_argument("after", metavar="AFTER.json")
    parser.add_argument("--html", metavar="FILE", help="also write the diff as HTML")
    parser.add_argument("--json", metavar="FILE|-", help="write the diagtools.diff/1 document")
    _add_debug(parser)


def _size(text: str) -> tuple[int, int]:
    groups, sep, head_dim = text.partition("x")
    if not sep or not groups.isdigit() or not head_dim.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not GxD, e.g. 4096x512")
    return int(groups), int(head_dim)


def _add_bench(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", action="append", type=_size, metavar="GxD", help="default: the full grid on a GPU")
    parser.add_argument("--backend", action="append", choices=("torch", "triton", "cutedsl"), metavar="B")
    parser.add_argument("--ratio", type=int, default=4)
    parser.add_argument("--driver", choices=DRIVER_CHOICES, default="auto")
    parser.add_argument("--json", metavar="FILE|-", help="write the diagtools.bench/1 document")
    parser.add_argument("--chart", metavar="PNG", help="write a bar chart of GB/s")
    _add_debug(parser)


def _add_demo(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="build/report", metavar="DIR", help="where the report goes")
    parser.add_argument("--no-notebooks", action="store_true", help="only scan the specimens")
    parser.add_argument("--driver", choices=DRIVER_CHOICES, default="auto")
    _add_debug(parser)


def _write_json(document: dict[str, Any], destination: str) -> None:
    text = json.dumps(document, indent=2, sort_keys=True) + "\n"
    if destination == "-":
        sys.stdout.write(text)
    else:
        Path(destination).write_text(text, encoding="utf-8")


def _run_scan(args: argparse.Namespace) -> int:
    from diagtools.render.text import render_scan
    from diagtools.usecases.scan import scan

    result = scan(args.targets, path=args.path, driver=args.driver, timeout=args.timeout)
    if args.svg:
        from diagtools.render.graph import write_svg

        write_svg(result, args.svg)
    _emit(result.to_json(), render_scan(result, stack=args.stack), args.json)
    if not result.ok:
        return EXIT_TARGET_FAILED
    return EXIT_CUDA if (args.fail_on_cuda and result.cuda_initialized) else EXIT_OK


def _run_replay(args: argparse.Namespace) -> int:
    from diagtools.render.text import render_comparison, render_replay
    from diagtools.usecases.replay import compare_replays, replay_fork

    common = {"child": args.child, "path": args.path, "driver": args.driver, "timeout": args.timeout}
    if args.compare:
        before, after = args.compare
        comparison = compare_replays(args.target, before=before, after=after, **common)
        _emit(comparison.to_json(), render_comparison(comparison), args.json)
        failed = [r for _, r in comparison.runs if r.status in _REPLAY_BROKEN]
        return EXIT_TARGET_FAILED if failed else EXIT_OK
    result = replay_fork(args.target, start_method=args.start_method, **common)
    _emit(result.to_json(), render_replay(result), args.json)
    return EXIT_TARGET_FAILED if result.status in _REPLAY_BROKEN else EXIT_OK


_REPLAY_BROKEN = ("setup-error", "crashed", "timeout", "exited")


def _emit(document: dict[str, Any], text: str, json_destination: str | None) -> None:
    if json_destination:
        _write_json(document, json_destination)
    if json_destination != "-":
        _print(text)


def _print(text: str) -> None:
    """Print a report, coloured when stdout is a terminal (``NO_COLOR`` and ``FORCE_COLOR`` respected)."""
    import os

    from diagtools.render.text import paint, use_color

    print(paint(text) if use_color(sys.stdout.isatty(), os.environ) else text)


def _run_sweep(args: argparse.Namespace) -> int:
    from diagtools.frontends.progress import terminal_progress
    from diagtools.render.text import render_sweep
    from diagtools.usecases.sweep import sweep

    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
    result = sweep(
        args.package,
        path=args.path,
        jobs=args.jobs,
        driver=args.driver,
        timeout=args.timeout,
        json_path=args.json,
        progress=terminal_progress(args.package),
    )
    _print(render_sweep(result))
    return EXIT_CUDA if (args.fail_on_cuda and result.culprits) else EXIT_OK


def _run_bisect(args: argparse.Namespace) -> int:
    from diagtools.render.text import render_bisect
    from diagtools.usecases.bisect import bisect

    result = bisect(
        args.repo,
        args.good,
        args.bad,
        args.target,
        path_in_repo=args.path_in_repo,
        driver=args.driver,
        timeout=args.timeout,
    )
    _emit(result.to_json(), render_bisect(result), args.json)
    return EXIT_OK if result.first_bad else EXIT_TARGET_FAILED


def _read_scan(path: str) -> Any:
    from diagtools.model.scan import ScanResult

    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise UsageError(f"{path} is not JSON: {exc}") from None
    return ScanResult.from_json(document)


def _run_diff(args: argparse.Namespace) -> int:
    from diagtools.model.diff import diff_scans
    from diagtools.render.html import diff_html
    from diagtools.render.text import render_diff

    diff = diff_scans(_read_scan(args.before), _read_scan(args.after))
    if args.html:
        Path(args.html).write_text(diff_html(diff), encoding="utf-8")
    _emit(diff.to_json(), render_diff(diff), args.json)
    return EXIT_OK


def _run_bench(args: argparse.Namespace) -> int:
    from diagtools.bench import compare

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
    return EXIT_TARGET_FAILED if report.error else EXIT_OK


def _run_demo(args: argparse.Namespace) -> int:
    from diagtools.frontends.demo import NOTEBOOKS, write_demo_report

    report = write_demo_report(Path(args.out), driver=args.driver, notebooks=None if args.no_notebooks else NOTEBOOKS)
    _print(report.summary)
    print(f"report written to {report.index.resolve()}")
    postmortem = report.index.parent / "postmortem.html"
    if postmortem.exists():
        print(f"postmortem: {postmortem.resolve()}")
    return EXIT_OK if report.as_expected else EXIT_TARGET_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``diagtools`` command; returns the exit code."""
    args = _build_parser().parse_args(argv)
    handlers = {
        "scan": _run_scan,
        "replay": _run_replay,
        "sweep": _run_sweep,
        "bisect": _run_bisect,
        "diff": _run_diff,
        "bench": _run_bench,
        "demo": _run_demo,
    }
    try:
        return handlers[args.command](args)
    except DiagtoolsError as exc:
        if args.debug:
            raise
        print(f"diagtools: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("diagtools: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
