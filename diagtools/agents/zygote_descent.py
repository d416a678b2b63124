"""The sweep zygote's package descent and continuation: who scans the modules below a package.

Part of the sweep zygote (:mod:`sweep_zygote`), in a file of its own for its
one role: once a package's own row child has ended, continue the zygote that
child left stopped after its traced import, or fork a zygote that imports the
package once, checked like any preload, and serves the modules below it.
The zygote loads this file with ``protocol.load_source`` before it preloads
anything; its state (the channel, the work folder, the serving loop) is the
zygote's, reached through ``z``.  Standard library and the protocol only.
"""

import posix
import sys
import time

import _diagtools_protocol as protocol  # registered by the runner's bootstrap

z = sys.modules["__main__"]  # the zygote itself: its channel, its files, its serving loop
_SIGSTOP, _SIGCONT = 19, 18  # Linux


DESCEND_MIN = 2  # a package with this many modules below it is imported once for all of them
_NOT_SERVED = 3  # a package zygote's exit code when it refused and scanned nothing


class _Descent:
    """Who scans the modules below one package, decided once the package's own row child has ended.

    Every one of them imports the package first.  The row child, once its
    traced import is done, forks a zygote that continues from there (see
    :class:`_Continuation`); when it did, that zygote serves them.  Otherwise
    (the import failed or started a thread, or it initialized the real
    driver) a zygote forked from this one imports the package once (untraced,
    checked like any preload: no CUDA, no thread) and forks their children;
    nothing else it loads is visible to any other module.  When the row's
    import initialized CUDA, that package zygote preloads only what the row
    had imported before that (outside the package, each checked CUDA-free),
    and each child below imports the package again: the chain and the rest.
    When no zygote serves them, this one scans them itself.
    """

    def __init__(self, index, inside):
        self.index, self.inside = index, inside
        self.kind = ""

    def start(self, state):
        """The row child has ended: continue its zygote, or fork one; a scan child's ``(index, module)``."""
        pid = _continued_zygote(self.index)
        if pid is not None:
            self._serve_by(state, pid, "continued")
            return None
        if _Continuation.prefix is not None:  # a continuing zygote never imports untraced: children need events
            state.give_back(self)
            return None
        before_cuda = z._lines_of(z._own_path(self.index, "before-cuda"))  # what its row imported off the chain
        return self._fork_package_zygote(state, before_cuda or None)

    def _fork_package_zygote(self, state, before_cuda):
        z._serving._flush_stdio()
        pid = posix.fork()
        if pid == 0:
            return _package_zygote(self.index, state.modules, self.inside, before_cuda)
        self._serve_by(state, pid, "before-cuda" if before_cuda else "package")
        return None

    def _serve_by(self, state, pid, kind):
        self.kind = kind
        state.zygotes[pid] = self

    def ended(self, state, code):
        """Its package zygote has ended: the modules are done, or this zygote's to scan."""
        served = code == 0 and (self.kind == "continued" or z._exists(z._own_path(self.index, "package")))
        if served:
            state.held.difference_update(self.inside)
            state.done.update(self.inside)
        else:
            state.give_back(self)


def _fork():
    """Fork a scan child: plainly, or without the fork handlers in a continuing zygote."""
    z._serving._flush_stdio()
    return posix.fork() if _Continuation.prefix is None else z._cuprobe.fork_continuing()


class _Continuation:
    """A package's row child, its import done, forks a zygote that goes on from there.

    That zygote is the process that imported the package, traced: each child
    it forks for a module below copies what the row had recorded so far
    (events, stdout, stderr) and imports its module, exactly as a fresh
    subkernel importing that module would after the package.  The fork skips
    the handlers libraries registered with ``pthread_atfork`` (a child
    continues the process, it is not a forked one: torch would otherwise mark
    CUDA unusable in it), so it is made only with a single thread.  A package
    that initialized the driver continues only on the simulated one, which
    hands the initialization to each child; the real driver's state does not
    survive a fork.

    The zygote stops itself at once; the zygote above, a subreaper it is
    orphaned to, continues it once the row child has ended.
    """

    below = None  # in a row child: (index, modules, inside) when it lies above modules to scan
    prefix = None  # in a continuing zygote and its children: (row index, sizes of its files), to copy
    channel = None  # in a row child that may continue: its own copy of the zygote's channel
    started = 0.0
    loaded = 0


def _may_continue(ok):
    """Why the row child must not continue from its import, or ``""``."""
    if not ok:
        return "its import failed"
    if _threads_after_settling():
        return "its import started a thread"
    if not z._cuprobe.can_fork_continuing():
        return "no fork without handlers here"
    if protocol.driver_initialized(z._cuprobe.driver_state()) and not z._cuprobe.driver_adoptable():
        return "it initialized a driver whose state does not survive a fork"
    return ""


def _threads_after_settling(limit=0.25):
    """Threads besides this one, given a moment to end: the simulated driver calls its hook from a
    short-lived helper thread when the caller released the GIL (ctypes does)."""
    deadline = z._clock() + limit
    while True:
        threads = z._extra_threads()
        if not threads or z._clock() >= deadline:
            return threads
        time.sleep(0.005)


