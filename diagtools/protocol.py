"""The contract between the runner and the programs it starts: environment, channel, events.

Written once, used by both sides: the names, numbers and event kinds of the
contract, and the agents' side of it (:mod:`diagtools.agents` write events
with :class:`Channel`).  The host reads them back with
:mod:`diagtools.runner.events`, which validates every line against
:data:`EVENTS`.

This module must load inside a bare ``python -S`` subkernel before the import
tracer starts without importing anything: at module level it uses only
``posix``, ``sys``, ``_thread`` and ``time``, which every interpreter has
loaded before running a single line.  The runner hands it to its programs as
the pre-registered module ``_diagtools_protocol`` (see
:mod:`diagtools.runner.subkernel`); the host imports it as ``diagtools.protocol``.
"""

import _thread
import posix
import sys
import time

# ---- the environment the runner sets for its programs ---------------------------

CHANNEL_FD = "DIAGTOOLS_CHANNEL_FD"
DUMP_FD = "DIAGTOOLS_DUMP_FD"
DUMP_SIGNAL = "DIAGTOOLS_DUMP_SIGNAL"
PROGRAM_FILE = "DIAGTOOLS_PROGRAM_FILE"
CUPROBE = "DIAGTOOLS_CUPROBE"
SUBKERNEL_MARKER = "DIAGTOOLS_SUBKERNEL"
DRIVER_KIND = "DIAGTOOLS_DRIVER"
SIMULATED_WORLD = "DIAGTOOLS_SIMULATED_WORLD"  # the simulated libraries' real folder: the only one they may load from
PROTOCOL_MODULE = "_diagtools_protocol"  # the name the agents import this module under
CUPROBE_MODULE = "_diagtools_cuprobe"

# each program's own settings (newline-separated lists)
SCAN_TARGETS = "DIAGTOOLS_PROBE_TARGETS"
SCAN_PATH = "DIAGTOOLS_PROBE_PATH"
SCAN_REFINE = "DIAGTOOLS_PROBE_REFINE"
SCAN_NO_SITE = "DIAGTOOLS_PROBE_NO_SITE"
SCAN_SETTLE = "DIAGTOOLS_PROBE_SETTLE"
# a cut being verified: lines of "original file", "file holding its rewritten text", ...
SCAN_SOURCES = "DIAGTOOLS_PROBE_SOURCES"
RESOLVE_NAMES = "DIAGTOOLS_RESOLVE_NAMES"  # lines of "module name": the names a patch must keep importable
RESOLVE_PATH = "DIAGTOOLS_RESOLVE_PATH"
REPLAY_TARGET = "DIAGTOOLS_REPLAY_TARGET"
REPLAY_PATH = "DIAGTOOLS_REPLAY_PATH"
REPLAY_CHILD = "DIAGTOOLS_REPLAY_CHILD"
REPLAY_START_METHOD = "DIAGTOOLS_REPLAY_START_METHOD"
REPLAY_CHILD_TIMEOUT = "DIAGTOOLS_REPLAY_CHILD_TIMEOUT"
REPLAY_SCRATCH = "DIAGTOOLS_REPLAY_SCRATCH"
BENCH_SIZES = "DIAGTOOLS_BENCH_SIZES"
BENCH_BACKENDS = "DIAGTOOLS_BENCH_BACKENDS"
BENCH_RATIO = "DIAGTOOLS_BENCH_RATIO"
SWEEP_MODULES_FILE = "DIAGTOOLS_SWEEP_MODULES_FILE"
SWEEP_PRELOAD = "DIAGTOOLS_SWEEP_PRELOAD"
SWEEP_PACKAGE = "DIAGTOOLS_SWEEP_PACKAGE"
SWEEP_JOBS = "DIAGTOOLS_SWEEP_JOBS"
SWEEP_WORKDIR = "DIAGTOOLS_SWEEP_WORKDIR"
SWEEP_PROBE = "DIAGTOOLS_SWEEP_PROBE"
SWEEP_FAILED_ALONE = "DIAGTOOLS_SWEEP_FAILED_ALONE"  # modules whose rows so far failed to import
SWEEP_NAMES_IMPORTED = "DIAGTOOLS_SWEEP_NAMES_IMPORTED"  # top-level names the swept sources import by name
SWEEP_WATCHED = "DIAGTOOLS_SWEEP_WATCHED"  # aliases a preload registers, watched in every row (zygote_aliases)
RUN_DIR = "DIAGTOOLS_RUN_DIR"  # diagtools run: where each watched process writes its record file
RUN_STARTS = "starts"  # in RUN_DIR: a line per Python program started, "PID PPID HEX(argv)" (driver/starts.c)
RUN_CUPROBE = "DIAGTOOLS_RUN_CUPROBE"  # the driver-state extension, for the interpreter named next
RUN_CUPROBE_FOR = "DIAGTOOLS_RUN_CUPROBE_FOR"
RUN_AGENT_MODULE = "_diagtools_run_agent"
BISECT_LOG = "DIAGTOOLS_BISECT_LOG"  # diagtools bisect: where each step appends its line
CACHE_DIR = "DIAGTOOLS_CACHE_DIR"  # where compiled libraries are kept (default: the XDG cache)

