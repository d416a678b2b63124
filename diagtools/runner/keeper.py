"""The keeper: a tiny parent that owns a subkernel's whole process tree.

The host starts this file as ``python -I -S keeper.py [OPTIONS] -- ARGV...``
in a session of its own (:mod:`diagtools.runner.kept` builds the line).  The
keeper makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``), so every
descendant that loses its parent (a double-forked daemon, a ``setsid``
grandchild, a process that dropped its environment) is re-parented to the
keeper instead of to init; it then starts the target (``ARGV``, looked up in
``PATH`` when it names no directory) in a new session.  When the target
exits, when the host writes ``k`` on the lifeline, or when that pipe closes
because the host died, the keeper kills every descendant it has, again and
again until it has no child left, and only then reports the target's exit
code.  Descendants are found by walking ``/proc/*/stat`` parent links, so no
cooperation of the target is needed.

Every scan starts one keeper, so its start is part of a scan's fixed cost: it
imports only C modules and ``os`` (``_signal`` rather than ``signal``, whose
enums cost milliseconds; ``_ctypes`` rather than ``ctypes`` for its one call),
and it leaves with ``os._exit`` once its last line is written.

Options (each takes a descriptor number):

``--status FD``    where the keeper reports (default 1);
``--lifeline FD``  what the keeper listens to (default 0);
``--out FD``       the target's stdout, its stdin then being ``/dev/null``;
                   without it the target gets the keeper's stdin, stdout and
                   stderr untouched;
``--channel FD``, ``--dump FD``  the result channel and the fault dump, moved
                   to high numbers in the target (``protocol.HIGH_FD`` and up) and
                   named there by ``protocol.CHANNEL_FD`` and ``protocol.DUMP_FD``.
``--census MS``    (not a descriptor) every MS milliseconds while the target
                   runs, note each descendant that is a Python interpreter,
                   so the host can name one its agent never heard from.

The status and lifeline descriptors are never inherited by the target.

Protocol on the status descriptor (one line each): ``pid N`` once the target
runs, or ``error ERRNO MESSAGE`` when it could not be started (its exit code
is then 127); with ``--census``, ``python PID HEX`` (the command line's
NUL-separated words, in hexadecimal) for each Python descendant seen alive in two polls in a row;
``exit CODE`` (``-N`` for signal N) once the tree is gone.
Standard library only; nothing of diagtools is imported (the protocol file is
read by path where the target gets private descriptors).
"""

import os
import select
import sys
import time

TYPE_CHECKING = False  # not typing's: importing typing would cost the keeper more than all the rest
if TYPE_CHECKING:
    import signal
else:
    import _signal as signal  # the same functions and numbers, without the enum module

PR_SET_CHILD_SUBREAPER = 36
SWEEP_LIMIT_S = 30.0
NUL = b"\0"


class StopRequest(Exception):  # noqa: N818 - a request, not an error
    """A signal asked the keeper to kill the tree and leave."""


def _stop(signum, frame):
    raise StopRequest(signum)


def set_subreaper():
    if _libc_prctl()(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        os.write(2, b"diagtools keeper: PR_SET_CHILD_SUBREAPER failed; orphans may escape\n")


def _libc_prctl():
    """libc's ``prctl`` as ``ctypes.CDLL(None).prctl`` would give it, built from ``_ctypes`` directly.

    ``ctypes`` is the same few lines over ``_ctypes`` plus imports that cost
    the keeper milliseconds; an interpreter whose ``_ctypes`` differs gets ``ctypes``.
    """
    try:
        import _ctypes

        class Int(_ctypes._SimpleCData):
            _type_ = "i"

        class Function(_ctypes.CFuncPtr):
            _flags_ = _ctypes.FUNCFLAG_CDECL
            _restype_ = Int

        class Libc:
            _handle = _ctypes.dlopen(None, _ctypes.RTLD_LOCAL)  # type: ignore[arg-type] # None: the program itself

        return Function(("prctl", Libc))  # type: ignore[arg-type] # any object with a _handle, as CDLL is
    except (ImportError, AttributeError, TypeError, OSError):
        import ctypes

        return ctypes.CDLL(None).prctl


def load_protocol():
    """The protocol module (:mod:`diagtools.protocol`), loaded from its file as the subkernel's bootstrap loads it.

    The keeper imports nothing of diagtools as a package; the protocol is
    where the descriptor numbers and the variables naming them are kept, so
    the keeper reads them there rather than keeping copies.
    """
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[0]))), "protocol.py")
    loader = sys.modules["_frozen_importlib_external"].SourceFileLoader("_diagtools_protocol", path)
    module = type(sys)("_diagtools_protocol")
    module.__file__ = path
    exec(loader.get_code("_diagtools_protocol"), module.__dict__)
    return module


def move_private_fds(options, env):
    """Move the channel and the dump file high, inheritable by the target, and name them in ``env``."""
    protocol = load_protocol()
    with protocol.RoomAbove():
        for name, variable in (("channel", protocol.CHANNEL_FD), ("dump", protocol.DUMP_FD)):
            if name in options:
                env[variable] = str(protocol.move_high(options[name], inheritable=True))


