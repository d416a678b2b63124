"""The sweep zygote's fork scheduler: one child per module, ``--jobs`` at a time across every zygote.

Part of the sweep zygote (:mod:`sweep_zygote`), in a file of its own for its
one role: fork a scan child for each module in order, hold back the modules
below a package until its row child has ended (then hand them to the package
descent, :mod:`zygote_descent`), reap children and report their exit
statuses, and share the sweep's jobs among all zygotes through one pipe of
tokens.  Loaded by the zygote with ``protocol.load_source``; the zygote's
state is reached through ``z``.  Standard library and the protocol only.
"""

import posix
import sys
import time

import _diagtools_protocol as protocol  # registered by the runner's bootstrap

z = sys.modules["__main__"]  # the zygote itself: its channel, its jobs, the modules it preloaded


def _flush_stdio():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass


def _below(modules, order):
    """For each package in ``order``, the indices of ``order`` that lie inside it, in order."""
    found = {}
    for index in order:
        parts = modules[index].split(".")
        for depth in range(1, len(parts)):
            found.setdefault(".".join(parts[:depth]), []).append(index)
    return found


def _serve(modules, order):
    """Fork one child per module of ``order``; ``(index, module)`` in a child, else None.

    No more than ``_JOBS`` scan children run at once in all zygotes together
    (see :class:`_Tokens`).  A package with at least :data:`DESCEND_MIN`
    modules below it is imported once for all of them, by another zygote
    (see :class:`_Descent`); its modules wait for that zygote while this one
    goes on with the others, so every job stays busy.
    """
    state = _Serving(modules, order)
    while True:
        index = state.next_module()
        if index is None:
            if not state.busy():
                return None
            child = state.reap()
            if child is not None:
                return child
            continue
        module = modules[index]
        if index in z._served:  # scanned before a candidate's import, which was then passed over
            child = state.descend_served(index)
            if child is not None:
                return child
            continue
        state.done.add(index)  # its row is this zygote's now: no package zygote below scans it again
        if module in z._explicit:
            z._channel.emit("present", i=index)  # preloaded: its row says so, no child needed
            continue
        while not z._tokens.take(len(state.running)):
            child = state.reap(block=False)
            if child is not None:
                return child
        inside = state.inside(module)
        descend = len(inside) >= z._descent.DESCEND_MIN and module not in sys.modules
        pid = z._descent._fork()
        if pid == 0:
            z._descent._Continuation.below = (index, modules, inside) if descend else None
            return index, module
        state.running[pid] = index
        z._channel.emit("forked", i=index, pid=pid, m=module, z=z._zygote_index)
        if descend:
            state.descents[pid] = z._descent._Descent(index, inside)
            state.held.update(inside)


_TOKEN_POLL_S = 0.002


class _Tokens:
    """The sweep's ``_JOBS``, shared by every zygote: one byte in a pipe per scan child that may run.

    A zygote takes a byte before it forks a scan child and puts it back when it
    reaps that child, so however many zygotes serve packages below one another,
    no more than ``_JOBS`` scan children run at once.  The pipe is checked to be
    the one made (a module a child imported may have closed the number and
    opened a file there); when it is not, each zygote keeps to ``_JOBS`` of its
    own children instead.
    """

    def __init__(self):
        self.fds, self.identity = None, None

    def create(self):
        try:
            read_fd, write_fd = posix.pipe()
            read_fd, write_fd = protocol.move_high(read_fd), protocol.move_high(write_fd)
            posix.set_blocking(read_fd, False)
            posix.write(write_fd, b"+" * z._JOBS)
        except OSError:
            return
        self.fds = (read_fd, write_fd)
        self.identity = protocol.identity(read_fd)

    def _intact(self):
        return self.fds is not None and protocol.identity(self.fds[0]) == self.identity

    def take(self, running):
        """Whether a scan child may be forked now (a byte was taken for it)."""
        if not self._intact():
            return running < z._JOBS
        try:
            return posix.read(self.fds[0], 1) == b"+"
        except BlockingIOError:
            return False
        except OSError:
            self.fds = None
            return running < z._JOBS

    def give(self):
        if self._intact():
            try:
                posix.write(self.fds[1], b"+")
            except OSError:
                self.fds = None


class _Serving:
    """One zygote's scan: what is left, what runs, which packages' modules wait for another zygote."""

    def __init__(self, modules, order):
        self.modules, self.order = modules, list(order)
        self.below = _below(modules, order)
        self.position = 0
        self.released = []  # modules a package zygote left to this one, in order
        self.running = {}  # pid -> index: scan children
        self.zygotes = {}  # pid -> _Descent: package zygotes serving the modules below a package
        self.descents = {}  # pid of a package's row child -> _Descent, decided when it ends
        self.held = set()  # modules another zygote scans, or may
        self.done = set()  # modules with a row, or one on its way: from this zygote or a package zygote it left

    def next_module(self):
        while self.released:
            index = self.released.pop(0)
            if index not in self.done and index not in self.held:
                return index
        while self.position < len(self.order):
            index = self.order[self.position]
            self.position += 1
            if index in self.done or index in self.held:
                continue  # if its package zygote leaves it, it comes back through ``released``
            if index in z._served and not self._worth_descending(index):
                continue
            return index
        return None

    def _worth_descending(self, index):
        module = self.modules[index]
        return len(self.inside(module)) >= z._descent.DESCEND_MIN and module not in sys.modules

    def descend_served(self, index):
        """A package whose row was scanned before a candidate's import (its import not kept here): a zygote
        that imports it once serves the modules below, as after its row in this loop; ``(index, module)`` in
        a scan child of that zygote, else None."""
        self.done.add(index)
        inside = self.inside(self.modules[index])
        self.held.update(inside)
        return z._descent._Descent(index, inside).start(self)

    def inside(self, module):
        taken = (self.done, z._served, self.held)
        return [k for k in self.below.get(module, ()) if not any(k in group for group in taken)]

    def busy(self):
        return bool(self.running or self.zygotes)

    def reap(self, block=True):
        """Wait for any child and act on it; ``(index, module)`` in a scan child forked meanwhile, else None.

        Without ``block``, a moment's wait when no child has ended (a job of another zygote may free).
        """
        try:
            pid, status = posix.waitpid(-1, 0 if block else posix.WNOHANG)
        except ChildProcessError:  # none of ours runs: every job is another zygote's
            pid = 0
        if pid == 0:
            time.sleep(_TOKEN_POLL_S)
            return None
        code = posix.waitstatus_to_exitcode(status)
        if pid in self.running:
            z._tokens.give()
            index = self.running.pop(pid)
            if code:  # read by a zygote that checks a candidate: the row failed, whoever reaped its child
                z._write_own(index, "code", str(code))
            z._channel.emit("reaped", i=index, pid=pid, code=code)
            descent = self.descents.pop(pid, None)
            return descent.start(self) if descent is not None else None
        descent = self.zygotes.pop(pid, None)
        if descent is not None:
            z._channel.emit("ascended", i=descent.index, code=code)
            descent.ended(self, code)
        return None  # or an orphan this zygote reaps as a subreaper

    def give_back(self, descent):
        """No package zygote serves ``descent``'s modules: this zygote scans them itself."""
        self.held.difference_update(descent.inside)
        self.released.extend(descent.inside)
