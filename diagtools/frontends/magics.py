"""IPython magics: ``%cuda_scan`` and ``%%cuda_watch``, loaded with ``%load_ext diagtools``.

Both run the work in other processes, so the notebook's own kernel never
imports the target and never initializes CUDA.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from diagtools.driver import DRIVER_CHOICES
from diagtools.errors import DiagtoolsError
from diagtools.model.options import DEFAULT_TIMEOUT_S
from diagtools.model.run import RunResult

__all__ = ["DiagtoolsMagics", "load_ipython_extension"]


def _report(exc: DiagtoolsError) -> None:
    print(f"diagtools: error: {exc}", file=sys.stderr)


def _cell_environment() -> dict[str, str]:
    """The kernel's environment, with its working directory importable as the cell's would be."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), env.get("PYTHONPATH", "")) if p)
    return env


DRIVER_HELP = "auto: the real driver on a GPU machine, the simulated one elsewhere; real; simulated"


@magics_class
class DiagtoolsMagics(Magics):
    """``%cuda_scan TARGET [--path DIR]`` and ``%%cuda_watch [--driver D] [--timeout S]``."""

    @magic_arguments()
    @argument("target", nargs="+", help="module(s) to import in a fresh subkernel")
    @argument("--path", action="append", default=[], help="directory to put first on sys.path")
    @argument("--driver", choices=DRIVER_CHOICES, default="auto", help=DRIVER_HELP)
    @argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds before the subkernel is stopped")
    @argument("--no-cuts", dest="cuts", action="store_false", help="do not search (and verify) where to cut")
    @line_magic
    def cuda_scan(self, line: str) -> Any:
        """Scan TARGET in a fresh subkernel; the result renders itself, with its verified cut."""
        from diagtools.usecases.scan import scan

        args = parse_argstring(self.cuda_scan, line)
        try:
            return scan(args.target, path=args.path, driver=args.driver, timeout=args.timeout, cuts=args.cuts)
        except DiagtoolsError as exc:
            _report(exc)
            return None

    @magic_arguments()
    @argument("--driver", choices=DRIVER_CHOICES, default="auto", help=DRIVER_HELP)
    @argument("--timeout", type=float, default=300.0, help="seconds before the cell's process tree is stopped")
    @cell_magic
    def cuda_watch(self, line: str, cell: str) -> Any:
        """Run the cell as a script under ``diagtools run``: which line initialized CUDA, and any poisoned fork.

        Lines are numbered as the notebook shows them (the ``%%cuda_watch`` line is
        line 1) and the file is named after the cell (``In[5]``, as IPython's own
        tracebacks name it), not after the temporary script, which is gone by then.
        """
        from diagtools.usecases.run import run

        args = parse_argstring(self.cuda_watch, line)
        label = cell_label(self.shell, cell)
        with tempfile.TemporaryDirectory(prefix="diagtools-cell-") as directory:
            script = Path(directory) / "cell.py"
            script.write_text("\n" + cell, encoding="utf-8")  # the magic's own line is line 1
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
        name, _, _cell_id = label.partition(" ")
        output = (result.stdout, result.stderr)  # the program's own words: never rewritten
        result = renamed(result, {str(script): name, sys.executable: "python"})
        result = dataclasses.replace(result, command=("python", name), cell=label, stdout=output[0], stderr=output[1])
        sys.stdout.write(result.stdout or "")
        sys.stderr.write(result.stderr or "")
        return result


def _prompt_number(shell: Any, cell: str) -> int | None:
    """The running cell's ``In[N]``: its index in the input history, which IPython fills before running it.

    ``execution_count`` is not it: IPython 9 counts the cell up before running it, older ones after.
    """
    history = getattr(getattr(shell, "history_manager", None), "input_hist_raw", None) or []
    if history and cell.strip() and cell.strip() in history[-1]:
        return len(history) - 1
    count = getattr(shell, "execution_count", None)
    return count if isinstance(count, int) else None


def cell_label(shell: Any, cell: str = "") -> str:
    """How the cell is named: ``In[N]`` (its prompt number) and, in JupyterLab, its cell id.

    Lines are shown as ``In[N]:L``, the way IPython's own tracebacks name a cell.
    """
    count = _prompt_number(shell, cell)
    header = getattr(shell, "parent_header", None) or {}
    cell_id = (header.get("metadata") or {}).get("cellId", "") if isinstance(header, dict) else ""
    name = f"In[{count}]" if isinstance(count, int) else "In[?]"
    return f"{name} (cell id {cell_id[:8]})" if cell_id else name


def renamed(result: RunResult, names: dict[str, str]) -> RunResult:
    """``result`` with each path in ``names`` (the temporary script, the kernel's interpreter) renamed in every field
    diagtools wrote; the caller puts the program's own output back as it was."""

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            for path, name in names.items():
                value = value.replace(path, name)
            return value
        if isinstance(value, list):
            return [walk(item) for item in value]
        if isinstance(value, dict):
            return {key: walk(item) for key, item in value.items()}
        return value

    return RunResult.from_json(walk(result.to_json()))


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext diagtools``: register the magics."""
    ipython.register_magics(DiagtoolsMagics)