# ---- the driver's answers --------------------------------------------------------

CUDA_SUCCESS = 0
CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_NAMES = {
    CUDA_SUCCESS: "CUDA_SUCCESS",
    CUDA_ERROR_NOT_INITIALIZED: "CUDA_ERROR_NOT_INITIALIZED",
    100: "CUDA_ERROR_NO_DEVICE",
    801: "CUDA_ERROR_NOT_SUPPORTED",
    999: "CUDA_ERROR_UNKNOWN",
}
# the simulated driver's and NVML's refusal bits (driver/simcuda.c, simnvml.c), as cuprobe.simulation_refusals() reports
SIM_EXPORT_TABLE_REFUSED = 1  # the CUDA runtime asked for an undocumented export table
SIM_UNMODELLED_CALLED = 2  # a function the simulation does not model was called
SIM_INIT_INFERRED = 4  # cuInit made on a real runtime's behalf at its export-table request
SIM_KERNEL_LAUNCH_REFUSED = 1  # the simulated runtime's bit for a refused launch (driver/simcudart.c)
NO_DRIVER = -1
DRIVER_UNASKABLE = -2  # a driver library loads but has no cuDeviceGetCount: its state cannot be asked

# the exit code a program uses when the target closed or replaced its channel: the events are incomplete
CHANNEL_LOST_EXIT = 213
# private descriptors live at or above this number, out of the range programs close or dup2 over
HIGH_FD = 2048
# a record file whose writer lost its descriptor and could not reopen it: what came after is missing
LOST_SUFFIX = ".lost.jsonl"

# ---- the events: kind -> fields every event of that kind carries -----------------
# Every event also has "e" (its kind); most have "t" (perf_counter seconds).

