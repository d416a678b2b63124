"""Inside one watched Python process: the first cuInit and every process start.

Loaded once per process under the module name ``_diagtools_run_agent``, by the
``sitecustomize`` beside it (``diagtools run``) or by the pytest plugin
(``--cuda-watch``).  It uses the standard library only, and only modules a
started interpreter already has (plus the small C module ``_posixsubprocess``),
so it does not change what the program imports.  It never reads attributes of
the program's modules: whatever it learns comes from stack frames.

Each process appends to its own JSON Lines file in the directory named by
``DIAGTOOLS_RUN_DIR``, one ``os.write`` per event and no buffering, so a crash
loses nothing already written.  Events (``e``):

* ``hello``: the process (pid, parent, argv, ``via`` exec or fork);
* ``cuinit``: the first ``cuInit`` in this process, with its stack;
* ``start``: a fork, a forkserver fork, a spawn or a subprocess, with its stack
  and whether the driver was initialized in this process at that moment;
* ``refused``: in a forked child, a driver call the driver refused;
* ``exec``, ``exception``, ``exit``: how a forked child ended.
"""

import _thread
import os
import sys
import time

import _diagtools_protocol as protocol  # registered by sitecustomize.py beside this file

DIR_ENV = "DIAGTOOLS_RUN_DIR"
CUPROBE_ENV = "DIAGTOOLS_RUN_CUPROBE"
CUPROBE_FOR_ENV = "DIAGTOOLS_RUN_CUPROBE_FOR"
NOT_INITIALIZED = 3
_MAX_FRAMES = 120
_MAX_REFUSALS = 3
# simcuda.c's bit for a cuInit made on a real runtime's behalf at its export-table request, and
# how such a cuInit is reported (the same words as diagtools.usecases.assemble.INFERRED_EVIDENCE)
_INIT_INFERRED = 4
_INFERRED_EVIDENCE = "driver-hook, inferred from the CUDA runtime's export-table request (no cuInit call was seen)"
_HERE = os.path.dirname(os.path.abspath(__file__))
_HIDDEN = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")
_STDLIB = os.path.dirname(os.path.abspath(os.__file__))


_encode = protocol.encode
_encode_str = protocol.encode_str


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


def _is_user_file(filename):
    return not filename.startswith(_STDLIB) and not filename.startswith("<frozen")


def _attribution(frames):
    """Who was running: the innermost module body on the stack, its chain and its own line."""
    bodies = [f for f in frames if f.f_code.co_name == "<module>"]
    chain = []
    for body in reversed(bodies):
        name = _module_name(body)
        if name is not None and (not chain or chain[-1] != name):
            chain.append(name)
    anchor = bodies[0] if bodies else next((f for f in frames if _is_user_file(f.f_code.co_filename)), None)
    if anchor is None:
        anchor = frames[0] if frames else None
    if anchor is None:
        return None, chain, None
    own_file = anchor.f_code.co_filename
    module_site = next(f for f in frames if f.f_code.co_filename == own_file)
    return _module_name(anchor), chain, _row(module_site)


def _start_kind(frames, default):
    """``spawn`` or ``forkserver`` when multiprocessing's own code makes the start."""
    files = [frame.f_code.co_filename.replace(os.sep, "/") for frame in frames]
    ours = [name for name in files if "/multiprocessing/" in name]
    if any(name.endswith(("/forkserver.py", "/popen_forkserver.py")) for name in ours):
        return "forkserver"
    if ours and default == "subprocess":
        return "spawn"
    return default


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


def _thread_name(tid, main_thread):
    if tid == main_thread:
        return "MainThread"
    threading = sys.modules.get("threading")
    thread = getattr(threading, "_active", {}).get(tid) if threading is not None else None
    return getattr(thread, "name", None) or f"thread {tid}"


# ---- the agent ---------------------------------------------------------------------


