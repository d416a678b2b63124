"""The sweep's preloading worker: import the heavy shared modules once, then fork one child per module.

The runner executes this file as the main program of ``python -S``, as it
does the scan probe.  The zygote runs start-up, preloads its modules (torch,
the package's parents) without any tracer, and checks that the driver is
still uninitialized and that no thread other than its own runs (threads do
not survive ``fork``).  If any check fails it says why ("refused") and ends:
the host then falls back to fresh subkernels.

Otherwise it forks one child per module, ``--jobs`` at a time.  Each child puts
itself in a process group of its own, sends its stdout, stderr, fault dumps
and probe events to files of its own, and runs the scan probe's
:func:`run_forked`: the same tracer and driver hook as a fresh subkernel.
The zygote reports each fork and each exit status; the host enforces the
per-module deadline by killing the child.  Like the probe, this file imports
only what a bare interpreter has loaded.
"""

import _thread
import posix
import sys
import time

import _diagtools_protocol as protocol  # registered by the runner's bootstrap

_ENV = protocol.environ()
_clock = time.perf_counter
_channel = protocol.channel_from(_ENV)
_cuprobe = protocol.load_cuprobe(_ENV)
_WORKDIR = _ENV.get(protocol.SWEEP_WORKDIR, "")
_JOBS = max(1, int(_ENV.get(protocol.SWEEP_JOBS, "1")))  # scan children at once, in all zygotes together
_FILE_FLAGS = posix.O_WRONLY | posix.O_CREAT | posix.O_TRUNC | posix.O_CLOEXEC
_HERE = _ENV.get(protocol.PROGRAM_FILE, "").rpartition("/")[0]
# the zygote's other rooms, each a file of its own (loaded as the probe is: by file, no import system)
_serving = protocol.load_source("_diagtools_zygote_serving", _HERE + "/zygote_serving.py")
_descent = protocol.load_source("_diagtools_zygote_descent", _HERE + "/zygote_descent.py")


def _lines(name):
    return [item for item in _ENV.get(name, "").split("\n") if item]


# ---- preloading and its checks -------------------------------------------------


def _load_probe():
    """The scan probe's functions, loaded as a library (its ``main`` does not run)."""
    return vars(protocol.load_source("_diagtools_scan_probe", _ENV[protocol.SWEEP_PROBE]))


def _extra_threads():
    """Threads besides this one: the kernel's count, and ``threading``'s when it is loaded."""
    try:
        tasks = len(posix.listdir("/proc/self/task")) - 1
    except OSError:
        tasks = 0
    threading = sys.modules.get("threading")
    python = len(threading.enumerate()) - 1 if threading is not None else 0
    return max(tasks, python)


def _problem_after(what):
    """Why forking now would not give a fresh-looking child, or ``""``."""
    if protocol.driver_initialized(_cuprobe.driver_state()):
        return f"{what} initialized CUDA"
    threads = _extra_threads()
    if threads:
        return f"{what} started {threads} thread(s), which would not survive fork"
    return ""


