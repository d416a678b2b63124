"""The code that runs inside the subkernel: an import tracer with a CUDA eye.

This file is never imported by diagtools; the runner executes it as the main
program of ``python -S``, before ``site`` runs, so that start-up hooks are
traced too.  It uses only modules that a bare interpreter has already loaded
(no ``os``, ``json``, ``threading``, ``ctypes``), so it cannot change the
import tree it measures, and it never touches a target module's attributes.

It streams one JSON object per line to a private pipe (never stdout): a
target that crashes, hangs or exits still leaves everything recorded so far.
"""

import _frozen_importlib as _bootstrap
import _thread
import posix
import sys
import time

import _diagtools_protocol as protocol  # registered by the runner's bootstrap; no import system involved

_ENV = protocol.environ()
_MAIN_THREAD = _thread.get_ident()
_PROBE_FILE = _ENV.get(protocol.PROGRAM_FILE, "")
_clock = time.perf_counter
_encode = protocol.encode
_encode_str = protocol.encode_str
_channel = protocol.channel_from(_ENV)
_cuprobe = protocol.load_cuprobe(_ENV)


def _driver_initialized():
    return protocol.driver_initialized(_cuprobe.driver_state())


# ---- what is executing, on which thread -------------------------------------


class _State:
    phase = "startup"
    hook_fired = False
    transition_seen = False
    refined = False
    refine = _ENV.get(protocol.SCAN_REFINE, "")
    stacks = {}  # thread id -> names of the modules it is importing, outermost first
    origins = {}  # thread id -> the module whose code started that thread
    alive = {}  # thread id -> {"name", "by", "stack"} of threads started by traced code, while they run
    imported = set()  # modules imported after start-up: candidates for blame at shutdown
    begun = []  # modules the main thread began importing, in order (a package before its modules)
    completed = set()  # those of them whose import finished without an exception
    chain = None  # when the main thread's import initialized the driver: the modules it was importing
    begun_before = 0  # how many imports the main thread had begun by then


def _innermost(tid):
    stack = _State.stacks.get(tid)
    if stack:
        return stack[-1]
    return _State.origins.get(tid)


def _phase_of(tid):
    return _State.phase if tid == _MAIN_THREAD else "thread"


def _frames(frame):
    """The Python stack from ``frame`` outwards, innermost first."""
    out = []
    while frame is not None:
        code = frame.f_code
        out.append([code.co_filename, frame.f_lineno or 0, code.co_name])
        frame = frame.f_back
    return out


def _note_transition(tid, module, event, phase=None):
    """The driver answered "initialized" for the first time at this event."""
    if _State.transition_seen:
        return
    _State.transition_seen = True
    _note_chain(tid, module)
    started = _State.alive.get(tid)
    _channel.emit(
        "transition",
        m=module,
        th=tid,
        ph=phase or _phase_of(tid),
        at=event,
        origin=_State.origins.get(tid),
        name=started["name"] if started else None,
        started=started["stack"] if started else None,
    )


def _note_chain(tid, module):
    """Remember which modules the main thread was importing when the driver got initialized."""
    if _State.chain is None and tid == _MAIN_THREAD and _State.phase == "import":
        _State.chain = set(_State.stacks.get(tid, ())) | {module}
        _State.begun_before = len(_State.begun)


def _check_state(tid, module, event, phase=None):
    if not _State.transition_seen and _driver_initialized():
        _note_transition(tid, module, event, phase)


# ---- the import tracer -------------------------------------------------------

_original_load = _bootstrap._load_unlocked
_IMPORT_MACHINERY = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")
_IMPORTLIB_INIT = "/importlib/__init__.py"


def _import_line(frame):
    """``[file, line, function]`` of the statement that started this import, as JSON text, or ``null``.

    The innermost frame outside the import system (and ``importlib.import_module``):
    the ``import`` line of the importing module, or the call that imported by name.
    """
    while frame is not None:
        code = frame.f_code
        file = code.co_filename
        if file not in _IMPORT_MACHINERY and not file.endswith(_IMPORTLIB_INIT):
            return f"[{_encode_str(file)},{frame.f_lineno or 0},{_encode_str(code.co_name)}]"
        frame = frame.f_back
    return "null"


