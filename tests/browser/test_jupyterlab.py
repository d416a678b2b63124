"""A real browser: JupyterLab in Debian's Chromium, driven by Playwright, in a 1024 px window.

Opens 01_root_cause, runs every cell, waits for the import graph, checks the
culprit node is highlighted, its text readable (>= 9 px) and a click shows
its details, clicks the panel's Scan button, checks the panel fits the
window, saves, reopens and finds the panel's static copy; then opens
02_fork_replay and clicks Replay.  Screenshots go under build/browser/.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import require, survivors

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "build" / "browser"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-dev-shm-usage",
    "--disable-gpu",
    "--disable-lcd-text",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
]

playwright_api = require("playwright.sync_api", "dev")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium: `apt-get install chromium` (make test does, as root)"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class JupyterLab:
    """A JupyterLab server on a loopback port with a token and its own Jupyter dirs."""

    def __init__(self, root: Path, scratch: Path) -> None:
        self.port, self.token, self.root = free_port(), secrets.token_hex(16), root
        self.marker = secrets.token_hex(8)
        self.log = scratch / "jupyter.log"
        env = dict(
            os.environ,
            JUPYTER_CONFIG_DIR=str(scratch / "config"),
            JUPYTER_DATA_DIR=str(scratch / "data"),
            JUPYTER_RUNTIME_DIR=str(scratch / "runtime"),
            DIAGTOOLS_SUBKERNEL=self.marker,
        )
        command = [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--port={self.port}",
            "--port-retries=0",
            f"--IdentityProvider.token={self.token}",
            "--ServerApp.allow_root=True",
            f"--ServerApp.root_dir={root}",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.news_url=None",
        ]
        news = scratch / "config" / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
        news.mkdir(parents=True, exist_ok=True)
        (news / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
        self.log_handle = self.log.open("wb")
        self.process = subprocess.Popen(
            command, env=env, stdout=self.log_handle, stderr=subprocess.STDOUT, start_new_session=True
        )

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}?token={self.token}"

    def api(self, path: str, method: str = "GET") -> object:
        request = urllib.request.Request(self.url(path), method=method)
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"jupyter lab exited: {self.log.read_text()[-3000:]}")
            try:
                self.api("/api/status")
                return
            except OSError:
                time.sleep(0.5)
        raise AssertionError(f"jupyter lab did not answer in {timeout} s: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        try:
            for session in self.api("/api/sessions") or []:
                self.api(f"/api/sessions/{session['id']}", method="DELETE")
        except OSError:
            pass
        self.process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self.log_handle.close()


@pytest.fixture
def lab(tmp_path):
    root = tmp_path / "notebooks"
    root.mkdir()
    shutil.copy(ROOT / "notebooks" / "01_root_cause.ipynb", root)
    shutil.copy(ROOT / "notebooks" / "02_fork_replay.ipynb", root)
    server = JupyterLab(root, tmp_path)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
        deadline = time.monotonic() + 10
        while survivors(server.marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert survivors(server.marker) == [], "the server or a kernel outlived the test"


def wait_kernel_idle(lab: JupyterLab, timeout: float = 120, notebook: str = "") -> None:
    """Kernels drop execute requests sent while they start: wait until the server says the notebook's is idle."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sessions = [s for s in lab.api("/api/sessions") or [] if s.get("path", "").endswith(notebook)]
        if any(s.get("kernel", {}).get("execution_state") == "idle" for s in sessions):
            return
        time.sleep(0.5)
    raise AssertionError("the notebook's kernel never became idle")


STARTED_JS = (
    "() => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-InputPrompt')]"
    ".some(p => /\\[(\\d+|\\*)\\]/.test(p.textContent))"
)


def run_all_cells(page) -> None:
    """Run > Run All Cells, again if the first cell has not started within 30 s."""
    for _ in range(3):
        page.locator(".lm-MenuBar-item", has_text="Run").first.click()
        page.locator(".lm-Menu-item", has_text="Run All Cells").first.click()
        try:
            page.wait_for_function(STARTED_JS, timeout=30_000)
            return
        except playwright_api.TimeoutError:
            page.keyboard.press("Escape")
    raise AssertionError("Run All Cells did not start the notebook")


WIDTH = 1024
MIN_TEXT_PX = 9
# The smallest rendered text of the first graph view, and its scale, measured in the page.
TEXT_JS = """box => {
  const texts = [...box.querySelectorAll('svg text')];
  const scale = parseFloat(box.getAttribute('data-scale') || '1');
  const sizes = texts.map(t => parseFloat(t.getAttribute('font-size') || '14') * scale);
  return {scale, minFont: Math.min(...sizes), minBox: Math.min(...texts.map(t => t.getBoundingClientRect().height))};
}"""
# Whether an element sticks out of the window or scrolls sideways.
OVERFLOW_JS = """el => {
  const r = el.getBoundingClientRect();
  return {right: r.right, width: window.innerWidth, scroll: el.scrollWidth - el.clientWidth};
}"""


def open_notebook(page, lab: JupyterLab, name: str) -> None:
    page.goto(lab.url(f"/lab/tree/{name}"), timeout=120_000)
    page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=120_000)
    page.wait_for_selector(".jp-Notebook", timeout=120_000)


def assert_fits(page, locator, what: str) -> None:
    geometry = locator.evaluate(OVERFLOW_JS)
    assert geometry["right"] <= geometry["width"] + 1, (what, geometry)
    assert geometry["scroll"] <= 1, (what, geometry)