class _ExitHandlers:
    """The ``atexit`` handlers the preload registers, so that a child can run them before the exit check.

    In a fresh subkernel the scan's exit check is registered before the target
    imports anything, so it runs after every handler the target's modules
    register.  Here the preloaded modules registered theirs before the child
    existed, and they would run after the check.  While preloading,
    ``atexit.register`` and ``unregister`` are wrapped to note each handler and
    the module whose import registered it; a child clears the registry and has
    the probe register them again after its check (exactly, when nothing was
    registered before the wrapper).  Those modules' rows are scanned by a
    child, not read as preloaded: importing them was not the whole story.
    """

    handlers = []  # (function, args, kwargs, registering module)
    exact = False
    _original = None

    @classmethod
    def watch(cls):
        already_loaded = "atexit" in sys.modules
        atexit = __import__("atexit")
        cls._loaded_before = already_loaded
        cls.exact = atexit._ncallbacks() == 0
        cls._original = (atexit.register, atexit.unregister)
        register, unregister = cls._original

        def noted_register(function, *args, **kwargs):
            result = register(function, *args, **kwargs)
            cls.handlers.append((function, args, kwargs, _registering_module(sys._getframe(1))))
            return result

        def noted_unregister(function):
            unregister(function)
            cls.handlers[:] = [h for h in cls.handlers if h[0] != function]

        atexit.register, atexit.unregister = noted_register, noted_unregister

    @classmethod
    def stop(cls):
        atexit = sys.modules.get("atexit")
        if atexit is None or cls._original is None:
            return
        atexit.register, atexit.unregister = cls._original
        cls.exact = cls.exact and atexit._ncallbacks() == len(cls.handlers)
        if not cls._loaded_before and not cls.handlers:
            del sys.modules["atexit"]

    @classmethod
    def modules(cls):
        """The modules whose import registered a handler (standard-library ones left out)."""
        stdlib = sys.stdlib_module_names
        return {m for *_, m in cls.handlers if m and m.partition(".")[0] not in stdlib}

    @classmethod
    def take_over(cls):
        """In a child: empty the registry and hand back the handlers for the probe to register again."""
        if not cls.exact or not cls.handlers:
            return ()
        weakref = sys.modules.get("weakref")
        finalizers = getattr(getattr(weakref, "finalize", None), "_exitfunc", None)
        __import__("atexit")._clear()
        return tuple(h for h in cls.handlers if finalizers is None or h[0] != finalizers)


def _registering_module(frame):
    """``__name__`` of the innermost module whose top-level code is running at ``frame``, or None."""
    while frame is not None:
        if frame.f_code.co_name == "<module>":
            name = frame.f_globals.get("__name__")
            return name if isinstance(name, str) else None
        frame = frame.f_back
    return None


def _preload(items, modules):
    """Import the preload in order, checking after each; ``(reason to refuse or "", child or None)``.

    An item ``NAME<TAB>INDEX`` is a candidate the host chose from what most
    children imported (``INDEX`` is its row's, or ``-`` when that row is
    done); ``NAME<TAB>-<TAB>library`` is a module outside the package most
    children imported.  A candidate is imported once, with a stopped copy of
    the zygote to go back to (:mod:`zygote_candidates`): one that does harm
    is passed over, and every module still to scan that it loaded, itself
    included, is scanned by a child of that copy, so no row is a preloaded
    one and every row is what a fresh subkernel would give.  In such a child
    this returns ``("", (index, module))``.
    """
    problem = _problem_after("start-up")
    if problem:
        _channel.emit("refused", reason=problem, item=None)
        return problem, None
    due_at = {name: index for index, name in enumerate(modules)}
    collapsed = False
    for item in items:
        name, _, index = item.partition("\t")
        index, _, kind = index.partition("\t")
        if index and name not in sys.modules:
            if not collapsed:  # each candidate is checked with forked copies of this zygote
                _collapse_memory()
                collapsed = True
            outcome = _candidates.attempt(name, kind == "library", modules, due_at)
            if outcome.kind == "child":
                return "", outcome.child
            if outcome.kind == "passed":
                _channel.emit("passed-over", n=name, reason=outcome.why)
            elif outcome.kind == "refused":
                _channel.emit("refused", reason=outcome.why, item=name)
                return outcome.why, None
            else:
                _kept(name, outcome)
            continue
        started = _clock()
        try:
            __import__(name)
        except BaseException as exc:
            problem = f"preloading {name} failed: {protocol.describe(exc)}"
        else:
            problem = _problem_after(f"preloading {name}")
        if problem:
            _channel.emit("refused", reason=problem, item=name)
            return problem, None
        _channel.emit("preloaded", n=name, s=_clock() - started)
    return "", None


def _collapse_memory():
    """Move what the zygote has loaded into huge pages, so that every fork copies and every child's exit
    drops 512 times fewer page-table entries (``collapse_to_huge_pages`` in cuprobe.c, which never raises:
    where the kernel cannot, it moves nothing)."""
    if _cuprobe is None:
        return
    started = _clock()
    moved = _cuprobe.collapse_to_huge_pages()
    _channel.emit("huge-pages", moved=moved, s=_clock() - started)


