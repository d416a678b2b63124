"""Import graphs with graphviz: the CUDA culprit unmistakable, big trees kept readable.

Modules are nodes, importer -> imported are edges.  The culprit is filled red
and carries its site line, the chain from the target to it is orange, thread
starters get a double border, every node shows its cumulative import time.
The default ``culprits`` view keeps the chains and collapses every subtree off
them into one node, so ``import torch`` stays a small graph.  Output is sorted,
so the DOT source is stable, and every label is escaped.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diagtools.errors import MissingExtraError, UsageError
from diagtools.model.diff import ScanDiff
from diagtools.model.scan import ImportNode, ScanResult, Site
from diagtools.render.graphview import BASE_FONT_PX
from diagtools.render.paths import readable, write_report

__all__ = ["GRAPH_VIEWS", "diff_graph", "scan_graph", "write_svg"]

GRAPH_VIEWS = ("culprits", "full")
CULPRIT_FILL, CHAIN_FILL, REMOVED = "#d62728", "#ffbb78", "#7f7f7f"


def _graphviz() -> Any:
    try:
        import graphviz
    except ImportError:
        raise MissingExtraError("graphviz", "notebook") from None
    return graphviz


@dataclass(frozen=True)
class _Tree:
    """The scan's modules indexed for drawing: children, subtree sizes, chain membership."""

    nodes: dict[str, ImportNode]
    children: dict[str | None, list[str]]
    chain: frozenset[str]
    culprits: frozenset[str]

    @classmethod
    def of(cls, result: ScanResult) -> _Tree:
        nodes = {node.name: node for node in result.modules}
        for missing in _chain_gaps(result, nodes):
            nodes[missing.name] = missing
        children: dict[str | None, list[str]] = defaultdict(list)
        for node in nodes.values():
            children[node.parent if node.parent in nodes else None].append(node.name)
        for names in children.values():
            names.sort(key=lambda n: (-nodes[n].cumulative_s, n))
        chain = frozenset(m for c in result.culprits for m in c.chain)
        culprits = frozenset(c.module for c in result.culprits if c.module)
        return cls(nodes, dict(children), chain, culprits)

    def subtree_size(self, name: str) -> int:
        size, stack = 0, [name]
        while stack:
            current = stack.pop()
            size += 1
            stack.extend(self.children.get(current, ()))
        return size


def _chain_gaps(result: ScanResult, nodes: dict[str, ImportNode]) -> list[ImportNode]:
    """Chain modules the document's ``modules`` lack (trimmed by hand, or run without an import the tracer saw),
    drawn under the module before them so the chain stays whole."""
    gaps: dict[str, ImportNode] = {}
    for culprit in result.culprits:
        for parent, name in zip((None, *culprit.chain), culprit.chain, strict=False):
            if name not in nodes and name not in gaps:
                gaps[name] = ImportNode(name, parent, None, 0.0, 0.0, name == culprit.module, complete=False)
    return list(gaps.values())


def _visible(result: ScanResult, tree: _Tree, view: str, max_children: int) -> tuple[list[str], dict[str, int]]:
    """Which modules to draw, and for collapsed ones how many modules they stand for."""
    if view == "full":
        return sorted(tree.nodes), {}
    anchors = sorted(tree.chain) or _target_roots(result, tree)
    shown: dict[str, int] = {}
    for anchor in anchors:
        shown[anchor] = 0
        kids = tree.children.get(anchor, [])
        on_chain = [k for k in kids if k in tree.chain]
        off_chain = [k for k in kids if k not in tree.chain][:max_children]
        for kid in on_chain + off_chain:
            shown.setdefault(kid, 0 if kid in tree.chain else tree.subtree_size(kid) - 1)
    return sorted(shown), {name: hidden for name, hidden in shown.items() if hidden}


def _target_roots(result: ScanResult, tree: _Tree) -> list[str]:
    roots = [t for t in result.targets if t in tree.nodes]
    return roots or [n for n in tree.children.get(None, []) if tree.nodes[n].phase == "import"][:1]


