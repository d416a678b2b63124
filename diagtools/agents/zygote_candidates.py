"""The sweep zygote's learned candidates: each imported once, in the zygote, with a stopped copy to go back to.

Part of the sweep zygote (:mod:`sweep_zygote`), in a file of its own for its
one role.  Before it imports a candidate the zygote forks a *backup*, a copy
of itself that stops at once.  The zygote then imports the candidate and
checks it: one that fails, initializes CUDA, starts a thread, looks up a name
an earlier candidate registered a module under, or (a module of the package)
changes what later imports see (``sys.path``, the import hooks, an environment
variable some other file names) must not stay; a module it registered under a
name the package imports is watched from then on (:mod:`zygote_aliases`).  A kept one's rows still to
scan, itself and every module of the package it loaded, are scanned by
children the backup forks (they start from the state before the candidate,
as a fresh subkernel would), and one whose import loads a module that fails
alone is not kept either, unless no file a row could run names that module.
When the candidate stays, the backup is killed; when it does not, the backup
is continued as the zygote and the zygote becomes a relay that waits for it
and ends as it ends.  So each candidate is imported once, never a second
time after a trial.  Standard library and the protocol only.
"""

import posix
import sys

import _diagtools_protocol as protocol  # registered by the runner's bootstrap

z = sys.modules["__main__"]  # the zygote itself: its channel, its files, what it served
_SIGSTOP, _SIGCONT, _SIGKILL = 19, 18, 9  # Linux
_names_imported = set(z._lines(protocol.SWEEP_NAMES_IMPORTED))
_SEARCH_FAILED = 3
WAIT_ROWS_PER_JOB = 1  # rows ordered per job at a time while a search runs: past its end, a row's wait at most


def _import_hooks():
    """What an import leaves for every later import to see: the search path, the hooks, the environment."""
    os = sys.modules.get("os")
    environ = dict(os.environ) if os is not None else {}
    return list(sys.path), list(sys.meta_path), list(sys.path_hooks), environ


def _registered_alias(name):
    """Whether ``name`` is a module registered under a name not its own that an import in the package (or a
    module of that name on the search path, which a fresh subkernel would import instead) could reach."""
    try:
        module = vars(sys.modules[name])
    except (KeyError, TypeError):
        return False
    own = module.get("__name__")
    spec = module.get("__spec__")
    if own == name or getattr(spec, "name", None) == name:
        return False  # imported under its own name (a C module may call itself otherwise: _decimal)
    top = name.partition(".")[0]
    if top in _names_imported:
        return True
    machinery = sys.modules.get("importlib.machinery")
    try:
        return machinery is not None and machinery.PathFinder.find_spec(top) is not None
    except Exception:
        return True


def _side_effect(before, after, added):
    """What an import changed that every later import would see, in words, or ``""``; when it set environment
    variables instead, the :class:`_Search` (started, not awaited) for the files that hold their names."""
    path, meta_path, path_hooks, environ = before
    new_path, new_meta_path, new_path_hooks, new_environ = after
    if new_path != path:
        extra = [entry for entry in new_path if entry not in path]
        return (f"it puts {extra[0]} on sys.path" if extra else "it changes sys.path"), None
    if new_meta_path != meta_path or new_path_hooks != path_hooks:
        return "it changes the import hooks (sys.meta_path, sys.path_hooks)", None
    changed = sorted(key for key in set(environ) | set(new_environ) if environ.get(key) != new_environ.get(key))
    return "", (_Search(changed, added) if changed else None)


def _variables_held(search):
    """The awaited :class:`_Search` for the variables an import set: why it must not stay, or ``""``; and the
    variables no file a row could run holds the name of (kept: no later import can tell)."""
    held = search.result()
    if held:
        name = sorted(held)[0]
        return f"it sets the environment variable {name} ({held[name]})", ()
    return "", tuple(search.names)


def _registered_aliases(added):
    """The names among ``added`` that the import registered a module under, not its own, and that a row
    could look up (vLLM registers its vendored triton_kernels so): watched, not refused (:mod:`zygote_aliases`).
    A name below another one listed goes with it."""
    return z._aliases.outermost([name for name in added if _registered_alias(name)])


