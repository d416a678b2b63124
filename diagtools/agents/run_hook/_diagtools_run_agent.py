"""Inside one watched Python process: the first cuInit and every process start.

Loaded once per process under the module name ``_diagtools_run_agent``, by the
``sitecustomize`` beside it (``diagtools run``) or by the pytest plugin
(``--cuda-watch``).  It uses the standard library only, and only modules a
started interpreter already has (plus the small C module ``_posixsubprocess``),
so it does not change what the program imports.  It never reads attributes of
the program's modules: whatever it learns comes from stack frames.

It speaks the protocol of :mod:`diagtools.protocol` (registered as
``_diagtools_protocol``): its settings are the ``RUN_*`` names there, each
process writes its own record file in the ``RUN_DIR`` directory through a
:class:`Channel` (a descriptor far above the program's, checked before every
write, reopened rather than ever written to once the program reuses its
number), and its events are the protocol's: ``hello``; ``cuinit`` or
``transition`` for the first cuInit (with ``chain``, the module bodies
running, so the host attributes it by the scan's rule); ``start`` and
``fork-child`` for process starts; in a forked child ``refusal``, ``raised``,
``exec`` and ``ended``; ``waited`` for a child's exit status seen by its parent.
"""

import _thread
import os
import sys
import time

import _diagtools_protocol as protocol  # registered by sitecustomize.py beside this file

_MAX_FRAMES = 120
_MAX_REFUSALS = 3
_HERE = os.path.dirname(os.path.abspath(__file__))
_HIDDEN = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")
_MP_FORKSERVER = ("/multiprocessing/forkserver.py",)
_MP_SPAWN = ("/multiprocessing/popen_spawn_posix.py", "/multiprocessing/spawn.py")
_MP_HELPERS = ("/multiprocessing/resource_tracker.py", "/multiprocessing/forkserver.py")


# ---- stacks ----------------------------------------------------------------------


def _hidden(filename):
    return filename in _HIDDEN or filename.startswith(_HERE)


def _visible_frames(frame):
    """Frames from ``frame`` outwards, innermost first, without importlib's and the agent's."""
    frames = []
    while frame is not None and len(frames) < _MAX_FRAMES:
        if not _hidden(frame.f_code.co_filename):
            frames.append(frame)
        frame = frame.f_back
    return frames


def _row(frame):
    code = frame.f_code
    return [code.co_filename, frame.f_lineno or 0, code.co_name]


def _module_name(frame):
    name = frame.f_globals.get("__name__")
    return name if isinstance(name, str) else None


def _has_source(filename):
    return not filename.startswith("<")


def _chain(frames):
    """The module bodies running, outermost first, as ``[name, file]``; and the culprit module.

    The culprit is the innermost module body with a source file.  When only a
    ``-c`` program's body runs (the forkserver's ``<string>``, ``python -c``),
    it is the module of the innermost frame in the user's own files, which
    then closes the chain.
    """
    chain = []
    for frame in reversed(frames):
        if frame.f_code.co_name == "<module>":
            name = _module_name(frame)
            if name is not None and (not chain or chain[-1][0] != name):
                chain.append([name, frame.f_code.co_filename])
    sourced = [entry for entry in chain if _has_source(entry[1])]
    if sourced:
        return chain, sourced[-1][0]
    user = next((frame for frame in frames if protocol.file_kind(frame.f_code.co_filename) == "user"), None)
    if user is None:
        return chain, chain[-1][0] if chain else None
    name = _module_name(user)
    return [*chain, [name, user.f_code.co_filename]], name


def _start_kind(frames, default):
    """What a start is: a ``fork``, a ``forkserver`` fork, a multiprocessing ``spawn``, or a ``subprocess``.

    Only forks copy the process; ``default`` says which mechanism made it
    (``fork`` from the at-fork handlers, ``subprocess`` from fork-and-exec).
    """
    files = [frame.f_code.co_filename.replace(os.sep, "/") for frame in frames]
    if default == "fork":
        return "forkserver" if any(name.endswith(_MP_FORKSERVER) for name in files) else "fork"
    if any(name.endswith(_MP_HELPERS) for name in files):  # the resource tracker, the forkserver itself
        return "subprocess"
    return "spawn" if any(name.endswith(_MP_SPAWN) for name in files) else "subprocess"


def _argv_text(argv):
    try:
        return [os.fsdecode(item) for item in argv]
    except TypeError:
        return None