def _kept(name, outcome):
    """Report a candidate kept: its seconds, and what it is kept though (variables, watched modules)."""
    _channel.emit("preloaded", n=name, s=outcome.seconds)
    if outcome.variables:
        _channel.emit("environment-kept", n=name, names=list(outcome.variables))
    if outcome.aliases:
        _channel.emit("watching", n=name, names=list(outcome.aliases))
    if outcome.guarded:
        _channel.emit("guarding", n=name, names=list(outcome.guarded), why=list(outcome.guarded.values()))


_served = set()  # indices whose child ran during the preload
_failed_alone = set(_lines(protocol.SWEEP_FAILED_ALONE))  # modules whose row failed to import (more found here)
_candidates = protocol.load_source("_diagtools_zygote_candidates", _HERE + "/zygote_candidates.py")
_aliases = protocol.load_source("_diagtools_zygote_aliases", _HERE + "/zygote_aliases.py")


def _scan_before_preloading(due, modules):
    """Scan the modules ``due`` (indices) in children and wait for them all: ``(index, module)`` in a child,
    else None.

    They are served as the ready zygote serves its modules (:func:`zygote_serving._serve`): a package among
    them is imported once, by its own row, for the modules below it, so a candidate that loads a package and
    its hundred modules costs one import of that package, not one in every row.  They are served by name, so
    that a package comes before the modules below it whatever order they are given in (a candidate's come in
    the order its import entered them in ``sys.modules``, where a package whose first import failed half way,
    as in a circular import, comes after them).  Its descendants are orphaned
    to this process, which reaps them; every module that failed (or whose child ended badly) is remembered.
    """
    inside = _inside(_ENV.get(protocol.SWEEP_PACKAGE, ""), [*sys.modules, *_aliases.hidden()])
    _channel.emit("preloading-inside", inside=inside)
    try:
        _cuprobe.become_subreaper()
    except OSError:
        pass
    child = _serving._serve(modules, sorted(due, key=modules.__getitem__))
    if child is not None:
        return child
    _served.update(due)
    _failed_alone.update(modules[index] for index in due if _reported_failure(index))
    return None


def _reported_failure(index):
    """Whether the child that scanned module ``index`` ended with a non-zero status (the serving loop notes
    it) or reported its import failing (an error or an exit)."""
    if _exists(_own_path(index, "code")):
        return True
    try:
        with open(_own_path(index, "events"), "rb") as handle:
            data = handle.read()
    except OSError:
        return True
    return b'"e":"error"' in data or b'"e":"exit"' in data


def _inside(package, names):
    """``[name, file]`` of each loaded module among ``names`` that belongs to ``package``: named inside
    it, or whose file lies in its directory under another name (a folder of it put on ``sys.path``);
    read from module dicts only."""
    folders = _folders_of(sys.modules.get(package))
    found, hidden = [], _aliases.hidden()  # watched modules are loaded too, out of sys.modules
    for name in names:
        module = sys.modules.get(name, hidden.get(name))
        try:
            file = vars(module).get("__file__")
        except TypeError:
            file = None
        file = file if isinstance(file, str) else None
        named = name == package or name.startswith(package + ".")
        if named or (file is not None and file.startswith(folders)):
            found.append([name, file])
    return found


def _folders_of(package):
    """The package's directories, each ending in a separator, read from its dict (never imported here)."""
    try:
        path = vars(package).get("__path__")
    except TypeError:
        return ()
    try:
        return tuple(folder.rstrip("/") + "/" for folder in path if isinstance(folder, str))
    except TypeError:
        return ()


_tokens = _serving._Tokens()


# ---- package zygotes (the descent itself: zygote_descent.py) ---------------------

_zygote_index = -1  # the index of the package this zygote imported (-1: the first zygote)
_explicit = set()  # the modules the preload loaded: their rows say "preloaded", no child is forked


