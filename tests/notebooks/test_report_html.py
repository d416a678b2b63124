"""The demo report as a reader gets it: every HTML file well formed, links and images present, no local leaks.

``diagtools demo`` runs into ``build/report/`` (the artifact the README points at); each HTML file there is
parsed by html5lib and must need no error repaired, every internal link and image must resolve, every graph
view must carry its inline SVG, and nothing may point into /tmp or the driver cache.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from tests.conftest import require

html5lib = require("html5lib", "dev")
require("nbclient", "notebook")

from diagtools.frontends.demo import write_demo_report  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NS = "{http://www.w3.org/1999/xhtml}"
# The exported notebooks' template (nbconvert's) loads its own scripts from a CDN; ours never do.
OWN_PAGES = ("index.html", "postmortem.html")


# nbconvert's lab template writes the saved widget state as a <script> after </body>; browsers take it, and the
# template is not ours.  That one error, on exported notebooks only, is let through; any other fails the page.
TEMPLATE_ERRORS = {("unexpected-start-tag-after-body", "script")}


def parse_strictly(page: Path):
    """The page's tree, and the errors a browser would have had to repair (html5lib, WHATWG parsing rules)."""
    parser = html5lib.HTMLParser(strict=False, namespaceHTMLElements=True)
    tree = parser.parse(page.read_bytes(), transport_encoding="utf-8")
    errors = [(code, data.get("name", "")) for _, code, data in parser.errors]
    if page.name not in OWN_PAGES:
        errors = [error for error in errors if error not in TEMPLATE_ERRORS]
    return tree, [f"{page.name}: {code} {name}".rstrip() for code, name in errors]


def problems_of(page: Path, cache_dir: str) -> list[str]:
    tree, problems = parse_strictly(page)
    ids = {element.get("id") for element in tree.iter() if element.get("id")}
    for element in tree.iter():
        for attribute in ("href", "src"):
            link = element.get(attribute)
            if link is None or link.startswith(("data:", "mailto:", "javascript:")):
                continue
            parts = urlsplit(link)
            if parts.scheme in ("http", "https"):
                if page.name in OWN_PAGES or element.tag == f"{NS}img":
                    problems.append(f"{page.name}: network reference {link}")
                continue
            if not parts.path:
                if parts.fragment and unquote(parts.fragment) not in ids:
                    problems.append(f"{page.name}: broken anchor #{parts.fragment}")
            elif not (page.parent / unquote(parts.path)).exists():
                problems.append(f"{page.name}: broken link {link}")
    for view in tree.iter(f"{NS}div"):
        if view.get("class") == "dtg-view" and not any(child.tag.endswith("svg") for child in view):
            problems.append(f"{page.name}: a graph view without its SVG")
    return problems + leaks_of(page, cache_dir)


def leaks_of(page: Path, cache_dir: str) -> list[str]:
    """Paths a reader elsewhere cannot use: temporary folders, the driver cache, the repository's absolute path."""
    text = page.read_text(encoding="utf-8")
    problems = []
    if str(ROOT) in text:  # exported notebooks too: repository-relative paths only
        problems.append(f"{page.name}: an absolute path into the repository")
    text = text.replace(str(ROOT), "<repository>")  # the repository itself may sit under /tmp
    problems += [f"{page.name}: mentions {leak}" for leak in ("/tmp/", cache_dir) if leak in text]
    return problems


@pytest.fixture(scope="module")
def report() -> Path:
    out = ROOT / "build" / "report"
    outcome = write_demo_report(out, driver="simulated")
    assert outcome.as_expected, outcome.summary
    return out


def test_every_report_page_is_well_formed_and_self_contained(report):
    cache_dir = os.environ.get("DIAGTOOLS_CACHE_DIR") or str(Path.home() / ".cache" / "diagtools")
    pages = sorted(report.rglob("*.html"))
    assert {"index.html", "postmortem.html"} <= {page.name for page in pages}
    assert len(pages) >= 7  # index, postmortem and the five notebooks
    problems = [problem for page in pages for problem in problems_of(page, cache_dir)]
    assert problems == []


def test_exported_notebooks_hold_no_machine_local_path_nor_widget_repr(report):
    for notebook in sorted((report / "notebooks").glob("*.ipynb")):
        text = notebook.read_text(encoding="utf-8")
        assert str(ROOT) not in text, notebook.name
        assert "VBox(" not in text, notebook.name
        assert "press the button" not in text, notebook.name


def test_index_is_styled_and_links_the_postmortem_markdown(report):
    index = (report / "index.html").read_text(encoding="utf-8")
    assert "<style>" in index
    assert 'href="postmortem.md"' in index
    assert 'href="postmortem.html"' in index
    assert '<span class="bad">initializes-cuda</span>' in index


def test_postmortem_markdown_names_the_graphs_beside_it(report):
    """Named, not embedded: a relative image breaks once the Markdown is pasted into an issue."""
    markdown = (report / "postmortem.md").read_text()
    assert not re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)
    named = re.findall(r"`([\w-]+\.svg)` beside this file", markdown)
    assert named
    for image in named:
        assert (report / image).read_text().lstrip().startswith("<?xml")
    assert str(ROOT) not in markdown  # repository-relative paths only
    assert "/tmp/" not in markdown
    assert ".cache" not in markdown
