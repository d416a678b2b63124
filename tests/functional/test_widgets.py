"""Widget callbacks, driven without a browser or a kernel; the panels run real scans and replays in subkernels."""

from __future__ import annotations

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
    assert "Python stack when CUDA was initialized" in panel.details.value
    assert "driver.cuInit(0)" in panel.details.value
    assert 'data-selected="vmodels.platforms"' in panel.view.value  # the graph below selects it too
    panel.module_picker.value = "vmodels.config"
    assert "Python stack" not in panel.details.value
    assert panel.status.value.startswith("done: ok, driver simulated")
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

    def fake_display(obj, display_id=False):
        shown.append(getattr(obj, "data", obj))
        return Handle() if display_id else None

    monkeypatch.setattr("IPython.display.display", fake_display)
    specimen = get("lazy_clean")
    panel = ScanPanel(specimen.target, str(specimen.tree("after")), "simulated", background=False)
    panel._ipython_display_()
    assert "No result yet" in shown[-1]
    panel.scan_button.click()
    assert '<span class="good">clean</span>' in shown[-1]
    assert shown[-1] == panel.view.value


def test_scan_panel_reports_bad_input_in_its_status_line():
    panel = ScanPanel("not a module", "", "simulated", background=False)
    panel.scan_button.click()
    assert "UsageError" in panel.status.value
    assert panel.view.value == ""


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


def test_bench_panel_draws_table_and_chart():
    rows = [
        {"size": "G=64 D=512", "backend": b, "median_ms": 0.01, "GB/s": v}
        for b, v in (("triton", 3.0), ("cutedsl", 4.0))
    ]
    panel = BenchPanel(rows)
    assert "triton" in panel.table.value
    assert panel.chart.value[:4] == b"\x89PNG"