def _traced_load(spec):
    if _REWRITTEN and spec.origin in _REWRITTEN:
        spec.loader = _Rewritten(spec.loader, spec.origin, _REWRITTEN[spec.origin])
        _channel.emit("rewritten", n=spec.name, f=spec.origin)
    tid = _thread.get_ident()
    stack = _State.stacks.setdefault(tid, [])
    name = spec.name
    parent = stack[-1] if stack else _State.origins.get(tid)
    _check_state(tid, parent, "begin")
    origin = spec.origin if spec.has_location else None
    # The hot path: one hand-built line per event instead of a dict walk.
    _channel.send(
        f'{{"e":"begin","n":{_encode_str(name)},"p":{_encode(parent)},"f":{_encode(origin)},'
        f'"l":{_import_line(sys._getframe(1))},"th":{tid},"ph":"{_phase_of(tid)}","t":{_clock()!r}}}'
    )
    stack.append(name)
    if tid == _MAIN_THREAD:
        _State.begun.append(name)
    if _State.phase != "startup":
        _State.imported.add(name)
    tracer = _start_refine(name)
    ok = False
    try:
        module = _original_load(spec)
        ok = True
        return module
    finally:
        if tracer is not None:
            sys.settrace(None)
        stack.pop()
        _check_state(tid, name, "end")
        if ok and tid == _MAIN_THREAD:
            _State.completed.add(name)
        _channel.send(f'{{"e":"end","n":{_encode_str(name)},"ok":{_encode(ok)},"t":{_clock()!r}}}')


# ---- a cut being verified: modules whose source text the request replaced ------


def _rewritten_sources():
    """``{original file: rewritten source bytes}`` from the request (empty for an ordinary scan)."""
    entries = _ENV.get(protocol.SCAN_SOURCES, "").split("\n")
    sources = {}
    for original, replacement in zip(entries[0::2], entries[1::2], strict=False):
        if original and replacement:
            with open(replacement, "rb") as handle:
                sources[original] = handle.read()
    return sources


class _Rewritten:
    """A module's own loader, except that its code comes from the rewritten text, compiled under the
    original file name (no bytecode cache is read or written)."""

    def __init__(self, loader, origin, source):
        self._loader = loader
        self._origin = origin
        self._source = source

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        exec(compile(self._source, self._origin, "exec", dont_inherit=True), module.__dict__)

    def get_source(self, fullname):
        return self._source.decode("utf-8", "replace")

    def is_package(self, fullname):
        return self._loader.is_package(fullname)

    def __getattr__(self, name):
        return getattr(self._loader, name)


_REWRITTEN = _rewritten_sources()


# ---- refinement: a line-traced rerun inside the culprit's window -------------


class _LineTracer:
    """Finds the line whose execution flipped the driver to initialized."""

    def __init__(self, module, phase):
        self.module = module
        self.phase = phase
        self.previous = None

    def __call__(self, frame, event, arg):
        if _State.refined or self._flipped():
            return None
        # After a return, execution goes on in the caller, mid-way through its line.
        here = frame.f_back if event == "return" and frame.f_back is not None else frame
        self.previous = here
        self.previous_line = here.f_lineno
        return self

    def _flipped(self):
        if self.previous is None or not _driver_initialized():
            return False
        if _State.refined:
            return True
        _State.refined = True
        stack = _frames(self.previous)
        stack[0][1] = self.previous_line
        tid = _thread.get_ident()
        started = _State.alive.get(tid)
        _channel.emit(
            "refined",
            m=self.module,
            stack=stack,
            th=tid,
            ph=self.phase,
            origin=_State.origins.get(tid),
            name=started["name"] if started else None,
            started=started["stack"] if started else None,
        )
        sys.settrace(None)
        _State.refine = ""
        return True


