"""IPython magics: ``%cuda_scan`` and ``%%cuda_watch``, loaded with ``%load_ext diagtools``.

Both run the work in other processes, so the notebook's own kernel never
imports the target and never initializes CUDA.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from diagtools.driver import DRIVER_CHOICES
from diagtools.errors import DiagtoolsError

__all__ = ["DiagtoolsMagics", "load_ipython_extension"]


def _report(exc: DiagtoolsError) -> None:
    print(f"diagtools: error: {exc}", file=sys.stderr)


def _cell_environment() -> dict[str, str]:
    """The kernel's environment, with its working directory importable as the cell's would be."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), env.get("PYTHONPATH", "")) if p)
    return env


@magics_class
class DiagtoolsMagics(Magics):
    """``%cuda_scan TARGET [--path DIR]`` and ``%%cuda_watch [--driver D] [--timeout S]``."""

    @magic_arguments()
    @argument("target", nargs="+", help="module(s) to import in a fresh subkernel")
    @argument("--path", action="append", default=[], help="directory to put first on sys.path")
    @argument("--driver", choices=DRIVER_CHOICES, default="auto")
    @argument("--timeout", type=float, default=120.0)
    @line_magic
    def cuda_scan(self, line: str) -> Any:
        """Scan TARGET in a fresh subkernel; the result renders itself."""
        from diagtools.usecases.scan import scan

        args = parse_argstring(self.cuda_scan, line)
        try:
            return scan(args.target, path=args.path, driver=args.driver, timeout=args.timeout)
        except DiagtoolsError as exc:
            _report(exc)
            return None

    @magic_arguments()
    @argument("--driver", choices=DRIVER_CHOICES, default="auto")
    @argument("--timeout", type=float, default=300.0)
    @cell_magic
    def cuda_watch(self, line: str, cell: str) -> Any:
        """Run the cell as a script under ``diagtools run``: which line initialized CUDA, and any poisoned fork."""
        from diagtools.usecases.run import run

        args = parse_argstring(self.cuda_watch, line)
        with tempfile.TemporaryDirectory(prefix="diagtools-cell-") as directory:
            script = Path(directory) / "cell.py"
            script.write_text(cell, encoding="utf-8")
            try:
                result = run(
                    [sys.executable, str(script)],
                    driver=args.driver,
                    timeout=args.timeout,
                    output="capture",
                    env=_cell_environment(),
                )
            except DiagtoolsError as exc:
                _report(exc)
                return None
        sys.stdout.write(result.stdout or "")
        sys.stderr.write(result.stderr or "")
        return result


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext diagtools``: register the magics."""
    ipython.register_magics(DiagtoolsMagics)