def _continue_below(probe):
    """The scan's ``after_import`` in a row child above modules: fork the continuing zygote."""

    def after_import(ok):
        below = _Continuation.below
        if below is None or _Continuation.channel is None or _may_continue(ok):
            return
        index = below[0]
        files = (probe["_channel"].fd, 1, 2)
        z._serving._flush_stdio()
        sizes = [_size(fd) for fd in files]
        initialized = protocol.driver_initialized(z._cuprobe.driver_state())  # the zygote must not ask: not handed over
        try:
            pid = z._cuprobe.fork_continuing()
        except OSError:
            return
        if pid:
            z._write_own(index, "continued", str(pid))
            _Continuation.channel.release()  # the zygote's to write now
            return
        _run_continuing_zygote(probe, below, sizes, initialized)

    return after_import


def _size(fd):
    try:
        return posix.fstat(fd).st_size
    except OSError:
        return 0


def _run_continuing_zygote(probe, below, sizes, initialized):
    """In the continuing zygote: wait to be continued, then serve the modules below; never returns."""
    index, modules, inside = below
    try:
        posix.setpgid(0, 0)  # the row's group is the host's to kill, not this one
    except OSError:
        pass
    null = posix.open("/dev/null", posix.O_WRONLY)
    posix.dup2(null, 1)
    posix.dup2(null, 2)
    posix.close(null)
    posix.kill(posix.getpid(), _SIGSTOP)
    loaded = len(sys.modules) - _Continuation.loaded
    z._channel = _Continuation.channel
    z._channel.adopt()
    z._cuprobe.become_subreaper()
    z._channel.emit(
        "descend", i=index, pid=posix.getpid(), z=z._zygote_index, before_cuda=False, continued=True, cuda=initialized
    )
    z._channel.emit("descended", i=index, s=z._clock() - _Continuation.started, n=loaded)
    z._zygote_index = index
    _Continuation.prefix = (index, sizes)
    try:
        child = z._serving._serve(modules, inside)
    except BaseException:
        posix._exit(_NOT_SERVED)
    if child is not None:
        z._run_child(probe, *child)
    posix._exit(0)


def _continued_zygote(index):
    """Continue the zygote the row child of ``index`` left stopped; its pid, or None when there is none."""
    text = "".join(z._lines_of(z._own_path(index, "continued")))
    if not text.isdigit():
        return None
    pid = int(text)
    try:
        _, status = posix.waitpid(pid, posix.WUNTRACED)
    except ChildProcessError:
        return None  # not ours: never orphaned to this zygote
    if not posix.WIFSTOPPED(status):
        return None
    posix.kill(pid, _SIGCONT)
    return pid


def _recorded(index, kind, size, skip_first_line=False):
    """The first ``size`` bytes the row child of ``index`` wrote to its file ``kind``."""
    try:
        with open(z._own_path(index, kind), "rb") as handle:
            data = handle.read(size)
    except OSError:
        return b""
    if skip_first_line:
        data = data[data.find(b"\n") + 1 :]
    return data


def _package_zygote(index, modules, inside, before_cuda=None):
    """In the package zygote: import the package (or only ``before_cuda``), check, then serve ``inside``.

    Returns ``(index, module)`` in a child; the package zygote itself exits.
    """
    module = modules[index]
    z._channel = protocol.Channel(int(z._ENV[protocol.CHANNEL_FD]))  # the parent's channel is quiet in a fork
    z._channel.emit(
        "descend",
        i=index,
        pid=posix.getpid(),
        z=z._zygote_index,
        before_cuda=before_cuda is not None,
        continued=False,
        cuda=False,
    )
    z._zygote_index = index
    before = set(sys.modules)
    started = z._clock()
    problem = _import_checked([module] if before_cuda is None else before_cuda, before_cuda=before_cuda is not None)
    if problem:
        z._channel.emit("descent-refused", i=index, reason=problem)
        z._serving._flush_stdio()
        posix._exit(_NOT_SERVED)
    loaded = z._inside(z._ENV.get(protocol.SWEEP_PACKAGE, ""), [name for name in sys.modules if name not in before])
    z._write_own(index, "package", protocol.encode(loaded))
    z._channel.emit("descended", i=index, s=z._clock() - started, n=len(sys.modules) - len(before))
    __import__("gc").freeze()
    child = z._serving._serve(modules, inside)
    if child is not None:
        return child
    z._serving._flush_stdio()
    posix._exit(0)


def _import_checked(names, before_cuda):
    """Import ``names`` in order, checking after each; why the zygote must not fork now, or ``""``.

    With ``before_cuda`` (what a package's row child imported before its
    import initialized CUDA), a module whose parent package is not loaded is
    skipped (importing it would run that package, the one being avoided),
    and so is one whose import fails here: its children import it themselves.
    """
    for name in names:
        if name in sys.modules:
            continue
        if before_cuda and "." in name and name.rpartition(".")[0] not in sys.modules:
            continue
        try:
            __import__(name)
        except BaseException as exc:
            if not before_cuda:
                return f"importing {name} failed: {protocol.describe(exc)}"
        problem = z._problem_after(f"importing {name}")
        if problem:
            return problem
    return ""