_environ = []  # the search's file, once loaded


def _environ_search():
    """The search's file, loaded once (standard library only; it imports ``select`` and ``fcntl`` as it searches)."""
    if not _environ:
        _environ.append(protocol.load_source("_diagtools_zygote_environ", z._HERE + "/zygote_environ.py"))
    return _environ[0]


class _Search:
    """:func:`zygote_environ.held_elsewhere` for ``names``, run in a throwaway child (what the search loads
    stays there) that starts at once, so the zygote's rows are scanned meanwhile; :meth:`result` awaits it.

    Only the names no earlier search of this sweep found held are searched for (``every``: each of them,
    else none once one is); what every search found is kept in a file, which a zygote's copy going on
    after a candidate was passed over reads too.
    """

    def __init__(self, names, added, every=False):
        self.names, self.pid, self.status, self.known = tuple(names), None, None, _known_holders()
        files, known = _environ_search().allowed_files(added), self.known
        self.held = {name: f"{known[name]} holds its name" for name in names if known.get(name, "") not in ("", *files)}
        self.searched = [name for name in names if name not in self.held]
        if (self.held and not every) or not self.searched:
            return
        z._serving._flush_stdio()
        self.pid = posix.fork()
        if self.pid == 0:
            _search_child(self.searched, added, z._own_path("environ", "held"))

    def running(self):
        """Whether the search's child is still searching (its end, when it came, is kept for :meth:`result`)."""
        if self.pid is None or self.status is not None:
            return False
        pid, status = posix.waitpid(self.pid, posix.WNOHANG)
        if pid:
            self.status = status
        return not pid

    def result(self):
        """For each name held by a file a row could run, why it may not stay; ``{}`` when every one may."""
        if self.pid is None:
            return self.held
        status = self.status if self.status is not None else posix.waitpid(self.pid, 0)[1]
        self.pid, lines = None, z._lines_of(z._own_path("environ", "held"))
        if posix.waitstatus_to_exitcode(status):
            why = lines[0] if lines else "the search for its name did not finish"
            return {**self.held, **dict.fromkeys(self.searched, why)}
        found = [line.split("\t") for line in lines if line.count("\t") == 2]
        self.known.update((name, where) for name, _, where in found if where)
        z._write_file(z._own_path("environ", "known"), "\n".join(f"{n}\t{where}" for n, where in self.known.items()))
        return {**self.held, **{name: why for name, why, _ in found}}

    def abandon(self):
        """End a search whose answer no longer matters (the zygote cannot go on)."""
        if self.pid is not None and self.status is None:
            posix.kill(self.pid, _SIGKILL)
            posix.waitpid(self.pid, 0)
        self.pid = None


def _known_holders():
    """The file found holding each name some earlier search of this sweep found held."""
    lines = z._lines_of(z._own_path("environ", "known"))
    return dict(line.split("\t", 1) for line in lines if "\t" in line)


def _search_child(names, added, path):
    """In the search's child: search, write what was found to ``path``, and end."""
    try:
        package = sys.modules.get(z._ENV.get(protocol.SWEEP_PACKAGE, "").partition(".")[0])
        found = _environ_search().held_elsewhere(names, added, first=z._folders_of(package))
        z._write_file(path, "\n".join(f"{name}\t{why}\t{where}" for name, (why, where) in found.items()))
    except BaseException as exc:
        z._write_file(path, f"the search for its name failed: {protocol.describe(exc)}")
        posix._exit(_SEARCH_FAILED)
    posix._exit(0)


class Outcome:
    """What one :func:`attempt` came to in the process that reads it.

    ``kind`` is ``kept`` in the zygote that keeps the candidate (``seconds``
    its import took, ``variables`` the environment variables it set that no
    other file names, ``aliases`` the names it registered a module under,
    watched from now on), ``passed`` in the zygote that goes on without it (the
    backup, continued; ``why``), ``child`` in a scan child the backup forked
    for one of its rows (``child``: its ``(index, module)``), and ``refused``
    when the backup ended while scanning them (``why``: the zygote cannot go
    back, and the host retries with a shorter preload).
    """

    __slots__ = ("aliases", "child", "guarded", "kind", "seconds", "variables", "why")

    def __init__(self, kind, *, why="", seconds=0.0, variables=(), child=None, aliases=(), guarded=None):
        self.kind, self.why, self.seconds, self.variables, self.child = kind, why, seconds, variables, child
        self.aliases, self.guarded = aliases, guarded or {}