def _label(node: ImportNode, hidden: int, site: str) -> str:
    lines = [node.name, f"{node.cumulative_s * 1000:.1f} ms"]
    if hidden:
        lines.append(f"+{hidden} modules below")
    if node.threads_started:
        lines.append(f"starts {node.threads_started} thread(s)")
    if node.initializes_cuda:
        lines.append("INITIALIZES CUDA")
        if site:
            lines += site.split("\n")
    return "\\n".join(_escape(line) for line in lines)  # escaped lines joined by DOT's own newline


def _site_text(result: ScanResult, name: str) -> str:
    for culprit in result.culprits:
        site = culprit.initialized_at  # the module's own line, never a library's
        if culprit.module == name and site is not None:
            return _short(site)
    return ""


_LABEL_CHARS = 60  # of a source line on one line of a label
_LABEL_LINES = 3
_BREAKS = (" ", ",", "(", "[")  # where a statement may break: between names


def _short(site: Site) -> str:
    """``file.py:N: statement``; a long statement goes on up to three lines, broken between names, never inside
    one (a label cut mid-identifier names another module)."""
    head = f"{site.file.rsplit('/', 1)[-1]}:{site.line}: "
    source = site.source
    if len(source) <= _LABEL_CHARS:
        return head + source
    lines: list[str] = []
    rest = source
    while rest and len(lines) < _LABEL_LINES:
        if len(rest) <= _LABEL_CHARS:
            lines.append(rest)
            rest = ""
            break
        cut = max(rest.rfind(mark, 0, _LABEL_CHARS) for mark in _BREAKS) + 1
        if cut <= 0:  # one name longer than a line: that line holds it whole
            found = [i for i in (rest.find(mark, _LABEL_CHARS) for mark in _BREAKS) if i > 0]
            cut = min(found) + 1 if found else len(rest)
        lines.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip()
    if rest:
        lines[-1] += " \u2026"
    return head + "\n".join(lines)


def _import_lines(result: ScanResult) -> dict[tuple[str, str], Site]:
    """Each culprit chain edge's import line; the line to change is marked where the edge holds it."""
    return {(a, b): site for c in result.culprits for a, b, site in c.import_edges() if site is not None}


def _node_style(node: ImportNode, tree: _Tree) -> dict[str, str]:
    if node.name in tree.culprits:
        return {
            "style": "filled,bold",
            "fillcolor": CULPRIT_FILL,
            "fontcolor": "white",
            "penwidth": "3",
            "class": "culprit",
        }
    style = (
        {"style": "filled", "fillcolor": CHAIN_FILL, "class": "chain"}
        if node.name in tree.chain
        else {"style": "filled", "fillcolor": "#f2f2f2", "class": "module"}
    )
    if node.threads_started:
        style["peripheries"] = "2"
    return style


def _top_package(name: str) -> str:
    return name.split(".", 1)[0]


@dataclass(frozen=True)
class _Marks:
    """Style overrides for a diff: nodes and edges the fix removed."""

    nodes: frozenset[str] = frozenset()
    edges: frozenset[tuple[str, str]] = frozenset()


REMOVED_NODE = {
    "color": REMOVED,
    "style": "filled,dashed",
    "fillcolor": "#eeeeee",
    "fontcolor": REMOVED,
    "class": "removed",
}
REMOVED_EDGE = {"color": REMOVED, "style": "dashed,bold", "class": "removed", "label": "removed"}


def scan_graph(
    result: ScanResult,
    view: str = "culprits",
    *,
    max_children: int = 12,
    title: str | None = None,
    marks: _Marks | None = None,
    change: Site | None = None,
) -> Any:
    """A ``graphviz.Digraph`` of the scan's import tree (``view``: culprits or full)."""
    if view not in GRAPH_VIEWS:
        raise UsageError(f"unknown graph view {view!r}: use {', '.join(GRAPH_VIEWS)}")
    graphviz = _graphviz()
    tree = _Tree.of(result)
    marks = marks or _Marks()
    names, hidden = _visible(result, tree, view, max_children)
    label = _escape(title) if title is not None else _title(result)
    graph = graphviz.Digraph(
        "imports",
        graph_attr={"rankdir": "TB", "fontname": "DejaVu Sans", "label": label},  # narrow: fits a notebook cell
        node_attr={"shape": "box", "fontname": "DejaVu Sans", "fontsize": str(BASE_FONT_PX)},
        edge_attr={"fontname": "DejaVu Sans", "fontsize": str(BASE_FONT_PX)},
    )
    _add_clusters(graph, names, lambda name: _draw_node(name, tree, hidden, result, marks))
    changes = _changes(result.line_to_change if change is None else change)
    _add_edges(graph, names, tree, marks, lines=_import_lines(result), changes=changes)
    return drawable(graph)