def check_graph_view(page) -> None:
    view = page.locator(".jp-OutputArea-output .dtg").first
    culprit = view.locator("svg g.node.culprit").first
    culprit.wait_for(state="visible", timeout=120_000)
    assert "vmodels.platforms" in culprit.text_content()
    assert culprit.locator("polygon").first.get_attribute("fill") == "#d62728"
    sizes = view.evaluate(TEXT_JS)
    assert sizes["minFont"] >= MIN_TEXT_PX, sizes
    assert sizes["minBox"] >= MIN_TEXT_PX, sizes
    assert view.locator(".dtg-legend").is_visible()
    assert view.locator(".dtg-bar button", has_text="Export SVG").is_visible()
    assert_fits(page, view, "graph view")
    culprit.scroll_into_view_if_needed()
    culprit.click()
    assert "Python stack when CUDA was initialized" in view.locator(".dtg-info").text_content()
    assert "platforms.py" in view.locator(".dtg-info").text_content()
    view.screenshot(path=str(SCREENSHOTS / "01_root_cause-graph.png"))


def test_root_cause_notebook_in_a_real_browser(lab):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with playwright_api.sync_playwright() as driver:
        try:
            browser = driver.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        except Exception as exc:
            pytest.skip(f"Chromium could not be launched: {exc}")
        errors: list[str] = []
        page = browser.new_page(viewport={"width": WIDTH, "height": 900})
        page.on("pageerror", lambda error: errors.append(str(error)))
        try:
            open_notebook(page, lab, "01_root_cause.ipynb")
            wait_kernel_idle(lab)
            run_all_cells(page)
            check_graph_view(page)
            check_scan_panel_and_its_saved_copy(page, lab)
            check_replay_panel(page, lab)
        finally:
            page.screenshot(path=str(SCREENSHOTS / "final.png"), full_page=True)
            browser.close()
        assert errors == [], errors


def check_scan_panel_and_its_saved_copy(page, lab: JupyterLab) -> None:
    scan_button = page.locator(".jupyter-widgets button", has_text="Scan").first
    scan_button.wait_for(state="visible", timeout=120_000)
    scan_button.scroll_into_view_if_needed()
    panel = page.locator(".jp-OutputArea-output .widget-vbox", has=scan_button).first
    assert_fits(page, panel, "scan panel")
    scan_button.click()
    page.locator(".jupyter-widgets", has_text="done: ok").first.wait_for(state="visible", timeout=120_000)
    panel_cell = page.locator(".jp-CodeCell", has_text="ScanPanel(TARGET")
    static = panel_cell.locator(".jp-OutputArea-output .dtg").first
    static.locator("svg g.node.culprit").first.wait_for(state="visible", timeout=60_000)
    assert_fits(page, static, "the panel's result")
    panel_cell.screenshot(path=str(SCREENSHOTS / "01_scan_panel.png"))
    page.screenshot(path=str(SCREENSHOTS / "01_root_cause.png"), full_page=True)
    page.keyboard.press("Control+s")
    wait_saved(lab.root / "01_root_cause.ipynb")
    page.reload()
    page.wait_for_selector(".jp-Notebook", timeout=120_000)
    reopened = page.locator(".jp-CodeCell", has_text="ScanPanel(TARGET")
    reopened.scroll_into_view_if_needed()
    copy = reopened.locator(".jp-OutputArea-output svg g.node.culprit").first
    copy.wait_for(state="attached", timeout=60_000)
    assert "vmodels.platforms" in copy.text_content()
    reopened.screenshot(path=str(SCREENSHOTS / "01_reopened_panel.png"))


def check_replay_panel(page, lab: JupyterLab) -> None:
    for session in lab.api("/api/sessions") or []:  # one kernel at a time on a small machine
        lab.api(f"/api/sessions/{session['id']}", method="DELETE")
    open_notebook(page, lab, "02_fork_replay.ipynb")
    wait_kernel_idle(lab, notebook="02_fork_replay.ipynb")
    run_all_cells(page)
    replay_button = page.locator(".jupyter-widgets button", has_text="Replay").first
    replay_button.wait_for(state="visible", timeout=180_000)
    replay_button.scroll_into_view_if_needed()
    replay_panel = page.locator(".jp-OutputArea-output .widget-vbox", has=replay_button).first
    assert_fits(page, replay_panel, "replay panel")
    replay_button.click()
    page.locator(".jupyter-widgets", has_text="done").first.wait_for(state="visible", timeout=180_000)
    panel_cell = page.locator(".jp-CodeCell", has_text="ReplayPanel(TARGET")
    panel_cell.locator(".jp-OutputArea-output", has_text="Fork replay").first.wait_for(timeout=60_000)
    panel_cell.screenshot(path=str(SCREENSHOTS / "02_replay_panel.png"))


def wait_saved(path: Path, timeout: float = 30) -> None:
    """Until the notebook on disk holds the panel's static copy among its outputs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        document = json.loads(path.read_text())
        outputs = [o for cell in document["cells"] for o in cell.get("outputs", [])]
        html = ["".join(o.get("data", {}).get("text/html", "")) for o in outputs]
        if any("diagtools scan" in h and 'class="dtg"' in h for h in html[-3:]):
            return
        time.sleep(0.5)
    raise AssertionError("the saved notebook has no static copy of the panel's result")