def _start_refine(name):
    if _State.refine != name or _driver_initialized():
        return None
    tracer = _LineTracer(name, _State.phase)
    sys.settrace(tracer)
    return tracer


def _refine_thread(starter):
    """Line-trace a thread started by the module being refined: its own line may be the one."""
    if _State.refine and _State.refine == starter and not _driver_initialized():
        sys.settrace(_LineTracer(starter, "thread"))


# ---- the driver hook and threads --------------------------------------------


def _on_cuinit(thread=None):
    """Called by the driver during the first cuInit, with the calling thread's id."""
    if _State.hook_fired:
        return
    _State.hook_fired = True
    caller, tid = protocol.calling_frame(thread, 1)
    module = _innermost(tid)
    _note_chain(tid, module)
    running = _module_code_running(caller)
    if running is not None and running not in _State.stacks.get(tid, ()):
        # Top-level code of a module the tracer never saw being imported (LazyLoader,
        # a manual exec_module, runpy) is running: that module is the culprit.
        module = running
    if module is None:
        # No import is running (an atexit handler, a finalizer): blame the module that defined the code.
        module = _defining_module(caller)
    started = _State.alive.get(tid)
    _channel.emit(
        "cuinit",
        m=module,
        importer=_innermost(tid),
        stack=_frames(caller),
        th=tid,
        ph=_phase_of(tid),
        origin=_State.origins.get(tid),
        name=started["name"] if started else None,
        started=started["stack"] if started else None,
        inferred=protocol.init_inferred(_cuprobe),
    )


def _defining_module(frame):
    """The innermost frame's module among those the target imported, or None.

    Standard-library modules are passed over: they never initialize CUDA of their own accord (a
    ``weakref.finalize`` or ``atexit`` only calls what a module gave it), and whether the target
    imported one first depends on what the interpreter loaded at start-up, so blaming it would make
    the verdict depend on the environment (a fresh subkernel and a sweep's zygote child disagreed).
    """
    stdlib = sys.stdlib_module_names
    while frame is not None:
        name = frame.f_globals.get("__name__")
        if isinstance(name, str) and name in _State.imported and name.partition(".")[0] not in stdlib:
            return name
        frame = frame.f_back
    return None


def _module_code_running(frame):
    """``__name__`` of the innermost frame that runs a module's top-level code, or None."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "<module>" and code.co_filename not in (_PROBE_FILE, "<string>"):
            name = frame.f_globals.get("__name__")
            return name if isinstance(name, str) else None
        frame = frame.f_back
    return None


def _traced_thread(function, caller):
    """Wrap a thread's function: remember who started it, from where, and while it is alive."""
    starter = _innermost(_thread.get_ident())
    record = {"name": protocol.thread_name(function), "by": starter, "stack": _frames(caller)}
    _channel.emit("thread", by=starter, name=record["name"], stack=record["stack"])

    def run(*call_args, **call_kwargs):
        tid = _thread.get_ident()
        _State.origins[tid] = starter
        _State.alive[tid] = record
        _refine_thread(starter)
        try:
            return function(*call_args, **call_kwargs)
        finally:
            # Without the driver hook, the thread itself is the first to see what it did.
            _check_state(tid, starter, "thread-end", "thread")
            _State.alive.pop(tid, None)

    return run


_original_start_new_thread = _thread.start_new_thread


def _traced_start_new_thread(function, args, kwargs=None):
    return _original_start_new_thread(_traced_thread(function, sys._getframe(1)), args, kwargs or {})


def _install():
    sys._diagtools_on_cuinit = _on_cuinit
    _bootstrap._load_unlocked = _traced_load
    _thread.start_new_thread = _traced_start_new_thread
    if hasattr(_thread, "start_joinable_thread"):
        _install_joinable()
    _install_in_loaded_threading()