def attempt(name, library, modules, due_at):
    """Import candidate ``name`` in this zygote, kept or gone back from: an :class:`Outcome`.

    A ``library`` (outside the package) may change what later imports see, as
    the libraries the host preloads itself (torch).
    """
    z._serving._flush_stdio()
    backup = posix.fork()
    if backup == 0:
        return _as_backup(modules)
    if not _stopped(backup):
        return Outcome("passed", why="its backup copy ended before the import")  # nothing imported yet: go on
    before, hooks = {*sys.modules, *z._aliases.hidden()}, _import_hooks()
    started = z._clock()
    try:
        __import__(name)
    except BaseException as exc:
        _go_back(backup, f"its import fails here: {protocol.describe(exc)}")
    seconds = z._clock() - started
    added = [module for module in sys.modules if module not in before]
    problem = z._problem_after("its import")
    if problem:
        _go_back(backup, problem)
    if z._aliases.marked():
        _go_back(backup, z._aliases.marked())
    kept, aliases, search = (), (), None
    if not library:
        change, search = _side_effect(hooks, _import_hooks(), added)
        if change:
            _go_back(backup, f"{change}, which every later import would see")
        aliases = _registered_aliases(added)
    if not _rows_scanned(backup, [due_at[m] for m in (name, *added) if m in due_at]):
        if search is not None:
            search.abandon()
        return Outcome("refused", why=f"the copy that scanned the rows {name} loads ended (rows not all scanned)")
    if search is not None:
        refused, kept = _searched(search, backup, modules, (name, before))
        if refused is not None:
            return refused
    named = _named_elsewhere([m for m in (name, *added) if m in z._failed_alone], added)
    if name in named or (named and library):
        failing = _failing(name if name in named else min(named), named)
        _go_back(backup, f"it loads {failing}: a row importing that first would differ")
    posix.kill(backup, _SIGKILL)
    posix.waitpid(backup, 0)
    watched = tuple(z._aliases.guard(aliases, name, alias=True)) if aliases else ()
    guarded = {module: _failing(module, named) for module in z._aliases.guard(sorted(named), name)} if named else {}
    z._aliases.rewatch()
    return Outcome("kept", seconds=seconds, variables=kept, aliases=watched, guarded=guarded)


def _rows_scanned(backup, indices):
    """Have the backup scan the rows among ``indices`` still to do (from the state before the candidate's
    import, which they need whether it stays or not; a search for its variables runs meanwhile); False when
    the backup ended instead."""
    due = list(dict.fromkeys(index for index in indices if index not in z._served))
    if not due:
        return True
    answer = _order(backup, "scan", " ".join(map(str, due)))
    if answer is None:
        return False
    z._failed_alone.update(answer)
    z._served.update(due)
    return True


def _searched(search, backup, modules, candidate):
    """Await the search for the variables a candidate set (``candidate``: its name, and what was loaded before
    its import), the jobs kept busy meanwhile: a refusal (:class:`Outcome`) or None, and the variables kept;
    a variable some file holds sends the zygote back."""
    name = candidate[0]
    if not _rows_scanned_while(search, backup, modules, candidate):
        search.abandon()
        return Outcome("refused", why=f"the copy that scanned rows while {name}'s search ran ended"), ()
    change, kept = _variables_held(search)
    if change:
        _go_back(backup, f"{change}, which every later import would see")
    return None, kept