class Agent:
    """The per-process recorder; after a fork the child's copy starts its own file."""

    def __init__(self, directory, cuprobe_path):
        self.directory = directory
        self.cuprobe_path = cuprobe_path
        self.cuprobe = None
        self.pid = os.getpid()
        self.parent = os.getppid()
        self.main_thread = _thread.get_ident()
        self.fd = -1
        self.seq = 0
        self.pending = {}
        self.quiet_threads = set()
        self.cuinit_seen = False
        self.refusals = 0
        self.probing = False
        self.startup = True
        self.context = None
        self.child_watch = False

    # -- the private channel --

    def open(self):
        if not self.directory:
            return
        name = f"{self.pid}-{time.monotonic_ns()}.jsonl"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC
        try:
            self.fd = os.open(os.path.join(self.directory, name), flags, 0o600)
        except OSError:
            self.fd = -1

    def emit(self, event, **fields):
        """Write one event; unbuffered, so a crash loses nothing already sent."""
        if self.fd < 0 or os.getpid() != self.pid:
            return
        fields["e"] = event
        fields["t"] = time.time()
        data = (_encode(fields) + "\n").encode("utf-8", "backslashreplace")
        try:
            while data:
                data = data[os.write(self.fd, data) :]
        except OSError:
            pass

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

    # -- what was running --

    def describe(self, frame):
        tid = _thread.get_ident()
        frames = _visible_frames(frame)
        module, chain, module_site = _attribution(frames)
        return {
            "module": module,
            "chain": chain,
            "site": _row(frames[0]) if frames else None,
            "module_site": module_site,
            "stack": [_row(f) for f in frames],
            "phase": self._phase(tid, chain),
            "thread": _thread_name(tid, self.main_thread),
            "context": self.context,
        }

    def _phase(self, tid, chain):
        if tid != self.main_thread:
            return "thread"
        if self.startup:
            return "startup"
        if sys.is_finalizing():
            return "shutdown"
        return "import" if any(name != "__main__" for name in chain) else "main"

    # -- driver hooks --

    def on_cuinit(self):
        """Called by the driver during the first cuInit of this process, on the calling thread."""
        if self.cuinit_seen:
            return
        self.cuinit_seen = True
        self.emit("cuinit", evidence=self._cuinit_evidence(), **self.describe(sys._getframe(1)))

    def _cuinit_evidence(self):
        """``driver-hook``, or the inferred form when the simulated driver inferred this cuInit (simcuda.c)."""
        module = self._cuprobe()
        found = module.simulation_refusals() if module is not None else None
        if found and found[0] & _INIT_INFERRED:
            return _INFERRED_EVIDENCE
        return "driver-hook"

    def on_refused(self, call):
        """Called by the simulated driver when it refuses a call in a poisoned child."""
        if self.probing or self.refusals >= _MAX_REFUSALS:
            return
        self.refusals += 1
        frames = _visible_frames(sys._getframe(1))
        self.emit("refused", call=str(call), code=NOT_INITIALIZED, stack=[_row(f) for f in frames])

    def check_state(self, phase="startup"):
        """Record an initialization that happened where no hook could see it."""
        if not self.cuinit_seen and self.driver_state() == 0:
            self.cuinit_seen = True
            self.emit(
                "cuinit",
                evidence="state-probe",
                module=None,
                chain=[],
                site=None,
                module_site=None,
                stack=[],
                phase=phase,
                thread="MainThread",
                context=self.context,
            )

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
            context=self.context,
        )

    def after_fork_parent(self):
        self.pending.pop(_thread.get_ident(), None)

    def after_fork_child(self):
        tid = _thread.get_ident()
        if tid in self.quiet_threads:  # a subprocess about to exec: not a fork of the program
            self.fd = -1
            return
        seq, parent_initialized = self.pending.pop(tid, (None, False))
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.parent, self.pid, self.main_thread = self.pid, os.getpid(), tid
        self.seq, self.pending, self.quiet_threads = 0, {}, set()
        self.cuinit_seen, self.refusals = False, 0
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

    def startup_done(self):
        self.startup = False


_AGENT = None


def _watch_child(agent):
    """In a forked child: record an exec, an uncaught exception and the exit code."""
    if agent.child_watch:
        return
    agent.child_watch = True
    real_exit = os._exit

    def _exit(code):
        _AGENT.emit("exit", code=code)
        real_exit(code)

    os._exit = _exit
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
        _AGENT.emit("exception", type=kind.__qualname__, message=text)
        previous_hook(kind, value, tb)

    sys.excepthook = excepthook
    import atexit  # a builtin module: nothing new is imported

    atexit.register(lambda: _AGENT.emit("exit", code=None))


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


def install(directory, cuprobe_path=None):
    """Start recording in this process (once; a second call returns the same agent)."""
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
    agent.check_state("startup")
    return agent


def install_from_environment():
    """``install`` with the settings ``diagtools run`` put in the environment."""
    cuprobe = os.environ.get(CUPROBE_ENV) if os.environ.get(CUPROBE_FOR_ENV) == sys.version else None
    return install(os.environ.get(DIR_ENV) or None, cuprobe)
