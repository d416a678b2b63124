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
