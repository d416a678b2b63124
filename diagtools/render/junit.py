"""A sweep as JUnit XML, the report format CI services show per test: one test case per swept module.

A module that initializes CUDA is a failure (its cause, the line to change and the chain, in the scan's own
words); one that could not be imported, or whose scan could not see, is an error; a module the zygote
imported before forking (preloaded, so not judged on its own) is skipped; a clean module passes.  Buildkite's
and GitHub's JUnit annotators then list the failing modules by name.  Every string is escaped as XML, and
characters XML 1.0 cannot hold are written as ``\\xNN``.
"""

from __future__ import annotations

import re
from xml.sax.saxutils import escape, quoteattr

from diagtools.model.cuts import NOT_SEARCHED, headline
from diagtools.model.sweep import RootCause, SweepResult, SweepRow, cause_key
from diagtools.render.lines import culprit_details
from diagtools.render.paths import roots_of, shown_headline, shown_site

__all__ = ["outcome", "sweep_junit"]

_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_text(text: str) -> str:
    return _NOT_XML.sub(lambda match: f"\\x{ord(match.group()):02x}", text)


def _attribute(text: str) -> str:
    return quoteattr(_xml_text(text))


def _body(text: str) -> str:
    return escape(_xml_text(text))


def outcome(row: SweepRow) -> str:
    """A row's JUnit outcome: ``skipped`` (preloaded), ``failure`` (initializes CUDA), ``error`` (not imported,
    or not seen whole) or ``passed``."""
    if row.preloaded:
        return "skipped"
    if row.cuda_initialized:
        return "failure"
    return "passed" if row.status == "ok" and row.judged.value == "clean" else "error"


def sweep_junit(result: SweepResult) -> str:
    """The sweep's rows as one ``<testsuite>`` named after the package, inside ``<testsuites>``."""
    causes = {cause.key: cause for cause in result.causes}
    outcomes = [outcome(row) for row in result.rows]
    # the package roots, from where each culprit module's file was: paths relative to them, as every report
    roots = roots_of((row.culprit.module or "", row.culprit.module_site.file) for row in result.culprits
                     if row.culprit is not None and row.culprit.module_site is not None)  # fmt: skip
    counts = {
        "tests": len(outcomes),
        "failures": outcomes.count("failure"),
        "errors": outcomes.count("error"),
        "skipped": outcomes.count("skipped"),
    }
    totals = " ".join(f'{key}="{value}"' for key, value in counts.items()) + f' time="{result.seconds:.3f}"'
    cases = [
        _case(result.package, row, kind, causes.get(cause_key(row.culprit)), roots)
        for row, kind in zip(result.rows, outcomes, strict=True)
    ]
    return "\n".join(
        [
            '<?xml version="1.0" encoding="UTF-8"?>',
            f"<testsuites name={_attribute('diagtools sweep ' + result.package)} {totals}>",
            f"  <testsuite name={_attribute(result.package)} {totals}>",
            *(f"    {case}" for case in cases),
            "  </testsuite>",
            "</testsuites>",
            "",
        ]
    )


def _case(package: str, row: SweepRow, kind: str, cause: RootCause | None, roots: tuple[str, ...]) -> str:
    opening = (
        f"<testcase classname={_attribute('diagtools.sweep.' + package)} name={_attribute(row.module)} "
        f'time="{row.import_s:.3f}"'
    )
    if kind == "skipped":
        message = "preloaded by the zygote before it forked: not judged on its own (sweep --fresh judges it)"
        return f"{opening}><skipped message={_attribute(message)}/></testcase>"
    if kind == "failure":
        message, details = _failure(row, cause, roots)
        element = f'<failure type="initializes-cuda" message={_attribute(message)}>{_body(details)}</failure>'
        return f"{opening}>{element}</testcase>"
    if kind == "error":
        message = f"{row.status}: {row.error}" if row.error else f"{row.status}: the scan could not see everything"
        return f"{opening}><error type={_attribute(str(row.status))} message={_attribute(message)}/></testcase>"
    return f"{opening}/>"


def _failure(row: SweepRow, cause: RootCause | None, roots: tuple[str, ...]) -> tuple[str, str]:
    """The failure's one-line message (what, and where to change) and its details, as the text report says them."""
    chosen = shown_headline(cause.headline if cause is not None else headline(None), roots)
    culprit = row.culprit.with_sites(lambda site: shown_site(site, roots)) if row.culprit else None
    where = (
        f"line to change {chosen.line.file}:{chosen.line.line}"
        if chosen.line is not None
        else f"line to change: none verified ({chosen.reason or NOT_SEARCHED})"
    )
    message = f"initializes CUDA through {culprit.module if culprit else '?'}; {where}"
    details = culprit_details(culprit, indent="", headline=chosen) if culprit is not None else []
    return message, "\n".join(details)