def start_target(options, argv):
    """Fork, and in the child: new session, private fds moved high, stdio wired, exec ``argv``.

    Returns the child's pid and, when it could not exec, why (``None`` once it runs).
    """
    failed_r, failed_w = os.pipe()  # close-on-exec: end of file once the exec succeeded
    pid = os.fork()
    if pid:
        os.close(failed_w)
        with os.fdopen(failed_r, "rb") as failed:
            reason = failed.read().decode("utf-8", "replace")
        return pid, reason or None
    try:
        os.close(failed_r)
        os.setsid()
        env = dict(os.environ)
        if "channel" in options or "dump" in options:
            move_private_fds(options, env)
        if "out" in options:
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(options["out"], 1)
            for fd in (null, options["out"]):
                if fd > 2:
                    os.close(fd)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        os.execvpe(argv[0], argv, env)
    except BaseException as exc:
        errno = getattr(exc, "errno", None) or 0
        message = getattr(exc, "strerror", None) or str(exc)
        try:
            os.write(failed_w, f"{errno} {message}".encode())
            if "out" in options:
                os.write(2, f"diagtools keeper: cannot start {argv[0]}: {message}\n".encode())
        except OSError:
            pass
    os._exit(127)


def descendants():
    """``{pid: pgid}`` of every process whose parent chain leads here, from ``/proc/*/stat``."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append((int(entry), int(fields[2])))
    found, frontier = {}, [os.getpid()]
    while frontier:
        for pid, pgid in children.get(frontier.pop(), ()):
            if pid not in found:
                found[pid] = pgid
                frontier.append(pid)
    return found


def reap(statuses):
    """Collect every exited child into ``statuses``; raises ChildProcessError once no child is left."""
    while True:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        statuses[pid] = status


def sweep(statuses):
    """Kill every descendant, repeatedly, until the keeper has no child at all."""
    me_group = os.getpgid(0)
    stop = time.monotonic() + SWEEP_LIMIT_S
    while time.monotonic() < stop:
        try:
            reap(statuses)
        except ChildProcessError:
            return True
        found = descendants()
        for pgid in set(found.values()) - {me_group}:
            _kill(os.killpg, pgid)
        for pid in found:
            _kill(os.kill, pid)
        time.sleep(0.002)
    return False


def _kill(kill, target):
    try:  # noqa: SIM105 - contextlib would cost every keeper its imports
        kill(target, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Census:
    """The Python interpreters among the descendants, polled while the target runs."""

    def __init__(self, interval_ms):
        self.interval = interval_ms / 1000.0 if interval_ms else None
        self.sightings = {}  # pid -> (how many polls in a row saw it as Python, its argv)

    def poll(self):
        if self.interval is None:
            return
        for pid in descendants():
            argv = _python_argv(pid)
            if argv is not None:
                count, _ = self.sightings.get(pid, (0, argv))
                self.sightings[pid] = (count + 1, argv)

    def report(self, status):
        for pid, (count, argv) in sorted(self.sightings.items()):
            if count >= 2:
                words = NUL.join(argv)[:600].hex()
                _say(status, f"python {pid} {words}\n")


def _python_argv(pid):
    """The command line of ``pid`` when its executable is a Python interpreter, else None."""
    try:
        name = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmdline = handle.read()
    except OSError:
        return None
    version = name[len("python") :]
    if not name.startswith("python") or (version and not version.replace(".", "").isdigit()):
        return None
    return cmdline.rstrip(b"\0").split(b"\0")


def wait_for(pid, lifeline, census=None):
    """Wait until the subkernel exits or the runner asks (or dies); True when asked to kill."""
    census = census or Census(0)
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # before Linux 5.3: poll the child instead
        pidfd = None
    try:
        while True:
            census.poll()
            watched = [lifeline] if pidfd is None else [lifeline, pidfd]
            wait = 1.0 if pidfd is not None else 0.02
            ready, _, _ = select.select(watched, [], [], min(wait, census.interval or wait))
            if lifeline in ready:
                data = os.read(lifeline, 64)
                if not data or b"k" in data:
                    return True
            if pidfd in ready or (pidfd is None and _exited(pid)):
                return False
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _exited(pid):
    """Whether the child exited, leaving it to be reaped by the sweep."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


OPTIONS = ("--status", "--lifeline", "--out", "--channel", "--dump", "--census")


def parse(argv):
    """``({name: fd}, command)`` from ``[OPTIONS] -- ARGV``."""
    split = argv.index("--")
    words = argv[1:split]
    if len(words) % 2 or not set(words[::2]) <= set(OPTIONS):
        raise SystemExit(f"diagtools keeper: usage: keeper.py [{' FD] ['.join(OPTIONS)} FD] -- ARGV")
    options = {name[2:]: int(value) for name, value in zip(words[::2], words[1::2], strict=True)}
    return options, argv[split + 1 :]


def main(argv):
    options, command = parse(argv)
    status, lifeline = options.pop("status", 1), options.pop("lifeline", 0)
    census = Census(options.pop("census", 0))
    for fd in (status, lifeline):
        os.set_inheritable(fd, False)  # the target must not hold the keeper's own pipes
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _stop)
    set_subreaper()
    statuses: dict[int, int] = {}
    pid = None
    try:
        pid, failed = start_target(options, command)
        for fd in options.values():
            os.close(fd)
        os.write(status, f"pid {pid}\n".encode() if failed is None else f"error {failed}\n".encode())
        if failed is None and wait_for(pid, lifeline, census):
            _kill(os.kill, pid)
    except StopRequest:
        if pid is not None:
            _kill(os.kill, pid)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        clean = sweep(statuses)
    code = os.waitstatus_to_exitcode(statuses[pid]) if pid in statuses else 127
    census.report(status)
    _say(status, f"exit {code}\n" if clean else f"exit {code} leftover\n")


def _say(status, line):
    """Write one status line; a host that is gone is no reason to stop."""
    try:  # noqa: SIM105 - contextlib would cost every keeper its imports
        os.write(status, line.encode())
    except OSError:
        pass


if __name__ == "__main__":
    main(sys.argv)
    os._exit(0)  # everything is said and nothing is buffered: tearing the interpreter down only delays the host
