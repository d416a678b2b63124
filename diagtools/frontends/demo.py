"""The main job: scan every built-in specimen, before and after its fix, and write a report."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from diagtools.model.scan import ScanResult
from diagtools.model.serial import json_text
from diagtools.model.verdict import VERDICT_TONES, Tone, Verdict
from diagtools.render.lines import wrapped
from diagtools.render.paths import display_path, shareable
from diagtools.render.style import HTML_COLOURS, toned, verdict_toned
from diagtools.render.text import render_scan
from diagtools.specimens import Specimen, all_specimens
from diagtools.usecases.scan import scan

__all__ = ["NOTEBOOKS", "DemoReport", "NotebookOutcome", "SpecimenOutcome", "run_notebook", "write_demo_report"]

# The notebooks live in the source repository (notebooks/ beside the package), not in the package:
# a checkout finds them here; an install from a wheel has none, and the report says so.
NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


@dataclass(frozen=True)
class SpecimenOutcome:
    """One specimen variant's scan and whether it matched the specimen's story."""

    specimen: Specimen
    variant: str
    result: ScanResult

    @property
    def as_expected(self) -> bool:
        if not self.result.ok:
            return False
        if self.variant == "after" or self.specimen.culprit is None:
            return self.result.verdict == Verdict.CLEAN
        culprit = self.result.culprit
        return (
            culprit is not None
            and culprit.module == self.specimen.culprit
            and culprit.site is not None
            and self.specimen.site_text in culprit.site.source
        )

    def summary_line(self) -> str:
        """``[ok ] name/variant: verdict: ...``, as the demo's summary lists it."""
        mark = "ok " if self.as_expected else toned("UNEXPECTED", Tone.UNKNOWN)  # the run's health: neutral
        return f"  [{mark}] {self.specimen.name}/{self.variant}: {verdict_toned(self.result.verdict, self.headline())}"

    def summary_lines(self) -> list[str]:
        """:meth:`summary_line` wrapped at 100 columns."""
        return wrapped(self.summary_line(), "        ")

    def headline(self) -> str:
        if not self.result.cuda_initialized:
            doubts = "; ".join(self.result.doubts())
            return f"{self.result.verdict}: CUDA not initialized" + (f" ({doubts})" if doubts else "")
        culprit = self.result.culprit
        line = self.result.line_to_change
        at = culprit.initialized_at if culprit else None
        where = f"; line to change {display_path(line.file)}:{line.line}" if line else ""
        where = where or (f"; CUDA initialized at {display_path(at.file)}:{at.line}" if at else "")
        return f"{self.result.verdict}: {culprit.module if culprit else '?'}{where}"


@dataclass(frozen=True)
class NotebookOutcome:
    """One notebook executed headless: where its HTML went, or the error that stopped it."""

    name: str
    html: Path | None
    error: str = ""
    seconds: float = 0.0

    def summary_line(self) -> str:
        state = f"FAILED: {self.error}" if self.error else f"executed in {self.seconds:.1f} s"
        return f"  notebook {self.name}: {state}"