def _install_joinable():
    original = _thread.start_joinable_thread

    def start_joinable_thread(function, *args, **kwargs):
        return original(_traced_thread(function, sys._getframe(1)), *args, **kwargs)

    _thread.start_joinable_thread = start_joinable_thread


def _install_in_loaded_threading():
    """``threading`` copies the start functions when it loads; one loaded before the probe (the sweep
    zygote preloads it with torch) still holds the untraced ones, so it gets the traced ones too."""
    threading = sys.modules.get("threading")
    if threading is None:
        return
    names = {"_start_new_thread": "start_new_thread", "_start_joinable_thread": "start_joinable_thread"}
    for copy, name in names.items():
        if copy in vars(threading) and hasattr(_thread, name):
            setattr(threading, copy, getattr(_thread, name))


# ---- errors ------------------------------------------------------------------


def _traceback_frames(exc):
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append([code.co_filename, tb.tb_lineno, code.co_name])
        tb = tb.tb_next
    return frames


def _report_error(target, exc):
    frames = _traceback_frames(exc)
    file = getattr(exc, "filename", None) if isinstance(exc, SyntaxError) else None
    line = getattr(exc, "lineno", None) if isinstance(exc, SyntaxError) else None
    _channel.emit(
        "error", target=target, type=type(exc).__qualname__, msg=protocol.describe(exc), tb=frames, file=file, line=line
    )


# ---- the run -----------------------------------------------------------------


def _run_startup():
    if _ENV.get(protocol.SCAN_NO_SITE) == "1":
        return
    __import__("site").main()


def _import_targets(targets, extra_path):
    """Import each target in turn; whether every import succeeded."""
    _State.phase = "import"
    _channel.emit("phase", phase="import")
    sys.path[0:0] = extra_path
    return _import_each(targets)


def _import_each(targets):
    ok = True
    for target in targets:
        try:
            __import__(target)
        except SystemExit as exc:
            code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
            _channel.emit("exit", target=target, code=code)
            protocol.exit_if_channel_lost(_channel)
            raise
        except BaseException as exc:
            ok = False
            _report_error(target, exc)
    return ok


def _settle(seconds):
    """Wait, up to ``seconds``, for the threads the target started; watch the driver meanwhile."""
    deadline = _clock() + seconds
    while _State.alive and _clock() < deadline:
        time.sleep(0.01)
        _check_alive_threads()
    _check_alive_threads()
    alive = [dict(record, th=tid) for tid, record in list(_State.alive.items())]
    _channel.emit("threads", alive=alive)


def _check_alive_threads():
    """Without the driver hook: a flip while only target threads run is theirs (the latest started)."""
    if _State.transition_seen or not _driver_initialized():
        return
    running = list(_State.alive.items())
    if running:
        tid, record = running[-1]
        _note_transition(tid, record["by"], "settle", "thread")


def _watch_shutdown():
    """Run last at exit (registered first): catch a cuInit from atexit handlers and finalizers."""
    already_loaded = "atexit" in sys.modules
    import atexit

    atexit.register(_at_exit)
    if not already_loaded:
        del sys.modules["atexit"]


def _at_exit():
    _State.phase = "shutdown"
    _check_state(_MAIN_THREAD, None, "exit", "shutdown")
    _channel.emit("shutdown", initialized=_driver_initialized())


def _hello(startup=True, **extra):
    state = _cuprobe.driver_state()
    _channel.emit(
        "hello",
        pid=posix.getpid(),
        python=sys.version,
        main_thread=_MAIN_THREAD,
        library=_cuprobe.driver_path(),
        initialized=protocol.driver_initialized(state),
        state=state,
        **extra,
    )
    if startup:
        _channel.emit("phase", phase="startup")


def _scan(targets, extra_path, after_import=None):
    """Import the targets, watch the threads they started, and report the driver's final state.

    ``after_import(ok)``, when given, runs right after the imports (``ok``: all succeeded),
    before anything else is checked or reported.
    """
    ok = _import_targets(targets, extra_path)
    if after_import is not None:
        after_import(ok)
    _finish_scan()