def _changes(line: Site | None) -> frozenset[tuple[str, int]]:
    """The line to change as ``(file, line)``: the chain edge whose import line it is gets marked."""
    return frozenset() if line is None else frozenset({(line.file, line.line)})


def _title(result: ScanResult) -> str:
    verdict = "initializes CUDA" if result.cuda_initialized else "does not initialize CUDA"
    return _escape(f"import {' '.join(result.targets)}: {verdict} [{result.driver.kind} driver]")


def _escape(text: str) -> str:
    return str(_graphviz().escape(readable(text)))


def _draw_node(
    name: str, tree: _Tree, hidden: dict[str, int], result: ScanResult, marks: _Marks
) -> tuple[str, dict[str, str]]:
    node = tree.nodes[name]
    attrs = _node_style(node, tree)
    if name in marks.nodes:
        attrs.update(REMOVED_NODE)
    attrs["label"] = _label(node, hidden.get(name, 0), _site_text(result, name))
    attrs["tooltip"] = _escape(node.file or name)
    return _escape(name), attrs


def _add_clusters(graph: Any, names: Iterable[str], draw: Any) -> None:
    packages: dict[str, list[str]] = defaultdict(list)
    for name in names:
        packages[_top_package(name)].append(name)
    for index, (package, members) in enumerate(sorted(packages.items())):
        with graph.subgraph(name=f"cluster_{index}") as cluster:
            cluster.attr(label=_escape(package), style="rounded,dashed", color="#bbbbbb")
            for member in members:
                node_id, attrs = draw(member)
                cluster.node(node_id, **attrs)


def _add_edges(
    graph: Any,
    names: list[str],
    tree: _Tree,
    marks: _Marks,
    *,
    lines: dict[tuple[str, str], Site] | None = None,
    changes: frozenset[tuple[str, int]] = frozenset(),
) -> None:
    shown = set(names)
    for name in names:
        parent = tree.nodes[name].parent
        if parent in shown:
            on_chain = parent in tree.chain and name in tree.chain
            attrs = {"color": CULPRIT_FILL, "penwidth": "2.5", "class": "chain"} if on_chain else {"color": "#999999"}
            site = (lines or {}).get((parent, name)) if on_chain else None
            if site is not None:
                mark = "line to change: " if (site.file, site.line) in changes else ""
                attrs["label"] = "\\n".join(_escape(line) for line in (mark + _short(site)).split("\n"))
            if (parent, name) in marks.edges:
                attrs.update(REMOVED_EDGE)
            graph.edge(_escape(parent), _escape(name), **attrs)


def diff_graph(diff: ScanDiff, *, max_children: int = 12) -> Any:
    """The before graph with what the fix removed greyed and dashed, and the verdict as its title."""
    marks = _Marks(frozenset(diff.removed_modules), frozenset(diff.removed_edges))
    return scan_graph(
        diff.before,
        "culprits",
        max_children=max_children,
        title=f"diff: {diff.summary()}",
        marks=marks,
        change=diff.headline.line,
    )


def write_svg(result: ScanResult, path: str | Path, view: str = "culprits") -> Path:
    """Render the scan's graph with graphviz ``dot`` and write it as a standalone SVG file."""
    try:
        svg = scan_graph(result, view).pipe(format="svg")
    except Exception as exc:  # graphviz raises ExecutableNotFound, CalledProcessError
        raise UsageError(f"cannot render the graph: {str(exc).splitlines()[0]}") from None
    return write_report(path, svg)


def drawable(graph: Any) -> Any:
    """``graph`` with every statement encodable as UTF-8 (a path under a folder named with byte 0xff)."""
    graph.body[:] = [readable(line) for line in graph.body]
    return graph
