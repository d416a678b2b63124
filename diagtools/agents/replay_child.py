"""The child side of a fork replay: one CUDA action, its outcome written to a file.

Imported by the child process (whatever the start method), so it must be an
importable module; it uses the standard library only and imports the CUDA
stack an action needs only inside that action.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from diagtools import protocol

__all__ = ["ACTIONS", "ActionUnavailableError", "run_child"]


class ActionUnavailableError(Exception):
    """The action cannot run here (a CPU-only torch, no real driver): reported, never faked."""


class DriverCallError(RuntimeError):
    """A CUDA driver call returned an error code, as the driver itself reported it."""


_ERROR_NAMES = protocol.CUDA_ERROR_NAMES


def _record(calls: list[list], name: str, code: int) -> int:
    calls.append([name, int(code), _ERROR_NAMES.get(int(code), f"CUresult {int(code)}")])
    if code != 0:
        raise DriverCallError(f"{name} failed with {_ERROR_NAMES.get(int(code), code)} ({int(code)})")
    return code


def action_cuinit(calls: list[list]) -> str:
    """cuda-python: cuInit(0), then the device count."""
    from cuda.bindings import driver

    (status,) = driver.cuInit(0)
    _record(calls, "cuInit(0)", int(status))
    status, count = driver.cuDeviceGetCount()
    _record(calls, "cuDeviceGetCount", int(status))
    return f"{count} device(s)"


def action_ctypes(calls: list[list]) -> str:
    """Raw libcuda through ctypes, as Triton's is_active() does."""
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise ActionUnavailableError(f"libcuda.so.1 does not load: {exc}") from None
    _record(calls, "cuInit(0)", lib.cuInit(0))
    count = ctypes.c_int()
    _record(calls, "cuDeviceGetCount", lib.cuDeviceGetCount(ctypes.byref(count)))
    return f"{count.value} device(s)"


def action_torch(calls: list[list]) -> str:
    """torch.cuda.init() and a tiny tensor: an op on a real GPU, an allocation and a copy on the simulated one.

    The simulated runtime serves allocations and copies from host memory but runs no
    kernels (a launch is refused and recorded as a simulation gap), so there the child
    stops short of an op; torch's own fork check, the point of the action, is the same.
    """
    driver = os.environ.get(protocol.DRIVER_KIND, "unknown")
    if driver not in ("real", "simulated"):
        raise ActionUnavailableError(f"torch needs a CUDA driver; this replay uses the {driver} driver")
    try:
        import torch
    except ImportError as exc:
        raise ActionUnavailableError(f"torch is not installed: {exc}") from None
    if torch.version.cuda is None:
        raise ActionUnavailableError(f"torch {torch.__version__} is a CPU build")
    torch.cuda.init()
    if driver == "real":
        value = (torch.ones(4, device="cuda") * 2).sum().item()
        calls.append(["torch.cuda.init() + tensor op", 0, f"sum = {value}"])
    else:
        value = torch.tensor([1.0, 2.0, 3.0, 4.0]).cuda().cpu().sum().item()
        calls.append(["torch.cuda.init() + tensor copy (simulated GPU: no kernels)", 0, f"sum = {value}"])
    return f"torch on {torch.cuda.get_device_name(0)}"


ACTIONS: dict[str, Callable[[list[list]], str]] = {
    "cuinit": action_cuinit,
    "ctypes": action_ctypes,
    "torch": action_torch,
}


def _resolve(action: str) -> Callable[[list[list]], str]:
    if action in ACTIONS:
        return ACTIONS[action]
    module_name, _, function_name = action.partition(":")
    function = getattr(importlib.import_module(module_name), function_name)
    return lambda calls: str(function())


def _redirect_output(scratch: Path) -> None:
    """Send the child's fd 1 and fd 2 to files, so the parent can report them apart (after what is already there)."""
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, name in ((1, "stdout"), (2, "stderr")):
        target = os.open(scratch / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(target, fd)
        os.close(target)


def driver_state() -> int | None:
    """The driver's answer to ``cuDeviceGetCount`` in this process (3: not initialized), if a probe was built."""
    cuprobe = protocol.load_cuprobe(os.environ)
    return None if cuprobe is None else int(cuprobe.driver_state())


def run_child(action: str, scratch: str) -> None:
    """Perform ``action`` and write ``result.json`` into ``scratch``; exit 1 on failure."""
    folder = Path(scratch)
    _redirect_output(folder)
    calls: list[list] = []
    outcome: dict = {"driver_state_at_start": driver_state(), "driver_calls": calls}
    try:
        outcome.update(status="ok", detail=_resolve(action)(calls))
    except ActionUnavailableError as exc:
        outcome.update(status="unavailable", detail=str(exc))
    except Exception as exc:
        outcome.update(
            status="failed",
            error_type=type(exc).__qualname__,
            error=str(exc),
            traceback="".join(traceback.format_exception(exc)),
        )
    (folder / "result.json").write_text(json.dumps(outcome), encoding="utf-8")
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    if outcome["status"] == "failed":
        sys.exit(1)