@dataclass(frozen=True)
class DemoReport:
    """Where the report went and what it found."""

    index: Path
    outcomes: tuple[SpecimenOutcome, ...]
    notebooks: tuple[NotebookOutcome, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def as_expected(self) -> bool:
        specimens_ok = all(outcome.as_expected for outcome in self.outcomes)
        return specimens_ok and not any(notebook.error for notebook in self.notebooks)

    @property
    def summary(self) -> str:
        """Everything the demo says, in the order a terminal saw it come (:func:`write_demo_report`'s ``said``)."""
        lines = driver_lines(self.outcomes[0]) if self.outcomes else []
        lines += [line for outcome in self.outcomes for line in outcome.summary_lines()]
        lines += [notebook.summary_line() for notebook in self.notebooks]
        return "\n".join(lines + self.closing_lines())

    def closing_lines(self) -> list[str]:
        """What the summary says only at the end: no specimens at all, the notes."""
        return [*([] if self.outcomes else ["no specimens"]), *(f"  note: {note}" for note in self.notes)]


def driver_lines(first: SpecimenOutcome) -> list[str]:
    """The driver the demo's scans used (one driver for them all), wrapped at 100 columns."""
    return wrapped(f"driver: {shareable(first.result, library=True).driver.describe()}")


def _markdown(report_outcomes: tuple[SpecimenOutcome, ...]) -> str:
    lines = ["# diagtools: built-in specimens", ""]
    if report_outcomes:
        lines += [f"Driver: {shareable(report_outcomes[0].result).driver.describe()}", ""]
    for outcome in report_outcomes:
        specimen = outcome.specimen
        lines += [f"## {specimen.title} ({outcome.variant}/)", "", specimen.story, ""]
        if outcome.variant == "after":
            lines += [f"Fix: {specimen.fix}.", ""]
        lines += ["```text", render_scan(shareable(outcome.result), stack=True), "```", ""]
    return "\n".join(lines)


def run_notebook(source: Path, out: Path, parameters: dict[str, Any], *, timeout: float = 900) -> NotebookOutcome:
    """Execute one notebook headless with ``parameters`` injected, and export it to HTML."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, DeadKernelError

    from diagtools.frontends.export import notebook_html

    notebook = nbformat.read(source, as_version=4)
    _inject_parameters(notebook, parameters, nbformat)
    started = time.perf_counter()
    error = ""
    client = NotebookClient(
        notebook, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(source.parent)}}
    )
    out.mkdir(parents=True, exist_ok=True)
    # The kernel's own stderr (IPKernelApp warnings, debugger notes) goes to a log beside the notebook,
    # not to the terminal of whoever runs the demo.
    with (out / f"{source.stem}.kernel.log").open("wb") as kernel_log:
        try:
            client.execute(stderr=kernel_log, stdout=kernel_log)
        except (CellExecutionError, DeadKernelError, TimeoutError) as exc:
            error = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
    nbformat.write(notebook, out / source.name)
    html = notebook_html(notebook)
    html_path = out / f"{source.stem}.html"
    html_path.write_text(html, encoding="utf-8")
    return NotebookOutcome(source.stem, html_path, error, time.perf_counter() - started)


def _inject_parameters(notebook: Any, parameters: dict[str, Any], nbformat: Any) -> None:
    """Papermill-style: a cell right after the one tagged ``parameters`` overrides its values."""
    source = "# Parameters injected by diagtools demo\n" + "\n".join(f"{k} = {v!r}" for k, v in parameters.items())
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["tags"] = ["injected-parameters"]
    index = next((i for i, c in enumerate(notebook.cells) if "parameters" in c.metadata.get("tags", [])), -1)
    notebook.cells.insert(index + 1, cell)


_INDEX_STYLE = (
    "<style>body{font:15px/1.5 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}"
    "h1{font-size:1.6rem;margin-bottom:.2rem}h2{font-size:1.2rem;margin-top:1.6rem;border-bottom:1px solid #ddd}"
    "a{color:#1f5fa8}ul{padding-left:1.2rem}li{margin:.2rem 0}"
    "code{background:#f4f4f4;padding:0 4px;box-decoration-break:clone}"
    + "".join(f".{tone.value}{{color:{colour};font-weight:600}}" for tone, colour in HTML_COLOURS.items())
    + ".lede{color:#555}nav a{margin-right:1rem}</style>"
)


def _index_html(
    report_outcomes: tuple[SpecimenOutcome, ...], notebooks: tuple[NotebookOutcome, ...], *, postmortem: bool = False
) -> str:
    items = "".join(
        f'<li><a href="notebooks/{escape(n.name)}.html">{escape(n.name)}</a>'
        + (f' <span class="bad">failed: {escape(n.error)}</span>' if n.error else "")
        + "</li>"
        for n in notebooks
    )
    links = [("postmortem.html", "Postmortem (page)"), ("postmortem.md", "Postmortem (Markdown, to paste)")]
    links = [link for link in links if postmortem] + [("specimens.md", "Specimen scans (Markdown)")]
    nav = "".join(f'<a href="{href}">{escape(text)}</a>' for href, text in links)
    verdicts = "".join(
        f"<li><code>{escape(o.specimen.name)}/{o.variant}</code>: "
        f'<span class="{VERDICT_TONES[o.result.verdict].value}">{escape(str(o.result.verdict))}</span>'
        f"{escape(o.headline().removeprefix(str(o.result.verdict)))}</li>"
        for o in report_outcomes
    )
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width,initial-scale=1'>"
        f"<title>diagtools report</title>{_INDEX_STYLE}</head><body>"
        "<h1>diagtools report</h1><p class='lede'>Which import initializes the CUDA driver, down to the line: "
        "the built-in specimens scanned before and after their fix, and the notebooks executed.</p>"
        f"<nav>{nav}</nav>"
        f"<h2>Notebooks</h2><ul>{items}</ul><h2>Specimens</h2><ul>{verdicts}</ul></body></html>"
    )


def write_demo_report(
    out: Path,
    *,
    driver: str = "auto",
    notebooks: Path | None = NOTEBOOKS,
    run: Callable[..., ScanResult] = scan,
    progress: Callable[[str], object] | None = None,
    said: Callable[[list[str]], object] | None = None,
) -> DemoReport:
    """Scan each specimen variant, execute the notebooks, and write the report under ``out``.

    ``progress(phase)`` hears what starts: each scan (with how many are done), each notebook, the report;
    ``said(lines)`` hears each part of the summary as soon as it is known: the driver with the first scan, each
    specimen's line as its scan ends, each notebook's as it ran.
    """
    say = progress or (lambda phase: None)
    tell = said or (lambda lines: None)
    variants = [(specimen, variant) for specimen in all_specimens() for variant in specimen.variants]
    outcomes_list: list[SpecimenOutcome] = []
    for number, (specimen, variant) in enumerate(variants, 1):
        say(f"scanning {specimen.name}/{variant} ({number} of {len(variants)})")
        result = run(specimen.target, path=[specimen.tree(variant)], driver=driver)
        outcome = SpecimenOutcome(specimen, variant, result)
        tell([*(driver_lines(outcome) if not outcomes_list else []), *outcome.summary_lines()])
        outcomes_list.append(outcome)
    outcomes = tuple(outcomes_list)
    out.mkdir(parents=True, exist_ok=True)
    _clear_earlier_report(out)
    # meant for sharing: every path by the one rule (diagtools.render.paths), no driver cache path
    scans = {f"{o.specimen.name}/{o.variant}": shareable(o.result).to_json() for o in outcomes}
    (out / "specimens.json").write_text(json_text(scans) + "\n", encoding="utf-8")
    (out / "specimens.md").write_text(_markdown(outcomes), encoding="utf-8")
    executed: tuple[NotebookOutcome, ...] = ()
    notes = () if notebooks is None or notebooks.is_dir() else (_no_notebooks(notebooks),)
    if notebooks is not None and notebooks.is_dir():
        # relative to the notebooks' folder, where they run: the exported notebooks hold no machine-local path
        parameters = {"DRIVER": driver, "OUT_DIR": os.path.relpath(out.resolve(), notebooks.resolve())}
        ran = []
        for path in sorted(notebooks.glob("*.ipynb")):
            say(f"executing notebook {path.name}")
            ran.append(run_notebook(path, out / "notebooks", parameters))
            tell([ran[-1].summary_line()])
        executed = tuple(ran)
    say("writing the report")
    index = out / "index.html"
    index.write_text(_index_html(outcomes, executed, postmortem=(out / "postmortem.html").exists()), encoding="utf-8")
    return DemoReport(index, outcomes, executed, notes)


def _clear_earlier_report(out: Path) -> None:
    """Remove what an earlier demo wrote into ``out`` (and only that), so the report is this run's alone: an
    index never links a postmortem or a notebook page this run did not write."""
    from diagtools.render.postmortem import FIX_GRAPH_FILE, GRAPH_FILE

    names = ("index.html", "specimens.json", "specimens.md", "postmortem.html", "postmortem.md")
    for name in (*names, GRAPH_FILE, FIX_GRAPH_FILE):
        (out / name).unlink(missing_ok=True)
    executed = out / "notebooks"
    if executed.is_dir():
        for page in executed.iterdir():
            if page.is_file() and page.name.endswith((".ipynb", ".html", ".kernel.log")):
                page.unlink()


def _no_notebooks(where: Path) -> str:
    return (
        f"no notebooks at {where}: they ship in the source repository's notebooks/ folder, not in an installed"
        " wheel; pass --notebooks DIR (a checkout's notebooks/) to run them, or --no-notebooks"
    )
