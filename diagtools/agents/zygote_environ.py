"""Whether a name a candidate's import leaves to every row could change another module's import.

Part of the sweep zygote (:mod:`sweep_zygote`), in a file of its own for its
one role.  The names are environment variables the import set, and modules it
loaded that fail to import alone (a row that imports one first would fail in
a fresh subkernel, and a row reaches one only through a file that names it).
Preloading a module that sets an environment variable shows that
variable to every row, where a fresh subkernel shows it only once that module
has run.  That difference can change a row only through code that reads the
variable, and code that reads it holds its name: so the variable is kept when
no file that a row could run holds the name, outside the modules the
candidate's import loaded (they run before any row, as that import ran them).
The files searched are everything under each ``sys.path`` folder (sources,
bytecode, extension modules, native libraries shipped in wheels) and every
file the process has mapped (the native libraries loaded from elsewhere),
less each distribution's metadata but its entry points (its list of files
and its description name modules and variables, and no import reads them).
A name built at run time from pieces, or a prefix matched over the whole
environment, is not seen: the search reads names, not programs.

Runs in a throwaway child of the zygote, after the candidate's import, so
whatever it loads cannot reach the zygote.  Standard library only.
"""

import posix
import sys
import time

SEARCH_LIMIT_S = 90.0  # past this the search gives up, and the variable is not kept
READERS = 4  # processes reading files at once: a cold disk answers several reads in the time of one
_CHUNK = 1 << 22  # a file is read this many bytes at a time
_BATCH = 16  # files handed to a reader at a time