def _own_argv():
    try:
        fd = os.open("/proc/self/cmdline", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return list(getattr(sys, "argv", []))
    try:
        data = b""
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    return [os.fsdecode(part) for part in data.split(b"\0")[:-1]]


# ---- the agent ---------------------------------------------------------------------


class Agent:
    """The per-process recorder; after a fork the child's copy starts its own file."""

    def __init__(self, directory, cuprobe_path):
        self.directory = directory
        self.cuprobe_path = cuprobe_path
        self.cuprobe = None
        self.channel = None
        self.pid = os.getpid()
        self.parent = os.getppid()
        self.main_thread = _thread.get_ident()
        self.seq = 0
        self.pending = {}
        self.quiet_threads = set()
        self.threads = {}  # thread id -> (starter module, its chain, the start stack, the thread's name)
        self.cuinit_seen = False
        self.refusals = 0
        self.probing = False
        self.startup = True
        self.context = None
        self.child_watch = False

    # -- the private record file --

    def open(self):
        """Start this process's record file, at a descriptor far above the program's."""
        if not self.directory:
            return
        path = os.path.join(self.directory, f"{self.pid}-{time.monotonic_ns()}.jsonl")
        try:
            fd = protocol.open_high(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND)
        except OSError:
            return
        self.channel = protocol.Channel(fd, path)

    def emit(self, event, /, **fields):
        """Write one event; unbuffered, so a crash loses nothing already sent."""
        if self.channel is not None and os.getpid() == self.pid:
            self.channel.emit(event, t=time.time(), **fields)

    def hello(self, via, **extra):
        self.emit(
            "hello",
            pid=self.pid,
            parent=self.parent,
            via=via,
            argv=_own_argv(),
            python=sys.version.split()[0],
            executable=sys.executable,
            main_thread=self.main_thread,
            **extra,
        )

    # -- the driver's state --

    def driver_state(self):
        """cuDeviceGetCount's answer from an already-loaded libcuda (3: not initialized), or None."""
        module = self._cuprobe()
        if module is None:
            return None
        self.probing = True
        try:
            return module.loaded_driver_state()
        finally:
            self.probing = False

    def _cuprobe(self):
        if self.cuprobe is None and self.cuprobe_path:
            path, self.cuprobe_path = self.cuprobe_path, None
            try:
                self.cuprobe = protocol.load_extension(protocol.CUPROBE_MODULE, path)
            except Exception:  # a foreign interpreter or a missing build: the hook alone decides
                self.cuprobe = None
        return self.cuprobe

    def initialized(self):
        return self.cuinit_seen or self.driver_state() == 0

    def unaskable(self):
        """A driver is loaded whose state cannot be asked, and it reported no cuInit: initialized or not is unknown."""
        return not self.cuinit_seen and self.driver_state() == protocol.DRIVER_UNASKABLE

    # -- what was running --

    def describe(self, frame, tid=None):
        """The protocol's first-cuInit fields: the module, chain, stack, thread and phase."""
        tid = _thread.get_ident() if tid is None else tid
        frames = _visible_frames(frame)
        chain, module = _chain(frames)
        started = self.threads.get(tid) if tid != self.main_thread else None
        if started is not None:  # a thread: blamed on the module that started it, as in a scan
            module, chain = started[0], started[1]
        return {
            "m": module,
            "chain": chain,
            "stack": [_row(f) for f in frames],
            "th": tid,
            "ph": self._phase(tid, chain),
            "origin": started[0] if started else None,
            "name": started[3] if started else None,
            "started": started[2] if started else None,
            "context": self.context,
        }

    def _phase(self, tid, chain):
        if tid != self.main_thread:
            return "thread"
        if self.startup:
            return "startup"
        if sys.is_finalizing():
            return "shutdown"
        return "import" if any(name not in ("__main__", "__mp_main__") for name, _ in chain) else "main"

    # -- driver hooks --

    def on_cuinit(self, thread=None):
        """Called by the driver during the first cuInit of this process, with the calling thread's id."""
        if self.cuinit_seen:
            return
        self.cuinit_seen = True
        frame, tid = protocol.calling_frame(thread, 1)
        self.emit("cuinit", inferred=protocol.init_inferred(self._cuprobe()), **self.describe(frame, tid))

    def on_refused(self, call, thread=None):
        """Called by the simulated driver when it refuses a call in a poisoned child."""
        if self.probing or self.refusals >= _MAX_REFUSALS:
            return
        self.refusals += 1
        frames = _visible_frames(protocol.calling_frame(thread, 1)[0])
        self.emit("refusal", call=str(call), code=protocol.CUDA_ERROR_NOT_INITIALIZED, stack=[_row(f) for f in frames])

    def check_state(self, phase="startup"):
        """Record an initialization that happened where no hook could see it."""
        if not self.cuinit_seen and self.driver_state() == 0:
            self.cuinit_seen = True
            tid = _thread.get_ident()
            self.emit("transition", m=None, chain=[], th=tid, ph=phase, at="check", context=self.context)

    # -- threads --

    def thread_started(self, function, caller):
        """Wrap a thread's function so that a cuInit in it is blamed on the module that started it."""
        frames = _visible_frames(caller)
        chain, module = _chain(frames)
        started = self.threads.get(_thread.get_ident())
        if started is not None:  # a thread started by a thread: the first starter keeps the blame
            module, chain = started[0], started[1]
        record = (module, chain, [_row(f) for f in frames], protocol.thread_name(function))

        def run(*args, **kwargs):
            tid = _thread.get_ident()
            self.threads[tid] = record
            try:
                return function(*args, **kwargs)
            finally:
                self.threads.pop(tid, None)

        return run

    # -- fork --

    def before_fork(self):
        tid = _thread.get_ident()
        if tid in self.quiet_threads:
            return
        frames = _visible_frames(sys._getframe(1))
        self.seq += 1
        initialized = self.initialized()
        self.pending[tid] = (self.seq, initialized)
        self.emit(
            "start",
            kind=_start_kind(frames, "fork"),
            seq=self.seq,
            child=None,
            argv=None,
            stack=[_row(f) for f in frames],
            driver_initialized=initialized,
            driver_unaskable=not initialized and self.unaskable(),
            context=self.context,
        )

    def after_fork_parent(self):
        self.pending.pop(_thread.get_ident(), None)

    def forked(self, seq, child):
        """In the parent, after ``os.fork``: which pid the numbered fork made."""
        if seq is not None and isinstance(child, int) and child > 0:
            self.emit("fork-child", seq=seq, child=child)

    def after_fork_child(self):
        tid = _thread.get_ident()
        if tid in self.quiet_threads:  # a subprocess about to exec: not a fork of the program
            self.channel = None
            return
        seq, parent_initialized = self.pending.pop(tid, (None, False))
        if self.channel is not None:
            self.channel.release()  # the parent's file: closed here only while the number is still ours
            self.channel = None
        self.parent, self.pid, self.main_thread = self.pid, os.getpid(), tid
        self.seq, self.pending, self.quiet_threads = 0, {}, set()
        self.cuinit_seen, self.refusals = False, 0
        self.threads = {}
        self.open()
        self.hello("fork", fork_seq=seq, parent_initialized=parent_initialized)
        _watch_child(self)

    # -- exec'd children --

    def started(self, kind, frames, argv, call):
        """Run ``call`` (which starts a process and returns its pid) and record the start."""
        tid = _thread.get_ident()
        rows = [_row(f) for f in frames]
        initialized = self.initialized()
        self.quiet_threads.add(tid)
        try:
            pid = call()
        finally:
            self.quiet_threads.discard(tid)
        self.emit(
            "start",
            kind=_start_kind(frames, kind),
            seq=None,
            child=pid if isinstance(pid, int) else None,
            argv=_argv_text(argv) if argv is not None else None,
            stack=rows,
            driver_initialized=initialized,
            context=self.context,
        )
        return pid

    def waited(self, pid, status):
        """A child's exit status, as its parent collected it (``-N``: killed by signal N)."""
        if pid > 0 and (os.WIFEXITED(status) or os.WIFSIGNALED(status)):
            self.emit("waited", child=pid, exitcode=os.waitstatus_to_exitcode(status))

    def startup_done(self):
        self.startup = False


_AGENT = None


def _watch_child(agent):
    """In a forked child: record an exec, an uncaught exception and how it ended."""
    if agent.child_watch:
        return
    agent.child_watch = True
    real_exit, real_sys_exit = os._exit, sys.exit

    def _exit(code):
        _AGENT.emit("ended", how="os._exit", exitcode=code if isinstance(code, int) else None)
        real_exit(code)

    def sys_exit(code=None):
        number = 0 if code is None else code if isinstance(code, int) else 1
        _AGENT.emit("ended", how="sys.exit", exitcode=number)
        real_sys_exit(code)

    os._exit, sys.exit = _exit, sys_exit
    for name in ("execv", "execve"):
        original = getattr(os, name)

        def exec_wrapper(path, args, *rest, _original=original):
            _AGENT.emit("exec", argv=_argv_text(args))
            return _original(path, args, *rest)

        setattr(os, name, exec_wrapper)
    previous_hook = sys.excepthook

    def excepthook(kind, value, tb):
        try:
            text = str(value)
        except Exception:
            text = "<unprintable>"
        _AGENT.emit("raised", type=kind.__qualname__, msg=text)
        _AGENT.emit("ended", how="exception", exitcode=1)
        previous_hook(kind, value, tb)

    sys.excepthook = excepthook
    import atexit  # a builtin module: nothing new is imported

    atexit.register(lambda: _AGENT.emit("ended", how="exit", exitcode=None))


def _hook_process_starts():
    import _posixsubprocess  # a small C module; subprocess imports it too

    fork_exec = _posixsubprocess.fork_exec

    def traced_fork_exec(*args, **kwargs):
        frames = _visible_frames(sys._getframe(1))
        return _AGENT.started("subprocess", frames, args[0] if args else None, lambda: fork_exec(*args, **kwargs))

    _posixsubprocess.fork_exec = traced_fork_exec
    for name in ("posix_spawn", "posix_spawnp"):
        original = getattr(os, name, None)
        if original is None:
            continue

        def traced_spawn(path, argv, *args, _original=original, **kwargs):
            frames = _visible_frames(sys._getframe(1))
            return _AGENT.started("subprocess", frames, argv, lambda: _original(path, argv, *args, **kwargs))

        setattr(os, name, traced_spawn)
    _hook_fork_and_wait()


def _hook_fork_and_wait():
    """``os.fork`` tells the parent its child's pid; ``os.waitpid`` and ``os.wait`` its exit status."""
    real_fork, real_waitpid, real_wait = os.fork, os.waitpid, os.wait

    def fork():
        agent = _AGENT
        seq_before = agent.seq
        pid = real_fork()
        if pid and agent.seq != seq_before:
            agent.forked(agent.seq, pid)
        return pid

    def waitpid(pid, options):
        result = real_waitpid(pid, options)
        _AGENT.waited(*result)
        return result

    def wait():
        result = real_wait()
        _AGENT.waited(*result)
        return result

    os.fork, os.waitpid, os.wait = fork, waitpid, wait


def _hook_threads():
    """Every new thread remembers which module started it (``threading`` uses ``_thread`` underneath)."""
    original = _thread.start_new_thread

    def start_new_thread(function, args, kwargs=None):
        return original(_AGENT.thread_started(function, sys._getframe(1)), args, kwargs or {})

    _thread.start_new_thread = start_new_thread
    joinable = getattr(_thread, "start_joinable_thread", None)
    if joinable is not None:

        def start_joinable_thread(function, *args, **kwargs):
            return joinable(_AGENT.thread_started(function, sys._getframe(1)), *args, **kwargs)

        _thread.start_joinable_thread = start_joinable_thread
    threading = sys.modules.get("threading")  # already imported at start-up: it holds the old functions
    if threading is not None:
        if getattr(threading, "_start_new_thread", None) is original:
            threading._start_new_thread = start_new_thread
        if joinable is not None and getattr(threading, "_start_joinable_thread", None) is joinable:
            threading._start_joinable_thread = _thread.start_joinable_thread


def install(directory, cuprobe_path=None, context=None):
    """Start recording in this process (once; a second call returns the same agent).

    ``context`` names what ran before (pytest's start-up): a cuInit already done is attributed to it.
    """
    global _AGENT
    existing = getattr(sys, "_diagtools_run_agent", None)
    if existing is not None:
        return existing
    agent = Agent(directory, cuprobe_path)
    _AGENT = agent
    sys._diagtools_run_agent = agent
    agent.open()
    agent.hello("exec")
    sys._diagtools_on_cuinit = agent.on_cuinit
    sys._diagtools_on_cuda_refused = agent.on_refused
    os.register_at_fork(
        before=agent.before_fork, after_in_parent=agent.after_fork_parent, after_in_child=agent.after_fork_child
    )
    _hook_process_starts()
    _hook_threads()
    agent.context = context
    agent.check_state("startup")
    agent.context = None
    return agent


def install_from_environment():
    """``install`` with the settings ``diagtools run`` put in the environment."""
    env = os.environ
    cuprobe = env.get(protocol.RUN_CUPROBE) if env.get(protocol.RUN_CUPROBE_FOR) == sys.version else None
    return install(env.get(protocol.RUN_DIR) or None, cuprobe)
