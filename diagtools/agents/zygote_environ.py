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
_CHUNK = 1 << 20  # files larger than this are mapped rather than read


class _Search:
    """One walk over the files a row could run, looking for any of ``needles``."""

    def __init__(self, needles, allowed, limit):
        self.needles = [name.encode("utf-8", "surrogateescape") for name in needles]
        self.allowed, self.deadline = allowed, time.monotonic() + limit
        self.seen_dirs, self.seen_files = set(), set()
        self.found = {}  # name -> the first file holding it

    def expired(self):
        return time.monotonic() > self.deadline

    def over(self):
        """Nothing more to learn: every name was found, or the time is up."""
        return len(self.found) == len(self.needles) or self.expired()

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
        try:
            info = posix.stat(path)
        except OSError:
            return
        if (info.st_dev, info.st_ino) in self.seen_files or path in self.allowed or not info.st_size:
            return
        if _install_record(path):
            return
        self.seen_files.add((info.st_dev, info.st_ino))
        try:
            fd = posix.open(path, posix.O_RDONLY | posix.O_CLOEXEC)
        except OSError:
            return
        try:
            self._scan(fd, path, info.st_size)
        finally:
            posix.close(fd)

    def _scan(self, fd, path, size):
        """Look for the names in the file, mapped (read in place, no copy) when it is large."""
        if size > _CHUNK:
            mmap = __import__("mmap")
            try:
                data = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError):
                return
            try:
                self._look(data, path)
            finally:
                data.close()
            return
        try:
            self._look(posix.read(fd, _CHUNK), path)
        except OSError:
            return

    def _look(self, data, path):
        for needle in self.needles:
            if data.find(needle) != -1:
                self.found.setdefault(needle.decode("utf-8", "surrogateescape"), path)


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


def held_elsewhere(names, loaded, limit=SEARCH_LIMIT_S, first=()):
    """For each of ``names`` held by a file a row could run (outside the sources of ``loaded``), ``(why it may
    not be kept, the file that holds it or "")``; ``{}`` when every one may.  A search that runs out of time
    keeps none.  The folders ``first`` (the swept package's) are searched before the rest: the file that
    holds a name is most often there, and a search ends once every name is found."""
    search = _Search(names, allowed_files(loaded), limit)
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
    return {name: (f"{path} holds its name", path) for name, path in search.found.items()}