class _Search:
    """One walk over the files a row could run, looking for any of ``needles``.

    The walk (this process) lists the folders and numbers each file in the
    order it meets them; :data:`READERS` forked readers read them, a batch
    at a time.  Every file numbered before the walk stops is read, so the
    file reported for a name is the first holding it in the walk's order,
    however the reads overlap.  A process with threads reads alone (forking
    it is not safe).
    """

    def __init__(self, needles, allowed, limit):
        self.needles = [name.encode("utf-8", "surrogateescape") for name in needles]
        self.allowed, self.deadline = allowed, time.monotonic() + limit
        self.seen_dirs, self.seen_files = set(), set()
        self.found = {}  # needle index -> (number, file) of the first file in the walk's order that holds it
        self.files, self.batch = [], []  # every file numbered (its number is its place), the batch being filled
        self.readers, self.turn = [], 0  # (pid, the pipe its paths go down); the one to try first
        self.results, self.pending = None, b""  # the pipe the readers' finds come up, and a line not yet whole
        self.failed = False  # a reader ended before reading every file it was given

    def __enter__(self):
        if READERS > 1 and _threads() == 1:
            self._start_readers()
        return self

    def __exit__(self, kind, *_):
        self._flush()
        for _pid, pipe in self.readers:
            posix.close(pipe)
        for pid, _pipe in self.readers:
            self.failed = posix.waitstatus_to_exitcode(posix.waitpid(pid, 0)[1]) != 0 or self.failed
        if self.results is not None:
            self._take_results(self.results, block=True)
            posix.close(self.results)

    def _start_readers(self):
        results, their_results = posix.pipe()
        for _ in range(READERS):
            paths, their_paths = posix.pipe()
            _shorten(their_paths)
            pid = posix.fork()
            if pid == 0:
                posix.close(their_paths)
                posix.close(results)
                for _, pipe in self.readers:
                    posix.close(pipe)
                _reader(paths, their_results, self.needles, self.deadline)
            posix.close(paths)
            self.readers.append((pid, their_paths))
        posix.close(their_results)
        posix.set_blocking(results, False)
        self.results = results

    def expired(self):
        return time.monotonic() > self.deadline

    def over(self):
        """Nothing more to learn: every name was found, or the time is up."""
        if self.results is not None:
            self._take_results(self.results, block=False)
        return len(self.found) == len(self.needles) or self.expired() or self.failed

    def holders(self):
        """Each name found, with the first file (in the walk's order) that holds it."""
        return {self.needles[i].decode("utf-8", "surrogateescape"): path for i, (_, path) in self.found.items()}

    def walk(self, folder):
        """Read every file under ``folder`` (or ``folder`` itself, a zip archive on ``sys.path``)."""
        try:
            if not posix.stat(folder).st_mode & 0o040000:
                self.read(folder)
                return
        except OSError:
            return
        stack = [folder]
        while stack and not self.over():
            current = stack.pop()
            try:
                key = posix.stat(current)
                entries = list(posix.scandir(current))
            except OSError:
                continue
            if (key.st_dev, key.st_ino) in self.seen_dirs:
                continue
            self.seen_dirs.add((key.st_dev, key.st_ino))
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=True):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=True):
                        self.read(entry.path)
                except OSError:
                    continue

    def read(self, path):
        """Number ``path`` and read it, or hand it to a reader (once per file, however many names it has)."""
        try:
            info = posix.stat(path)
        except OSError:
            return
        if (info.st_dev, info.st_ino) in self.seen_files or path in self.allowed or not _readable_file(info):
            return
        if _install_record(path):
            return
        self.seen_files.add((info.st_dev, info.st_ino))
        self.files.append(path)
        if not self.readers:
            for index in _names_in(path, self.needles):
                self._found(index, len(self.files) - 1)
            return
        self.batch.append(len(self.files) - 1)
        if len(self.batch) == _BATCH:
            self._flush()

    def _flush(self):
        """Hand the batch to a reader with room for it (one busy with a large file waits)."""
        if not self.batch or not self.readers:
            return
        turn = self.turn = (self.turn + 1) % len(self.readers)
        pipes = [pipe for _, pipe in self.readers[turn:] + self.readers[:turn]]
        _, room, _ = __import__("select").select([], pipes, [])
        pipe = next(pipe for pipe in pipes if pipe in room)
        items = b"".join(b"%d\t%s\0" % (n, self.files[n].encode("utf-8", "surrogateescape")) for n in self.batch)
        self.batch = []
        try:
            _write_all(pipe, items)
        except OSError:  # that reader ended: what it was given may be unread
            self.failed = True

    def _take_results(self, results, block):
        """Read what the readers found so far from ``results`` (``block``: until every one of them has ended)."""
        data, self.pending = self.pending, b""
        posix.set_blocking(results, block)
        while True:
            try:
                chunk = posix.read(results, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                break
            data += chunk
        *lines, self.pending = data.split(b"\n")
        for line in lines:
            number, _, index = line.partition(b"\t")
            if index:
                self._found(int(index), int(number))

    def _found(self, index, number):
        """Needle ``index`` is held by file ``number``: kept when no earlier file (in the walk's order) was found."""
        if index not in self.found or number < self.found[index][0]:
            self.found[index] = (number, self.files[number])


def _readable_file(info):
    """A regular file with something in it (a FIFO or a device file, on ``sys.path`` or mapped, could block
    a read or answer one with no end)."""
    return info.st_mode & 0o170000 == 0o100000 and info.st_size > 0


def _shorten(pipe):
    """Keep a reader's pipe to one page, so that files wait for the first reader free, not in a long queue."""
    fcntl = __import__("fcntl")
    try:
        fcntl.fcntl(pipe, fcntl.F_SETPIPE_SZ, 4096)
    except (OSError, AttributeError):
        pass


def _threads():
    """How many threads this process runs."""
    try:
        return len(posix.listdir("/proc/self/task"))
    except OSError:
        return 0  # cannot tell: read alone


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[posix.write(fd, view) :]


def _reader(paths, results, needles, deadline):
    """A reader's whole life: read each file that comes down ``paths`` (its number, a tab, its path; until
    the pipe closes) and send up the file's number and the needle's index for the first file it read holding
    each needle; exit 1 when time ran out before the last one was read, or a read failed."""
    code, pending, reported = 0, b"", set()
    __import__("gc").disable()  # the search's own collections were off; a reader's stay off too
    try:
        while True:
            chunk = posix.read(paths, 1 << 16)
            if not chunk:
                break
            pending += chunk
            *items, pending = pending.split(b"\0")
            for item in items:
                if time.monotonic() > deadline:
                    code = 1
                    continue
                number, _, path = item.partition(b"\t")
                held = [i for i in _names_in(path.decode("utf-8", "surrogateescape"), needles) if i not in reported]
                reported.update(held)
                if held:
                    _write_all(results, b"".join(b"%s\t%d\n" % (number, i) for i in held))
    except BaseException:
        code = 1
    posix._exit(code)


def _names_in(path, needles):
    """The indices of the ``needles`` the file at ``path`` holds, read :data:`_CHUNK` bytes at a time with
    an overlap (a name across two reads is seen); ``[]`` when it cannot be read."""
    try:
        fd = posix.open(path, posix.O_RDONLY | posix.O_CLOEXEC)
    except OSError:
        return []
    try:
        size = posix.fstat(fd).st_size
        if size <= _CHUNK:
            data = posix.read(fd, size)
            return [i for i, needle in enumerate(needles) if needle in data]
        overlap, left = max(len(needle) for needle in needles) - 1, set(range(len(needles)))
        buffer = _buffer(_CHUNK + overlap)
        for start in range(0, size, _CHUNK):
            with memoryview(buffer)[: min(_CHUNK + overlap, size - start)] as view:
                got = posix.preadv(fd, [view], start)
            left = {i for i in left if buffer.find(needles[i], 0, got) == -1}
            if not got or not left:
                break
        return [i for i in range(len(needles)) if i not in left]
    except OSError:
        return []
    finally:
        posix.close(fd)


_buffers: list = []


def _buffer(size):
    """One buffer of at least ``size`` bytes, kept for every large file this process reads."""
    if not _buffers or len(_buffers[0]) < size:
        _buffers[:] = [bytearray(size)]
    return _buffers[0]


def _install_record(path):
    """Whether ``path`` is a distribution's metadata other than its entry points (a wheel's ``RECORD`` and
    ``METADATA``, an egg's ``SOURCES.txt``): it names modules and variables, in its list of files and its
    description, and no import reads a name from it (entry points are read, and stay searched)."""
    folder, _, name = path.rpartition("/")
    return folder.endswith((".dist-info", ".egg-info")) and name != "entry_points.txt"


def allowed_files(modules):
    """The sources and bytecode of ``modules``: read before any row, as the candidate's import read them."""
    allowed = set()
    util = sys.modules.get("importlib.util")
    for name in modules:
        try:
            file = vars(sys.modules[name]).get("__file__")
        except (KeyError, TypeError):
            continue
        if not isinstance(file, str):
            continue
        allowed.add(file)
        if util is not None and file.endswith(".py"):
            try:
                allowed.add(util.cache_from_source(file))
            except (NotImplementedError, ValueError):
                pass
    return allowed


def _mapped_files():
    """The files this process has mapped: the native libraries loaded so far, wherever they live."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="surrogateescape") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return []
    files = []
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/") and parts[5] not in files:
            files.append(parts[5])
    return files


class _no_collection:  # noqa: N801 - used as a context manager, named as one
    """No garbage collection while the search runs: the walk makes many objects, and each full collection
    would go over every object the process holds (torch's and the package's, millions in a zygote)."""

    def __enter__(self):
        self.gc = __import__("gc")
        self.was = self.gc.isenabled()
        self.gc.disable()

    def __exit__(self, *_):
        if self.was:
            self.gc.enable()


def held_elsewhere(names, loaded, limit=SEARCH_LIMIT_S, first=()):
    """For each of ``names`` held by a file a row could run (outside the sources of ``loaded``), ``(why it may
    not be kept, the file that holds it or "")``; ``{}`` when every one may.  A search that runs out of time
    keeps none.  The folders ``first`` (the swept package's) are searched before the rest: the file that
    holds a name is most often there, and a search ends once every name is found."""
    with _no_collection(), _Search(names, allowed_files(loaded), limit) as search:
        for folder in first:
            if not search.over():
                search.walk(folder.rstrip("/") or "/")
        for path in _mapped_files():
            search.read(path)
        for folder in list(sys.path):
            if isinstance(folder, str) and folder and not search.over():
                search.walk(folder)
    if search.expired() and len(search.found) < len(search.needles):
        return dict.fromkeys(names, (f"no search for its name finished in {limit:.0f} s", ""))
    if search.failed and len(search.found) < len(search.needles):
        return dict.fromkeys(names, ("the search for its name could not read every file", ""))
    return {name: (f"{path} holds its name", path) for name, path in search.holders().items()}
