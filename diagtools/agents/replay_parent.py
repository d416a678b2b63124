"""The replay program: import the setup target, then start a child that uses CUDA.

Run by the runner as a fresh subkernel (never in the notebook's kernel). It
plays the parent in vLLM's story: the setup import happens first, exactly as a
server imports its modules, then a worker starts with the chosen
multiprocessing start method and performs one CUDA action.  Events go to the
runner's private pipe.
"""

import json
import os
import sys
import traceback

import _diagtools_protocol as protocol  # registered by the runner's bootstrap

_ENV = protocol.environ()
_channel = protocol.channel_from(_ENV)
_emit = _channel.emit


def _import_setup(target, extra_path):
    sys.path[0:0] = extra_path
    try:
        __import__(target)
    except BaseException as exc:
        _emit(
            "setup",
            ok=False,
            error=f"{type(exc).__qualname__}: {exc}",
            traceback="".join(traceback.format_exception(exc)),
        )
        return False
    _emit("setup", ok=True)
    return True


def _find_own_package():
    """Make ``diagtools.agents.replay_child`` importable under another interpreter (``--python``).

    The child side must be an importable module (spawn imports it by name);
    an environment without diagtools gets this copy's root at the end of
    ``sys.path``, after the setup import, so the target's own tree is unchanged.
    """
    import importlib.util

    if importlib.util.find_spec("diagtools") is None:
        program = os.path.realpath(_ENV.get(protocol.PROGRAM_FILE, ""))
        sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(program))))


def _parent_state():
    import threading

    from diagtools.agents.replay_child import driver_state

    torch_cuda = sys.modules.get("torch.cuda")
    state = driver_state()
    return {
        "driver_state": state,
        "cuda_initialized": protocol.driver_initialized(state),
        "torch_cuda_initialized": bool(vars(torch_cuda).get("_initialized")) if torch_cuda else None,
        "threads": sorted(thread.name for thread in threading.enumerate()),
        "modules": len(sys.modules),
    }


def _child_outcome(process, scratch, timeout):
    process.join(timeout)
    timed_out = process.is_alive()
    if timed_out:
        process.kill()
        process.join()
    outcome = _read_json(os.path.join(scratch, "result.json")) or {}
    code = process.exitcode
    status = outcome.get("status")
    if timed_out:
        status = "timeout"
    elif code is not None and code < 0:
        status = "crashed"
    elif status is None:
        status = "exited"
    outcome.update(
        status=status,
        exitcode=code,
        signal=-code if code is not None and code < 0 else None,
        stdout=_read_text(os.path.join(scratch, "stdout")),
        stderr=_read_text(os.path.join(scratch, "stderr")),
    )
    if not outcome.get("traceback"):
        outcome.update(_traceback_from(outcome["stderr"]))
    return outcome


def _traceback_from(stderr):
    """The last traceback a child printed before it could report (a spawn child failing to start, say)."""
    start = stderr.rfind("Traceback (most recent call last):")
    if start < 0:
        return {}
    traceback_text = stderr[start:].rstrip()
    error_type, _, error = traceback_text.splitlines()[-1].partition(": ")
    return {"traceback": traceback_text, "error_type": error_type.strip(), "error": error.strip()}


def _start_with_output_files(process, scratch):
    """Start the child with fd 1 and 2 on files: whatever it prints, even before it runs our code, is kept."""
    saved = [os.dup(1), os.dup(2)]
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        for fd, name in ((1, "stdout"), (2, "stderr")):
            target = os.open(os.path.join(scratch, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(target, fd)
            os.close(target)
        process.start()
    finally:
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def _read_text(path, limit=64 * 1024):
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError:
        return ""
    text = data[:limit].decode("utf-8", "backslashreplace")
    return text + ("\n[... truncated]" if len(data) > limit else "")


def main():
    import multiprocessing
    import tempfile

    protocol.enable_fault_dumps(_ENV, protocol.load_cuprobe(_ENV))  # its dumps never land in a target's file
    _emit("hello", pid=os.getpid(), python=sys.version)
    extra_path = [p for p in _ENV.get(protocol.REPLAY_PATH, "").split("\n") if p]
    if not _import_setup(_ENV[protocol.REPLAY_TARGET], extra_path):
        _emit("done")
        protocol.exit_if_channel_lost(_channel)
        return
    _find_own_package()
    _emit("parent", **_parent_state())
    from diagtools.agents.replay_child import run_child

    context = multiprocessing.get_context(_ENV[protocol.REPLAY_START_METHOD])
    # inside the runner's scratch directory, which the runner removes even when this process is killed
    with tempfile.TemporaryDirectory(
        prefix="diagtools-replay-", dir=_ENV.get(protocol.REPLAY_SCRATCH) or None
    ) as scratch:
        process = context.Process(target=run_child, args=(_ENV[protocol.REPLAY_CHILD], scratch), name="replay-child")
        _start_with_output_files(process, scratch)
        outcome = _child_outcome(process, scratch, float(_ENV[protocol.REPLAY_CHILD_TIMEOUT]))
    _emit("child", **outcome)
    _emit("done")
    protocol.exit_if_channel_lost(_channel)


main()
