"""Widget callbacks, driven without a browser or a kernel; the panels run real scans and replays in subkernels."""

from __future__ import annotations

import re

from tests.conftest import require

require("ipywidgets", "notebook")

from diagtools.specimens import get  # noqa: E402
from diagtools.widgets import BenchPanel, ReplayPanel, ScanPanel  # noqa: E402


def test_scan_button_scans_and_module_picker_shows_details():
    specimen = get("common_ops")
    panel = ScanPanel(specimen.target, str(specimen.tree("before")), "simulated", background=False)
    panel.scan_button.click()
    assert "vmodels.platforms" in panel.view.value
    assert "<svg" in panel.view.value
    assert panel.module_picker.options[0] == "vmodels.platforms"
    panel.module_picker.value = "vmodels.platforms"
    assert 'data-selected="vmodels.platforms"' in panel.view.value  # the graph shows its details, once
    assert panel.view.value.count("Python stack when CUDA was initialized") <= 1
    assert panel.view.value.count("<table") == panel.view.value.count('class="dt-box"')  # tables in own box
    panel.module_picker.value = "vmodels.config"
    assert 'data-selected="vmodels.config"' in panel.view.value
    status = panel.status.value
    # the verdict is said once, in the result; the status line says what ran, in neutral words
    ran = r"imported <code>vmodels.common.ops</code> in a fresh subkernel \(driver simulated\)"
    assert re.match(rf"done in \d+\.\d s: {ran}; the answer is below$", status), status
    assert "initializes-cuda" not in status
    assert "<span" not in status
    assert panel.view.value.count('<span class="bad">initializes-cuda</span>') == 1
    assert "common/<wbr>ops/<wbr>__init__.py:3" in panel.view.value  # the nearest verified cut
    assert "/tmp/" not in panel.view.value
    assert str(specimen.tree("before")) not in panel.view.value
    assert all(name.startswith("vmodels") for name in panel.module_picker.options)  # the target's own package
    assert list(panel.module_picker.options[:4]) == [
        "vmodels.platforms",
        "vmodels.common.ops",
        "vmodels.common.ops.fused_allreduce_rms_norm",
        "vmodels.config",
    ]
    panel.all_modules.value = True
    assert len(panel.module_picker.options) == len(panel.result.modules)


def test_panel_result_is_a_static_display_saved_with_the_notebook(monkeypatch):
    shown = []

    class Handle:
        def update(self, obj):
            shown.append(obj.data)

    def fake_display(obj, display_id=False, raw=False):
        shown.append(getattr(obj, "data", obj))
        return Handle() if display_id else None

    monkeypatch.setattr("IPython.display.display", fake_display)
    specimen = get("lazy_clean")
    panel = ScanPanel(specimen.target, str(specimen.tree("after")), "simulated", background=False)
    panel._ipython_display_()
    assert shown[0]["text/plain"].startswith("ScanPanel: interactive in a running notebook")
    assert "application/vnd.jupyter.widget-view+json" in shown[0]
    assert "No result yet" in shown[-1]
    assert "press the button" not in shown[-1]
    panel.scan_button.click()
    assert any("Running" in item for item in shown if isinstance(item, str))  # "No result yet" goes while it runs
    assert '<span class="good">clean</span>' in shown[-1]
    assert shown[-1] == panel.view.value


def test_scan_panel_reports_bad_input_in_its_status_line():
    panel = ScanPanel("not a module", "", "simulated", background=False)
    panel.scan_button.click()
    assert re.match(r"stopped by UsageError after \d+\.\d s; the message is below$", panel.status.value)
    assert "UsageError: " in panel.view.value
    assert "#a15c00" in panel.view.value  # amber: no answer, not a verdict


def test_background_scan_finishes_and_fills_the_view():
    specimen = get("lazy_clean")
    panel = ScanPanel(specimen.target, str(specimen.tree("after")), "simulated")
    panel.scan_button.click()
    panel.wait(60)
    assert '<span class="good">clean</span>' in panel.view.value


def test_replay_panel_compares_before_and_after():
    specimen = get("common_ops")
    panel = ReplayPanel(specimen.target, specimen.tree("before"), specimen.tree("after"), "simulated", background=False)
    panel.compare_button.click()
    assert "CUDA_ERROR_NOT_INITIALIZED" in panel.view.value
    assert panel.comparison.run("before", "fork").reproduced
    headline = "Reproduced: before/fork fails; fixed: after passes fork and spawn"
    assert panel.comparison.headline() == headline
    status = panel.status.value
    assert re.match(r"done in \d+\.\d s: 4 replays in fresh subkernels; the answer is below$", status), status
    assert "Reproduced" not in status  # said once, in the result, in its colours
    view = panel.view.value
    assert '<span class="bad">Reproduced: before/fork fails</span>' in view
    assert '<span class="good">fixed: after passes fork and spawn</span>' in view
    assert "replay_child.py" not in panel.view.value  # diagtools' own frames stay in the JSON


def test_bench_panel_is_static_html_with_its_note_on_table_and_chart():
    rows = [
        {"size": "G=64 D=512", "backend": b, "median_ms": 0.01, "GB/s": v}
        for b, v in (("triton", 3.0), ("cutedsl", 4.0))
    ]
    note = "CPU: time not meaningful (torch reference vs Triton interpreter; not GPU timings)"
    panel = BenchPanel(rows, note=note)
    html = panel._repr_html_()
    assert "triton" in html
    assert note in html
    assert 'src="data:image/png;base64,' in html
    assert "max-width:100%" in html
    assert panel.png[:4] == b"\x89PNG"


def test_suggest_fix_shows_the_checked_patch_and_the_guard():
    specimen = get("common_ops")
    panel = ScanPanel(specimen.target, str(specimen.tree("before")), "simulated", background=False)
    panel.fix_button.click()
    view, status = panel.view.value, panel.status.value
    assert panel.fix_result is not None
    assert panel.fix_result.verified
    assert re.match(r"done in \d+\.\d s: searched a verified cut for <code>vmodels.common.ops</code>", status), status
    assert "verified</span>" not in status
    assert '<span class="good">verified</span>' in view
    assert "common/<wbr>ops/<wbr>__init__.py:3" in view
    assert '<pre class="dt-patch">' in view
    assert '<span class="add">+def __getattr__(name):</span>' in view
    assert "from vmodels.common.ops import fused_allreduce_rms_norm</code>: " in view
    assert "assert_import_cuda_free(&#x27;vmodels.common.ops&#x27;)" in view
    assert str(specimen.tree("before")) not in view
