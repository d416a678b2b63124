"""The report pages in a real browser at 1024 px: code spans that wrap keep every underscore visible.

A wrapped ``<code>`` span draws one background box per line; when those boxes
overlap, each line's background paints over the underscores of the line above
("fused allreduce rms norm").  Checked by the computed boxes of every line of
a long identifier, in the page styles the reports use.
"""

from __future__ import annotations

import itertools

import pytest

from diagtools.frontends.demo import _INDEX_STYLE
from diagtools.render.html import _STYLE
from tests.browser.test_jupyterlab import CHROMIUM, CHROMIUM_ARGS, playwright_api

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium: `apt-get install chromium` (make test does)")

NAME = (
    "from vmodels.common.ops.fused_allreduce_rms_norm import fused_allreduce_rms_norm_quant as "
    "fused_allreduce_rms_norm_static_per_tensor_group_kernel"
)


@pytest.fixture(scope="module")
def tab():
    with playwright_api.sync_playwright() as driver:
        try:
            browser = driver.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        except Exception as exc:
            pytest.skip(f"Chromium could not be launched: {exc}")
        page = browser.new_page(viewport={"width": 1024, "height": 768}, device_scale_factor=1)
        try:
            yield page
        finally:
            browser.close()


LINE_BOXES = """(element) => Array.from(element.getClientRects()).map(r => [r.top, r.bottom])"""


@pytest.mark.parametrize(
    ("style", "body"),
    [
        (_STYLE, '<div class="dt" style="width:260px"><p>line to change: <code id="c">{name}</code></p></div>'),
        (_INDEX_STYLE, '<div style="width:260px"><p>line to change: <code id="c">{name}</code></p></div>'),
    ],
    ids=["panels-and-postmortem", "demo-index"],
)
def test_a_wrapped_code_span_never_paints_over_the_line_above(tab, style, body):
    tab.set_content(f"<html><head>{style}</head><body>{body.format(name=NAME)}</body></html>")
    boxes = tab.eval_on_selector("#c", LINE_BOXES)
    assert len(boxes) >= 3, boxes  # it did wrap
    for (_, bottom), (top, _) in itertools.pairwise(boxes):
        assert top >= bottom - 0.01, boxes  # the next line's background starts below this line's box


def test_a_tall_graph_opens_whole_in_its_view_at_1024_by_768(tab):
    """Fitted to the view's height as well as its width: the last row is never below the view's edge; when that
    makes the text small, the zoom cue shows."""
    from diagtools.render.graphview import graph_view_html

    rows = "".join(
        f'<g class="node"><title>m{i}</title><rect x="10" y="{i * 60}" width="300" height="40"/>'
        f'<text x="20" y="{i * 60 + 25}" font-size="12">m{i}</text></g>'
        for i in range(20)
    )
    svg = (
        '<svg width="400pt" height="1200pt" viewBox="0 0 400 1200" xmlns="http://www.w3.org/2000/svg">'
        f'<g id="graph0" class="graph" transform="translate(0 0)">{rows}</g></svg>'
    )
    tab.set_content(f"<html><head>{_STYLE}</head><body><div class='dt'>{graph_view_html(svg, {})}</div></body></html>")
    tab.wait_for_function("() => document.querySelector('.dtg').hasAttribute('data-scale')", timeout=30_000)
    geometry = tab.evaluate(
        """() => {
      const box = document.querySelector('.dtg'), view = box.querySelector('.dtg-view');
      const v = view.getBoundingClientRect(), s = view.querySelector('svg').getBoundingClientRect();
      const cue = box.querySelector('.dtg-cue');
      return {top: s.top >= v.top - 1, bottom: s.bottom <= v.bottom + 1, left: s.left >= v.left - 1,
              right: s.right <= v.right + 1,
              scale: parseFloat(box.getAttribute('data-scale')), min: parseFloat(box.getAttribute('data-min-scale')),
              cue: !cue.hidden};
    }"""
    )
    assert all(geometry[side] for side in ("top", "bottom", "left", "right")), geometry
    assert geometry["cue"] == (geometry["scale"] < geometry["min"] - 1e-3), geometry


def test_the_notebook_check_for_overlapping_code_lines_finds_one(tab):
    """The check the notebook test runs on every output (``OVERLAP_JS``) sees the overlap a bad style makes,
    and none in the reports' style."""
    from tests.browser.test_jupyterlab import OVERLAP_JS

    code = f"<p><code>{NAME}</code></p>"
    tab.set_content(
        f'<html><head>{_STYLE}</head><body><div id="out" class="dt" style="width:260px">{code}</div></body></html>'
    )
    assert tab.eval_on_selector("#out", OVERLAP_JS) == []
    bad = "<style>code{line-height:1;padding:6px 3px;background:#eee}</style>"
    tab.set_content(f'<html><head>{bad}</head><body><div id="out" style="width:260px">{code}</div></body></html>')
    assert tab.eval_on_selector("#out", OVERLAP_JS), "a padded code span on tight lines overlaps"