EVENTS = {
    # the scan probe
    "hello": ("pid", "python"),
    "phase": ("phase",),
    "begin": ("n", "t"),
    "end": ("n", "ok", "t"),
    "thread": ("by",),
    "transition": ("m", "th", "ph", "at"),
    "refined": ("m", "stack", "th", "ph"),
    "cuinit": ("m", "stack", "th", "ph"),
    "error": ("target", "type", "msg", "tb"),
    "exit": ("target", "code"),
    "threads": ("alive",),
    "final": ("initialized",),
    "shutdown": ("initialized",),
    "done": (),
    "rewritten": ("n", "f"),  # a module whose source the scan request replaced was executed from that text
    "resolved": ("module", "name", "ok"),  # the name check of a patch
    # the replay parent
    "setup": ("ok",),
    "parent": ("cuda_initialized",),
    "child": ("status",),
    # the kernel benchmark
    "meta": ("device", "timing_meaningful"),
    "row": ("backend", "G", "D"),
    # the sweep zygote (its children write scan-probe events to files of their own)
    "preloaded": ("n", "s"),
    "refused": ("reason", "item"),
    "passed-over": ("n", "reason"),  # a candidate the host chose, not preloaded (the preload goes on)
    "environment-kept": ("n", "names"),  # a candidate preloaded though it sets these (no file a row runs names them)
    "scanned-while-searching": ("n", "rows", "s"),  # rows still due scanned while candidate n's search ran
    "watching": ("n", "names"),  # aliases a candidate ("": the preload given) registered, watched in every row
    "guarding": ("n", "names", "why"),  # modules a candidate loaded that fail alone (why each), guarded by it
    "ready": ("count", "inside"),
    "preloading-inside": ("inside",),  # what of the package is loaded where a candidate's rows are scanned
    "forked": ("i", "pid"),
    "present": ("i",),
    "reaped": ("i", "code"),
    "huge-pages": ("moved", "s"),  # bytes of the zygote's memory moved into huge pages before it forks
    # package zygote below package i (before_cuda: preloads what it imported before CUDA; continued: its row going
    # on after its import; cuda: that import initialized the simulated driver)
    "descend": ("i", "pid", "z", "before_cuda", "continued", "cuda"),
    "descended": ("i", "s", "n"),  # it imported the package: what it loaded is in <i>.package
    "descent-refused": ("i", "reason"),
    "ascended": ("i", "code"),
    # the run agent (diagtools run, pytest --cuda-watch): one record file per process.  Its first
    # cuInit is a "cuinit" (the driver's hook) or a "transition" (the driver's state), as in a scan,
    # with "chain": [[module, file], ...] (the module bodies running, outermost first)
    "start": ("kind", "stack", "driver_initialized"),
    "fork-child": ("seq", "child"),
    "refusal": ("call", "code", "stack"),
    "raised": ("type", "msg"),
    "exec": ("argv",),
    "ended": ("how", "exitcode"),
    "waited": ("child", "exitcode"),
}


# ---- writing (inside the subkernel) ----------------------------------------------