def _finish_scan():
    _check_state(_MAIN_THREAD, None, "import-end")
    _settle(float(_ENV.get(protocol.SCAN_SETTLE, "0") or 0))
    _State.phase = "shutdown"
    _channel.emit(
        "final",
        initialized=_driver_initialized(),
        torch=protocol.torch_cuda_initialized(),
        refusals=protocol.simulation_refusals(_cuprobe),
        foreign=protocol.foreign_cuda_libraries(_ENV),
    )
    _channel.emit("done")


def main():
    protocol.guard_agent(_ENV, _cuprobe)
    _watch_shutdown()
    _install()
    _hello()
    _run_startup()
    _check_state(_MAIN_THREAD, None, "startup-end")
    targets = [t for t in _ENV.get(protocol.SCAN_TARGETS, "").split("\n") if t]
    extra_path = [p for p in _ENV.get(protocol.SCAN_PATH, "").split("\n") if p]
    _scan(targets, extra_path)
    protocol.exit_if_channel_lost(_channel)


# ---- a forked start: the sweep zygote's children ------------------------------


def imported_before_cuda():
    """When an import initialized the driver: the modules whose import began and finished before
    that, in the order they began (a package before its modules); else ``[]``.

    The sweep zygote preloads them (each checked CUDA-free) for the modules
    below a package that initializes CUDA, so each of those children runs
    only the initializing chain and what came after it.  What came after is
    not preloaded: it ran with the driver already initialized, so whether it
    would initialize it is unknown.
    """
    if _State.chain is None:
        return []
    done, chain = _State.completed, _State.chain
    return [name for name in _State.begun[: _State.begun_before] if name in done and name not in chain]


def run_forked(channel, targets, after_import=None, exit_handlers=(), preloaded_blame=()):
    """Scan ``targets`` in a child forked from the sweep zygote, reporting on ``channel``.

    The zygote ran start-up and preloaded its modules without this tracer; the
    child installs the same tracer and driver hook as :func:`main` and imports
    the targets, so the events read exactly as a fresh subkernel's would.
    ``after_import`` is :func:`_scan`'s.  ``exit_handlers`` (function, args, kwargs, module) are the
    preloaded modules' ``atexit`` handlers, registered again after the exit check so that they run
    before it, as in a fresh subkernel; a cuInit at exit in code of ``preloaded_blame``'s modules is
    blamed on them, as it would be on the modules a fresh subkernel imported.
    """
    global _channel, _MAIN_THREAD
    _channel, _MAIN_THREAD = channel, _thread.get_ident()
    _watch_shutdown()
    if exit_handlers:
        register = sys.modules["atexit"].register
        for function, args, kwargs, _module in exit_handlers:
            register(function, *args, **kwargs)
    _State.imported.update(preloaded_blame)
    _install()
    _hello(forked=True)
    _check_state(_MAIN_THREAD, None, "startup-end")
    _scan(targets, [], after_import)


def continue_forked(channel, target, recorded, after_import=None):
    """Go on scanning in a child forked, tracer and all, right after another scan's import.

    That scan imported the package ``target`` lies in; a fresh subkernel
    importing ``target`` would have done exactly that first.  So this child
    reports its own ``hello``, then the events that scan recorded after its
    own (``recorded``: encoded lines), then imports ``target`` from the same
    place and finishes as any scan does: its events read as a fresh
    subkernel's.  ``after_import`` is :func:`_scan`'s.
    """
    global _channel, _MAIN_THREAD
    _channel, _MAIN_THREAD = channel, _thread.get_ident()
    _hello(startup=False, forked=True)
    channel.send_raw(recorded)
    ok = _import_each([target])
    if after_import is not None:
        after_import(ok)
    _finish_scan()


if __name__ == "__main__":  # run by the runner; the sweep zygote loads this file as a library
    main()