def _rows_scanned_while(search, backup, modules, candidate):
    """While ``search`` runs, have the backup scan rows still due, :data:`WAIT_ROWS_PER_JOB` per job at a time
    from the end of the order, so the jobs are not idle (a search that reads every file on a cold disk takes
    half a minute); False when the backup ended instead.

    A row scanned from the state before the candidate is what a fresh subkernel gives, as the candidate's own
    rows are, whether the candidate then stays or not, and no later zygote scans it again.  Only a module
    loaded neither before the candidate nor by it is taken (in the backup, a loaded module's import would
    run nothing; one the candidate took out of ``sys.modules`` is still loaded there).  The rows come from
    the end, far from those the zygote scans first once ready (the second sample the host learns from).
    """
    (name, before), started, scanned, end = candidate, z._clock(), 0, len(modules)
    loaded = {*before, *sys.modules, *z._aliases.hidden()}  # the backup's, and what the candidate loaded
    while search.running():
        batch, end = _rows_still_due(modules, end, z._JOBS * WAIT_ROWS_PER_JOB, loaded)
        if not batch:
            break
        if not _rows_scanned(backup, batch):
            return False
        scanned += len(batch)
    if scanned:
        z._channel.emit("scanned-while-searching", n=name, rows=scanned, s=z._clock() - started)
    return True


def _rows_still_due(modules, end, count, loaded):
    """Up to ``count`` indices below ``end`` whose rows are still to do and whose modules are loaded nowhere,
    in order; and where the next batch ends."""
    batch = []
    while end > 0 and len(batch) < count:
        end -= 1
        name = modules[end]
        if end not in z._served and name not in loaded:
            batch.append(end)
    return batch[::-1], end


def _failing(module, named):
    return f"{module}, which fails to import on its own ({named[module]})"


def _named_elsewhere(alone, added):
    """The modules among ``alone`` (each fails to import on its own) that a row could still import first,
    each with the file that names it.

    With the candidate preloaded such a module imports cleanly in every row, where a fresh subkernel
    that reaches it first fails (a circular import, entered from the wrong side).  A row reaches it only
    through a file that names it, and names it by its last part at least (``from . import part``); so
    when no file a row could run holds that part outside the candidate's own modules (which ran in the
    zygote, not in the rows), no row can reach it first.  A short, common part is held somewhere and
    keeps the candidate out.
    """
    parts = {}
    for module in alone:
        parts.setdefault(module.rpartition(".")[2], []).append(module)
    held = _Search(sorted(parts), added, every=True).result() if parts else {}
    return {module: why for part, why in held.items() for module in parts[part]}


def _stopped(pid):
    """Wait until child ``pid`` stops itself; False when it ended instead."""
    _, status = posix.waitpid(pid, posix.WUNTRACED)
    return posix.WIFSTOPPED(status)


def _order(backup, kind, text):
    """Tell the stopped backup to do ``kind``, let it run until it stops again; the lines it answered, or
    None when it ended instead."""
    z._write_file(z._own_path("backup", "order"), f"{kind}\n{text}")
    posix.kill(backup, _SIGCONT)
    if not _stopped(backup):
        return None
    return z._lines_of(z._own_path("backup", "answer"))


def _as_backup(modules):
    """In the backup: wait stopped for the zygote's orders; scan rows for it, or go on as the zygote."""
    try:
        z._cuprobe.die_with_parent()
    except OSError:
        pass
    z._channel.adopt()
    while True:
        posix.kill(posix.getpid(), _SIGSTOP)
        kind, _, text = "\n".join(z._lines_of(z._own_path("backup", "order"))).partition("\n")
        if kind == "take-over":
            return Outcome("passed", why=text)
        due = [int(index) for index in text.split()]
        child = z._scan_before_preloading(due, modules)
        if child is not None:
            return Outcome("child", child=child)
        failed = [modules[index] for index in due if modules[index] in z._failed_alone]
        z._write_file(z._own_path("backup", "answer"), "\n".join(failed))


def _go_back(backup, why):
    """The candidate must not stay: the backup goes on as the zygote, and this process relays its end."""
    z._write_file(z._own_path("backup", "order"), f"take-over\n{why}")
    posix.kill(backup, _SIGCONT)
    _relay_gone(backup)


def _relay_gone(backup):
    """Wait for the backup (the zygote now) to end, and end as it did; never returns."""
    while True:
        try:
            _, status = posix.waitpid(backup, 0)
        except ChildProcessError:
            posix._exit(1)
        if posix.WIFEXITED(status) or posix.WIFSIGNALED(status):
            break
    code = posix.waitstatus_to_exitcode(status)
    z._serving._flush_stdio()
    posix._exit(code if code >= 0 else 128 - code)