def encode(value):
    """JSON text for builtin values, without the json module (which the probe must not import)."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, (int, float)):
        return _encode_number(value)
    if isinstance(value, str):
        return encode_str(value)
    if isinstance(value, dict):
        return "{" + ",".join(encode_str(str(k)) + ":" + encode(v) for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(encode(item) for item in value) + "]"
    return encode_str(repr(value))


def _encode_number(value):
    if isinstance(value, int):
        return str(int(value))
    return repr(value) if value - value == 0 else "null"  # NaN and infinities have no JSON form


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def encode_str(text):
    """A JSON string literal; the fast path keeps printable text as it is."""
    if text.isprintable() and '"' not in text and "\\" not in text:
        return '"' + text + '"'
    out = []
    for char in text:
        escaped = _ESCAPES.get(char)
        if escaped is None:
            escaped = char if char >= " " and char.isprintable() else _escape_code(ord(char))
        out.append(escaped)
    return '"' + "".join(out) + '"'


def _escape_code(code):
    """``\\uXXXX``; a character beyond the Basic Multilingual Plane as its UTF-16 surrogate pair, as JSON has it."""
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


class Channel:
    """Writes one event per line to a descriptor it owns, unbuffered; goes quiet in forked children.

    A crash loses nothing already sent.  Before every write the descriptor's
    identity (device and inode, taken when the channel was made) is checked,
    so an event never lands in a file the program put on that number after
    closing ours.  A record file (``path`` given) is then reopened; a pipe
    cannot be, and the channel is lost: :meth:`intact` says so, and a scan
    program exits with :data:`CHANNEL_LOST_EXIT`.
    """

    def __init__(self, fd, path=None):
        self.fd = fd
        self.path = path
        self.pid = posix.getpid()
        self.lock = _thread.allocate_lock()
        self.identity = identity(fd)
        self.failed = False
        self.reopened = 0
        posix.register_at_fork(after_in_child=self._after_fork_in_child)

    def intact(self):
        """Whether every event reached the runner: no write failed and the descriptor is still ours."""
        return not self.failed and self.identity is not None and identity(self.fd) == self.identity

    def _after_fork_in_child(self):
        self.lock = _thread.allocate_lock()

    def adopt(self):
        """Write from this forked child: the channel was made for it before the fork."""
        self.pid = posix.getpid()
        self.lock = _thread.allocate_lock()

    def emit(self, kind, /, **fields):
        """Send one event of ``kind``, stamped with the time (an event may have a field named ``kind``)."""
        fields["e"] = kind
        fields.setdefault("t", time.perf_counter())
        self.send(encode(fields))

    def send(self, line):
        """Send one already encoded event."""
        self.send_raw((line + "\n").encode("utf-8", "backslashreplace"))

    def send_raw(self, data):
        """Send bytes that are already whole event lines, each ending in a newline."""
        if posix.getpid() != self.pid or self.failed or not data:
            return
        with self.lock:
            if not self._owned():
                self._lose()
                return
            try:
                while data:
                    data = data[posix.write(self.fd, data) :]
            except OSError:
                self._lose()

    def _lose(self):
        """Stop writing; a record file is renamed ``*.lost.jsonl`` (no descriptor needed) so the host knows."""
        self.failed = True
        if self.path is not None and self.path.endswith(".jsonl"):
            try:
                posix.rename(self.path, self.path[: -len(".jsonl")] + LOST_SUFFIX)
            except OSError:
                pass

    def _owned(self):
        """Whether ``fd`` is still our file; a record file whose number was taken is reopened elsewhere."""
        if self.identity is not None and identity(self.fd) == self.identity:
            return True
        if self.path is None:
            return False
        try:
            fd = open_high(self.path, posix.O_WRONLY | posix.O_APPEND)
        except OSError:
            return False
        if identity(fd) != self.identity:
            posix.close(fd)
            return False
        self.fd, self.reopened = fd, self.reopened + 1  # the old number is the program's now: never closed
        return True

    def release(self):
        """Close the descriptor, only if it is still ours (a forked child gives up its parent's file)."""
        if self.identity is not None and identity(self.fd) == self.identity:
            try:
                posix.close(self.fd)
            except OSError:
                pass
        self.failed = True


def open_high(path, flags, mode=0o600):
    """Open ``path`` close-on-exec and move it to a free descriptor at or above :data:`HIGH_FD`."""
    with RoomAbove():
        fd = posix.open(path, flags | posix.O_CLOEXEC, mode)
        try:
            return move_high(fd)
        except OSError:
            posix.close(fd)
            raise


class RoomAbove:
    """Raise the soft descriptor limit past :data:`HIGH_FD` while inside, where the hard limit allows.

    A descriptor made meanwhile stays valid once the limit is put back, so a
    program with a low limit (or one that used every number below it) still
    cannot reach the agent's file.  ``resource`` is taken out of
    ``sys.modules`` again, so the program's own import of it is still its first.
    """

    def __enter__(self):
        self.saved = None
        if _open_max() > HIGH_FD + 64:
            return self
        already_loaded = "resource" in sys.modules
        try:
            import resource
        except ImportError:
            return self
        finally:
            if not already_loaded:
                sys.modules.pop("resource", None)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = HIGH_FD + 64 if hard == resource.RLIM_INFINITY else min(HIGH_FD + 64, hard)
        if wanted > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
                self.saved = (resource, soft, hard)
            except (OSError, ValueError):
                pass
        return self

    def __exit__(self, *exc_info):
        if self.saved is not None:
            resource, soft, hard = self.saved
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def move_high(fd, inheritable=False, far=False):
    """``fd`` moved to the lowest free number at or above :data:`HIGH_FD`; the old one closed.

    The copy is close-on-exec unless ``inheritable`` (the keeper hands the
    channel and the dump file to the program it starts this way).  ``far``
    takes the highest free number below ``HIGH_FD + 1024`` instead: away
    from the others.  Where the descriptor limit is too low, the next free
    number below it is taken, searching down from the limit: still far above
    what a program opens itself.  Call it inside :class:`RoomAbove` to raise
    a low soft limit meanwhile.
    """
    limit = _open_max()
    if far:
        candidates = range(min(limit, HIGH_FD + 1024) - 1, fd, -1)
    elif limit >= HIGH_FD + 64:
        candidates = range(HIGH_FD, limit)
    else:
        candidates = range(limit - 1, fd, -1)
    for number in candidates:
        if number == fd or identity(number) is not None:
            continue
        posix.dup2(fd, number, inheritable)
        posix.close(fd)
        return number
    return fd


def _open_max():
    try:
        return int(posix.sysconf("SC_OPEN_MAX"))
    except (OSError, ValueError):
        return 1024


def identity(fd):
    """(device, inode) of the file open on ``fd``, or None: whether a number still holds the same file."""
    try:
        stat = posix.fstat(fd)
    except OSError:
        return None
    return (stat.st_dev, stat.st_ino)


_INSTALLED = ("/site-packages/", "/dist-packages/")


def file_kind(filename):
    """Whose code ``filename`` is: ``user`` (the user's own), ``installed`` (a package in site-packages),
    ``stdlib`` (this interpreter's library) or ``generated`` (no file: ``<string>``, ``<frozen ...>``).

    The one rule every agent, the attribution and the renderers use for "is this the user's code?".
    """
    if not filename or filename.startswith("<"):
        return "generated"
    if any(part in filename for part in _INSTALLED):
        return "installed"
    if filename.startswith((sys.base_prefix + "/lib/", sys.prefix + "/lib/")):
        return "stdlib"
    return "user"


def environ():
    """The process environment as text, read through ``posix`` (``os`` may not be imported)."""
    return {key.decode(): value.decode("utf-8", "surrogateescape") for key, value in posix.environ.items()}


def channel_from(env):
    """The channel the runner opened for this program."""
    return Channel(int(env[CHANNEL_FD]))


def exit_if_channel_lost(channel):
    """End the program with :data:`CHANNEL_LOST_EXIT` when the target broke its channel."""
    if not channel.intact():
        posix._exit(CHANNEL_LOST_EXIT)


def enable_fault_dumps(env, cuprobe=None):
    """Send fatal-signal tracebacks, and the runner's stack requests, to the runner's dump file.

    ``faulthandler`` is a built-in module; it is taken out of ``sys.modules``
    again so that a target importing it still counts as its first importer.
    With the ``cuprobe`` extension, a program that puts its own file on the dump
    descriptor's number never receives a dump in it: the descriptor is checked
    before each dump (see ``guard_fault_dumps`` in ``cuprobe.c``).
    """
    fd = env.get(DUMP_FD)
    if not fd:
        return
    already_loaded = "faulthandler" in sys.modules
    import faulthandler

    dump_signal = int(env.get(DUMP_SIGNAL, "10"))
    faulthandler.enable(file=int(fd), all_threads=True)
    faulthandler.register(dump_signal, file=int(fd), all_threads=True)
    if not already_loaded:
        del sys.modules["faulthandler"]
    if cuprobe is not None and hasattr(cuprobe, "guard_fault_dumps"):
        _guard_fault_dumps(cuprobe, int(fd), dump_signal)


_FATAL_SIGNALS = (11, 8, 6, 7, 4)  # SIGSEGV, SIGFPE, SIGABRT, SIGBUS, SIGILL: faulthandler's own list on Linux


def _guard_fault_dumps(cuprobe, fd, dump_signal):
    try:
        with RoomAbove():
            spare = move_high(posix.dup(fd), far=True)
        posix.set_inheritable(spare, False)
        cuprobe.guard_fault_dumps(fd, spare, (*_FATAL_SIGNALS, dump_signal))
    except OSError:
        pass


def guard_agent(env, cuprobe):
    """What every agent does first: die with the process that started it, and dump fatal tracebacks to it."""
    if cuprobe is not None:
        try:
            cuprobe.die_with_parent()
        except OSError:
            pass
    enable_fault_dumps(env, cuprobe)


def load_extension(name, path):
    """Load a compiled extension from ``path`` without the import system, and leave ``sys.modules`` as it was."""
    import _imp

    machinery = sys.modules["_frozen_importlib_external"]
    spec = sys.modules["_frozen_importlib"].ModuleSpec(name, None, origin=path)
    spec.loader = machinery.ExtensionFileLoader(name, path)
    module = _imp.create_dynamic(spec)
    sys.modules.pop(name, None)
    return module


def load_cuprobe(env):
    """The ``_diagtools_cuprobe`` extension the runner built, or ``None`` when none was given."""
    path = env.get(CUPROBE)
    return load_extension(CUPROBE_MODULE, path) if path else None


def driver_initialized(state):
    """Whether a ``cuDeviceGetCount`` result code means some caller already ran ``cuInit``."""
    return state not in (None, NO_DRIVER, DRIVER_UNASKABLE, CUDA_ERROR_NOT_INITIALIZED)


# ---- what every agent does the same way ------------------------------------------

MESSAGE_LIMIT = 100_000  # characters of an exception's message an event carries: far below the channel's bound


def describe(exc, limit=MESSAGE_LIMIT):
    """``Type: message`` of an exception, however broken its ``str``; a message past ``limit`` characters is cut."""
    try:
        text = str(exc)
    except BaseException:
        text = "<unprintable>"
    if len(text) > limit:
        text = text[:limit] + f"... [truncated: {len(text)} characters]"
    return type(exc).__qualname__ + (": " + text if text else "")


def calling_frame(thread, depth):
    """The innermost Python frame of the thread that called the driver, ``depth`` calls above the caller of this
    function, and that thread's id.

    The driver calls a hook on the calling thread when that thread holds the GIL,
    and otherwise from a helper thread while the caller waits inside the driver,
    its frames unchanged (see driver/simcuda.c).
    """
    tid = _thread.get_ident()
    if thread is None or thread == tid:
        return sys._getframe(depth + 1), tid
    return sys._current_frames().get(thread), thread


def thread_name(function):
    """The ``threading.Thread`` name behind a low-level start, when there is one."""
    owner = getattr(function, "__self__", None)
    name = getattr(owner, "_name", None) if owner is not None else None
    return name if isinstance(name, str) else None


def init_inferred(cuprobe):
    """True when the simulated driver inferred this cuInit from a real runtime's export-table request."""
    found = cuprobe.simulation_refusals() if cuprobe is not None else None
    return bool(found and found[0] & SIM_INIT_INFERRED)


def simulation_refusals(cuprobe):
    """What the simulated driver, NVML and runtime refused (see driver/simcuda.c), or None elsewhere."""
    found = cuprobe.simulation_refusals()
    if found is None:
        return None
    driver, first, nvml, nvml_first = found
    refusals = {"driver": driver, "first": first, "nvml": nvml, "nvml_first": nvml_first}
    runtime = getattr(cuprobe, "runtime_refusals", lambda: None)()
    if runtime is not None:
        refusals["runtime"], refusals["runtime_first"] = runtime
    return refusals


def torch_cuda_initialized():
    """Whether ``torch.cuda`` says it initialized (None: it was never imported)."""
    module = sys.modules.get("torch.cuda")
    if module is None:
        return None
    return bool(vars(module).get("_initialized", False))


_CUDA_LIBRARIES = ("libcuda.so", "libcudart.so", "libnvidia-ml.so")


def foreign_cuda_libraries(env):
    """Under the simulated driver: CUDA libraries mapped into this process from outside the simulated world's
    folder (read from the loaded maps, not the environment), each as its path; ``[]`` when there are none."""
    world = env.get(SIMULATED_WORLD)
    if env.get(DRIVER_KIND) != "simulated" or not world:
        return []
    try:
        with open("/proc/self/maps", "rb") as maps:
            lines = maps.read().decode("utf-8", "surrogateescape").splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        path = line.split(None, 5)[5] if line.count(" ") >= 5 and "/" in line else ""
        path = path.strip()
        name = path.rsplit("/", 1)[-1]
        if name.startswith(_CUDA_LIBRARIES) and path.rsplit("/", 1)[0] != world and path not in found:
            found.append(path)
    return found


def load_source(name, path, register=False):
    """The module ``name`` made from the Python file ``path``, its code read through the bytecode cache.

    The one way agent code is loaded by file (the probe as the zygote's library, the run agent in a
    notebook's kernel): the import system's own source loader, which every interpreter has loaded, without
    asking the import system to find anything, so nothing is added to what the target's imports see.
    ``register``: the module is in ``sys.modules`` while its code runs (and stays there when it succeeds).
    """
    module = type(sys)(name)
    module.__file__ = path
    code = sys.modules["_frozen_importlib_external"].SourceFileLoader(name, path).get_code(name)
    if register:
        sys.modules[name] = module
    try:
        exec(code, module.__dict__)
    except BaseException:
        if register:
            sys.modules.pop(name, None)
        raise
    return module
