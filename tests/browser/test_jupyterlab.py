"""A real browser: JupyterLab in Debian's Chromium, driven by Playwright.

Opens 01_root_cause, runs every cell, waits for the import graph, checks the
culprit node is highlighted and visible in the rendered SVG, clicks the
widget's Scan button, sees the result, and saves screenshots under build/.
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

from tests.conftest import survivors

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

playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
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


def wait_kernel_idle(lab: JupyterLab, timeout: float = 120) -> None:
    """Kernels drop execute requests sent while they start: wait until the server says idle."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sessions = lab.api("/api/sessions") or []
        if any(s.get("kernel", {}).get("execution_state") == "idle" for s in sessions):
            return
        time.sleep(0.5)
    raise AssertionError("the notebook's kernel never became idle")


STARTED_JS = "() => [...document.querySelectorAll('.jp-InputPrompt')].some(p => /\\[(\\d+|\\*)\\]/.test(p.textContent))"


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


def test_root_cause_notebook_in_a_real_browser(lab):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with playwright_api.sync_playwright() as driver:
        try:
            browser = driver.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        except Exception as exc:
            pytest.skip(f"Chromium could not be launched: {exc}")
        errors: list[str] = []
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        page.on("pageerror", lambda error: errors.append(str(error)))
        try:
            page.goto(lab.url("/lab/tree/01_root_cause.ipynb"), timeout=120_000)
            page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=120_000)
            page.wait_for_selector(".jp-Notebook", timeout=120_000)
            wait_kernel_idle(lab)
            run_all_cells(page)
            culprit = page.locator(".jp-OutputArea-output svg g.node.culprit").first
            culprit.wait_for(state="visible", timeout=120_000)
            assert "vmodels.platforms" in culprit.text_content()
            fill = culprit.locator("polygon").first.get_attribute("fill")
            assert fill == "#d62728"
            box = culprit.bounding_box()
            assert box is not None
            assert box["width"] > 50
            assert box["height"] > 20
            culprit.scroll_into_view_if_needed()
            page.locator(".jp-OutputArea-output svg").first.screenshot(
                path=str(SCREENSHOTS / "01_root_cause-graph.png")
            )
            scan_button = page.locator(".jupyter-widgets button", has_text="Scan").first
            scan_button.wait_for(state="visible", timeout=120_000)
            scan_button.scroll_into_view_if_needed()
            scan_button.click()
            page.locator(".jupyter-widgets", has_text="done: ok").first.wait_for(state="visible", timeout=120_000)
            widget_graph = page.locator(".jupyter-widgets svg g.node.culprit").first
            widget_graph.wait_for(state="visible", timeout=60_000)
        finally:
            page.screenshot(path=str(SCREENSHOTS / "01_root_cause.png"), full_page=True)
            browser.close()
        assert errors == [], errors
