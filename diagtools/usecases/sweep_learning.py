"""What an adaptive sweep learns from its sampled children, and what it says about it.

The learner counts which of the package's modules (and which libraries outside
it) the sampled children imported; the candidates it chooses are checked by a
zygote (:mod:`sweep_forked`), which keeps or passes over each; the notes say
what was added to the preload and why.  Plain Python: no process is started here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from diagtools.model.scan import ScanResult
from diagtools.model.sweep import SweepRow

if TYPE_CHECKING:
    from diagtools.usecases.sweep_forked import ZygotePass

ADAPT_SHARE = 0.5  # a module at least this share of them imported is preloaded
ADAPT_COSTLY_SHARE = 0.25  # and one this share imported, when importing it costs an average child
ADAPT_COSTLY_S = 0.05  # this long (its share of the children times its own import time)
ADAPT_LIBRARY_MIN_S = 0.1  # libraries are learned when an average child spends this long importing them
ADAPT_LIBRARY_EACH_S = 0.005  # and each of them only when it costs an average child this long


class Learned(Exception):  # noqa: N818 - control flow that stops a zygote, not an error
    """Raised from a zygote's child callback once the sample has shown what to preload: stops that zygote."""


class Learner:
    """What the first children imported of ``package``: the candidates for a larger preload.

    It learns from the children of the ``sample`` modules only, and decides
    once every one of them has ended (or was found preloaded): the first
    children to end are the quick ones, and learning from them alone would
    see fewer of the heavy shared imports.  When some module of the package
    was imported by at least ``share`` of them, :meth:`decide` raises
    :class:`Learned` (the zygote is stopped and a larger one started);
    otherwise the same zygote goes on.  A learner given ``jobs`` learns in a
    zygote that already preloads what an earlier one learned: it stops that
    zygote only when what it learned saves the rows left more than starting
    another zygote costs (:meth:`pays`).
    """

    def __init__(
        self,
        package: str,
        sample: Sequence[str] = (),
        share: float = 1.0,
        exclude: Sequence[str] = (),
        jobs: int | None = None,
    ) -> None:
        self.package, self.share, self.exclude, self.jobs = package, share, tuple(exclude), jobs
        self.sample, self.waiting = tuple(sample), set(sample)  # the sample, and its modules not yet seen
        self.decided = False
        self.counts: dict[str, int] = {}  # first-import order: a package before its modules
        self.importers: dict[str, str | None] = {}  # who imported each module, the first time it was seen
        self.outside: dict[str, int] = {}  # the same for modules outside the package (libraries)
        self.seconds: dict[str, float] = {}  # the seconds the children spent importing each module (either kind)
        self.children = 0
        self.unsafe: set[str] = set()
        self.declined = ""  # why what it learned was not preloaded (it would not pay for another zygote)

    def observe(self, module: str, result: ScanResult | None) -> None:
        """Count what a sample module's child imported (``result`` None: the module was preloaded)."""
        if self.decided or module not in self.waiting:
            return
        self.waiting.discard(module)
        if result is None:
            return
        self.children += 1
        for culprit in result.culprits:
            self.unsafe.update(culprit.chain)
        for node in result.modules:
            if node.name == module or not node.complete or node.phase != "import":
                continue
            inside = node.name == self.package or node.name.startswith(self.package + ".")
            counts = self.counts if inside else self.outside
            counts[node.name] = counts.get(node.name, 0) + 1
            self.importers.setdefault(node.name, node.parent)
            self.seconds[node.name] = self.seconds.get(node.name, 0.0) + node.cumulative_s

    def decide(self, passed_over: Iterable[str] = (), restart_s: float = 0.0, rows_left: int = 0) -> None:
        """Once every sample module was seen: raise :class:`Learned` when there is something to preload (never
        one its zygote passed over) and, for a learner given ``jobs``, when it :meth:`pays`."""
        if self.decided or self.waiting:
            return
        self.decided = True
        self.exclude = (*self.exclude, *(name for name in passed_over if name not in self.exclude))
        libraries, modules = self.chosen()
        names = [*libraries, *modules]
        if names and self.pays(names, restart_s, rows_left):
            raise Learned
        if names:
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            self.declined = (
                f"learned {shown} from {self.children} more sampled children, not preloaded: they would save the "
                f"{rows_left} rows left about {self.saving(names, rows_left):.0f} s, and another zygote takes "
                f"{restart_s:.0f} s to start"
            )

    def chosen(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """What it would preload: the libraries, then the package's modules (never one it excludes)."""
        libraries = tuple(name for name, _ in self.libraries(self.share, self.exclude))
        return libraries, tuple(name for name, _ in self.candidates(self.share, self.exclude))

    def pays(self, names: Sequence[str], restart_s: float, rows_left: int) -> bool:
        """Whether preloading ``names`` saves the ``rows_left`` rows, ``jobs`` at a time, more than the
        ``restart_s`` seconds a zygote that preloads them takes to start (always, for a first learner)."""
        return self.jobs is None or self.saving(names, rows_left) > restart_s

    def saving(self, names: Sequence[str], rows_left: int) -> float:
        """Seconds preloading ``names`` saves ``rows_left`` rows, ``jobs`` at a time."""
        chosen = set(names)
        roots = [name for name in names if self.importers.get(name) not in chosen]  # each counted once
        return self.worth(roots) * rows_left / (self.jobs or 1)

    def worth(self, names: Sequence[str]) -> float:
        """Seconds an average child spent importing ``names`` (and what they import)."""
        return sum(self.seconds.get(name, 0.0) for name in names) / max(1, self.children)

    def candidates(self, share: float, exclude: Sequence[str]) -> list[tuple[str, int]]:
        """Modules most children imported (at least ``share`` of them), clean in every child, in import order."""
        return self._common(self.counts, share, exclude)

    def libraries(self, share: float, exclude: Sequence[str]) -> list[tuple[str, int]]:
        """The modules outside the package most children imported, each the first of its subtree to be
        imported (a library's own modules follow it), in import order: only those worth preloading (each
        :data:`ADAPT_LIBRARY_EACH_S`, together :data:`ADAPT_LIBRARY_MIN_S`), since every library preloaded
        is one whose own import-time changes the rows are scanned after."""
        common = self._common(self.outside, share, exclude)
        names = {name for name, _ in common}
        roots = [(name, count) for name, count in common if self.importers.get(name) not in names]
        roots = [(name, count) for name, count in roots if self.worth([name]) >= ADAPT_LIBRARY_EACH_S]
        return roots if self.worth([name for name, _ in roots]) >= ADAPT_LIBRARY_MIN_S else []

    def _common(self, counts: dict[str, int], share: float, exclude: Sequence[str]) -> list[tuple[str, int]]:
        """The modules at least ``share`` of the children imported, and those a smaller share imported
        (:data:`ADAPT_COSTLY_SHARE`) that cost an average child :data:`ADAPT_COSTLY_S`: preloading a slow
        module a third of the rows import saves more than a quick one they all import."""
        common, costly = max(2, share * self.children), max(2, ADAPT_COSTLY_SHARE * self.children)
        skip = set(exclude) | self.unsafe
        return [
            (name, count)
            for name, count in counts.items()
            if name not in skip and (count >= common or (count >= costly and self.worth([name]) >= ADAPT_COSTLY_S))
        ]


def spread(modules: Sequence[str], count: int) -> list[str]:
    """``count`` modules spread evenly over the sorted list, so every part of the package is seen."""
    step = len(modules) / count
    return list(dict.fromkeys(modules[int(i * step)] for i in range(count)))


class Recorder:
    """Hands each row on, remembering which modules have a row and which of them failed to import."""

    def __init__(self, on_row: Callable[[SweepRow], None], failed: Iterable[str] = ()) -> None:
        self.on_row = on_row
        self.recorded: set[str] = set()
        self.failed: set[str] = set(failed)

    def __call__(self, row: SweepRow) -> None:
        self.recorded.add(row.module)
        if row.status != "ok":
            self.failed.add(row.module)
        self.on_row(row)


@dataclass(frozen=True)
class Candidates:
    """What a zygote checks before preloading it: ``names`` (``libraries`` first), learned by ``learner`` from
    a sample, or remembered by the journal (no learner); ``earlier`` are those an earlier learner chose, checked
    again first."""

    names: tuple[str, ...]
    libraries: tuple[str, ...]
    learner: Learner | None = None
    earlier: Candidates | None = None

    @classmethod
    def learned_by(cls, learner: Learner) -> Candidates:
        libraries, modules = learner.chosen()
        return cls((*libraries, *modules), libraries, learner)

    def then(self, later: Candidates) -> Candidates:
        """These candidates, then ``later``'s (learned in a zygote that preloaded these)."""
        names = (*self.names, *(name for name in later.names if name not in self.names))
        return replace(later, names=names, libraries=(*self.libraries, *later.libraries), earlier=self)

    @classmethod
    def remembered(cls, learned: tuple[Sequence[str], Sequence[str]], preload: Sequence[str]) -> Candidates:
        names = tuple(n for n in learned[0] if n not in preload)
        return cls(names, tuple(n for n in learned[1] if n in names))

    @property
    def checking(self) -> str:
        """The stage that checks them."""
        if self.learner is None:
            return f"checking {len(self.names)} preload(s) the last run learned"
        if self.earlier is not None:
            return f"checking {len(self.names) - len(self.earlier.names)} more learned preload(s)"
        return f"checking {len(self.names)} learned preload(s)"

    def notes(self, done: ZygotePass) -> tuple[str, ...]:
        """What was added to the preload and why, and each candidate passed over and why."""
        if self.learner is None:
            kept = [name for name in self.names if name in done.preload]
            note = f"preloaded {len(kept)} of the {len(self.names)} module(s) the journal's last run learned to preload"
            return (note, *(f"{n} (not preloaded: {done.passed_over[n]})" for n in self.names if n in done.passed_over))
        chosen = self.learner.candidates(ADAPT_SHARE, self.learner.exclude)
        sampled = len(self.learner.sample)
        earlier: tuple[str, ...] = () if self.earlier is None else self.earlier.notes(done)
        libraries = tuple(n for n in self.libraries if self.earlier is None or n not in self.earlier.libraries)
        return (
            *earlier,
            *library_notes(libraries, done, again=self.earlier is not None),
            *adapt_notes(self.learner, chosen, done.preload, sampled, done.passed_over),
        )

    def outcome(self, done: ZygotePass) -> ZygotePass:
        """``done``, the checked pass, with what it kept of the candidates and why."""
        return replace(
            done,
            notes=(*self.notes(done), *done.notes),
            learned=tuple(name for name in self.names if name in done.preload),
            libraries=tuple(name for name in self.libraries if name in done.preload),
        )


def library_notes(libraries: Sequence[str], done: ZygotePass, *, again: bool = False) -> tuple[str, ...]:
    """The libraries learned and preloaded first (their own import-time changes accepted, as torch's are);
    ``again``: learned by a later sample, from children of a zygote that preloaded the earlier ones."""
    if not libraries:
        return ()
    kept = [name for name in libraries if name in done.preload]
    shown = ", ".join(kept[:8]) + (f" and {len(kept) - 8} more" if len(kept) > 8 else "")
    which = "more sampled children" if again else "sampled children"
    notes = [
        f"{len(kept)} librar{'y' if len(kept) == 1 else 'ies'} most {which} import, preloaded first: {shown or 'none'}"
    ]
    notes += [f"{name} (not preloaded: {done.passed_over[name]})" for name in libraries if name in done.passed_over]
    return tuple(notes)


def adapt_notes(
    learner: Learner,
    chosen: list[tuple[str, int]],
    used: Sequence[str],
    sampled: int,
    passed_over: Mapping[str, str] | None = None,
) -> tuple[str, ...]:
    if not chosen:
        return (f"learned from {learner.children} of {sampled} sampled children: no module most of them import",)
    kept, names, passed_over = set(used), {name for name, _ in chosen}, passed_over or {}
    roots: dict[str, int] = {}
    for name, _ in chosen:
        root = name
        while learner.importers.get(root) in names and learner.importers.get(root) != root:
            root = str(learner.importers[root])
        roots[root] = roots.get(root, 0) + (root != name)
    counts = dict(chosen)
    notes = [
        f"{root}"
        + (f" (+{below} module{'s' if below > 1 else ''} it imports)" if below else "")
        + f": imported by {counts[root]} of {learner.children} sampled children"
        + ("" if root in kept else f" (not preloaded: {passed_over.get(root, 'refused by the zygote check')})")
        for root, below in roots.items()
    ]
    return tuple(notes)