def _lines_of(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return [line for line in handle.read().split("\n") if line]
    except OSError:
        return []


def _exists(path):
    try:
        posix.stat(path)
    except OSError:
        return False
    return True


def _write_own(index, kind, text):
    """Write the file ``kind`` of module ``index`` in the work folder (as its child writes its own)."""
    _write_file(_own_path(index, kind), text)


def _write_file(path, text):
    fd = posix.open(path, _FILE_FLAGS, 0o600)
    try:
        _write_all(fd, text.encode("utf-8", "backslashreplace"))
    finally:
        posix.close(fd)


def _write_all(fd, data):
    while data:
        data = data[posix.write(fd, data) :]


# ---- in the child --------------------------------------------------------------


def _own_path(index, kind):
    return f"{_WORKDIR}/{index}.{kind}"


def _open_own(index, kind):
    return posix.open(_own_path(index, kind), _FILE_FLAGS, 0o600)


def _redirect(index, kind, target_fd, recorded=b""):
    """Send ``target_fd`` to this child's file ``kind``, which starts with what was ``recorded``."""
    fd = _open_own(index, kind)
    _write_all(fd, recorded)
    posix.dup2(fd, target_fd)
    posix.close(fd)


def _at_named_number(fd, variable):
    """``fd`` moved to the number the environment's ``variable`` names, when that number is free.

    The child's own channel and dump then sit where a fresh subkernel's would: a
    module that writes to ``DIAGTOOLS_CHANNEL_FD`` (a flood, a forged event) meets
    this child's file, as it would meet a fresh subkernel's pipe.
    """
    try:
        number = int(_ENV.get(variable, ""))
    except ValueError:
        return fd
    if number == fd or protocol.identity(number) is not None:
        return fd
    posix.dup2(fd, number, False)
    posix.close(fd)
    return number


def _keep_channel():
    """A copy of the zygote's channel for the zygote this row child may leave, or None.

    Made before the row runs its import: the copy checks on every write that its
    descriptor is still the one it copied, whatever the import did with it.
    """
    try:
        return protocol.Channel(protocol.move_high(posix.dup(_channel.fd)))
    except OSError:
        return None


def _recorded_files(prefix):
    """What the row a continuing zygote went on from had recorded: events (its hello left out),
    stdout and stderr, as bytes; empty outside such a zygote."""
    if prefix is None:
        return b"", b"", b""
    row, sizes = prefix
    return tuple(
        _descent._recorded(row, kind, size, skip_first_line=kind == "events")
        for kind, size in zip(("events", "out", "err"), sizes, strict=True)
    )


def _exit_code(exc):
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _forget_preloaded_finalizers():
    """Run at this child's exit only the ``weakref.finalize`` callbacks its module registers.

    The preload's finalizers belong to the zygote's objects (torch makes over a hundred, one
    per operator library, each costly in a child: every one writes to copy-on-write pages);
    they are marked not to run at exit.  Their exit callback was registered with ``atexit``
    before the fork, so after the scan's shutdown check: it is registered again when the
    module makes a finalizer, as in a fresh subkernel, where that comes after the check was
    registered and so runs before it.
    """
    weakref = sys.modules.get("weakref")
    finalize = getattr(weakref, "finalize", None)
    registry = getattr(finalize, "_registry", None)
    if not isinstance(registry, dict):
        return
    for info in list(registry.values()):
        info.atexit = False
    finalize._registered_with_atexit = False


def _leave(code):
    """End as a normal interpreter exit would (join threads, run atexit, flush), minus module teardown."""
    threading = sys.modules.get("threading")
    try:
        if threading is not None:
            threading._shutdown()
        __import__("atexit")._run_exitfuncs()
    except BaseException:
        pass
    _serving._flush_stdio()
    posix._exit(code)


def _run_child(probe, index, module):
    try:
        posix.setpgid(0, 0)  # the host kills this group on a timeout
    except OSError:
        pass
    try:
        _cuprobe.die_with_parent()
    except OSError:
        pass
    prefix = _descent._Continuation.prefix
    if prefix is not None:
        _cuprobe.adopt_parent_init()  # the simulated driver: this child goes on as the row that initialized it
    _descent._Continuation.channel = _keep_channel() if _descent._Continuation.below is not None else None
    _channel.release()  # the zygote's channel is not the child's to write
    if prefix is None:  # nor its dump file (below a continuing zygote, that number is no longer the zygote's)
        try:
            posix.close(int(_ENV.get(protocol.DUMP_FD)))
        except (OSError, TypeError):
            pass
    recorded = _recorded_files(prefix)
    _redirect(index, "out", 1, recorded[1])
    _redirect(index, "err", 2, recorded[2])
    dump_env = {
        protocol.DUMP_FD: str(_at_named_number(_open_own(index, "dump"), protocol.DUMP_FD)),
        protocol.DUMP_SIGNAL: _ENV.get(protocol.DUMP_SIGNAL, "10"),
    }
    protocol.enable_fault_dumps(dump_env, _cuprobe)
    channel = protocol.Channel(_at_named_number(_open_own(index, "events"), protocol.CHANNEL_FD))
    _aliases.arm(index)
    _descent._Continuation.started, _descent._Continuation.loaded = _clock(), len(sys.modules)
    code = 0
    try:
        if prefix is None:
            _forget_preloaded_finalizers()
            exits = _ExitHandlers.take_over()
            probe["run_forked"](channel, [module], _descent._continue_below(probe), exits, _ExitHandlers.modules())
        else:
            probe["continue_forked"](channel, module, recorded[0], _descent._continue_below(probe))
    except SystemExit as exc:
        code = _exit_code(exc)
    beside = probe["imported_before_cuda"]()
    if beside:
        _write_own(index, "before-cuda", "\n".join(beside))
    _leave(code)


# ---- the run -----------------------------------------------------------------


def main():
    """Preload, check, then fork; returns ``(probe, index, module)`` in a child, else None."""
    protocol.guard_agent(_ENV, _cuprobe)
    probe = _load_probe()
    _channel.emit("hello", pid=posix.getpid(), python=sys.version, main_thread=_thread.get_ident())
    if _ENV.get(protocol.SCAN_NO_SITE) != "1":
        __import__("site").main()
    sys.path[0:0] = _lines(protocol.SCAN_PATH)
    with open(_ENV[protocol.SWEEP_MODULES_FILE], encoding="utf-8") as handle:
        modules = handle.read().split()
    _tokens.create()  # before the preload: the rows a candidate loads are scanned while it is checked
    _ExitHandlers.watch()
    problem, child = _preload(_lines(protocol.SWEEP_PRELOAD), modules)
    _ExitHandlers.stop()
    if child is not None:
        return (probe, *child)
    if problem:
        return None
    for candidate, (aliases, alone) in _aliases.watch_lines(_lines(protocol.SWEEP_WATCHED)).items():
        if aliases:  # as the zygote that checked the preload did
            _channel.emit("watching", n=candidate, names=aliases)
        if alone:
            _channel.emit("guarding", n=candidate, names=alone, why=[""] * len(alone))
    _aliases.rewatch()
    loaded = [*sys.modules, *_aliases.hidden()]
    _channel.emit("ready", count=len(sys.modules), inside=_inside(_ENV.get(protocol.SWEEP_PACKAGE, ""), loaded))
    try:
        _cuprobe.become_subreaper()  # a row's continuing zygote is orphaned to this one
    except OSError:
        pass
    _explicit.update(name for name in sys.modules if name not in _ExitHandlers.modules())
    __import__("gc").freeze()  # the preloaded objects stay out of the children's collections
    _collapse_memory()
    child = _serving._serve(modules, range(len(modules)))
    if child is None:
        _channel.emit("done")
        return None
    return (probe, *child)


_child = main()
if _child is not None:
    _run_child(*_child)  # outside main's frames, so the child's stack holds only its own scan
